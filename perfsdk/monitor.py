"""The public entry point: :class:`Monitor`.

Wrap the request lifecycle (host clock: what users feel) and every prefill, decode or mixed step
(device clock: what the GPU did)::

    import perfsdk

    mon = perfsdk.Monitor(
        model=perfsdk.ModelSpec.named("llama-3-8b"),   # or ModelSpec.from_hf_config(cfg), or None
        hardware="auto",                                # detect the GPU; or "h100-sxm", or a HardwareSpec
        service="my-llm",
    )
    mon.serve_metrics(port=9400)                        # Prometheus /metrics on 127.0.0.1:9400

    # a request: TTFT, inter-token latency, TPOT, queue time, duration, and a span
    with mon.request(prompt_tokens=512) as req:
        req.scheduled()                                 # leaves the waiting queue
        for tok in generate():
            req.tokens(1)                               # first call: TTFT; later ones: ITL
    # or, across callbacks / asyncio tasks: req = mon.request(...); ...; req.finish("length")

    # a step: device time, MBU (decode), MFU (prefill), an NVTX range
    with mon.prefill(tokens=512, batch=1):
        logits = model(prompt)
    with mon.decode(batch=8, context_tokens=sum(ctx_lens)):
        graph.replay()                                  # wrap *around* replay, never inside capture
    with mon.mixed(prefill_seq_lens=[256], decode_batch=7, context_tokens=7000):
        step()                                          # chunked prefill + decode: MBU and MFU

    @mon.decode(batch=lambda ids, **_: ids.shape[0])    # decorator: values from the call's arguments
    def decode_step(ids, ...): ...

    # values an engine measured itself (perfsdk.engines does this for vLLM and SGLang)
    mon.record_step("decode", 0.021, batch=8, context_tokens=8192)
    mon.record_latencies(ttft_s=[0.12], itl_s=[0.021, 0.020])
    mon.record_finished(e2e_s=1.9, queue_s=0.01, prefill_s=0.11, output_tokens=90)

    mon.flush()                                         # everything recorded so far is exported
    mon.close()

How it is built — "record on the hot path, compute off it":

* the hot path (:mod:`perfsdk.hotpath`, in C where the extension was built) records a clock read, a
  pooled CUDA event, an NVTX range while a tool is attached, and hands one step record
  (:mod:`perfsdk.records`) to
* the step core (:mod:`perfsdk.stepcore`; in C on a native thread that never takes the GIL), which
  reads the events, prices the step and counts it into histograms; and
* the collector thread (:mod:`perfsdk.collector`) takes the core's totals and the request events every
  export interval and hands them to the sinks (:mod:`perfsdk.sinks`: Prometheus, OpenTelemetry).

Nothing here waits for the GPU, and nothing raises into serving code except the user's own exceptions
(which propagate unchanged and are recorded as errors) and configuration mistakes at construction. A bad
value from serving code (``mon.decode(batch=-1)``, ``req.tokens(float("nan"))``) is dropped, counted in
``perfsdk_internal_errors_total`` and logged once with the value; ``Monitor(strict=True)`` (on in
:mod:`perfsdk.testing`'s harness) raises :class:`~perfsdk.errors.ConfigError` instead, so tests catch it.

``perfsdk.Monitor()`` with no arguments works: host timers (or CUDA events when torch is already imported
and sees a GPU), MBU/MFU off with one warning saying what to pass. Every setting also comes from a
``PERFSDK_*`` environment variable (explicit arguments win): see :mod:`perfsdk.config`. Under torchrun,
``PERFSDK_METRICS_PORT`` serves each rank on that port plus its ``LOCAL_RANK``, so the ranks of one host do
not collide.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perfsdk._guard import ErrorGuard
from perfsdk.config import MonitorConfig, env
from perfsdk.errors import ConfigError
from perfsdk.hotpath import HotState, LastEnd, NoStep, Step, ThreadSteps, check_sizes, decorate, host_step
from perfsdk.model import ModelSpec
from perfsdk.records import (
    NULL_REQUEST,
    PHASES,
    Flush,
    MeasuredLatencies,
    MeasuredRequest,
    Request,
    RequestQueue,
    check_count,
    finite_seconds,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from perfsdk.collector import Collector
    from perfsdk.hardware import HardwareSpec
    from perfsdk.metrics_server import MetricsServer

__all__ = ["Monitor", "Phase", "Request", "Step"]

log = logging.getLogger("perfsdk")

Phase = Step  # the name this type had before 0.2 (perfsdk.Phase); both work

_UNSET: Any = object()


def load_native() -> Any:
    """perfsdk's C extension (``perfsdk._native``: the hot path and the step core), or None where not built."""
    try:
        from perfsdk import _native

        return _native
    except ImportError:
        return None


class Monitor:
    """Instrument a serving loop; see the module docstring for a guide.

    Args:
        model: a :class:`~perfsdk.model.ModelSpec`, a known model name, or a Hugging Face config
            (dict or object). ``None``: no MBU/MFU.
        hardware: ``"auto"`` (detect the GPU), a datasheet name (``"h100-sxm"``), ``"calibrate"``
            (measured ceilings), a :class:`~perfsdk.hardware.HardwareSpec`, or ``None``.
        service: the service name (used in logs).
        model_name: the ``model`` label and span model name (default: the spec's name).
        registry: the Prometheus registry to write to (default: the global one).
        prometheus / otel: turn a sink off (``otel=True`` insists: a missing SDK is an error).
        nvtx: ``"auto"`` (default): NVTX ranges only when Nsight Systems/Compute is attached
            (``NVTX_INJECTION64_PATH``; they are free then, and skipped otherwise); ``True`` or ``"nvtx"``:
            always, through the ``nvtx`` package; ``"torch"``: through ``torch.cuda.nvtx``; ``False``: never.
        tracer_provider: an OpenTelemetry provider (default: the global one; none set costs nothing).
        timing: ``"auto"`` (CUDA events if torch is imported and sees a GPU), ``"cuda"``, ``"host"``.
        cuda_events: ``"auto"`` (default: raw driver events through libcuda, the cheapest record, else
            torch's), ``"driver"``, ``"torch"`` (``torch.cuda.Event``; runs the Python hot path).
        operation: GenAI operation name of request spans (``"chat"``, ``"text_completion"``, …).
        queue_size: step records (and, separately, request events) the collector may lag behind before
            dropping (never blocking). Default 65,536.
        event_pool_size: timed steps in flight at most (two CUDA events each); beyond, steps are counted
            but not timed. Default 1,024.
        chain_gap_us: a step entered within this many µs of the previous step's exit, on the same thread
            and stream, starts at the previous step's end event (one event record per step instead of two,
            which is most of the hot path's cost). Its device time then also covers any GPU work queued
            in that gap, as a whole decode iteration's would. ``0``: two events per step. Default 10.
        timing_every: time every N-th step with CUDA events (default 1: all). The others still count as
            steps and tokens, but not in step time, MBU/MFU or the byte and FLOP counters (so that
            bytes / step seconds stays exact in PromQL).
        step_span_rate: fraction of steps that get a span (0: none; deterministic, every 1/rate-th step).
        compute_dtype: dtype whose dense peak MFU divides by (default: the model's dtype, bf16 for
            integer weights).
        rank: ``"auto"`` adds a ``rank`` label when this process is one rank of several; an int forces it;
            ``None``: no label.
        hot_path: ``"auto"`` (default): the hot path and step core in C (``perfsdk._native``) where the
            extension was built and the events allow, else in Python; ``"c"`` (raise if not possible) or
            ``"python"``. ``Monitor.hot_path`` says which runs.
        poll_interval: the step core's shortest idle sleep (s; it backs off to 0.1 s while idle).
        export_interval: how often the collector hands results to the sinks (s, default 0.1).
        strict: raise :class:`~perfsdk.errors.ConfigError` for bad values from serving code instead of
            dropping and counting them (tests; :mod:`perfsdk.testing` turns it on).
        clock: a ``() -> int`` nanosecond clock (tests); default ``time.perf_counter_ns``.
        enabled: ``False`` makes every call a no-op.
    """

    def __init__(
        self,
        model: ModelSpec | str | Mapping[str, Any] | Any | None = _UNSET,
        hardware: HardwareSpec | str | None = _UNSET,
        *,
        service: str | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        prometheus: bool = True,
        otel: bool | None = None,
        tracer_provider: Any = None,
        nvtx: bool | str | None = None,
        timing: str | None = None,
        cuda_events: str | None = None,
        operation: str | None = None,
        queue_size: int | None = None,
        event_pool_size: int | None = None,
        chain_gap_us: float | None = None,
        timing_every: int | None = None,
        step_span_rate: float | None = None,
        compute_dtype: str | None = None,
        rank: int | str | None = "auto",
        hot_path: str | None = None,
        poll_interval: float | None = None,
        export_interval: float | None = None,
        strict: bool | None = None,
        clock: Callable[[], int] | None = None,
        enabled: bool | None = None,
        _events: Any = None,
    ) -> None:
        cfg = MonitorConfig.from_env(
            enabled=enabled, service=service, model_name=model_name, nvtx=nvtx, otel=otel, timing=timing,
            cuda_events=cuda_events, hot_path=hot_path, queue_size=queue_size, event_pool_size=event_pool_size,
            timing_every=timing_every, chain_gap_us=chain_gap_us, step_span_rate=step_span_rate,
            poll_interval=poll_interval, export_interval=export_interval, strict=strict, operation=operation,
            compute_dtype=compute_dtype, rank="none" if rank is None else rank,
        )
        if clock is not None and not callable(clock):
            raise ConfigError(f"clock: expected a () -> int nanoseconds callable, got {clock!r}")
        self.config = cfg
        self._errors = ErrorGuard()
        self._enabled = cfg.enabled
        self.service = cfg.service
        self.operation = cfg.operation
        self._clock: Callable[[], int] = clock or time.perf_counter_ns
        self._epoch_offset_ns = time.time_ns() - self._clock()
        self._window: Any = None
        self._server: MetricsServer | None = None
        self._closed = False
        self._collector: Collector | None = None

        self.model = _resolve_model(env("PERFSDK_MODEL") if model is _UNSET else model)
        self.model_name = cfg.model_name or (self.model.name if self.model else "") or "unknown"
        self.hardware = _resolve_hardware((env("PERFSDK_HARDWARE") or "auto") if hardware is _UNSET else hardware)
        self.compute_dtype = cfg.compute_dtype or self._default_compute_dtype()

        # ---- choose implementations once (STYLE 3) ----
        from perfsdk import timing as _timing
        from perfsdk.nvtx_ranges import make_nvtx
        from perfsdk.stepcost import StepCosts

        if _events is not None:  # a scripted GPU (tests): its event API, as timing="cuda" would use the driver's
            use_cuda = self._enabled
            api = _events if use_cuda else None
        else:
            use_cuda = self._enabled and (cfg.timing == "cuda" or (cfg.timing == "auto" and _timing.cuda_usable()))
            if cfg.timing == "cuda" and not _timing.cuda_usable(force=True):
                raise ConfigError("timing='cuda': torch does not see a CUDA device here; use timing='host' or "
                                  "'auto'")
            api = _timing.event_api(cfg.cuda_events) if use_cuda else None
        self.timing = "cuda" if use_cuda else "host"
        event_capacity = getattr(_events, "pool_capacity", 2 * cfg.event_pool_size)
        event_prefill = getattr(_events, "pool_prefill", 32)
        self.cuda_events = api.name if api is not None else None
        addresses = api.addresses() if api is not None and hasattr(api, "addresses") else None
        native = load_native() if self._enabled else None
        if cfg.hot_path == "c":
            if load_native() is None:
                raise ConfigError("hot_path='c': perfsdk's C extension (perfsdk._native) is not built in this "
                                  "install; reinstall with a C compiler and the Python headers, or use "
                                  "hot_path='python'")
            if api is not None and addresses is None:
                raise ConfigError(f"hot_path='c' needs driver events (cuda_events={self.cuda_events!r} runs the "
                                  "Python hot path)")
        use_c = native is not None and cfg.hot_path != "python" and (api is None or addresses is not None)
        self.hot_path = "c" if use_c or (cfg.hot_path == "c" and not self._enabled) else "python"

        nv = make_nvtx(cfg.nvtx if self._enabled else False)
        self.nvtx_backend = nv.backend
        self._nvtx = nv

        self._extra_label_values: tuple[str, ...] = ()
        extra_labels: tuple[str, ...] = ()
        r = _detect_rank(cfg.rank)
        if r is not None:
            extra_labels, self._extra_label_values = ("rank",), (str(r),)
        self.rank = r

        # ---- sinks ----
        from perfsdk.sinks.prometheus import PrometheusSink, metric_set

        self.registry = registry
        self._prom: PrometheusSink | None = None
        sinks: list[Any] = []
        if prometheus:
            from prometheus_client import REGISTRY

            self.registry = registry if registry is not None else REGISTRY
            self._prom = PrometheusSink(metric_set(self.registry, extra_labels), self.model_name,
                                        self._extra_label_values)
            if self.hardware is not None:
                flops = {k: float(v) for k, v in self.hardware.flops.items()}
                self._prom.set_hardware(self.hardware.name, self.hardware.memory_bandwidth, flops)
            sinks.append(self._prom)
        self._otel: Any = None
        if cfg.otel and self._enabled:
            from perfsdk.sinks.otel import make_otel_sink

            self._otel = make_otel_sink(tracer_provider, self.model_name, self._epoch_offset_ns)
            if self._otel is None and cfg.otel_explicit:
                from perfsdk.errors import MissingDependencyError

                raise MissingDependencyError("opentelemetry-api", "OpenTelemetry spans", extra="otel")
            if self._otel is not None:
                sinks.append(self._otel)
        self._capture_ctx = self._otel.capture_context if self._otel is not None else None

        # ---- the step core, the request queue, the hot path ----
        peak = None
        if self.hardware is not None:
            try:
                peak = self.hardware.peak_flops(self.compute_dtype)
            except Exception:
                peak = None
        costs = StepCosts.of(self.model, self.hardware.memory_bandwidth if self.hardware else None, peak)
        self._requests = RequestQueue(cfg.queue_size, self._clock, self._errors, cfg.strict)
        self._pool: Any = None
        if use_c:
            from perfsdk.stepcore import native_core

            self._core: Any = native_core(
                native, costs, cfg.queue_size, cfg.step_span_rate, cfg.poll_interval, addresses,
                event_capacity if api is not None else 0, event_prefill,
                api.new if api is not None else None, api.destroy if api is not None else None,
            )
        else:
            from perfsdk.stepcore import PyStepCore

            if api is not None:
                self._pool = _timing.EventPool(api, event_capacity, event_prefill)
            self._core = PyStepCore(costs, self._pool, api, cfg.queue_size, cfg.step_span_rate, cfg.poll_interval)
        self._api = api
        compiling, cuda_capturing = _timing.capture_checks(use_cuda)
        if _events is not None:
            compiling, cuda_capturing = None, getattr(_events, "capture_check", None)
        self._compiling: Callable[[], bool] = compiling if (compiling is not None and use_c) else _never
        self._hot_state = HotState(
            core=self._core, errors=self._errors,
            local=ThreadSteps(native.LastEnd if native is not None and use_c else LastEnd,
                              self._core if use_c else self._pool),
            clock=None if use_c and self._clock is time.perf_counter_ns and sys.platform.startswith("linux")
            else self._clock,
            capturing=(cuda_capturing if use_c or _events is not None else _timing.capture_check(use_cuda))
            if self._enabled else None,
            is_capturing_fn=addresses.is_capturing if (use_c and addresses is not None
                                                        and cuda_capturing is not None) else 0,
            stream=api.make_stream() if api is not None else None,
            record_on=api.make_record_on() if api is not None else None,
            record_fn=addresses.record if use_c and addresses is not None else 0,
            raise_for=api.raise_for if api is not None else None,
            ensure_context=getattr(api, "ensure_context", None),
            pool=self._pool, nvtx_on=nv.backend != "none", nvtx_push=nv.push, nvtx_pop=nv.pop,
            chain_gap_ns=int(cfg.chain_gap_us * 1000), every=cfg.timing_every, strict=cfg.strict,
        )
        self._hot: Any = None
        self._bind_hot()

        self._warn_missing()
        if self._enabled:
            from perfsdk.collector import Collector

            self._core.start()
            self._collector = Collector(
                self._core, self._requests, sinks, self._errors, model=self.model_name, operation=self.operation,
                epoch_offset_ns=self._epoch_offset_ns, export_interval=cfg.export_interval, untimed=self._untimed,
            )
            self._collector.start()
        port = env("PERFSDK_METRICS_PORT")
        if port is not None and self._enabled:
            from perfsdk.config import _int

            base = _int("PERFSDK_METRICS_PORT (environment)", port, 0, 65535)
            self.serve_metrics(port=_rank_port(base), addr=cfg.metrics_addr)

    # ---- construction helpers ----------------------------------------
    def _default_compute_dtype(self) -> str:
        dt = self.model.dtype if self.model is not None else "bfloat16"
        return "bf16" if dt.startswith(("int", "uint", "fp4", "nvfp4", "mxfp4")) or "byte" in dt else dt

    def _warn_missing(self) -> None:
        missing = []
        if self.model is None:
            missing.append("model=perfsdk.ModelSpec.named(...) or ModelSpec.from_hf_config(config)")
        if self.hardware is None:
            missing.append("hardware='h100-sxm' (a datasheet name), a HardwareSpec, or 'calibrate' "
                           "(no GPU was detected)")
        if missing and self._enabled:
            log.warning("perfsdk: MBU/MFU are off until you pass %s. Latency metrics work without them.",
                        " and ".join(missing))
        if self.model is not None and not self.model.has_attention_shape:
            log.warning("perfsdk: model %s has no layers/kv_heads/head_dim: KV-cache bytes and attention "
                        "FLOPs are left out of MBU/MFU", self.model.name or "(unnamed)")

    def _bind_hot(self) -> None:
        """Bind the hot path to the current :class:`HotState` (the constructor; tests that swap a part)."""
        st = self._hot_state
        st.window = self._window
        st.decorate = functools.partial(decorate, self._new_step, self._compiling, self._errors)
        st.slow_step = self._slow_step
        if self._hot is not None and self.hot_path == "c":
            st.untimed += self._hot.untimed  # keep what the previous binding counted
        if not self._enabled:
            self._hot = None
            self._step: Callable[..., Any] = _no_step
        elif self.hot_path == "c":
            native = load_native()
            self._hot = native.Hot(st)
            self._step = self._hot.step
        else:
            self._hot = st
            self._step = self._python_step

    def _new_step(self, phase: str, batch: Any, tokens: Any, ctx: Any, seq_lens: Any) -> Any:
        return self._step(phase, batch, tokens, ctx, seq_lens)

    def _python_step(self, phase: str, batch: Any, tokens: Any, ctx: Any, seq_lens: Any) -> Step:
        try:
            return Step(self._hot_state, phase, batch, tokens, ctx, seq_lens)
        except ConfigError as e:
            return self._refused(phase, e)

    def _slow_step(self, phase: str, batch: Any, tokens: Any, ctx: Any, seq_lens: Any) -> Any:
        """The C path's constructor for sizes that are not plain ints: validated here, as Step does."""
        try:
            b, t, c, lens, dynamic = check_sizes(phase, batch, tokens, ctx, seq_lens)
        except ConfigError as e:
            return self._refused(phase, e)
        if dynamic:
            return Step(self._hot_state, phase, batch, tokens, ctx, seq_lens)  # a decorator only
        return load_native().make_step(self._hot, phase, b, None if t < 0 else t, c, lens)

    def _refused(self, phase: str, e: ConfigError) -> Step:
        """A step with a bad size: strict raises; otherwise it runs unrecorded, counted and logged once."""
        if self.config.strict:
            raise e
        self._errors.record(e, f"{phase}() sizes")
        return NoStep(phase)

    def _reserve_events(self, n: int) -> None:
        """Make events now until *n* are free (benchmarks that hold the core back: nothing comes back)."""
        if self.hot_path == "c":
            self._core.reserve(n)
        elif self._pool is not None:
            self._pool.reserve(n)

    def _untimed(self) -> int:
        n = self._hot_state.untimed
        if self.hot_path == "c" and self._hot is not None:
            n += self._hot.untimed
        return n

    # ---- the serving thread's API -----------------------------------------------------------------
    def request(self, prompt_tokens: int = 0, *, operation: str | None = None, request_id: str | None = None,
                arrival_ns: int | None = None) -> Request:
        """A request arrived now (or at *arrival_ns* on this Monitor's clock)."""
        if not self._enabled:
            return NULL_REQUEST
        if type(prompt_tokens) is not int or prompt_tokens < 0:
            try:
                prompt_tokens = check_count("prompt_tokens", prompt_tokens)
            except ConfigError as e:
                self._requests.refuse("request", str(e))
                prompt_tokens = 0
        if arrival_ns is not None and type(arrival_ns) is not int:
            self._requests.refuse("request", f"arrival_ns must be an int timestamp, got {arrival_ns!r}")
            arrival_ns = None
        parent = None
        if self._capture_ctx is not None:
            try:
                parent = self._capture_ctx()
            except Exception as e:
                self._errors.record(e, "request context")
        return Request(self._requests, prompt_tokens, self._clock() if arrival_ns is None else arrival_ns,
                       operation or self.operation, request_id, parent)

    def prefill(self, tokens: int | Callable[..., int] | None = None, batch: int | Callable[..., int] = 1, *,
                seq_lens: Sequence[int] | Callable[..., Sequence[int]] | None = None,
                cached_tokens: int | Callable[..., int] = 0) -> Step:
        """One prefill step of *batch* sequences, *tokens* prompt tokens in all (or their *seq_lens*).

        ``cached_tokens``: prefix tokens already in the KV cache (read, not recomputed; the new tokens attend
        to them, which MFU counts).
        """
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("prefill")
        return self._step("prefill", batch, tokens, cached_tokens, seq_lens)  # type: ignore[no-any-return]

    def decode(self, batch: int | Callable[..., int] = 1,
               context_tokens: int | Callable[..., int] = 0) -> Step:
        """One decode step: *batch* sequences, *context_tokens* = the sum of their context lengths."""
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("decode")
        return self._step("decode", batch, None, context_tokens, None)  # type: ignore[no-any-return]

    def mixed(self, prefill_seq_lens: Sequence[int] | Callable[..., Sequence[int]] = (),
              decode_batch: int | Callable[..., int] = 0,
              context_tokens: int | Callable[..., int] = 0) -> Step:
        """A chunked-prefill + decode step: prefill chunks of *prefill_seq_lens* tokens, and *decode_batch*
        sequences decoding over *context_tokens* context tokens in all. Reports MBU and MFU."""
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("mixed")
        return self._step("mixed", decode_batch, None, context_tokens, prefill_seq_lens)  # type: ignore[no-any-return]

    # ---- values measured elsewhere ----------------------------------------
    # For engines that time themselves (perfsdk.engines): the values go through the same core, collector,
    # histograms and spans as those perfsdk measures.
    def record_step(self, phase: str, seconds: float, *, batch: int = 1, tokens: int | None = None,
                    context_tokens: int = 0, seq_lens: Sequence[int] | None = None,
                    end_ns: int | None = None) -> None:
        """A step someone else timed (*seconds*, ending now or at *end_ns*): counted, timed and costed
        (bytes, FLOPs, MBU, MFU) like a step perfsdk timed itself. Sizes as in :meth:`prefill`,
        :meth:`decode` and :meth:`mixed` (for ``"mixed"``: *batch* decoding sequences, *seq_lens* the
        prefill chunks). Host time: an engine's step timer includes what its loop does around the GPU."""
        if not self._enabled:
            return
        try:
            if phase not in PHASES:
                raise ConfigError(f"record_step: phase must be one of {PHASES}, got {phase!r}")
            secs = finite_seconds(seconds)
            if secs is None:
                raise ConfigError(f"record_step: seconds must be a finite number >= 0, got {seconds!r}")
            if end_ns is not None and type(end_ns) is not int:
                raise ConfigError(f"record_step: end_ns must be an int timestamp, got {end_ns!r}")
            rec = host_step(phase, secs, self._clock() if end_ns is None else end_ns, batch, tokens,
                            context_tokens, seq_lens)
        except ConfigError as e:
            self._requests.refuse("record_step", str(e))
            return
        self._push_step(rec)

    def _push_step(self, rec: Any) -> bool:
        """Hand a :class:`~perfsdk.records.StepRecord` to the core (False: dropped, the core is behind)."""
        return bool(self._core.push(rec))

    def record_latencies(self, ttft_s: Sequence[float] = (), itl_s: Sequence[float] = ()) -> None:
        """Times to first token and inter-token gaps (seconds) someone else measured, for the histograms.

        Values that are not finite, non-negative numbers are left out (an engine's missing value)."""
        if not self._enabled:
            return
        try:
            ttft, itl = _seconds(ttft_s), _seconds(itl_s)
        except ConfigError as e:
            self._requests.refuse("record_latencies", str(e))
            return
        if ttft or itl:
            self._requests.push(MeasuredLatencies(ttft, itl))

    def record_finished(self, *, e2e_s: float, queue_s: float | None = None, prefill_s: float | None = None,
                        ttft_s: float | None = None, tpot_s: float | None = None, prompt_tokens: int = 0,
                        output_tokens: int = 0, finish_reason: str = "stop", error: str | None = None,
                        request_id: str | None = None, end_ns: int | None = None) -> None:
        """A finished request someone else timed (seconds; it ended now or at *end_ns*).

        Observed: request duration (*e2e_s*), queue time, and time per output token (*tpot_s*, or
        ``(e2e - ttft) / (output_tokens - 1)`` when only *ttft_s* is given). TTFT itself is not observed
        here (engines report it as it happens: :meth:`record_latencies`); *ttft_s*, or *queue_s* +
        *prefill_s*, places the first token in the request's span.
        """
        if not self._enabled:
            return
        try:
            e2e = finite_seconds(e2e_s)
            if e2e is None:
                raise ConfigError(f"record_finished: e2e_s must be a finite number >= 0, got {e2e_s!r}")
            prompt = check_count("prompt_tokens", prompt_tokens)
            output = check_count("output_tokens", output_tokens)
            if end_ns is not None and type(end_ns) is not int:
                raise ConfigError(f"record_finished: end_ns must be an int timestamp, got {end_ns!r}")
        except ConfigError as e:
            self._requests.refuse("record_finished", str(e))
            return
        end = self._clock() if end_ns is None else end_ns
        self._requests.push(MeasuredRequest(end, e2e, finite_seconds(queue_s), finite_seconds(prefill_s),
                                            finite_seconds(ttft_s), finite_seconds(tpot_s), prompt, output,
                                            str(finish_reason), None if error is None else str(error),
                                            None if request_id is None else str(request_id)))

    # ---- control -------------------------------------------------------
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until everything recorded so far is counted and exported (``False`` on timeout)."""
        c = self._collector
        if c is None or not c.is_alive():
            return not self._enabled
        marker = Flush(threading.Event(), timeout, [])
        self._requests.push_marker(marker)  # a marker is never dropped
        c.wake()
        return marker.done.wait(timeout) and all(marker.result)

    def close(self, timeout: float | None = 10.0) -> None:
        """Flush, stop the threads and the metrics server, within *timeout* in all. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        if self._window is not None:
            try:
                self._window.close(left())
            except Exception as e:
                self._errors.record(e, "window.close")
        self.flush(left())
        if self._collector is not None:
            self._collector.stop(left())
            for s in self._collector.sinks:
                try:
                    s.close(left())
                except Exception as e:
                    self._errors.record(e, f"{type(s).__name__}.close")
        stopped = self._core.stop(left()) if self._enabled else True
        if stopped:
            if self.hot_path == "c" and self._enabled:
                self._core.close_events()  # nothing in flight any more: destroy the free events
            elif self._pool is not None:
                self._pool.close()
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve_metrics(self, port: int = 9400, addr: str = "127.0.0.1", *, token: str | None = None) -> MetricsServer:
        """Serve ``GET /metrics`` (and ``POST /profile``, a profiler-window trigger) on a daemon thread.

        Binding anywhere but loopback requires *token* for the trigger (``Authorization: Bearer …``).
        Called again it returns the running server, if it serves the same port and address (else
        :class:`~perfsdk.errors.ConfigError`: one server per Monitor).
        """
        from perfsdk.metrics_server import MetricsServer

        if self._server is not None:
            if (port not in (0, self._server.port) or addr != self._server.addr):
                raise ConfigError(f"serve_metrics: this Monitor already serves {self._server.url}; "
                                  f"close it first to serve {addr}:{port}")
            return self._server
        self._server = MetricsServer(self, port=port, addr=addr, token=token, errors=self._errors)
        return self._server

    def stats(self) -> dict[str, Any]:
        """Rolling per-phase statistics (last few thousand steps) and the SDK's health counters."""
        if self._collector is not None:
            out = self._collector.stats()
        else:
            out = {"dropped_records": 0, "internal_errors": self._errors.count}
        if self._otel is not None:
            out["dropped_spans"] = self._otel.dropped
        if self._window is not None:
            out["profiler"] = self._window.status()
        return out

    def epoch_ns(self, t: int) -> int:
        """Convert a timestamp of this Monitor's clock to Unix epoch nanoseconds."""
        return t + self._epoch_offset_ns

    # ---- profiler window ----------------------------------------------
    def enable_profiler(self, **config: Any) -> Any:
        """Set up the opt-in profiler window (see :mod:`perfsdk.profiling.window`); returns it.

        Called again with settings, it replaces the window (a capture armed by the old one is cancelled);
        without settings it returns the current one.
        """
        from perfsdk.profiling.window import ProfilerWindow

        if self._window is not None and not config:
            return self._window
        if self._window is not None and self._window.state in ("ready", "running", "writing"):
            # the serving thread drives a running capture through the current window; swapping it now
            # would leave torch.profiler recording with nobody to stop it
            raise ConfigError("enable_profiler: a capture is in progress; change settings once it has finished")
        new = ProfilerWindow(self, **config)  # validate before dropping the old window
        old, self._window = self._window, new
        self._set_window(new)
        if old is not None:
            old.close()
        return new

    def _set_window(self, w: Any) -> None:
        self._hot_state.window = w
        if self.hot_path == "c" and self._hot is not None:
            self._hot.window = w  # the C hot path's copy
        if self._collector is not None:
            self._collector.window = w
        self._core.feed_window = w is not None

    def profile(self, steps: int | None = None, mode: str | None = None, reason: str = "api", *,
                steady: bool = True) -> Any:
        """Ask for one profiler capture of *steps* steady-state steps; returns a handle to wait on.

        ``steady=False``: no steady-state gate; the next step entered starts the capture (called at the same
        step on every rank of a tensor-parallel group, it captures the same steps on each).
        """
        w = self._window if self._window is not None else self.enable_profiler()
        return w.trigger(steps=steps, mode=mode, reason=reason, steady=steady)

    def window_deps(self) -> tuple[ErrorGuard, Callable[[float | None, float | None], None] | None, str]:
        """What a profiler window needs from its Monitor: the error guard, the profile gauges' setter
        (GPU busy and communication fractions of the last capture), the rank."""
        prom = self._prom
        return (self._errors, prom.set_profile if prom is not None else None,
                self._extra_label_values[0] if self._extra_label_values else "0")


def _never() -> bool:
    return False


def _no_step(phase: str, *_: Any) -> Step:
    return NoStep(phase)


def _resolve_model(model: Any) -> ModelSpec | None:
    if model is None or isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return ModelSpec.named(model)
    if isinstance(model, Mapping) or hasattr(model, "to_dict"):
        return ModelSpec.from_hf_config(model)
    raise ConfigError(
        f"model: expected a ModelSpec, a known model name or a Hugging Face config, got {type(model).__name__}"
    )


def _resolve_hardware(hardware: Any) -> HardwareSpec | None:
    from perfsdk import hardware as hw

    if isinstance(hardware, str) and hardware.lower() == "auto":
        try:
            return hw.resolve("auto")
        except Exception as e:  # an unknown GPU is not a reason to refuse to monitor
            log.warning("perfsdk: could not map this GPU to a datasheet row (%s); MBU/MFU off", e)
            return None
    return hw.resolve(hardware)


def _seconds(values: Any) -> tuple[float, ...]:
    """The finite, non-negative values of *values*, as floats (ConfigError if it is not a sequence)."""
    if values is None or isinstance(values, (str, bytes)):
        raise ConfigError(f"expected a sequence of seconds, got {values!r}")
    try:
        items = list(values)
    except TypeError:
        raise ConfigError(f"expected a sequence of seconds, got {values!r}") from None
    return tuple(f for f in map(finite_seconds, items) if f is not None)


def _rank_port(port: int) -> int:
    """``PERFSDK_METRICS_PORT`` for this process: the base port plus ``LOCAL_RANK`` (torchrun's local rank).

    Every rank of a host gets its own /metrics port (one scrape target per rank: a rank that dies shows as
    a target down), from one setting shared by all ranks. Port 0 (any free port) stays 0.
    """
    import os

    local = os.environ.get("LOCAL_RANK", "")
    return port + int(local) if port and local.isdigit() else port


def _detect_rank(rank: int | str | None) -> int | None:
    if rank is None or rank == "none":
        return None
    if isinstance(rank, int):
        return rank
    import os

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:
        pass
    world = os.environ.get("WORLD_SIZE")
    if world and world.isdigit() and int(world) > 1:
        rank_env = os.environ.get("RANK", "0") or "0"
        return int(rank_env) if rank_env.isdigit() else None
    return None


def _register_native_step() -> None:
    native = load_native()
    if native is not None:
        Step.register(native.Step)


_register_native_step()
