"""OpenTelemetry spans, built on the collector thread from recorded timestamps.

One span per request, named ``{operation} {model}`` (GenAI semantic
conventions), with child spans ``queue``, ``prefill`` (scheduled → first
token) and ``decode`` (first token → finish); opt-in sampled spans per step.
Every span gets explicit start and end times, so building them off the hot
path changes nothing about what they say.

perfsdk uses the global tracer provider unless one is passed. With no SDK
configured the global provider is a proxy that hands out no-op tracers; the
sink notices and builds nothing at all.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["OtelSink", "make_otel_sink"]


def make_otel_sink(tracer_provider: Any = None, step_span_rate: float = 0.0) -> OtelSink | None:
    """An :class:`OtelSink`, or ``None`` when the OpenTelemetry API is not installed."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return OtelSink(trace, tracer_provider, step_span_rate)


class OtelSink:
    def __init__(self, trace_api: Any, tracer_provider: Any, step_span_rate: float) -> None:
        from perfsdk._version import __version__

        self._trace = trace_api
        self._provider = tracer_provider
        self._version = __version__
        self._tracer: Any = None
        self._step_rate = step_span_rate
        self._rng = random.Random()
        from opentelemetry.trace import SpanKind, Status, StatusCode

        self._server_kind = SpanKind.SERVER
        self._internal_kind = SpanKind.INTERNAL
        self._error_status = Status(StatusCode.ERROR)
        self._status_cls = Status
        self._error_code = StatusCode.ERROR

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

    def request(
        self,
        *,
        operation: str,
        model: str,
        parent: Any,
        start_ns: int,
        scheduled_ns: int | None,
        first_token_ns: int | None,
        end_ns: int,
        input_tokens: int,
        output_tokens: int,
        finish_reason: str,
        error: str | None,
        ttft_s: float | None,
        queue_s: float | None,
        request_id: str | None,
    ) -> None:
        tracer = self.tracer()
        if tracer is None:
            return
        trace = self._trace
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": operation,
            "gen_ai.request.model": model,
            "gen_ai.usage.input_tokens": input_tokens,
            "gen_ai.usage.output_tokens": output_tokens,
            "gen_ai.response.finish_reasons": [finish_reason],
        }
        if ttft_s is not None:
            attrs["gen_ai.server.time_to_first_token"] = ttft_s
        if queue_s is not None:
            attrs["perfsdk.queue_seconds"] = queue_s
        if request_id is not None:
            attrs["gen_ai.response.id"] = request_id
        if error is not None:
            attrs["error.type"] = error
        span = tracer.start_span(
            f"{operation} {model}", context=parent, kind=self._server_kind, attributes=attrs, start_time=start_ns
        )
        if error is not None:
            span.set_status(self._status_cls(self._error_code, error))
        ctx = trace.set_span_in_context(span)
        children = []
        if scheduled_ns is not None:
            children.append(("queue", start_ns, scheduled_ns))
        prefill_start = scheduled_ns if scheduled_ns is not None else start_ns
        if first_token_ns is not None:
            children.append(("prefill", prefill_start, first_token_ns))
            children.append(("decode", first_token_ns, end_ns))
        for name, t0, t1 in children:
            child = tracer.start_span(name, context=ctx, kind=self._internal_kind, start_time=t0,
                                      attributes={"gen_ai.request.model": model})
            child.end(end_time=max(t1, t0))
        span.end(end_time=end_ns)

    def step(
        self,
        *,
        phase: str,
        model: str,
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        error: str | None,
    ) -> None:
        if self._step_rate <= 0 or self._rng.random() >= self._step_rate:
            return
        tracer = self.tracer()
        if tracer is None:
            return
        span = tracer.start_span(
            f"{phase} step", kind=self._internal_kind, start_time=start_ns,
            attributes={"gen_ai.request.model": model, **attributes},
        )
        if error is not None:
            span.set_status(self._status_cls(self._error_code, error))
        span.end(end_time=end_ns)
