"""The step core: the C one (``perfsdk._native.StepCore``) and its Python reference, on the same inputs, exactly.

Each test feeds both cores the same step records — host-timed, untimed, failed, timed by a scripted GPU —
and compares every output: per-phase histogram counts and sums, byte/FLOP/token totals, the sampled steps,
the profiler window's feed and the last steps kept for stats(). The costs are also checked against
:mod:`perfsdk.budget`, the formulas' reference.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from perfsdk import budget
from perfsdk.buckets import STEP, UTIL
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.monitor import load_native
from perfsdk.records import DECODE, HOST, MIXED, PREFILL, UNSIZED, UNTIMED, StepRecord, lens_summary
from perfsdk.stepcore import CLOCK_BACKWARDS, SAMPLES, VALUE_FEED, PyStepCore, StepTotals, native_core
from perfsdk.stepcost import StepCosts, utilization

native = load_native()
needs_c = pytest.mark.skipif(native is None, reason="perfsdk._native is not built here")

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 989e12})


def costs(model: ModelSpec | None = MODEL) -> StepCosts:
    return StepCosts.of(model, HW.memory_bandwidth, HW.peak_flops("bf16"))


def random_records(rng: random.Random, n: int) -> list[StepRecord]:
    """Host-timed, untimed and failed steps of every phase, with odd and ordinary sizes."""
    out = []
    t = 10_000
    for _ in range(n):
        phase = rng.choice((PREFILL, DECODE, MIXED))
        timing = rng.choice((HOST, HOST, HOST, UNTIMED))
        batch = rng.choice((0, 1, 7, 64, rng.randrange(1, 4096)))
        ctx = rng.choice((0, 1, rng.randrange(0, 2**24), rng.randrange(0, 2**34), UNSIZED))
        tokens = rng.choice((-1, rng.randrange(0, 2**20)))
        lens = None if rng.random() < 0.5 else [rng.randrange(0, 2**16) for _ in range(rng.randrange(0, 9))]
        if phase == DECODE or ctx == UNSIZED:  # a step with no sizes (a bare @mon.decode) has none at all
            tokens, lens = -1, None
        if ctx == UNSIZED:
            batch = 0
        s, sq, c = lens_summary(phase, batch, tokens, lens)
        dur = rng.choice((0, 1, rng.randrange(1, 10**9), rng.randrange(10**5, 3 * 10**6)))
        error = "ValueError" if rng.random() < 0.05 else None
        out.append(StepRecord(phase, timing, t, t + dur, None, None, batch, tokens, ctx, s, sq, c, error))
        t += dur + 1
    return out


def run(core: Any, records: list[StepRecord], feed_window: bool = True) -> tuple[StepTotals, list[Any]]:
    core.feed_window = feed_window
    core.feed_values = feed_window
    core.start()
    try:
        for r in records:
            assert core.push(r)
        assert core.sync(30)
        totals = core.take()
        recent = [core.recent(p) for p in (PREFILL, DECODE, MIXED)]
    finally:
        core.stop(10)
    return totals, recent


def py_core(c: StepCosts, span_rate: float = 0.1, capacity: int = 100_000) -> PyStepCore:
    return PyStepCore(c, None, None, capacity, span_rate, 0.001)


def c_core(c: StepCosts, span_rate: float = 0.1, capacity: int = 100_000) -> Any:
    return native_core(c, capacity, span_rate, 0.001, None, 0, 0, None, None)


@needs_c
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("model", ["llama-3-8b", "no-attention-shape", "none"])
def test_c_and_python_cores_agree_exactly(seed: int, model: str) -> None:
    spec = {"llama-3-8b": MODEL, "no-attention-shape": ModelSpec(name="x", params=1e9, weight_bytes=2e9), "none": None}[
        model
    ]
    records = random_records(random.Random(seed), 3000)
    py = run(py_core(costs(spec)), records)
    c = run(c_core(costs(spec)), records)
    assert c == py  # every count, sum, sample and window entry, bit for bit
    totals, _ = py
    assert sum(p.steps for p in totals.phases) == len(records)
    assert len(totals.samples) == 300  # span_rate 0.1: every tenth step, deterministically


@needs_c
def test_the_value_feed_keeps_every_timed_step_and_counts_what_it_cannot() -> None:
    """feed_values (an OpenTelemetry metrics sink): each timed step's (phase, seconds, MBU, MFU), identical in
    both cores, at most VALUE_FEED per take, the rest counted."""
    n = VALUE_FEED + 7
    recs = [StepRecord(DECODE, HOST, 0, 1_000_000 + i, None, None, 1, -1, 10, 0, 0, 0, None) for i in range(n)]
    recs.append(StepRecord(DECODE, UNTIMED, 0, 5, None, None, 1, -1, 10, 0, 0, 0, None))  # not timed: no value
    py = run(py_core(costs(), span_rate=0.0), recs)
    c = run(c_core(costs(), span_rate=0.0), recs)
    assert c == py
    totals, _ = py
    assert len(totals.value_feed) == VALUE_FEED and totals.value_feed_dropped == 7
    phase, seconds, mbu, mfu = totals.value_feed[0]
    assert (phase, seconds, mfu) == (DECODE, 0.001, None) and mbu is not None and mbu > 0


@needs_c
def test_both_cores_count_negative_times_and_spans_beyond_the_cap_alike() -> None:
    """Issue 20, items 9 and 12: a host clock that went backwards is never observed, and sampled steps beyond
    SAMPLES per take are counted (dropped_samples) — in both cores, identically."""
    records = random_records(random.Random(5), 6000)
    records = [r._replace(t1=r.t0 - 1000) if i % 7 == 0 and r.timing == HOST else r for i, r in enumerate(records)]
    out = []
    for core in (py_core(costs(), span_rate=1.0), c_core(costs(), span_rate=1.0)):
        totals, recent = run(core, records)
        out.append((totals, recent, core.errors, core.dropped_samples, core.take_errors()))
    assert out[0] == out[1]
    totals, recent, errors, dropped, sites = out[0]
    assert errors == sum(r.t1 < r.t0 for r in records) > 0
    assert sites[0] == ("core clock", CLOCK_BACKWARDS)
    assert len(totals.samples) == SAMPLES and dropped == len(records) - SAMPLES
    assert sum(p.steps for p in totals.phases) == len(records)  # every step counted, the backwards ones untimed
    assert all(v >= 0 for _, _, secs, _, _ in recent for v in secs)
    assert all(s.seconds is None or s.seconds >= 0 for s in totals.samples)


def test_costs_are_the_budget_formulas() -> None:
    c = costs()
    rng = random.Random(7)
    for _ in range(500):
        lens = [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 6))]
        ctx = rng.randrange(0, 100_000)
        batch = rng.randrange(1, 256)
        s, sq, n = lens_summary(PREFILL, len(lens), -1, lens)
        nbytes, flops, tokens = c.cost(DECODE, batch, ctx, 0, 0, 0)
        assert nbytes == budget.decode_step_bytes(MODEL, ctx, batch)
        assert flops == budget.decode_flops(MODEL, batch, ctx)
        assert tokens == batch
        nbytes, flops, tokens = c.cost(PREFILL, len(lens), ctx, s, sq, n)
        assert nbytes == budget.prefill_step_bytes(MODEL, lens, ctx)
        assert flops == budget.prefill_flops(MODEL, lens, cached_tokens=ctx)
        assert tokens == sum(lens)
        nbytes, flops, tokens = c.cost(MIXED, batch, ctx, s, sq, n)
        assert nbytes == budget.mixed_step_bytes(MODEL, lens, ctx, batch)
        assert flops == budget.mixed_step_flops(MODEL, lens, batch, ctx)
        assert tokens == sum(lens) + batch


def test_an_even_split_of_prefill_tokens_is_what_servers_mean() -> None:
    assert lens_summary(PREFILL, 3, 10, None) == (10, 4 * 4 + 3 * 3 + 3 * 3, 3)
    assert lens_summary(PREFILL, 0, 10, None) == (10, 100, 1)
    assert lens_summary(DECODE, 8, -1, None) == (0, 0, 0)


def test_buckets_count_as_prometheus_observe_would() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    values = [0.0, 0.0005, 0.00050001, 0.0015, 0.1, 2.5, 2.5000001, 1e9]
    recs = [StepRecord(DECODE, HOST, 0, round(v * 1e9), None, None, 1, -1, 0, 0, 0, 0, None) for v in values]
    totals, _ = run(py_core(costs(), span_rate=0.0), recs, feed_window=False)
    h = Histogram("x", "x", registry=CollectorRegistry(), buckets=STEP)
    for r in recs:
        h.observe((r.t1 - r.t0) / 1e9)
    counts = [int(s.value) for s in next(iter(h.collect())).samples if s.name == "x_bucket"]
    cumulative = [sum(totals.phases[DECODE].step_counts[: i + 1]) for i in range(len(STEP) + 1)]
    assert cumulative == counts
    assert len(totals.phases[DECODE].mbu_counts) == len(UTIL) + 1


def scripted_run(hot_path: str, seed: int) -> tuple[Any, ...]:
    """The same scripted GPU steps (random device times, host gaps, sizes, a few user errors) through a
    Monitor on *hot_path*; everything its registry and its core report."""
    from prometheus_client import generate_latest

    from perfsdk.testing import FakeClock, ScriptedGpu, monitor_harness

    rng = random.Random(seed)
    clock = FakeClock()
    gpu = ScriptedGpu(capacity=2048)
    # one export, at the flush: sums of floats added in other groupings differ in their last bits
    with monitor_harness(
        model=MODEL,
        hardware=HW,
        clock=clock,
        hot_path=hot_path,
        gpu=gpu,
        step_span_rate=0.25,
        otel=False,
        export_interval=60,
    ) as h:
        mon = h.monitor
        for _ in range(400):
            phase = rng.choice(("decode", "decode", "prefill", "mixed"))
            step = (
                mon.decode(batch=rng.randrange(1, 64), context_tokens=rng.randrange(0, 10**6))
                if phase == "decode"
                else mon.prefill(
                    seq_lens=[rng.randrange(1, 4096) for _ in range(rng.randrange(1, 5))],
                    cached_tokens=rng.randrange(0, 10_000),
                )
                if phase == "prefill"
                else mon.mixed(
                    prefill_seq_lens=[rng.randrange(1, 512)],
                    decode_batch=rng.randrange(1, 32),
                    context_tokens=rng.randrange(0, 10**5),
                )
            )
            try:
                with step:
                    gpu.now_ms += rng.choice((0.125, 1.5, 7.25, 33.0))
                    if rng.random() < 0.02:
                        raise KeyError("user")
            except KeyError:
                pass
            clock.advance(rng.choice((0.0, 2e-6, 5e-5, 1e-3)))  # some chain, some start fresh
        assert mon.flush(10)
        recent = tuple(h.probe.recent(p) for p in ("prefill", "decode", "mixed"))
        text = generate_latest(h.registry).decode()
        return recent, [ln for ln in text.splitlines() if not ln.startswith("#") and "_created" not in ln]


@needs_c
@pytest.mark.parametrize("seed", [11, 12])
def test_timed_steps_through_both_pipelines_export_the_same_numbers(seed: int) -> None:
    """A scripted GPU reached through the Python EventApi (Python hot path and core) and through C function
    pointers (the C ones): identical step times, MBU/MFU and exposition, to the last bit."""
    c = scripted_run("c", seed)
    py = scripted_run("python", seed)
    assert c == py
    assert len(c[0][DECODE][2]) > 150  # the decode steps were timed


HAND_OFF = ("PhaseTotals", "StepSample", "WindowFeedEntry", "ValueFeedEntry", "StepTotals", "RecentSteps")


@needs_c
@pytest.mark.parametrize("name", HAND_OFF)
def test_each_c_struct_sequence_has_the_fields_of_its_python_type(name: str) -> None:
    """The C core's results are named: each struct sequence has the field names of the perfsdk.records type of the
    same name, in the same order — a field added, dropped or moved on one side only fails here."""
    from perfsdk import records

    c_type, py_type = getattr(native, name), getattr(records, name)
    assert c_type.__match_args__ == py_type._fields
    assert c_type.n_fields == c_type.n_sequence_fields == len(py_type._fields)


@needs_c
def test_both_cores_hand_back_the_records_types() -> None:
    from perfsdk import records

    recs = random_records(random.Random(9), 200)
    for core in (py_core(costs(), span_rate=0.5), c_core(costs(), span_rate=0.5)):
        totals, recent = run(core, recs)
        assert type(totals) is records.StepTotals
        assert all(type(p) is records.PhaseTotals for p in totals.phases)
        assert totals.samples and all(type(s) is records.StepSample for s in totals.samples)
        assert totals.window_feed and all(type(e) is records.WindowFeedEntry for e in totals.window_feed)
        assert totals.value_feed and all(type(e) is records.ValueFeedEntry for e in totals.value_feed)
        assert all(type(r) is records.RecentSteps for r in recent)
        assert recent[DECODE].steps == totals.phases[DECODE].steps > 0


@needs_c
def test_the_c_constants_are_the_python_ones() -> None:
    from perfsdk import records, sizes

    for name in ("PREFILL", "DECODE", "MIXED", "TIMED", "HOST", "UNTIMED", "NO_TOKENS", "UNSIZED"):
        assert getattr(native, name) == getattr(records, name), name
    assert native.LENS_SQ_MAX == sizes.LENS_SQ_MAX
    assert len(STEP) <= native.MAX_STEP_BOUNDS
    assert len(UTIL) <= native.MAX_UTIL_BOUNDS


@needs_c
def test_the_c_core_reads_a_pushed_record_by_field_name() -> None:
    """``push`` reads a record's fields by name: the same step in a type with its fields in another order (or any
    object with those attributes) counts exactly as the StepRecord does."""
    from typing import NamedTuple

    class Reordered(NamedTuple):  # StepRecord's fields, reversed
        error: str | None
        lens_count: int
        lens_sq: int
        lens_sum: int
        context_tokens: int
        tokens: int
        batch: int
        end: Any
        start: Any
        t1: int
        t0: int
        timing: int
        phase: int

    recs = random_records(random.Random(3), 500)
    reordered = [Reordered(*{f: getattr(r, f) for f in Reordered._fields}.values()) for r in recs]
    assert run(c_core(costs()), reordered) == run(py_core(costs()), recs)
    with pytest.raises(TypeError, match="StepRecord"):
        c_core(costs()).push((0,) * 13)  # a bare tuple has no names


@needs_c
def test_the_c_core_allocates_the_capacities_it_is_given() -> None:
    """The buffers' capacities are given to the C core (perfsdk.records defines them once); none is built in."""
    kw: dict[str, Any] = {
        "costs": costs(),
        "capacity": 100,
        "span_rate": 1.0,
        "poll_interval": 0.001,
        "events": None,
        "event_capacity": 0,
        "event_prefill": 0,
        "new_event": None,
        "destroy_event": None,
        "step_bounds": STEP,
        "util_bounds": UTIL,
        "idle_max": 0.1,
    }
    with pytest.raises(TypeError):
        native.StepCore(**kw)  # no capacities: refused, not defaulted
    with pytest.raises(ValueError, match="recent"):
        native.StepCore(**kw, recent=0, samples=2, window_feed=4, value_feed=5)
    core = native.StepCore(**kw, recent=3, samples=2, window_feed=4, value_feed=5)
    recs = [StepRecord(DECODE, HOST, 0, 1_000_000 * (i + 1), None, None, 1, -1, 10, 0, 0, 0, None) for i in range(9)]
    core.feed_window = core.feed_values = True
    core.start()
    try:
        for r in recs:
            assert core.push(r)
        assert core.sync(10)
        totals, recent = core.take(), core.recent(DECODE)
    finally:
        core.stop(10)
    assert recent.seconds == (0.007, 0.008, 0.009)  # the last 3
    assert len(totals.samples) == 2 and core.dropped_samples == 7
    assert [e.seconds for e in totals.window_feed] == [0.006, 0.007, 0.008, 0.009]  # the latest 4
    assert len(totals.value_feed) == 5 and totals.value_feed_dropped == 4


def test_the_named_formulas_are_the_budget_ones_and_the_cores() -> None:
    """``stepcost.StepCosts`` is the one source of the formulas: each named piece is what ``budget`` returns for
    that quantity, and what a step core's ``cost()`` prices a step with, to the last bit."""
    rng = random.Random(8)
    for spec in (MODEL, MODEL.with_tp(2), ModelSpec(name="x", params=1e9, weight_bytes=2e9)):
        c = costs(spec)
        for _ in range(200):
            lens = [rng.randrange(1, 5000) for _ in range(rng.randrange(1, 6))]
            ctx, batch = rng.randrange(0, 100_000), rng.randrange(1, 256)
            s, sq, n = lens_summary(PREFILL, len(lens), -1, lens)
            # without the KV shape the core leaves the KV bytes out (a floor asking for them is a ConfigError)
            assert c.decode_bytes(batch, ctx) == budget.decode_step_bytes(spec, ctx if c.kv else 0, batch)
            assert c.decode_flops(batch, ctx) == budget.decode_flops(spec, batch, ctx)
            assert c.prefill_bytes(s, ctx) == budget.prefill_step_bytes(spec, lens, ctx)
            assert c.prefill_flops(s, sq, n, ctx) == budget.prefill_flops(spec, lens, attention=c.kv, cached_tokens=ctx)
            if c.kv:
                assert c.attention_flops(s, sq, n, ctx) == budget.attention_flops(spec, lens, ctx)
            assert c.mixed_bytes(batch, ctx, s) == budget.mixed_step_bytes(spec, lens, ctx, batch)
            assert c.mixed_flops(batch, ctx, s, sq, n) == budget.mixed_step_flops(spec, lens, batch, ctx)
            assert c.cost(DECODE, batch, ctx, 0, 0, 0) == (
                c.decode_bytes(batch, ctx),
                c.decode_flops(batch, ctx),
                batch,
            )
            assert c.cost(PREFILL, len(lens), ctx, s, sq, n) == (
                c.prefill_bytes(s, ctx),
                c.prefill_flops(s, sq, n, ctx),
                s,
            )
            assert c.cost(MIXED, batch, ctx, s, sq, n) == (
                c.mixed_bytes(batch, ctx, s),
                c.mixed_flops(batch, ctx, s, sq, n),
                s + batch,
            )
        assert budget.mbu(1e9, 0.01, 2e12) == utilization(1e9, 0.01, 2e12) == 1e9 / (0.01 * 2e12)
