"""OpenTelemetry spans, built on a thread of their own from recorded timestamps.

One span per request, named ``{operation} {model}`` (GenAI semantic conventions), with child spans
``queue``, ``prefill`` (scheduled → first token) and ``decode`` (first token → finish); opt-in sampled
spans per step (``step_span_rate``). Every span gets explicit start and end times, so building them off
the hot path changes nothing about what they say.

A request span's ``gen_ai.response.finish_reasons`` is the same bounded reason as the
``perfsdk_requests_total{finish_reason}`` label (``stop``, ``length``, ``tool_calls``, ``content_filter``,
``abort``, ``cancelled``, ``error``, ``other``; the engine's own word in ``perfsdk.raw_finish_reason`` where it
differs). Only a failed request gets ``error.type`` and an error status: a client that went away
(``abort``) or a cancelled task (``cancelled``) is not an error.

Spans are built on the sink's own thread (``perfsdk-spans``) from a bounded queue: a span processor
that exports synchronously and slowly (a ``SimpleSpanProcessor`` in front of a slow backend) holds
back only spans, never metrics; when the queue is full new spans are dropped and counted
(``stats()["dropped_spans"]``, ``perfsdk_dropped_spans_total{reason="queue_full"}``).
:meth:`OtelSink.flush` and :meth:`OtelSink.close` honour their timeout.

Fork: a span is built holding :attr:`OtelSink.building` (a lock a fork waits for, so the span thread holds
none of the exporter's locks when the child is made); in the child, :meth:`OtelSink.after_fork` drops the
parent's queued spans (the parent builds them) and the thread starts again with the next span.

perfsdk uses the global tracer provider unless one is passed. With no SDK configured the global
provider is a proxy that hands out no-op tracers; the sink notices and builds nothing at all (no
thread either).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from perfsdk.records import PHASES
from perfsdk.stepcore import StepSample

if TYPE_CHECKING:
    from perfsdk.sinks import ExportBatch, RequestResult

__all__ = ["OtelSink", "make_otel_sink"]

log = logging.getLogger("perfsdk")

QUEUE = 8192  # spans waiting to be built, at most


def make_otel_sink(
    tracer_provider: Any = None,
    model: str = "unknown",
    epoch_offset_ns: int = 0,
    queue_size: int = QUEUE,
    interval: float = 0.25,
) -> OtelSink | None:
    """An :class:`OtelSink`, or ``None`` when the OpenTelemetry API is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return OtelSink(trace, tracer_provider, model, epoch_offset_ns, queue_size, interval)


class OtelSink:
    """The :class:`~perfsdk.sinks.Sink` for OpenTelemetry (see the module docstring)."""

    def __init__(
        self,
        trace_api: Any,
        tracer_provider: Any,
        model: str,
        epoch_offset_ns: int = 0,
        queue_size: int = QUEUE,
        interval: float = 0.25,
    ) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        from perfsdk._version import __version__

        self._trace = trace_api
        self._provider = tracer_provider
        self._version = __version__
        self._tracer: Any = None
        self._model = model
        self._offset = epoch_offset_ns
        self._server_kind = SpanKind.SERVER
        self._internal_kind = SpanKind.INTERNAL
        self._status_cls = Status
        self._error_code = StatusCode.ERROR
        self._jobs: deque[Any] = deque()
        self._capacity = queue_size
        self._interval = interval  # the span thread builds what is queued this often (or when half full)
        self._cond = threading.Condition()
        self.building = threading.Lock()  # held while one span is built (see the module docstring)
        self._busy = 0  # jobs taken off the queue and not yet built
        self._thread: threading.Thread | None = None
        self._closed = False
        self.dropped = 0
        self.errors = 0

    def tracer(self) -> Any:
        """The tracer, or ``None`` while no real provider is configured (costs nothing then)."""
        if self._tracer is not None:
            return self._tracer
        provider = self._provider or self._trace.get_tracer_provider()
        name = type(provider).__name__
        if name in ("ProxyTracerProvider", "NoOpTracerProvider"):
            return None  # checked again next time: a provider may be set later
        self._tracer = provider.get_tracer("perfsdk", self._version)
        return self._tracer

    @staticmethod
    def capture_context() -> Any:
        """The caller's current context (hot path: one contextvar read), to parent the request span."""
        from opentelemetry import context

        return context.get_current()

    # ---- the Sink interface (collector thread) ------------------------------------------------------
    wants_step_values = False  # spans come from the core's sampled steps

    def record(self, batch: ExportBatch) -> None:
        """Queue a span for each sampled step and each finished request (built on the span thread)."""
        samples = batch.steps.samples if batch.steps is not None else ()
        if (samples or batch.requests) and self.tracer() is not None:
            for s in samples:
                self._enqueue(s)
            for r in batch.requests:
                self._enqueue(r)

    def after_fork(self, usable: bool = True) -> None:
        """In a forked child: new locks, none of the parent's queued spans, the thread started anew on demand.

        *usable* False: the fork found a span being built, so the exporter's locks may be held forever in this
        process; no span is built here then, each one dropped and counted (logged once).
        """
        self._cond = threading.Condition()
        self.building = threading.Lock()
        self._jobs = deque()
        self._busy = 0
        self._thread = None
        self.dropped = self.errors = 0
        if not usable:
            self._closed = True
            log.error(
                "perfsdk: forked while a span was being exported: this process builds no spans (counted in "
                "stats()['dropped_spans']; metrics are not affected). Create the Monitor after the fork."
            )

    def flush(self, timeout: float | None) -> bool:
        """Wait until every span handed over is built (False on timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()  # build now, not at the next interval
            while self._jobs or self._busy:
                if self._thread is None or not self._thread.is_alive():
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self, timeout: float | None) -> None:
        """Build what is queued (within *timeout*), then stop the thread; what is left is dropped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        t = self._thread
        if t is not None:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # ---- the span thread ----------------------------------------------------------------------------
    def _enqueue(self, job: Any) -> None:
        with self._cond:
            if self._closed:
                self.dropped += 1
                return
            if len(self._jobs) >= self._capacity:
                self.dropped += 1
                if self.dropped == 1:
                    log.warning(
                        "perfsdk: spans are built slower than they arrive (a slow span exporter?); "
                        "dropping spans beyond %d queued (metrics are not affected)",
                        self._capacity,
                    )
                return
            self._jobs.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="perfsdk-spans", daemon=True)
                self._thread.start()
            if len(self._jobs) >= self._capacity // 2:
                self._cond.notify_all()  # otherwise the thread comes by on its interval: one wake-up per batch

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._jobs and not self._closed:
                    self._cond.wait(self._interval)
                if self._closed:  # close() gave what it could to building; the rest is dropped, counted
                    self.dropped += len(self._jobs)
                    self._jobs.clear()
                    self._cond.notify_all()
                    return
                if not self._jobs:
                    continue
                job = self._jobs.popleft()
                self._busy += 1
            try:
                with self.building:
                    if isinstance(job, StepSample):
                        self._step_span(job)
                    else:
                        self._request_span(job)
            except Exception as e:
                self.errors += 1
                if self.errors == 1:
                    log.error("perfsdk: building a span failed (counted; logged once): %s", e, exc_info=e)
            finally:
                with self._cond:
                    self._busy -= 1
                    if not self._jobs:
                        self._cond.notify_all()  # flush() waits for an empty queue
            time.sleep(0)  # let go of the GIL between spans: a serving thread waiting for it gets a turn

    def _request_span(self, r: RequestResult) -> None:
        tracer = self.tracer()
        trace = self._trace
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": r.operation,
            "gen_ai.request.model": r.model,
            "gen_ai.usage.input_tokens": r.input_tokens,
            "gen_ai.usage.output_tokens": r.output_tokens,
            # the bounded reason, as perfsdk_requests_total's finish_reason label has it (error only when it failed;
            # a client that went away is "abort", a cancelled task "cancelled")
            "gen_ai.response.finish_reasons": [r.finish_reason],
        }
        if r.raw_finish_reason is not None and r.raw_finish_reason != r.finish_reason:
            attrs["perfsdk.raw_finish_reason"] = r.raw_finish_reason  # what the engine said, where it was mapped
        if r.ttft_s is not None:
            attrs["gen_ai.server.time_to_first_token"] = r.ttft_s
        if r.queue_s is not None:
            attrs["perfsdk.queue_seconds"] = r.queue_s
        if r.request_id is not None:
            attrs["gen_ai.response.id"] = r.request_id
        if r.error is not None:
            attrs["error.type"] = r.error
        span = tracer.start_span(
            f"{r.operation} {r.model}",
            context=r.parent,
            kind=self._server_kind,
            attributes=attrs,
            start_time=r.start_ns,
        )
        if r.error is not None:
            span.set_status(self._status_cls(self._error_code, r.error))
        ctx = trace.set_span_in_context(span)
        children = []
        if r.scheduled_ns is not None:
            children.append(("queue", r.start_ns, r.scheduled_ns))
        prefill_start = r.scheduled_ns if r.scheduled_ns is not None else r.start_ns
        if r.first_token_ns is not None:
            children.append(("prefill", prefill_start, r.first_token_ns))
            children.append(("decode", r.first_token_ns, r.end_ns))
        for name, t0, t1 in children:
            child = tracer.start_span(
                name, context=ctx, kind=self._internal_kind, start_time=t0, attributes={"gen_ai.request.model": r.model}
            )
            child.end(end_time=max(t1, t0))
        span.end(end_time=max(r.end_ns, r.start_ns))  # a clock that went backwards: no negative span

    def _step_span(self, s: StepSample) -> None:
        tracer = self.tracer()
        attrs: dict[str, Any] = {"gen_ai.request.model": self._model, "perfsdk.batch": s.batch}
        if s.error is None:
            attrs["perfsdk.tokens"] = s.tokens
            if s.seconds is not None:
                attrs["perfsdk.device_seconds"] = s.seconds
            if s.mbu is not None:
                attrs["perfsdk.mbu"] = s.mbu
            if s.mfu is not None:
                attrs["perfsdk.mfu"] = s.mfu
        span = tracer.start_span(
            f"{PHASES[s.phase]} step", kind=self._internal_kind, start_time=s.t0 + self._offset, attributes=attrs
        )
        if s.error is not None:
            span.set_status(self._status_cls(self._error_code, s.error))
        span.end(end_time=max(s.t1, s.t0) + self._offset)
