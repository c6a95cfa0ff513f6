"""The collector on its own: a step core, a request queue and list-backed sinks, no Monitor around them.

What it must do each round: hand the core's totals to every sink, turn request events into latencies and
RequestResults, report perfsdk's own losses as deltas — all in one typed ExportBatch per sink, through
Sink.record and nothing else — and keep going when a sink fails.
"""

from __future__ import annotations

import dataclasses
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from perfsdk._guard import ErrorGuard
from perfsdk.collector import Collector
from perfsdk.model import ModelSpec
from perfsdk.records import (
    DECODE,
    HOST,
    PREFILL,
    UNTIMED,
    Flush,
    MeasuredLatencies,
    MeasuredRequest,
    Request,
    RequestQueue,
    StepRecord,
)
from perfsdk.sinks import ExportBatch, RequestResult, Sink
from perfsdk.stepcore import PyStepCore, StepTotals
from perfsdk.stepcost import StepCosts
from perfsdk.testing import FakeClock

OFFSET = 10**18  # the epoch offset the collector adds to host-clock times


class ListSink:
    """A sink that keeps what it is given (the interface of perfsdk.sinks.Sink)."""

    wants_step_values = False

    def __init__(self) -> None:
        self.batches: list[ExportBatch] = []
        self.totals: list[StepTotals] = []
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.requests: list[RequestResult] = []
        self.health_calls: list[tuple[int, int]] = []
        self.flushes = 0

    def record(self, batch: ExportBatch) -> None:
        self.batches.append(batch)
        if batch.steps is not None:
            self.totals.append(batch.steps)
        self.ttft.extend(batch.ttft_s)
        self.itl.extend(batch.itl_s)
        self.requests.extend(batch.requests)
        if batch.dropped or batch.errors:
            self.health_calls.append((batch.dropped, batch.errors))

    def flush(self, timeout: float | None) -> bool:
        self.flushes += 1
        return True

    def close(self, timeout: float | None) -> None:
        return None


class Parts:
    def __init__(self, *sinks: Sink, queue: int = 100, spans_dropped: Any = None) -> None:
        self.clock = FakeClock()
        self.errors = ErrorGuard()
        costs = StepCosts.of(ModelSpec.named("llama-3-8b"), 4.8e12, 989e12)
        self.core = PyStepCore(costs, None, None, 1000, 0.5, 0.001)
        self.requests = RequestQueue(queue, self.clock, self.errors, strict=True)
        self.collector = Collector(
            self.core,
            self.requests,
            list(sinks),
            self.errors,
            model="m",
            operation="chat",
            epoch_offset_ns=OFFSET,
            export_interval=60.0,
            recorder=SimpleNamespace(window=None, event_pool_empty=7),
            spans_dropped=spans_dropped,
        )
        self.core.start()

    def step(self, phase: int, seconds: float, batch: int = 1, timing: int = HOST) -> None:
        t1 = self.clock.advance(seconds)
        assert self.core.push(
            StepRecord(
                phase,
                timing,
                t1 - round(seconds * 1e9),
                t1,
                None,
                None,
                batch,
                -1,
                100,
                batch if phase == PREFILL else 0,
                batch if phase == PREFILL else 0,
                batch if phase == PREFILL else 0,
                None,
            )
        )

    def round(self) -> bool:
        assert self.core.sync(10)
        return self.collector.export()

    def close(self) -> None:
        self.core.stop(10)


@pytest.fixture
def parts() -> Any:
    sink = ListSink()
    p = Parts(sink)
    p.sink = sink  # type: ignore[attr-defined]
    yield p
    p.close()


def test_step_totals_reach_the_sink_once(parts: Any) -> None:
    for _ in range(3):
        parts.step(DECODE, 0.002, batch=4)
    parts.step(PREFILL, 0.01, batch=64)
    parts.step(DECODE, 0.0, batch=2, timing=UNTIMED)
    assert parts.round() is True
    [totals] = parts.sink.totals
    dec = totals.phases[DECODE]
    assert dec.steps == 4 and sum(dec.step_counts) == 3 and dec.step_sum == pytest.approx(0.006)
    assert dec.tokens == 3 * 4 + 2  # the untimed step counts its tokens, not its time
    assert totals.phases[PREFILL].tokens == 64
    assert len(totals.samples) == 2  # every other step (span rate 0.5), deterministically
    assert parts.round() is False  # nothing new: nothing handed over
    assert len(parts.sink.totals) == 1


def test_request_events_become_latencies_and_results(parts: Any) -> None:
    clock = parts.clock
    req = Request(parts.requests, 12, clock(), "chat", "r1", None)
    clock.advance(0.01)
    req.scheduled()
    clock.advance(0.04)
    req.tokens(1)
    clock.advance(0.02)
    req.tokens(2)
    req.finish("length")
    parts.requests.push(MeasuredLatencies((0.3,), (0.01, 0.02)))
    parts.requests.push(MeasuredRequest(clock(), 1.0, 0.1, 0.2, None, None, 5, 9, "stop", None, "r2"))
    parts.round()
    sink = parts.sink
    assert sink.ttft == pytest.approx([0.05, 0.3])
    assert sink.itl == pytest.approx([0.01, 0.02])
    r1, r2 = sink.requests
    assert (r1.request_id, r1.finish_reason, r1.output_tokens) == ("r1", "length", 3)
    assert r1.queue_s == pytest.approx(0.01) and r1.ttft_s == pytest.approx(0.05)
    assert r1.itl_s == pytest.approx([0.02]) and r1.tpot_s == pytest.approx((0.07 - 0.05) / 2)
    assert r1.start_ns == req.arrival_ns + OFFSET and r1.end_ns == req.finish_ns + OFFSET  # type: ignore[operator]
    assert r2.ttft_s == pytest.approx(0.3) and r2.tpot_s == pytest.approx(0.7 / 8) and r2.itl_s == ()


def test_losses_reach_the_sinks_as_deltas() -> None:
    sink = ListSink()
    p = Parts(sink, queue=2)
    try:
        for _ in range(5):
            p.requests.push(MeasuredLatencies((0.1,), ()))  # 2 fit, 3 dropped
        p.errors.record(RuntimeError("x"), "somewhere")
        p.round()
        assert sink.health_calls == [(3, 1)]
        p.round()
        assert sink.health_calls == [(3, 1)]  # no new losses: nothing reported
        p.errors.record(RuntimeError("y"), "somewhere")
        p.round()
        assert sink.health_calls == [(3, 1), (0, 1)]
        assert p.collector.stats()["untimed_steps_event_pool_empty"] == 7
    finally:
        p.close()


def test_a_failing_sink_is_counted_and_the_others_still_get_their_results() -> None:
    class Broken(ListSink):
        def record(self, batch: ExportBatch) -> None:
            if batch.steps is not None:
                raise OSError("disk full")
            super().record(batch)

    broken, fine = Broken(), ListSink()
    p = Parts(broken, fine)
    try:
        p.step(DECODE, 0.002)
        p.round()
        assert len(fine.totals) == 1 and not broken.totals
        assert p.errors.count == 1
    finally:
        p.close()


def test_a_flush_marker_exports_everything_before_it_in_one_export(parts: Any) -> None:
    for _ in range(50):
        parts.step(DECODE, 0.001)
    marker = Flush(threading.Event(), 10.0, [])
    parts.requests.push_marker(marker)
    parts.collector.export()  # no sync beforehand: the marker makes the round count everything first
    assert marker.done.is_set() and marker.result == [True]
    assert sum(t.phases[DECODE].steps for t in parts.sink.totals) == 50
    assert len(parts.sink.totals) == 1 and parts.sink.flushes == 1
    assert parts.requests.markers == []


class Spy:
    """A sink that notes every attribute the collector reads on it (methods included); a ListSink keeps the rest."""

    wants_step_values = False

    def __init__(self) -> None:
        self.inner = ListSink()
        self.seen: list[str] = []

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__") and name not in ("inner", "seen"):
            object.__getattribute__(self, "seen").append(name)
        return object.__getattribute__(self, name)

    def record(self, batch: ExportBatch) -> None:
        self.inner.record(batch)

    def flush(self, timeout: float | None) -> bool:
        return self.inner.flush(timeout)

    def close(self, timeout: float | None) -> None:
        self.inner.close(timeout)


def test_the_collector_calls_only_record_and_flush_on_sinks_with_one_frozen_batch_per_export() -> None:
    """Issue 23: one typed call per export (vLLM's StatLoggerBase.record), not a call per kind of result."""
    spy, other = Spy(), ListSink()
    spans = {"sample_cap": 0, "queue_full": 0}
    p = Parts(spy, other, queue=3, spans_dropped=lambda: dict(spans))
    try:
        p.step(DECODE, 0.002, batch=4)
        req = Request(p.requests, 12, p.clock(), "chat", "r1", None)
        p.clock.advance(0.05)
        req.tokens(1)
        req.finish("stop")
        p.requests.push(MeasuredLatencies((0.3,), (0.01,)))
        p.requests.push(MeasuredLatencies((0.4,), ()))  # the queue holds 3: dropped, counted
        p.errors.record(RuntimeError("x"), "somewhere")
        spans["sample_cap"] = 5
        spy.seen.clear()
        assert p.round() is True
        marker = Flush(threading.Event(), 10.0, [])
        p.requests.push_marker(marker)
        p.collector.export()  # nothing new: no batch, but the flush reaches every sink
        assert marker.result == [True]
        assert set(spy.seen) <= {"record", "flush", "wants_step_values"}, spy.seen
        assert spy.seen.count("record") == 1 and spy.seen.count("flush") == 1
        [batch] = spy.inner.batches
        assert len(other.batches) == 1 and other.batches[0] is batch  # the same batch for every sink, built once
        assert isinstance(batch, ExportBatch)
        with pytest.raises(dataclasses.FrozenInstanceError):
            batch.errors = 0  # type: ignore[misc]
        assert batch.steps is not None and batch.steps.phases[DECODE].steps == 1
        assert batch.ttft_s == pytest.approx((0.05, 0.3)) and batch.itl_s == pytest.approx((0.01,))
        assert [r.request_id for r in batch.requests] == ["r1"]
        assert (batch.dropped, batch.errors, batch.dropped_spans) == (1, 1, (("sample_cap", 5),))
        assert p.errors.count == 1  # nothing failed on the way: the one error is the test's own
    finally:
        p.close()


def test_a_sink_that_fails_is_reported_with_the_next_batch() -> None:
    class Broken(ListSink):
        def record(self, batch: ExportBatch) -> None:
            raise OSError("disk full")

    fine = ListSink()
    p = Parts(Broken(), fine)
    try:
        p.step(DECODE, 0.002)
        p.round()
        assert p.errors.count == 1 and fine.health_calls == []
        assert p.round() is False  # nothing new was recorded, but the failure is exported
        assert fine.health_calls == [(0, 1)] and fine.batches[-1].steps is None
    finally:
        p.close()
