"""The sinks behind a Monitor, through their one call per export (``Sink.record`` over an ``ExportBatch``).

A Monitor with OpenTelemetry on has three sinks (Prometheus, spans, OTel metrics); each gets the whole batch,
so a part one sink has nothing to do with (spans dropped, for the metrics sinks) is no error for it, and a
value that was not observed (a duration from a clock that went backwards) is left out by every sink.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.sinks import ExportBatch, Sink
from perfsdk.sinks.otel import make_otel_sink
from perfsdk.sinks.otel_metrics import make_otel_metrics_sink
from perfsdk.sinks.prometheus import PrometheusSink, metric_set
from perfsdk.testing import FakeClock, monitor_harness

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 989e12})
ERRORS = "perfsdk_internal_errors_total"
DROPPED_SPANS = "perfsdk_dropped_spans_total"


def _lenient(**kw: Any) -> Any:
    return monitor_harness(strict=False, model=MODEL, hardware=HW, **kw)


def test_every_sink_has_the_one_record_call_and_none_of_the_old_per_part_calls() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from prometheus_client import CollectorRegistry

    otel = make_otel_sink(TracerProvider(), "m")
    otel_metrics = make_otel_metrics_sink(MeterProvider(metric_readers=[InMemoryMetricReader()]), "m")
    assert otel is not None and otel_metrics is not None
    sinks: list[Sink] = [PrometheusSink(metric_set(CollectorRegistry()), "m"), otel, otel_metrics]
    for s in sinks:
        assert callable(s.record) and isinstance(s.wants_step_values, bool)
        for old in ("steps", "latencies", "request", "health", "dropped_spans"):
            assert not hasattr(s, old), (type(s).__name__, old)
    assert [s.wants_step_values for s in sinks] == [False, False, True]  # a meter provider is set
    assert ExportBatch().empty()
    otel.close(1)


def test_spans_dropped_by_the_cap_are_no_internal_error_of_the_other_sinks() -> None:
    """Before the typed call, the OTel metrics sink had no ``dropped_spans`` method: every export with dropped
    spans counted one internal error (an AttributeError) against it."""
    with _lenient(step_span_rate=1.0, export_interval=60) as h:
        for _ in range(5000):  # one export interval: at most 4,096 sampled steps become spans
            h.monitor.record_step("decode", 0.001, batch=1)
        h.flush()
        dropped = h.monitor.stats()["dropped_spans"]
        assert dropped > 0
        assert h.value(DROPPED_SPANS, reason="sample_cap") == dropped
        assert h.monitor.stats()["internal_errors"] == 0
        assert not h.value(ERRORS)


def test_a_duration_from_a_clock_that_went_backwards_is_observed_by_no_sink() -> None:
    """Before, the OTel metrics sink recorded ``None`` as a duration: the SDK raised, one more internal error
    than the one the collector counts, and the rest of the request's values were lost for that sink."""
    reader = InMemoryMetricReader()
    clock = FakeClock()
    with _lenient(clock=clock, meter_provider=MeterProvider(metric_readers=[reader])) as h:
        mon = h.monitor
        ok = mon.request(prompt_tokens=4)  # a good one first: the OTel metrics sink is live
        clock.advance(0.1)
        ok.tokens(1)
        ok.finish()
        assert mon.flush(10)
        req = mon.request(prompt_tokens=4)
        clock.advance(0.1)
        req.tokens(1)
        clock.advance(0.2)
        req.tokens(1)
        clock.advance(-0.25)
        req.finish()  # before its last token: no duration, no TPOT
        assert mon.flush(10)
        assert h.count("gen_ai_server_request_duration_seconds") == 1
        assert h.value(ERRORS) == 1  # the collector's count of the clock, nothing more
    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                points.setdefault(m.name, []).extend(m.data.data_points)
    (duration,) = points["gen_ai.server.request.duration"]
    assert duration.count == 1  # the good request's only
    (itl,) = points["perfsdk.inter_token_latency"]
    assert itl.count == 1 and itl.sum == pytest.approx(0.2)  # the bad request's gap still counts
