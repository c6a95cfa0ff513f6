"""OpenTelemetry metrics: the SDK's exponential histograms fed by perfsdk, read back from an in-memory reader."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import ExponentialHistogramDataPoint, HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

from perfsdk import buckets
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.testing import FakeClock, monitor_harness

pytestmark = pytest.mark.usefixtures("each_hot_path")

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 989e12})


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def _run(h: Any, clock: FakeClock) -> None:
    mon = h.monitor
    for _ in range(3):
        with mon.request(prompt_tokens=16) as req:
            req.scheduled()
            clock.advance(0.010)
            with mon.prefill(tokens=16):
                clock.advance(0.004)
            for i in range(5):
                with mon.decode(batch=1, context_tokens=16 + i):
                    clock.advance(0.005)
                req.tokens(1)
    assert mon.flush(10)


def test_exponential_histograms_from_an_sdk_view() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(
        metric_readers=[reader],
        views=[View(instrument_type=Histogram, aggregation=ExponentialBucketHistogramAggregation())],
    )
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, meter_provider=provider) as h:
        _run(h, clock)
        # the feed is turned on at the first export after the provider is seen: run once more, then read
        _run(h, clock)
        assert h.monitor.stats()["dropped_step_values"] == 0
    points = _points(reader)
    step = {p.attributes["perfsdk.phase"]: p for p in points["perfsdk.step.duration"]}
    assert isinstance(step["decode"], ExponentialHistogramDataPoint)
    assert step["decode"].count in (15, 30)  # the first round's steps may precede the feed
    assert step["decode"].sum == pytest.approx(0.005 * step["decode"].count)
    assert step["decode"].attributes["gen_ai.request.model"] == "llama-3-8b"
    mbu = {p.attributes["perfsdk.phase"]: p for p in points["perfsdk.step.bandwidth_utilization"]}
    assert mbu["decode"].count == step["decode"].count and 0 < mbu["decode"].sum / mbu["decode"].count < 1
    assert {p.attributes["perfsdk.phase"] for p in points["perfsdk.step.flops_utilization"]} == {"prefill"}
    (ttft,) = points["gen_ai.server.time_to_first_token"]
    assert ttft.count == 6 and ttft.sum == pytest.approx(6 * (0.010 + 0.004 + 0.005))
    (duration,) = points["gen_ai.server.request.duration"]
    (tpot,) = points["gen_ai.server.time_per_output_token"]
    assert duration.count == tpot.count == 6
    (itl,) = points["perfsdk.inter_token_latency"]
    assert itl.count == 6 * 4 and itl.sum == pytest.approx(6 * 4 * 0.005)


def test_without_a_view_the_histograms_use_perfsdks_bounds() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, meter_provider=provider) as h:
        _run(h, clock)
    (ttft,) = _points(reader)["gen_ai.server.time_to_first_token"]
    assert isinstance(ttft, HistogramDataPoint)
    assert tuple(ttft.explicit_bounds) == buckets.TTFT


def test_no_meter_provider_costs_nothing() -> None:
    """The API's default (proxy) provider: no instruments, and the core keeps no per-step values."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        _run(h, clock)
        core_feeds = h.probe.feeds["value_feed"]
    assert core_feeds is False
