"""perfsdk inside vLLM's GPU workers: the device time of every step, under vLLM's default settings.

**Loaded by vLLM itself.** perfsdk registers :func:`register` under vLLM's ``vllm.general_plugins``
entry point (name ``perfsdk_worker``), which vLLM loads in every process it starts. ``register``
(:class:`VllmWorkerInstrumentor`) wraps ``WorkerWrapperBase.init_device`` — nothing else — so that in
each worker process, once vLLM has set the device and the distributed groups up, :func:`attach` hooks
that worker. Worker processes are forked by default, inheriting the wrapped class; everything per
process (the Monitor, its collector thread, a metrics port) is made there, lazily, after
``init_device``. No flag is needed::

    pip install perfsdk        # in vLLM's environment
    PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) PERFSDK_HARDWARE=h200 vllm serve meta-llama/Llama-3.1-8B-Instruct

The explicit alternative (with the plugin filtered out by ``VLLM_PLUGINS``, or just to say it)::

    vllm serve ... --worker-extension-cls perfsdk.engines.vllm.worker.PerfsdkWorkerExtension

(vLLM 0.33 calls the extension's ``init_worker_extension`` after ``init_device``, which hooks the worker;
vLLM 0.26 does not call it, so there the plugin hooks the workers and the extension adds only its
``collective_rpc`` methods.)

**One step.** vLLM runs a step on a worker as ``Worker.execute_model(scheduler_output)`` followed by
``Worker.sample_tokens(grammar_output)``, on the worker's thread and its current CUDA stream (with the
V1 and the V2 model runner alike). The hook enters a perfsdk step (a pooled CUDA event) when
``execute_model`` is entered and exits it (a second event) when ``sample_tokens`` returns, so the step's
device time brackets its forward pass and sampling with no host synchronisation — also under async
scheduling, where the host runs ahead. A step whose ``execute_model`` already returns the output (no
sampling follows: pooling models, a step with nothing scheduled) ends there. The step is sized from
the ``SchedulerOutput`` exactly (:mod:`perfsdk.engines.vllm.batch`): a ``prefill``, ``decode``, or
``mixed`` step (chunked prefill beside decodes), each sequence's context, the cached prefix. Nothing
is recorded before ``compile_or_warm_up_model`` has returned (warm-up runs through the same methods;
graph capture happens in it), and perfsdk's steps are no-ops inside a CUDA-graph capture anyway.

**Per rank.** Each worker has its own Monitor, sized per GPU (``ModelSpec.with_tp`` over the
tensor-parallel size), so MBU and MFU are each GPU's against its own share of the weights, KV cache
and FLOPs; with more than one rank its series carry a ``rank`` label (torch.distributed's rank).

**Where the numbers go.** A worker is not vLLM's API server, so its metrics reach ``/metrics`` one of
two ways (both may be on):

* ``PROMETHEUS_MULTIPROC_DIR`` set, to a fresh empty directory, *before* ``vllm serve`` starts: every
  process writes its values there and vLLM's own ``/metrics`` reads them all back (vLLM sets this up
  itself with ``--api-server-count`` > 1, but then only after its front end has imported
  prometheus_client — so set it yourself);
* ``PERFSDK_METRICS_PORT=P``: rank *r* serves perfsdk's ``/metrics`` (and ``POST /profile``) on port
  ``P + 1 + r`` (``PERFSDK_METRICS_ADDR``, default 127.0.0.1); port ``P`` itself is the API server's
  perfsdk Monitor (the request latencies of :mod:`perfsdk.engines.vllm.stats`).

With neither, the steps are measured and dropped, and each worker says so once in the log.

**Profiler window, per rank.** ``PERFSDK_PROFILER=torch`` (or ``nsys``) enables perfsdk's profiler
window in every worker (traces under ``PERFSDK_PROFILE_DIR``, default ``./perfsdk-traces``, named by
rank). A capture is then triggered on one rank by ``POST /profile`` on that rank's port, by
``SIGUSR2`` to that worker's process, or from Python for chosen ranks::

    llm.collective_rpc(perfsdk.engines.vllm.worker.profile, kwargs={"steps": 4, "ranks": [0]})

**NVTX.** While Nsight Systems is attached (``nsys profile vllm serve ...``) every step is an NVTX
range ``perfsdk.prefill`` / ``perfsdk.decode`` / ``perfsdk.mixed`` on the worker's thread.

**Never breaks vLLM.** Every hook body is guarded: a perfsdk failure is counted in
``perfsdk_internal_errors_total`` and logged once, and the vLLM call goes on; vLLM's own exceptions
pass through unchanged. The supported releases are one line, :class:`VllmWorkerInstrumentor`'s
``_instruments`` (``vllm >= 0.26, < 0.34``; CI runs 0.26.0 and 0.33.0): on another the plugin logs which
range it supports and patches nothing. ``PERFSDK_ENABLED=0`` turns it off.

**Undo.** Every patch is a ``wrapt`` wrapper marked as perfsdk's (:mod:`perfsdk.engines.instrumentor`):
:func:`unregister` puts ``WorkerWrapperBase.init_device`` back and detaches every worker hooked in the
process (their own methods back, no more steps recorded); :meth:`WorkerHook.detach` does it for one
worker. Both restore only what still carries perfsdk's marker, and both may be called twice.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING, Any

from perfsdk.engines._common import count_error, distributed_rank, enabled, enter_step, exit_step, process_monitor
from perfsdk.engines.instrumentor import Instrumentor, guard, unwrap, wrap
from perfsdk.engines.vllm.batch import step_shape
from perfsdk.engines.vllm.config import hardware_of, model_of

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor

__all__ = [
    "PerfsdkWorkerExtension",
    "VllmWorkerInstrumentor",
    "WorkerHook",
    "attach",
    "installed",
    "profile",
    "register",
    "unregister",
]

log = logging.getLogger("perfsdk")

_HOOK_ATTR = "_perfsdk_hook"  # on the worker instance: its WorkerHook (attach is idempotent)
_WRAPPED = ("execute_model", "sample_tokens", "compile_or_warm_up_model")  # per worker: WorkerHook's methods
_HOOKS: weakref.WeakSet[WorkerHook] = weakref.WeakSet()  # every worker hooked in this process


class VllmWorkerInstrumentor(Instrumentor):
    """Wraps ``WorkerWrapperBase.init_device`` so that each worker is hooked right after vLLM set it up;
    uninstalling unwraps it and detaches every worker hooked in this process."""

    name = "vLLM worker hook"
    _instruments = ("vllm >= 0.26, < 0.34",)  # CI runs the oldest and the newest (scripts/test_engine.sh)

    def _install(self) -> None:
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        wrap(WorkerWrapperBase, "init_device", _init_device)

    def _uninstall(self) -> None:
        from vllm.v1.worker.worker_base import WorkerWrapperBase

        unwrap(WorkerWrapperBase, "init_device")
        for hook in list(_HOOKS):
            hook.detach()


def _init_device(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    result = wrapped(*args, **kwargs)  # vLLM's own: its exceptions are its own
    # uninstalled, but another library's wrapper put on top keeps this one in the chain: pass through
    if VllmWorkerInstrumentor().installed:
        with guard(None, "vLLM worker hook not attached"):  # attach guards itself; this is for what it could not
            attach(instance.worker)
    return result


def installed() -> bool:
    """Whether :func:`register` has wrapped vLLM's ``WorkerWrapperBase.init_device`` (in this process)."""
    return bool(VllmWorkerInstrumentor().installed)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it once in every process it starts.

    Installs :class:`VllmWorkerInstrumentor`: idempotent; on a vLLM outside its range it logs which range
    it supports and patches nothing; never raises.
    """
    VllmWorkerInstrumentor().install()


def unregister() -> None:
    """Undo :func:`register`: vLLM's ``WorkerWrapperBase.init_device`` back, and every worker this process
    hooked given its own methods back (their steps are no longer recorded)."""
    VllmWorkerInstrumentor().uninstall()


def worker_monitor(vllm_config: Any) -> Monitor:
    """This process's worker Monitor for *vllm_config*'s model (made once per process, model and rank).

    ``PERFSDK_METRICS_PORT=P``: served on ``P + 1 + rank`` (``P`` is the API server's).
    """
    model, name = model_of(vllm_config)
    return process_monitor("vllm", model, name, hardware_of(_local_device()), port_offset=1, rank=distributed_rank())


def _local_device() -> int:
    try:
        import torch

        if torch.cuda.is_available():  # vLLM set this worker's device in init_device
            return int(torch.cuda.current_device())
    except Exception:
        pass
    return 0


class WorkerHook:
    """One vLLM worker's steps as perfsdk steps: wraps the worker's ``execute_model``,
    ``sample_tokens`` and ``compile_or_warm_up_model`` (``wrapt`` wrappers set on the instance;
    :meth:`detach` removes them). Made by :func:`attach`; see the module docstring for what is measured.

    Counters (plain ints, for tests and ``perfsdk_stats``): ``steps`` recorded, ``warmup`` calls seen
    before the model was warm (not recorded), ``unpaired`` steps that had to be closed by the next
    ``execute_model`` because no ``sample_tokens`` came.
    """

    def __init__(self, worker: Any, monitor: Monitor, *, ready: bool = False) -> None:
        self.worker = worker
        self.monitor = monitor
        self.ready = ready  # False until compile_or_warm_up_model has returned: warm-up is not serving
        self.steps = 0
        self.warmup = 0
        self.unpaired = 0
        self._open: Any = None  # the step entered by execute_model, to exit when sample_tokens returns
        for name in _WRAPPED:  # on this worker only (instance attributes), each marked as perfsdk's
            wrap(worker, name, getattr(self, name))
        setattr(worker, _HOOK_ATTR, self)
        _HOOKS.add(self)

    def detach(self) -> None:
        """Give the worker its own methods back (those that still carry perfsdk's wrapper); idempotent."""
        for name in _WRAPPED:
            unwrap(self.worker, name)
        if getattr(self.worker, _HOOK_ATTR, None) is self:
            delattr(self.worker, _HOOK_ATTR)
        self._close(None)
        _HOOKS.discard(self)

    # ---- the wrapped methods (the worker's thread), as wrapt calls them -----
    def compile_or_warm_up_model(
        self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        result = wrapped(*args, **kwargs)
        self.ready = True
        return result

    def execute_model(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        scheduler_output = args[0] if args else kwargs.get("scheduler_output")
        step = None
        if self.ready:
            if self._open is not None:
                self._close(None)
                self.unpaired += 1
            step = self._begin(scheduler_output)
        elif scheduler_output is not None:
            self.warmup += 1
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as e:
            if step is not None:
                self._end(step, e)
            raise
        if step is not None:
            if out is None:
                self._open = step  # the step goes on in sample_tokens
            else:
                self._end(step, None)  # its output is back: no sample_tokens follows
        return out

    def sample_tokens(self, wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            out = wrapped(*args, **kwargs)
        except BaseException as e:
            self._close(e)
            raise
        if self._open is not None:
            self._close(None)
        return out

    # ---- steps ----------------------------------------------------------
    def _begin(self, scheduler_output: Any) -> Any:
        """Enter a perfsdk step sized from *scheduler_output*; None when there is nothing to time."""
        try:
            step = enter_step(self.monitor, step_shape(scheduler_output))
        except Exception as e:
            count_error(self.monitor, e, "vllm worker hook: step begin")
            return None
        if step is not None:
            self.steps += 1
        return step

    def _end(self, step: Any, exc: BaseException | None) -> None:
        exit_step(self.monitor, step, exc)

    def _close(self, exc: BaseException | None) -> None:
        step, self._open = self._open, None
        if step is not None:
            self._end(step, exc)


def attach(worker: Any, monitor: Monitor | None = None, *, ready: bool = False) -> WorkerHook | None:
    """Hook *worker* (a vLLM ``Worker``, after its ``init_device``); None when perfsdk is off or cannot.

    Idempotent. *monitor*: default, this process's worker Monitor (:func:`worker_monitor`). *ready*:
    record from the first step (the model is already warm); by default recording starts once
    ``compile_or_warm_up_model`` has returned.
    """
    try:
        existing = getattr(worker, _HOOK_ATTR, None)
        if isinstance(existing, WorkerHook):
            return existing
        if monitor is None and not enabled():
            return None
        mon = monitor if monitor is not None else worker_monitor(worker.vllm_config)
        return WorkerHook(worker, mon, ready=ready)
    except Exception as e:  # a bad PERFSDK_* setting, an odd worker: vLLM runs on without perfsdk
        log.error("perfsdk: vLLM worker not hooked (it runs on without perfsdk's step metrics): %s", e)
        return None


def hook_of(target: Any) -> WorkerHook | None:
    """The WorkerHook of a vLLM worker, or of the ``WorkerWrapperBase`` around it (``collective_rpc``)."""
    hook = getattr(target, _HOOK_ATTR, None)
    if hook is None:
        hook = getattr(getattr(target, "worker", None), _HOOK_ATTR, None)
    return hook if isinstance(hook, WorkerHook) else None


def profile(
    target: Any, steps: int | None = None, mode: str | None = None, ranks: list[int] | None = None
) -> dict[str, Any]:
    """Ask this worker's profiler window for one capture (``collective_rpc`` runs it on every worker).

    *ranks*: only those ranks (torch.distributed's; a single GPU is rank 0) capture; the others answer
    ``{"accepted": False, "reason": "not this rank"}``. Returns the capture handle as a dict.
    """
    hook = hook_of(target)
    if hook is None:
        return {"accepted": False, "reason": "perfsdk's worker hook is not attached to this worker"}
    rank = distributed_rank() or 0
    if ranks is not None and rank not in ranks:
        return {"accepted": False, "reason": "not this rank", "rank": rank}
    try:
        out: dict[str, Any] = hook.monitor.profile(steps=steps, mode=mode, reason="rpc").to_dict()
    except Exception as e:
        return {"accepted": False, "reason": str(e), "rank": rank}
    out["rank"] = rank
    return out


class PerfsdkWorkerExtension:
    """The worker hook as vLLM's explicit switch::

        vllm serve ... --worker-extension-cls perfsdk.engines.vllm.worker.PerfsdkWorkerExtension

    vLLM adds this class to its worker's bases and calls ``init_worker_extension`` after
    ``init_device``; the methods below become ``collective_rpc`` targets
    (``llm.collective_rpc("perfsdk_profile", kwargs={"steps": 4, "ranks": [1]})``).
    """

    def init_worker_extension(self) -> None:
        try:
            problem = VllmWorkerInstrumentor().dependency_problem()
        except Exception as e:
            problem = str(e)
        if problem is not None:
            log.warning("perfsdk: %s: the worker extension does nothing", problem)
            return
        attach(self)

    def destroy_worker_extension(self) -> None:
        hook = hook_of(self)
        if hook is not None:
            hook.detach()

    def perfsdk_profile(
        self, steps: int | None = None, mode: str | None = None, ranks: list[int] | None = None
    ) -> dict[str, Any]:
        return profile(self, steps, mode, ranks)

    def perfsdk_stats(self) -> dict[str, Any]:
        """This worker's step counts and its Monitor's rolling statistics."""
        hook = hook_of(self)
        if hook is None:
            return {}
        return {
            "rank": distributed_rank() or 0,
            "steps": hook.steps,
            "warmup": hook.warmup,
            "unpaired": hook.unpaired,
            "monitor": hook.monitor.stats(),
        }
