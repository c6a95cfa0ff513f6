"""Testing helpers: an in-memory Monitor you can read back, for your tests and ours.

::

    from perfsdk.testing import FakeClock, monitor_harness

    clock = FakeClock()
    with monitor_harness(model="llama-3-8b", hardware="h100-sxm", clock=clock) as h:
        req = h.monitor.request(prompt_tokens=16)
        clock.advance(0.050)
        req.tokens(1)                       # TTFT = 50 ms
        req.finish()
        assert h.value("gen_ai_server_time_to_first_token_seconds_sum") == 0.05
        assert h.count("gen_ai_server_time_to_first_token_seconds") == 1
        [span] = [s for s in h.spans() if s.name.startswith("text_completion")]

The harness gives the Monitor a fresh ``CollectorRegistry`` (nothing global is
touched), turns strict mode on (a bad value from the code under test raises
:class:`~perfsdk.errors.ConfigError` instead of being dropped and counted) and,
when the OpenTelemetry SDK is installed, its own
``TracerProvider`` with an ``InMemorySpanExporter`` (the global provider is
left alone). Reads flush the Monitor first, so everything recorded before the
read is visible.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from perfsdk.monitor import Monitor

__all__ = ["FakeClock", "MonitorHarness", "monitor_harness"]


class FakeClock:
    """A nanosecond clock that moves only when told: ``Monitor(clock=FakeClock())``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> int:
        self.now_ns += round(seconds * 1e9)
        return self.now_ns


class MonitorHarness:
    """A Monitor wired to a private registry and an in-memory span exporter."""

    def __init__(self, **monitor_kwargs: Any) -> None:
        self.registry = CollectorRegistry()
        self.exporter: Any = None
        self.tracer_provider: Any = None
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            self.exporter = InMemorySpanExporter()
            self.tracer_provider = TracerProvider()
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        except ImportError:
            pass
        kwargs: dict[str, Any] = {"timing": "host", "nvtx": False, "model": None, "hardware": None, "strict": True}
        kwargs.update(monitor_kwargs)
        if self.tracer_provider is not None:
            kwargs.setdefault("tracer_provider", self.tracer_provider)
        else:
            kwargs.setdefault("otel", False)
        self.kwargs = kwargs
        self.monitor = Monitor(registry=self.registry, **kwargs)

    def flush(self) -> None:
        if not self.monitor.flush(timeout=30):
            raise TimeoutError("perfsdk collector did not drain within 30 s")

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value (``..._sum``, ``..._count``, ``..._total``, a bucket with ``le=``), after a flush."""
        self.flush()
        if "model" not in labels and not name.startswith(("perfsdk_dropped", "perfsdk_internal", "perfsdk_hardware")):
            labels["model"] = self.monitor.model_name
        return self.registry.get_sample_value(name, labels)

    def count(self, histogram: str, **labels: str) -> float:
        """Observations in a histogram (0 when it has none)."""
        return self.value(f"{histogram}_count", **labels) or 0.0

    def sum(self, histogram: str, **labels: str) -> float:
        return self.value(f"{histogram}_sum", **labels) or 0.0

    def spans(self) -> list[Any]:
        """Finished spans, oldest first (empty without the OpenTelemetry SDK)."""
        self.flush()
        if self.exporter is None:
            return []
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        return list(self.exporter.get_finished_spans())

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self.monitor.close()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


@contextlib.contextmanager
def monitor_harness(**monitor_kwargs: Any) -> Iterator[MonitorHarness]:
    """``with monitor_harness(...) as h:`` — a :class:`MonitorHarness`, closed on exit."""
    h = MonitorHarness(**monitor_kwargs)
    try:
        yield h
    finally:
        h.close()
