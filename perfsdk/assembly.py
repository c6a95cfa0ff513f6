"""How a Monitor is put together: every implementation chosen once, when it is built (STYLE 3).

:func:`assemble` takes the validated settings (:class:`~perfsdk.config.MonitorConfig`) and what the
Monitor resolved (model, GPU, registry, clock) and returns the :class:`Parts`:

* the timer — CUDA events only if torch is *already imported* and sees a GPU (perfsdk never imports
  torch on its own initiative), else the host clock — and the events: driver handles through libcuda
  (:mod:`perfsdk.cuda_driver`), else ``torch.cuda.Event`` (:mod:`perfsdk.timing`);
* the hot path and step core: in C (``perfsdk._native``) where the extension was built and the events are
  driver events (or none), else the Python reference (:mod:`perfsdk.hotpath`, :mod:`perfsdk.stepcore`);
* NVTX (the ``nvtx`` package, ``torch.cuda.nvtx``, or nothing), the ``rank`` label, the sinks;
* the :class:`~perfsdk.recorder.Recorder` of that hot path: the one owner of its state, core, events and
  profiler window, which makes the step objects ``Monitor.decode()`` and its siblings hand out.

Nothing here runs per step. :mod:`perfsdk.monitor` keeps only the public API.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfsdk._guard import ErrorGuard
from perfsdk.config import MAX_RANK, MonitorConfig, env_int, multiproc_dir
from perfsdk.errors import ConfigError, MissingDependencyError
from perfsdk.hotpath import HotState, LastEnd, ThreadSteps
from perfsdk.model import ModelSpec
from perfsdk.recorder import (
    CoreEvents,
    Events,
    NativeRecorder,
    NoEvents,
    OffRecorder,
    PythonRecorder,
    Recorder,
    load_native,
)
from perfsdk.records import RequestQueue

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from perfsdk.sinks import Sink
    from perfsdk.sinks.otel import OtelSink
    from perfsdk.sinks.prometheus import PrometheusSink

__all__ = ["Parts", "assemble", "load_native", "resolve_hardware", "resolve_model"]

log = logging.getLogger("perfsdk")


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Parts:
    """What :func:`assemble` chose and built; a Monitor keeps it as it is."""

    recorder: Recorder  # the one owner of the hot path's state: steps, core, events, window
    requests: RequestQueue
    nvtx_backend: str
    rank: int | None
    rank_label: tuple[str, ...]  # ("<rank>",) when the rank label is on
    registry: CollectorRegistry | None
    prom: PrometheusSink | None
    otel: OtelSink | None
    sinks: list[Sink]


def assemble(
    cfg: MonitorConfig,
    *,
    model: ModelSpec | None,
    hardware: Any,
    compute_dtype: str,
    model_name: str,
    registry: Any,
    prometheus: bool,
    tracer_provider: Any,
    clock: Callable[[], int],
    epoch_offset_ns: int,
    errors: ErrorGuard,
    events: Any = None,
    meter_provider: Any = None,
) -> Parts:
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
            raise ConfigError(
                "hot_path='c': perfsdk's C extension (perfsdk._native) is not built in this install; "
                "reinstall with a C compiler and the Python headers, or use hot_path='python'"
            )
        if api is not None and addresses is None:
            raise ConfigError(f"hot_path='c' needs driver events (cuda_events={api.name!r} runs the Python hot path)")
    use_c = native is not None and cfg.hot_path != "python" and (api is None or addresses is not None)

    nv = make_nvtx(cfg.nvtx if enabled else False)
    rank = detect_rank(cfg.rank)
    rank_label = (str(rank),) if rank is not None else ()

    # ---- sinks (OpenTelemetry first: otel=True without the SDK fails before any registry entry is made) ----
    from perfsdk.sinks.prometheus import PrometheusSink, metric_set

    sinks: list[Sink] = []  # typed: mypy checks each sink against the Sink protocol
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
        prom = PrometheusSink(metric_set(registry, ("rank",) if rank_label else ()), model_name, rank_label, registry)
        if hardware is not None:
            prom.set_hardware(
                hardware.name, hardware.memory_bandwidth, {k: float(v) for k, v in hardware.flops.items()}
            )
        sinks.append(prom)
    if otel is not None:
        sinks.append(otel)
    if cfg.otel and enabled:
        from perfsdk.sinks.otel_metrics import make_otel_metrics_sink

        # inert (nothing built, nothing recorded) until an SDK meter provider is set or given
        otel_metrics = make_otel_metrics_sink(
            meter_provider, model_name, {"perfsdk.rank": rank_label[0]} if rank_label else None
        )
        if otel_metrics is not None:
            sinks.append(otel_metrics)

    # ---- the step core and its events, the hot path, the request queue ----
    peak = None
    if hardware is not None:
        try:
            peak = hardware.peak_flops(compute_dtype)
        except Exception:
            peak = None
    costs = StepCosts.of(model, hardware.memory_bandwidth if hardware else None, peak)
    pool = None
    event_owner: Events
    if use_c:
        from perfsdk.stepcore import native_core

        core = native_core(
            costs,
            cfg.queue_size,
            cfg.step_span_rate,
            cfg.poll_interval,
            addresses,
            event_capacity if api is not None else 0,
            event_prefill,
            api.new if api is not None else None,
            api.destroy if api is not None else None,
        )
        event_owner = CoreEvents(core)  # the C core keeps the pool, in C
    else:
        from perfsdk.stepcore import PyStepCore

        if api is not None:
            pool = _timing.EventPool(api, event_capacity, event_prefill)
        core = PyStepCore(costs, pool, api, cfg.queue_size, cfg.step_span_rate, cfg.poll_interval)
        event_owner = pool if pool is not None else NoEvents()
    compiling, cuda_capturing = _timing.capture_checks(use_cuda)
    if events is not None:
        compiling, cuda_capturing = None, getattr(events, "capture_check", None)
    capturing = (
        (cuda_capturing if use_c or events is not None else _timing.capture_check(use_cuda)) if enabled else None
    )
    requests = RequestQueue(cfg.queue_size, clock, errors, cfg.strict)
    state = HotState(
        core=core,
        errors=errors,
        requests=requests,
        local=ThreadSteps(native.LastEnd if native is not None and use_c else LastEnd, core if use_c else pool),
        clock=None if use_c and clock is time.perf_counter_ns and sys.platform.startswith("linux") else clock,
        capturing=capturing,
        is_capturing_fn=addresses.is_capturing if use_c and addresses is not None and cuda_capturing is not None else 0,
        stream=api.make_stream() if api is not None else None,
        record_on=api.make_record_on() if api is not None else None,
        record_fn=addresses.record if use_c and addresses is not None else 0,
        raise_for=api.raise_for if api is not None else None,
        ensure_context=getattr(api, "ensure_context", None),
        pool=pool,
        nvtx_on=nv.backend != "none",
        nvtx_push=nv.push,
        nvtx_pop=nv.pop,
        chain_gap_ns=int(cfg.chain_gap_us * 1000),
        every=cfg.timing_every,
        strict=cfg.strict,
    )
    common: dict[str, Any] = {
        "timing": "cuda" if use_cuda else "host",
        "cuda_events": api.name if api is not None else None,
        "strict": cfg.strict,
    }
    recorder: Recorder
    if not enabled:
        recorder = OffRecorder(
            state, core, event_owner, hot_path="c" if cfg.hot_path == "c" else "python", compiling=_never, **common
        )
    elif use_c:
        recorder = NativeRecorder(native, state, core, event_owner, compiling=compiling or _never, **common)
    else:
        recorder = PythonRecorder(state, core, event_owner, compiling=_never, **common)
    return Parts(
        recorder=recorder,
        requests=requests,
        nvtx_backend=nv.backend,
        rank=rank,
        rank_label=rank_label,
        registry=registry,
        prom=prom,
        otel=otel,
        sinks=sinks,
    )


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
        log.warning(
            "perfsdk: MBU/MFU are off until you pass %s. Latency metrics work without them.", " and ".join(missing)
        )
    if model is not None and not model.has_attention_shape:
        log.warning(
            "perfsdk: model %s has no layers/kv_heads/head_dim: KV-cache bytes and attention FLOPs are "
            "left out of MBU/MFU",
            model.name or "(unnamed)",
        )


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
