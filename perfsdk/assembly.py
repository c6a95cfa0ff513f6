"""How a Monitor is put together: every implementation chosen once, when it is built (STYLE 3).

:func:`assemble` takes the validated settings (:class:`~perfsdk.config.MonitorConfig`) and what the
Monitor resolved (model, GPU, registry, clock) and returns the :class:`Parts`:

* the timer — CUDA events only if torch is *already imported* and sees a GPU (perfsdk never imports
  torch on its own initiative), else the host clock — and the events: driver handles through libcuda
  (:mod:`perfsdk.cuda_driver`), else ``torch.cuda.Event`` (:mod:`perfsdk.timing`);
* the hot path and step core: in C (``perfsdk._native``) where the extension was built and the events are
  driver events (or none), else the Python reference (:mod:`perfsdk.hotpath`, :mod:`perfsdk.stepcore`);
* NVTX (the ``nvtx`` package, ``torch.cuda.nvtx``, or nothing), the ``rank`` label, the sinks;
* the :class:`StepMaker` that makes the step objects ``Monitor.decode()`` and its siblings hand out.

Nothing here runs per step. :mod:`perfsdk.monitor` keeps only the public API.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from perfsdk._guard import ErrorGuard
from perfsdk.config import MAX_RANK, MonitorConfig, env_int, multiproc_dir
from perfsdk.decorators import bare_function, decorate
from perfsdk.errors import ConfigError, MissingDependencyError
from perfsdk.hotpath import HotState, LastEnd, NoStep, Step, ThreadSteps, check_sizes
from perfsdk.model import ModelSpec
from perfsdk.records import UNSIZED, RequestQueue

__all__ = ["Parts", "StepMaker", "assemble", "load_native", "resolve_hardware", "resolve_model"]

log = logging.getLogger("perfsdk")


def load_native() -> Any:
    """perfsdk's C extension (``perfsdk._native``: the hot path and the step core), or None where not built."""
    try:
        from perfsdk import _native

        return _native
    except ImportError:
        return None


def _never() -> bool:
    return False


@dataclass
class Parts:
    """What :func:`assemble` chose and built."""

    timing: str                # "cuda" or "host"
    cuda_events: str | None    # "driver", "torch" (or a test's scripted GPU), None with host timing
    hot_path: str              # "c" or "python"
    nvtx_backend: str
    rank: int | None
    rank_label: tuple[str, ...]  # ("<rank>",) when the rank label is on
    registry: Any
    prom: Any                  # the PrometheusSink, or None
    otel: Any                  # the OtelSink, or None
    sinks: list[Any]
    requests: RequestQueue
    core: Any                  # the step core (C or Python)
    pool: Any                  # the Python event pool (the C core keeps its own), or None
    api: Any                   # the event API, or None
    hot_state: HotState
    compiling: Callable[[], bool]  # torch.compile's "am I tracing?", asked before any C code runs


def assemble(cfg: MonitorConfig, *, model: ModelSpec | None, hardware: Any, compute_dtype: str, model_name: str,
             registry: Any, prometheus: bool, tracer_provider: Any, clock: Callable[[], int], epoch_offset_ns: int,
             errors: ErrorGuard, events: Any = None, meter_provider: Any = None) -> Parts:
    """Choose and build every part of a Monitor (see the module docstring). *events*: a scripted GPU (tests)."""
    from perfsdk import timing as _timing
    from perfsdk.nvtx_ranges import make_nvtx
    from perfsdk.stepcost import StepCosts

    enabled = cfg.enabled
    if events is not None:  # a scripted GPU (tests): its event API, as timing="cuda" would use the driver's
        use_cuda = enabled
        api = events if use_cuda else None
    else:
        use_cuda = enabled and (cfg.timing == "cuda" or (cfg.timing == "auto" and _timing.cuda_usable()))
        if cfg.timing == "cuda" and not _timing.cuda_usable(force=True):
            raise ConfigError("timing='cuda': torch does not see a CUDA device here; use timing='host' or 'auto'")
        api = _timing.event_api(cfg.cuda_events) if use_cuda else None
    event_capacity = getattr(events, "pool_capacity", 2 * cfg.event_pool_size)
    event_prefill = getattr(events, "pool_prefill", 32)
    addresses = api.addresses() if api is not None and hasattr(api, "addresses") else None
    native = load_native() if enabled else None
    if cfg.hot_path == "c":
        if load_native() is None:
            raise ConfigError("hot_path='c': perfsdk's C extension (perfsdk._native) is not built in this install; "
                              "reinstall with a C compiler and the Python headers, or use hot_path='python'")
        if api is not None and addresses is None:
            raise ConfigError(f"hot_path='c' needs driver events (cuda_events={api.name!r} runs the Python hot path)")
    use_c = native is not None and cfg.hot_path != "python" and (api is None or addresses is not None)

    nv = make_nvtx(cfg.nvtx if enabled else False)
    rank = detect_rank(cfg.rank)
    rank_label = (str(rank),) if rank is not None else ()

    # ---- sinks (OpenTelemetry first: otel=True without the SDK fails before any registry entry is made) ----
    from perfsdk.sinks.prometheus import PrometheusSink, metric_set

    sinks: list[Any] = []
    prom = otel = None
    if cfg.otel and enabled:
        from perfsdk.sinks.otel import make_otel_sink

        otel = make_otel_sink(tracer_provider, model_name, epoch_offset_ns, interval=cfg.export_interval)
        if otel is None and cfg.otel_explicit:
            raise MissingDependencyError("opentelemetry-api", "OpenTelemetry spans", extra="otel")
    if prometheus:
        multiproc_dir()  # PROMETHEUS_MULTIPROC_DIR: a clear error now, not an OS error on the first metric
        from prometheus_client import REGISTRY

        registry = registry if registry is not None else REGISTRY
        prom = PrometheusSink(metric_set(registry, ("rank",) if rank_label else ()), model_name, rank_label,
                              registry)
        if hardware is not None:
            prom.set_hardware(hardware.name, hardware.memory_bandwidth,
                              {k: float(v) for k, v in hardware.flops.items()})
        sinks.append(prom)
    if otel is not None:
        sinks.append(otel)
    if cfg.otel and enabled:
        from perfsdk.sinks.otel_metrics import make_otel_metrics_sink

        # inert (nothing built, nothing recorded) until an SDK meter provider is set or given
        otel_metrics = make_otel_metrics_sink(meter_provider, model_name, {"perfsdk.rank": rank_label[0]}
                                              if rank_label else None)
        if otel_metrics is not None:
            sinks.append(otel_metrics)

    # ---- the step core, the request queue, the hot path ----
    peak = None
    if hardware is not None:
        try:
            peak = hardware.peak_flops(compute_dtype)
        except Exception:
            peak = None
    costs = StepCosts.of(model, hardware.memory_bandwidth if hardware else None, peak)
    pool = None
    if use_c:
        from perfsdk.stepcore import native_core

        core = native_core(native, costs, cfg.queue_size, cfg.step_span_rate, cfg.poll_interval, addresses,
                           event_capacity if api is not None else 0, event_prefill,
                           api.new if api is not None else None, api.destroy if api is not None else None)
    else:
        from perfsdk.stepcore import PyStepCore

        if api is not None:
            pool = _timing.EventPool(api, event_capacity, event_prefill)
        core = PyStepCore(costs, pool, api, cfg.queue_size, cfg.step_span_rate, cfg.poll_interval)
    compiling, cuda_capturing = _timing.capture_checks(use_cuda)
    if events is not None:
        compiling, cuda_capturing = None, getattr(events, "capture_check", None)
    capturing = (cuda_capturing if use_c or events is not None else _timing.capture_check(use_cuda)) if enabled \
        else None
    hot_state = HotState(
        core=core, errors=errors,
        local=ThreadSteps(native.LastEnd if native is not None and use_c else LastEnd, core if use_c else pool),
        clock=None if use_c and clock is time.perf_counter_ns and sys.platform.startswith("linux") else clock,
        capturing=capturing,
        is_capturing_fn=addresses.is_capturing if use_c and addresses is not None and cuda_capturing is not None
        else 0,
        stream=api.make_stream() if api is not None else None,
        record_on=api.make_record_on() if api is not None else None,
        record_fn=addresses.record if use_c and addresses is not None else 0,
        raise_for=api.raise_for if api is not None else None, ensure_context=getattr(api, "ensure_context", None),
        pool=pool, nvtx_on=nv.backend != "none", nvtx_push=nv.push, nvtx_pop=nv.pop,
        chain_gap_ns=int(cfg.chain_gap_us * 1000), every=cfg.timing_every, strict=cfg.strict,
    )
    return Parts(
        timing="cuda" if use_cuda else "host", cuda_events=api.name if api is not None else None,
        hot_path="c" if use_c or (cfg.hot_path == "c" and not enabled) else "python", nvtx_backend=nv.backend,
        rank=rank, rank_label=rank_label, registry=registry, prom=prom, otel=otel, sinks=sinks,
        requests=RequestQueue(cfg.queue_size, clock, errors, cfg.strict), core=core, pool=pool, api=api,
        hot_state=hot_state, compiling=compiling if (compiling is not None and use_c) else _never,
    )


class StepMaker:
    """Makes the step objects: ``make(phase, batch, tokens, context_tokens, seq_lens)``.

    C steps from the C hot path where it runs (odd sizes validated in Python, :meth:`slow`), Python
    :class:`~perfsdk.hotpath.Step` objects otherwise. A bad size raises in strict mode; otherwise the step
    is a :class:`~perfsdk.hotpath.NoStep` (runs, records nothing) and the value is counted and logged once.
    """

    def __init__(self, state: HotState, hot_path: str, enabled: bool, compiling: Callable[[], bool],
                 errors: ErrorGuard, strict: bool) -> None:
        self.state = state
        self.hot_path = hot_path
        self.enabled = enabled
        self.compiling = compiling
        self.errors = errors
        self.strict = strict
        self.hot: Any = None
        self.make: Callable[..., Any] = self._none
        self._on_closed: Callable[[str], None] | None = None  # set by close(): counts each step asked for
        self.bind()

    def close(self, on_call: Callable[[str], None]) -> None:
        """The Monitor no longer records (closed): every later step is a no-op that calls *on_call(phase)*
        (which counts it). Bound once, here — the steps themselves check nothing."""
        self._on_closed = on_call
        self.make = self._closed

    def _closed(self, phase: str, batch: Any = 1, tokens: Any = None, context_tokens: Any = 0,
                seq_lens: Any = None) -> Any:
        assert self._on_closed is not None
        self._on_closed(phase)
        return self._none(phase, batch, tokens, context_tokens, seq_lens)

    def bind(self) -> None:
        """(Re)bind the hot path to the current state (the constructor; tests that swap a part of it)."""
        st = self.state
        st.decorate = functools.partial(decorate, self._make, self.unsized, self.compiling, self.errors)
        st.slow_step = self.slow
        if self.hot is not None and self.hot_path == "c":
            st.untimed += self.hot.untimed  # keep what the previous binding counted
        if not self.enabled:
            self.hot, self.make = None, self._none
        elif self.hot_path == "c":
            self.hot = load_native().Hot(st)
            self.make = self.hot.step
        else:
            self.hot, self.make = st, self._python
        if self._on_closed is not None:
            self.make = self._closed

    def _make(self, *args: Any) -> Any:
        return self.make(*args)

    @staticmethod
    def _none(phase: str, batch: Any = 1, tokens: Any = None, context_tokens: Any = 0, seq_lens: Any = None) -> Any:
        fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
        return fn if fn is not None else NoStep(phase)  # a bare @mon.decode on a disabled Monitor: fn itself

    def _python(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> Any:
        if not (type(batch) is int and (tokens is None or type(tokens) is int) and seq_lens is None):
            fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
            if fn is not None:
                return self._bare(phase, fn)
        try:
            return Step(self.state, phase, batch, tokens, context_tokens, seq_lens)
        except ConfigError as e:
            return self.refused(phase, e)

    def _bare(self, phase: str, fn: Any) -> Any:
        """``mon.decode(fn)``: a bare ``@mon.decode`` — *fn* with every call a timed step without sizes."""
        assert self.state.decorate is not None
        return self.state.decorate(self.unsized(phase), fn)

    def unsized(self, phase: str) -> Any:
        """A step with no sizes: timed and counted, no bytes or FLOPs (so no MBU/MFU), no tokens."""
        if self._on_closed is not None:
            self._on_closed(phase)
            return NoStep(phase)
        if not self.enabled:
            return NoStep(phase)
        if self.hot_path == "c":
            return load_native().make_step(self.hot, phase, 0, None, UNSIZED, None)
        step = Step(self.state, phase, 0, None, 0, None)
        step._context_tokens = UNSIZED
        return step

    def slow(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> Any:
        """The C path's constructor for sizes that are not plain ints: validated here, as Step does."""
        fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
        if fn is not None:
            return self._bare(phase, fn)
        try:
            b, t, c, lens, dynamic = check_sizes(phase, batch, tokens, context_tokens, seq_lens)
        except ConfigError as e:
            return self.refused(phase, e)
        if dynamic:
            return Step(self.state, phase, batch, tokens, context_tokens, seq_lens)  # a decorator only
        return load_native().make_step(self.hot, phase, b, None if t < 0 else t, c, lens)

    def refused(self, phase: str, e: ConfigError) -> Step:
        """A step with a bad size: strict raises; otherwise it runs unrecorded, counted and logged once."""
        if self.strict:
            raise e
        self.errors.record(e, f"{phase}() sizes")
        return NoStep(phase)

    @property
    def untimed(self) -> int:
        """Steps counted but not timed because every event was in flight."""
        n = self.state.untimed
        if self.hot_path == "c" and self.hot is not None:
            n += self.hot.untimed
        return n


def resolve_model(model: Any) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return ModelSpec.named(model)
    if isinstance(model, Mapping) or hasattr(model, "to_dict"):
        return ModelSpec.from_hf_config(model)
    raise ConfigError(
        f"model: expected a ModelSpec, a known model name or a Hugging Face config, got {type(model).__name__}"
    )


def resolve_hardware(hardware: Any) -> Any:
    from perfsdk import hardware as hw

    if isinstance(hardware, str) and hardware.lower() == "auto":
        try:
            return hw.resolve("auto")
        except Exception as e:  # an unknown GPU is not a reason to refuse to monitor
            log.warning("perfsdk: could not map this GPU to a datasheet row (%s); MBU/MFU off", e)
            return None
    return hw.resolve(hardware)


def default_compute_dtype(model: ModelSpec | None) -> str:
    """The dtype whose dense peak MFU divides by: the model's, bf16 for integer or 4-bit weights."""
    dt = model.dtype if model is not None else "bfloat16"
    return "bf16" if dt.startswith(("int", "uint", "fp4", "nvfp4", "mxfp4")) or "byte" in dt else dt


def warn_missing(model: ModelSpec | None, hardware: Any, asked: Any = None) -> None:
    missing = []
    if model is None:
        missing.append("model=perfsdk.ModelSpec.named(...) or ModelSpec.from_hf_config(config)")
    # hardware="calibrate" that came back empty has already warned, naming the problem and the fallback
    if hardware is None and not (isinstance(asked, str) and asked.strip().lower() == "calibrate"):
        missing.append("hardware='h100-sxm' (a datasheet name), a HardwareSpec, or 'calibrate' (no GPU was detected)")
    if missing:
        log.warning("perfsdk: MBU/MFU are off until you pass %s. Latency metrics work without them.",
                    " and ".join(missing))
    if model is not None and not model.has_attention_shape:
        log.warning("perfsdk: model %s has no layers/kv_heads/head_dim: KV-cache bytes and attention FLOPs are "
                    "left out of MBU/MFU", model.name or "(unnamed)")


def peak_notes(hardware: Any, compute_dtype: str) -> dict[str, str]:
    """The peaks MBU and MFU divide by, each with where it comes from: what a log of an impossible
    utilisation names (``"mbu"``: bandwidth, ``"mfu"``: the compute dtype's dense FLOP/s)."""
    if hardware is None:
        return {}
    where = f"{hardware.display_name}; {hardware.source or 'no source given'}"
    out = {"mbu": f"{hardware.memory_bandwidth / 1e12:.4g} TB/s ({where})"}
    try:
        out["mfu"] = f"{hardware.peak_flops(compute_dtype) / 1e12:.4g} TFLOP/s {compute_dtype} ({where})"
    except Exception:  # no published peak for this dtype: MFU is off anyway
        pass
    return out


def detect_rank(rank: int | str | None) -> int | None:
    """The rank label: an int as given; ``"auto"``: this process's rank when it is one of several
    (torch.distributed if already initialised, else torchrun's ``WORLD_SIZE`` and ``RANK``)."""
    if rank is None or rank == "none":
        return None
    if isinstance(rank, int):
        return rank
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:
        pass
    world = env_int("WORLD_SIZE", 1, MAX_RANK)
    if world is not None and world > 1:
        return env_int("RANK", 0, world - 1) or 0
    return None
