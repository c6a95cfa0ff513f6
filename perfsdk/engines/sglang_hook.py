"""perfsdk inside SGLang's scheduler processes: the device time of every forward pass, no flag needed.

**Loaded by SGLang itself.** perfsdk registers :func:`install` under SGLang's ``sglang.srt.plugins`` entry
point (name ``perfsdk``). SGLang's ``load_plugins()`` runs it early in every scheduler process (one per
GPU) and then applies the hooks it registered through SGLang's ``HookRegistry``: one ``AROUND`` hook on
``ModelRunner.forward``. Nothing else is patched::

    pip install perfsdk                      # into SGLang's environment
    PERFSDK_HARDWARE=h200 python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct \\
        --enable-metrics
    curl -s localhost:30000/metrics | grep -E 'perfsdk_step_(seconds|bandwidth_utilization)_(count|sum)'

``SGLANG_PLUGINS`` (a comma-separated allow-list of plugin names) filters it like any SGLang plugin;
``PERFSDK_ENABLED=0`` turns it off.

**One step.** ``ModelRunner.forward(forward_batch)`` is one forward pass of the target model (CUDA graph
replay or eager), on the scheduler thread and its current stream (the forward stream under overlap
scheduling). perfsdk enters a step — a pooled CUDA event — when it is called and exits it — a second
event — when it returns, so the step's device time is the forward's, with no host synchronisation;
sampling runs after it and is not included. The step is sized from the ``ForwardBatch`` exactly
(:func:`forward_shape`): ``DECODE`` → a ``decode`` step over the batch's sequence lengths
(``seq_lens_sum``); ``EXTEND`` → ``prefill`` with each sequence's new tokens (``extend_seq_lens_cpu``)
and cached prefix (``extend_prefix_lens_cpu``); ``MIXED`` (``--enable-mixed-chunk``) → ``mixed``, the
decoding rows being the trailing one-token rows SGLang appends; ``TARGET_VERIFY`` (speculative decoding) →
a ``decode`` step of ``draft_token_num`` tokens per sequence, not a prefill. ``IDLE`` forwards (data-
parallel attention padding) and draft-model forwards (``is_draft_worker``) are not recorded. Warm-up:
the forwards SGLang's server runs after it starts (one short request) are real forwards and are
recorded; CUDA-graph capture calls the model directly, not ``ModelRunner.forward``, and perfsdk's steps
are no-ops inside a capture anyway.

**Per rank.** Each scheduler process has its own Monitor, sized per GPU (``ModelSpec.with_tp`` over
``--tp-size``); with several ranks its series carry a ``rank`` label (torch.distributed's rank).

**Where the numbers go.** With ``--enable-metrics`` SGLang sets ``PROMETHEUS_MULTIPROC_DIR`` before it
starts its scheduler processes, and its ``/metrics`` reads every process's values back: perfsdk's step
metrics appear there beside ``sglang:*``. ``PERFSDK_METRICS_PORT=P`` serves rank *r* on ``P + r`` as well
(``/metrics`` and ``POST /profile``). ``PERFSDK_PROFILER=torch`` (or ``nsys``) enables the profiler window
in every rank (triggered per rank by that port or ``SIGUSR2`` to the scheduler process).

**Never breaks SGLang.** A perfsdk failure is counted in ``perfsdk_internal_errors_total`` and logged
once; the forward runs on. SGLang's own exceptions pass through unchanged (the step is recorded as
failed). The supported releases are one line, :class:`SglangForwardInstrumentor`'s ``_instruments``
(``sglang >= 0.5.23, < 0.6``): on another release the plugin says which range it supports and registers
nothing. :func:`uninstall` undoes it (the registered hook then passes every forward straight through:
SGLang's registry cannot take a hook back).

When to use which: this hook needs perfsdk installed in SGLang's environment and gives device-time steps
with exact sizes, in SGLang's own ``/metrics``. ``perfsdk sglang`` (:mod:`perfsdk.engines.sglang`) runs
beside an unmodified SGLang started with ``--enable-forward-pass-metrics``, in another process or host,
from SGLang's published sums (prefill lengths split evenly).
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from perfsdk.config import env
from perfsdk.engines._common import (
    StepShape,
    count_error,
    distributed_rank,
    enabled,
    enter_step,
    exit_step,
    process_monitor,
)
from perfsdk.engines.instrumentor import Instrumentor

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor

__all__ = ["TARGET", "RunnerHook", "SglangForwardInstrumentor", "forward_shape", "install", "uninstall"]

log = logging.getLogger("perfsdk")

TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
_HOOK_ATTR = "_perfsdk_hook"
_REGISTERED = False  # SGLang's HookRegistry holds around_forward (once per process: it has no unregister)
_ACTIVE = False  # around_forward records; False: it passes every forward straight through
_HOOKS: weakref.WeakSet[RunnerHook] = weakref.WeakSet()  # every runner hooked in this process


class SglangForwardInstrumentor(Instrumentor):
    """The ``AROUND`` hook on ``ModelRunner.forward``, through SGLang's own ``HookRegistry``.

    SGLang's registry applies a hook once and can take none back, so :meth:`uninstall` turns the registered
    hook into a pass-through (one global read per forward) and lets go of every runner's
    :class:`RunnerHook`; installing again turns it back on without registering twice.
    """

    name = "SGLang forward hook"
    _instruments = ("sglang >= 0.5.23, < 0.6",)  # the CI suite runs 0.5.23

    def _install(self) -> None:
        global _REGISTERED, _ACTIVE
        if not _REGISTERED:
            from sglang.srt.plugins.hook_registry import HookRegistry, HookType

            HookRegistry.register(TARGET, around_forward, HookType.AROUND)
            _REGISTERED = True
        _ACTIVE = True

    def _uninstall(self) -> None:
        global _ACTIVE
        _ACTIVE = False
        for hook in list(_HOOKS):
            if hook.runner.__dict__.get(_HOOK_ATTR) is hook:
                del hook.runner.__dict__[_HOOK_ATTR]
            _HOOKS.discard(hook)


def install() -> None:
    """The ``sglang.srt.plugins`` entry point: register the ``AROUND`` hook on ``ModelRunner.forward``.

    SGLang's ``load_plugins()`` calls it, then applies the hooks (a hook registered after that is applied
    only by SGLang's next ``apply_hooks``). Idempotent; on an SGLang outside the supported range it logs
    which range perfsdk supports and registers nothing; never raises.
    """
    SglangForwardInstrumentor().install()


def uninstall() -> None:
    """Undo :func:`install`: no forward is recorded any more, and the runners' hooks are let go."""
    SglangForwardInstrumentor().uninstall()


def forward_shape(forward_batch: Any) -> StepShape | None:
    """The :class:`~perfsdk.engines._common.StepShape` of one ``ForwardBatch``; None: nothing to record."""
    mode = getattr(forward_batch.forward_mode, "name", "")
    bs = int(forward_batch.batch_size)
    if not bs:
        return None
    if mode == "DECODE":
        return StepShape((), 0, bs, bs, int(forward_batch.seq_lens_sum))
    if mode in ("EXTEND", "SPLIT_PREFILL"):
        chunks = tuple(int(n) for n in forward_batch.extend_seq_lens_cpu)
        return StepShape(chunks, sum(int(n) for n in forward_batch.extend_prefix_lens_cpu), 0, 0, 0)
    if mode == "MIXED":
        # ScheduleBatch.mix_with_running appends the decoding rows last, one new token each
        lens = [int(n) for n in forward_batch.extend_seq_lens_cpu]
        prefix = [int(n) for n in forward_batch.extend_prefix_lens_cpu]
        k = len(lens)
        while k > 0 and lens[k - 1] == 1:
            k -= 1
        k = max(k, 1)  # the first row is a prefill chunk: mixing needs one
        decode = len(lens) - k
        return StepShape(tuple(lens[:k]), sum(prefix[:k]), decode, decode, sum(prefix[k:]) + decode)
    if mode == "TARGET_VERIFY":
        per_seq = int(getattr(forward_batch.spec_info, "draft_token_num", 0) or 0)
        if per_seq <= 0:
            extend = forward_batch.extend_num_tokens
            per_seq = max(int(extend) // bs, 1) if extend else 1
        tokens = bs * per_seq
        return StepShape((), 0, bs, tokens, int(forward_batch.seq_lens_sum) + tokens)
    return None  # IDLE, PREBUILT, DRAFT_EXTEND_V2, DLLM_EXTEND: nothing perfsdk costs


class RunnerHook:
    """One ``ModelRunner``'s forwards as perfsdk steps; made on its first forward by :func:`around_forward`.

    ``steps`` counts the forwards recorded, ``skipped`` those with nothing to cost (IDLE and the like).
    """

    def __init__(self, runner: Any, monitor: Monitor) -> None:
        self.runner = runner
        self.monitor = monitor
        self.steps = 0
        self.skipped = 0

    def begin(self, forward_batch: Any) -> Any:
        try:
            shape = forward_shape(forward_batch)
            step = enter_step(self.monitor, shape) if shape is not None else None
        except Exception as e:
            count_error(self.monitor, e, "sglang forward hook: step begin")
            return None
        if step is None:
            self.skipped += 1
        else:
            self.steps += 1
        return step


def runner_monitor(runner: Any) -> Monitor:
    """This process's Monitor for *runner*'s model (once per process, model and rank)."""
    from perfsdk.model import ModelSpec, quantized_weight_dtype

    args = runner.server_args
    mc = runner.model_config
    name = args.served_model_name or args.model_path
    spec = None
    try:
        act = str(getattr(mc, "dtype", "") or "").replace("torch.", "") or None
        quant = quantized_weight_dtype(getattr(mc.hf_config, "quantization_config", None))
        cache = str(getattr(args, "kv_cache_dtype", "auto") or "auto")
        kv = act if cache == "auto" else ("fp8" if cache.startswith("fp8") else cache)
        spec = ModelSpec.from_hf_config(mc.hf_config, dtype=quant or act, kv_dtype=kv)
        tp = int(getattr(args, "tp_size", 1) or 1)
        spec = spec.with_tp(tp) if tp > 1 else spec
        import dataclasses

        spec = dataclasses.replace(spec, name=str(name))
    except Exception as e:  # an architecture perfsdk cannot size: step times without MBU/MFU
        log.warning("perfsdk: cannot size model %s from its config (%s): MBU/MFU off", name, e)
    # a datasheet name, else the GPU this process runs on (the Monitor warns when it cannot tell)
    hw = env("PERFSDK_HARDWARE") or "auto"
    return process_monitor("sglang", spec, str(name), hw, port_offset=0, rank=distributed_rank())


_NO_HOOK: Any = object()


def hook_of(runner: Any) -> RunnerHook | None:
    """*runner*'s hook, made on first use; None for a draft-model runner or when perfsdk cannot run."""
    hook = runner.__dict__.get(_HOOK_ATTR, _NO_HOOK)
    if hook is _NO_HOOK:
        hook = None
        try:
            if not getattr(runner, "is_draft_worker", False) and enabled():
                hook = RunnerHook(runner, runner_monitor(runner))
                _HOOKS.add(hook)
        except Exception as e:  # a bad PERFSDK_* setting: SGLang runs on without perfsdk's step metrics
            log.error("perfsdk: SGLang model runner not hooked (it runs on without perfsdk's step metrics): %s", e)
        runner.__dict__[_HOOK_ATTR] = hook
    return hook if isinstance(hook, RunnerHook) else None


def around_forward(original: Any, *args: Any, **kwargs: Any) -> Any:
    """The ``AROUND`` hook on ``ModelRunner.forward(self, forward_batch, ...)``."""
    if not _ACTIVE:  # uninstalled: SGLang's registry keeps the hook, which passes straight through
        return original(*args, **kwargs)
    step = hook = None
    try:
        hook = hook_of(args[0])
        if hook is not None:
            step = hook.begin(args[1] if len(args) > 1 else kwargs.get("forward_batch"))
    except Exception as e:
        count_error(hook.monitor if hook is not None else None, e, "sglang forward hook")
    if step is None or hook is None:
        return original(*args, **kwargs)
    try:
        out = original(*args, **kwargs)
    except BaseException as e:
        exit_step(hook.monitor, step, e)
        raise
    exit_step(hook.monitor, step)
    return out
