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
    with mon.decode(batch=8, context_tokens=sum(ctx_lens)) as step:
        graph.replay()                                  # wrap *around* replay, never inside capture
        step.tokens(running)                            # a token for each running request: one call per step
    with mon.mixed(prefill_seq_lens=[256], decode_batch=7, context_tokens=7000):
        step()                                          # chunked prefill + decode: MBU and MFU

    @mon.decode(batch=lambda ids, **_: ids.shape[0])    # decorator: values from the call's arguments
    def decode_step(ids, ...): ...

    @mon.decode                                         # bare: each call a timed step with no sizes (no MBU)
    def other_step(...): ...

    # values an engine measured itself (perfsdk.engines does this for vLLM and SGLang)
    mon.record_step("decode", 0.021, batch=8, context_tokens=8192)
    mon.record_latencies(ttft_s=[0.12], itl_s=[0.021, 0.020])
    mon.record_finished(e2e_s=1.9, queue_s=0.01, prefill_s=0.11, output_tokens=90)

    mon.flush()                                         # everything recorded so far is exported
    mon.close()

How it is built — "record on the hot path, compute off it" (``docs/architecture.md``): the hot path
(:mod:`perfsdk.hotpath`, in C where built; one :mod:`perfsdk.recorder` owns its state) hands a step record
(:mod:`perfsdk.records`) to the step core (:mod:`perfsdk.stepcore`, in C on a thread without the GIL), which
reads the events, prices and counts the step; the collector (:mod:`perfsdk.collector`) hands the totals and
the request events to the sinks (:mod:`perfsdk.sinks`) every export interval.

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

A failed constructor leaves nothing running; calls on a closed Monitor are counted no-ops or raise
:class:`~perfsdk.errors.MonitorClosedError`; a Monitor keeps working in an ``os.fork()`` child: see
:mod:`perfsdk.lifecycle`.

Why this module is over 500 lines: it is the public API and its guide — this docstring, ``Monitor``'s
argument list (one argument a line under ``ruff format``) and a docstring for every public method; each
method is a few lines that hand over to :mod:`perfsdk.recorder`, :mod:`perfsdk.lifecycle` or
:mod:`perfsdk.collector` (``tests/test_layout.py`` keeps its code lines few).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perfsdk import assembly, lifecycle
from perfsdk._guard import ErrorGuard
from perfsdk.assembly import load_native
from perfsdk.config import MonitorConfig, metrics_endpoint
from perfsdk.errors import ConfigError, MonitorClosedError
from perfsdk.hotpath import NoStep, Step
from perfsdk.measured import check_end_ns, measured_request, measured_step
from perfsdk.model import ModelSpec
from perfsdk.records import NULL_REQUEST, MeasuredLatencies, Request, check_count, negative_seconds, seconds_list

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from perfsdk.collector import Collector
    from perfsdk.hardware import HardwareSpec
    from perfsdk.metrics_server import MetricsServer

__all__ = ["Monitor", "Phase", "Request", "Step", "load_native"]

Phase = Step  # the name this type had before 0.2 (perfsdk.Phase); both work

_UNSET: Any = object()
DRAIN_TIMEOUT = 1.0  # how long a scrape waits for the collector at most (s); Prometheus' scrape timeout is 10 s


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
        meter_provider: an OpenTelemetry meter provider for the same latencies and steps as OTel histograms
            (an SDK's exponential aggregation: :mod:`perfsdk.sinks.otel_metrics`; default: the global one).
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
        rank: ``"auto"`` (default, or ``PERFSDK_RANK``) adds a ``rank`` label when this process is one rank
            of several; an int forces it; ``None``: no label.
        hot_path: ``"auto"`` (default): the hot path and step core in C (``perfsdk._native``) where the
            extension was built and the events allow, else in Python; ``"c"`` (raise if not possible) or
            ``"python"``. ``Monitor.hot_path`` says which runs.
        poll_interval: the step core's shortest idle sleep, and how often it asks the GPU whether a pending step's
            end event has completed (s, default 0.005; it backs off to 0.1 s while idle).
        export_interval: how often the collector hands results to the sinks (s, default 1: Prometheus scrapes
            every 10-15 s, and every visit is a turn at the GIL; ``flush()`` and ``stats()`` are exact anyway).
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
        meter_provider: Any = None,
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
        rank: int | str | None = _UNSET,
        hot_path: str | None = None,
        poll_interval: float | None = None,
        export_interval: float | None = None,
        strict: bool | None = None,
        clock: Callable[[], int] | None = None,
        enabled: bool | None = None,
        _events: Any = None,
    ) -> None:
        cfg = MonitorConfig.from_env(
            enabled=enabled,
            service=service,
            model_name=model_name,
            nvtx=nvtx,
            otel=otel,
            timing=timing,
            cuda_events=cuda_events,
            hot_path=hot_path,
            queue_size=queue_size,
            event_pool_size=event_pool_size,
            timing_every=timing_every,
            chain_gap_us=chain_gap_us,
            step_span_rate=step_span_rate,
            poll_interval=poll_interval,
            export_interval=export_interval,
            strict=strict,
            operation=operation,
            compute_dtype=compute_dtype,
            rank=None if rank is _UNSET else "none" if rank is None else rank,
        )
        if clock is not None and not callable(clock):
            raise ConfigError(f"clock: expected a () -> int nanoseconds callable, got {clock!r}")
        # PERFSDK_METRICS_PORT (plus LOCAL_RANK) and PERFSDK_METRICS_ADDR: checked before anything starts
        endpoint = metrics_endpoint(cfg) if cfg.enabled else None
        self.config = cfg
        self._errors = ErrorGuard()
        self._life = lifecycle.Recording(cfg.enabled, cfg.service)  # .on: False once closed; calls then count
        self.service = cfg.service
        self.operation = cfg.operation
        self._clock: Callable[[], int] = clock or time.perf_counter_ns
        self._epoch_offset_ns = time.time_ns() - self._clock()
        self._server: MetricsServer | None = None
        self._closed = False
        self._collector: Collector | None = None
        server = lifecycle.bind(self, endpoint)  # a port in use fails before any thread starts
        try:
            self.model = assembly.resolve_model(cfg.model if model is _UNSET else model)
            self.model_name = cfg.model_name or (self.model.name if self.model else "") or "unknown"
            self._hardware_asked = cfg.hardware if hardware is _UNSET else hardware
            self.hardware = assembly.resolve_hardware(self._hardware_asked)
            self.compute_dtype = cfg.compute_dtype or assembly.default_compute_dtype(self.model)
            parts = self._parts = assembly.assemble(
                cfg,
                model=self.model,
                hardware=self.hardware,
                compute_dtype=self.compute_dtype,
                model_name=self.model_name,
                registry=registry,
                prometheus=prometheus,
                tracer_provider=tracer_provider,
                clock=self._clock,
                epoch_offset_ns=self._epoch_offset_ns,
                errors=self._errors,
                events=_events,
                meter_provider=meter_provider,
            )
            self.nvtx_backend, self.rank, self.registry = parts.nvtx_backend, parts.rank, parts.registry
            # read on every step or request: bound once (an attribute lookup fewer each time)
            self._recorder, self._requests, self._compiling = parts.recorder, parts.requests, parts.recorder.compiling
            self._otel_context = parts.otel.capture_context if parts.otel is not None else None
            if cfg.enabled:
                lifecycle.start(self, cfg, server)
        except BaseException:
            lifecycle.abandon(self, server)  # a constructor that fails leaves nothing running
            raise

    @property
    def timing(self) -> str:
        """``"cuda"`` (CUDA events) or ``"host"`` (the host clock; also in a forked child)."""
        return self._recorder.timing

    @property
    def cuda_events(self) -> str | None:
        """The CUDA events in use: ``"driver"``, ``"torch"``, or None with host timing."""
        return self._recorder.cuda_events

    @property
    def hot_path(self) -> str:
        """Which hot path and step core run: ``"c"`` or ``"python"``."""
        return self._recorder.hot_path

    # ---- the serving thread's API -----------------------------------------------------------------
    def request(
        self,
        prompt_tokens: int = 0,
        *,
        operation: str | None = None,
        request_id: str | None = None,
        arrival_ns: int | None = None,
    ) -> Request:
        """A request arrived now (or at *arrival_ns* on this Monitor's clock)."""
        if not self._life.on:
            self._life.refused("request")
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
        if self._otel_context is not None:
            try:
                parent = self._otel_context()
            except Exception as e:
                self._errors.record(e, "request context")
        return Request(
            self._requests,
            prompt_tokens,
            self._clock() if arrival_ns is None else arrival_ns,
            operation or self.operation,
            request_id,
            parent,
        )

    def tokens(self, requests: Sequence[Request], n: int = 1) -> None:
        """*n* tokens (default 1) each for *requests*, emitted now: one call for a batch (inside a step:
        :meth:`perfsdk.Step.tokens`, stamped with its exit). Applied by the collector as ``req.tokens(n)`` now would
        have been, so the requests' ``output_tokens`` and ``token_ns`` lag on this thread until its next round."""
        if not self._life.on:
            self._life.refused("tokens")
            return
        self._requests.tokens_now("tokens", requests, n)

    def prefill(
        self,
        tokens: int | Callable[..., int] | None = None,
        batch: int | Callable[..., int] = 1,
        *,
        seq_lens: Sequence[int] | Callable[..., Sequence[int]] | None = None,
        cached_tokens: int | Callable[..., int] = 0,
    ) -> Step:
        """One prefill step of *batch* sequences, *tokens* prompt tokens in all (or their *seq_lens*).

        ``cached_tokens``: prefix tokens already in the KV cache (read, not recomputed; the new tokens attend
        to them, which MFU counts).
        """
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("prefill")
        return self._recorder.make("prefill", batch, tokens, cached_tokens, seq_lens)  # type: ignore[no-any-return]

    def decode(self, batch: int | Callable[..., int] = 1, context_tokens: int | Callable[..., int] = 0) -> Step:
        """One decode step: *batch* sequences, *context_tokens* = the sum of their context lengths."""
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("decode")
        return self._recorder.make("decode", batch, None, context_tokens, None)  # type: ignore[no-any-return]

    def mixed(
        self,
        prefill_seq_lens: Sequence[int] | Callable[..., Sequence[int]] = (),
        decode_batch: int | Callable[..., int] = 0,
        context_tokens: int | Callable[..., int] = 0,
    ) -> Step:
        """A chunked-prefill + decode step: prefill chunks of *prefill_seq_lens* tokens, and *decode_batch*
        sequences decoding over *context_tokens* context tokens in all. Reports MBU and MFU."""
        if self._compiling():  # torch.compile traces this call: a no-op step there
            return NoStep("mixed")
        return self._recorder.make(  # type: ignore[no-any-return]
            "mixed", decode_batch, None, context_tokens, prefill_seq_lens
        )

    # ---- values measured elsewhere (engines that time themselves, perfsdk.engines): through the same core,
    # collector, histograms and spans as those perfsdk measures
    def record_step(
        self,
        phase: str,
        seconds: float,
        *,
        batch: int = 1,
        tokens: int | None = None,
        context_tokens: int = 0,
        seq_lens: Sequence[int] | None = None,
        end_ns: int | None = None,
    ) -> None:
        """A step someone else timed (*seconds*, ending now or at *end_ns*): counted, timed and costed
        (bytes, FLOPs, MBU, MFU) like a step perfsdk timed itself. Sizes as in :meth:`prefill`,
        :meth:`decode` and :meth:`mixed` (for ``"mixed"``: *batch* decoding sequences, *seq_lens* the
        prefill chunks). Host time: an engine's step timer includes what its loop does around the GPU."""
        if not self._life.on:
            self._life.refused("record_step")
            return
        try:
            check_end_ns("record_step", end_ns)
            rec = measured_step(
                phase,
                seconds,
                self._clock() if end_ns is None else end_ns,
                batch=batch,
                tokens=tokens,
                context_tokens=context_tokens,
                seq_lens=seq_lens,
            )
        except ConfigError as e:
            self._requests.refuse("record_step", str(e))
            return
        self._recorder.core.push(rec)  # False: dropped, counted (the core is behind)

    def record_latencies(self, ttft_s: Sequence[float] = (), itl_s: Sequence[float] = ()) -> None:
        """Times to first token and inter-token gaps (seconds) someone else measured, for the histograms.

        Values that are not finite numbers (None, NaN, infinities: an engine's missing value) are left out;
        negative ones (a clock that went backwards) too, counted in ``perfsdk_internal_errors_total``."""
        if not self._life.on:
            self._life.refused("record_latencies")
            return
        try:
            (ttft, neg_ttft), (itl, neg_itl) = seconds_list(ttft_s), seconds_list(itl_s)
        except ConfigError as e:
            self._requests.refuse("record_latencies", str(e))
            return
        self._requests.went_back("record_latencies", neg_ttft + neg_itl)
        if ttft or itl:
            self._requests.push(MeasuredLatencies(ttft, itl))

    def record_finished(
        self,
        *,
        e2e_s: float,
        queue_s: float | None = None,
        prefill_s: float | None = None,
        ttft_s: float | None = None,
        tpot_s: float | None = None,
        prompt_tokens: int = 0,
        output_tokens: int = 0,
        finish_reason: str = "stop",
        error: str | None = None,
        request_id: str | None = None,
        end_ns: int | None = None,
    ) -> None:
        """A finished request someone else timed (seconds; it ended now or at *end_ns*).

        Observed: request duration (*e2e_s*), queue time, and time per output token (*tpot_s*, or
        ``(e2e - ttft) / (output_tokens - 1)`` when only *ttft_s* is given). TTFT itself is not observed
        here (engines report it as it happens: :meth:`record_latencies`); *ttft_s*, or *queue_s* +
        *prefill_s*, places the first token in the request's span. A negative *queue_s*, *prefill_s*,
        *ttft_s* or *tpot_s* (a clock that went backwards) is left out and counted in
        ``perfsdk_internal_errors_total``, as is a TPOT that would come out negative.
        """
        if not self._life.on:
            self._life.refused("record_finished")
            return
        try:
            check_end_ns("record_finished", end_ns)
            rec = measured_request(
                self._clock() if end_ns is None else end_ns,
                e2e_s=e2e_s,
                queue_s=queue_s,
                prefill_s=prefill_s,
                ttft_s=ttft_s,
                tpot_s=tpot_s,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                finish_reason=finish_reason,
                error=error,
                request_id=request_id,
            )
        except ConfigError as e:
            self._requests.refuse("record_finished", str(e))
            return
        self._requests.went_back("record_finished", sum(map(negative_seconds, (queue_s, prefill_s, ttft_s, tpot_s))))
        self._requests.push(rec)

    # ---- control -------------------------------------------------------
    def flush(self, timeout: float | None = 10.0, *, sinks: bool = True) -> bool:
        """Block until everything recorded so far is counted and exported (``False`` on timeout).

        ``sinks=False`` (what a scrape does): hand it to the sinks — the Prometheus registry has it then — but
        do not wait for them to deliver (an OpenTelemetry exporter's network round trip). On a closed Monitor
        there is nothing left to do: whether :meth:`close` exported everything.
        """
        if self._closed:
            return self._life.flushed
        return lifecycle.flush(self, timeout, sinks)

    def close(self, timeout: float | None = 10.0) -> None:
        """Flush, stop the threads and the metrics server, within *timeout* in all. Idempotent. Afterwards a call
        that records is a counted no-op, one that would start something an error (:mod:`perfsdk.lifecycle`)."""
        if not self._closed:
            self._closed = True
            lifecycle.close(self, timeout)

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve_metrics(
        self, port: int | None = None, addr: str = "127.0.0.1", *, token: str | None = None
    ) -> MetricsServer:
        """Serve ``GET /metrics`` (and ``POST /profile``, a profiler-window trigger) on a daemon thread.

        *port*: default 9400; 0 picks a free one. Binding anywhere but loopback requires *token* for the
        trigger (``Authorization: Bearer …``). Called again it returns the running server (one per Monitor);
        asking for another port or address then is a :class:`~perfsdk.errors.ConfigError`; on a closed Monitor a
        :class:`~perfsdk.errors.MonitorClosedError`.
        """
        return lifecycle.serve(self, port, addr, token)

    def metrics_text(self, drain_timeout: float | None = DRAIN_TIMEOUT) -> tuple[bytes, str]:
        """``(body, content type)`` of this Monitor's Prometheus metrics, for a ``/metrics`` route of your own.

        It first drains the collector (waiting at most *drain_timeout* s), so it holds every step and request
        that finished before the call (``docs/metrics.md``, "Freshness"); it blocks that long at most: in an
        async server run it in a worker thread (``await asyncio.to_thread(mon.metrics_text)``).
        """
        from perfsdk.sinks.prometheus import exposition

        if drain_timeout is None or drain_timeout > 0:
            try:
                self.flush(drain_timeout, sinks=False)
            except Exception as e:  # a scrape must answer even if perfsdk cannot drain
                self._errors.record(e, "metrics drain")
        return exposition(self.registry)

    def count_error(self, exc: BaseException, where: str) -> None:
        """Count a failure of code instrumenting with this Monitor (an engine hook, your own wrapper) as perfsdk
        counts its own: ``perfsdk_internal_errors_total`` + 1, logged once per *where*. Never raises."""
        with contextlib.suppress(Exception):
            self._errors.record(exc, where)

    def stats(self) -> dict[str, Any]:
        """Rolling per-phase statistics (last few thousand steps) and the SDK's health counters (``dropped_records``,
        ``internal_errors``, ``calls_after_close``; ``dropped_spans`` with an OpenTelemetry sink)."""
        c = self._collector
        out = c.stats() if c is not None else {"dropped_records": 0, "internal_errors": self._errors.count}
        core, otel, window = self._recorder.core, self._parts.otel, self._recorder.window
        out["calls_after_close"] = self._life.late(core)
        if otel is not None:
            out["dropped_spans"] = otel.dropped + core.dropped_samples
        if window is not None:
            out["profiler"] = window.status()
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

        if self._closed:
            raise MonitorClosedError(f"enable_profiler: {self._life.reason()}")
        old = self._recorder.window
        if old is not None and not config:
            return old
        if old is not None and old.state in ("ready", "running", "writing"):
            # the serving thread drives a running capture through the current window; swapping it now
            # would leave torch.profiler recording with nobody to stop it
            raise ConfigError("enable_profiler: a capture is in progress; change settings once it has finished")
        new = ProfilerWindow(self, **config)  # validate before dropping the old window
        self._recorder.set_window(new)
        if old is not None:
            old.close()
        return new

    def profile(
        self, steps: int | None = None, mode: str | None = None, reason: str = "api", *, steady: bool = True
    ) -> Any:
        """Ask for one profiler capture of *steps* steady-state steps; returns a handle to wait on.

        ``steady=False``: no steady-state gate; the next step entered starts the capture (called at the same
        step on every rank of a tensor-parallel group, it captures the same steps on each). Closed: an error.
        """
        if self._closed:
            raise MonitorClosedError(f"profile: {self._life.reason()}; no step would ever start the capture")
        w = self._recorder.window if self._recorder.window is not None else self.enable_profiler()
        return w.trigger(steps=steps, mode=mode, reason=reason, steady=steady)

    def profile_status(self) -> dict[str, Any] | None:
        """The profiler window's state, the capture under way and the last result; None without a window."""
        w = self._recorder.window
        return None if w is None else w.status()

    def cancel_profile(self, reason: str = "cancelled") -> bool:
        """Cancel the capture under way (armed: now; running: at the next step); False if there is none."""
        return False if (w := self._recorder.window) is None else bool(w.cancel(reason))

    def window_deps(self) -> tuple[ErrorGuard, Callable[[float | None, float | None], None] | None, str]:
        """A profiler window's needs: the error guard, the last capture's gauges' setter, the rank."""
        prom, rank = self._parts.prom, self._parts.rank_label
        return self._errors, prom.set_profile if prom is not None else None, rank[0] if rank else "0"
