"""Hostile-but-fair values and faults against the core (issue 14): none reaches the server, none corrupts a
counter, every one is counted.

A Monitor's serving-side calls never raise on a value (an OpenTelemetry-style rule): the record is dropped,
counted in ``perfsdk_internal_errors_total`` with its site, and logged once with the value. Strict mode
(``Monitor(strict=True)``, on in :mod:`perfsdk.testing`'s harness) raises instead, so tests catch caller
bugs. Settings given at construction (arguments or ``PERFSDK_*``) keep raising clear errors.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

import perfsdk
from perfsdk.errors import ConfigError
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.records import MAX_COUNT
from perfsdk.testing import FakeClock, monitor_harness

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 989e12})
TOKENS = "perfsdk_step_tokens_total"
STEP = "perfsdk_step_seconds"
E2E = "gen_ai_server_request_duration_seconds"
ERRORS = "perfsdk_internal_errors_total"

pytestmark = pytest.mark.usefixtures("each_hot_path")


def lenient(**kw: Any) -> Any:
    """A harness Monitor in the production mode: bad values are dropped and counted, never raised."""
    kw.setdefault("model", MODEL)
    kw.setdefault("hardware", HW)
    return monitor_harness(strict=False, **kw)


# ---- item 3: absurd sizes never poison a counter; odd token counts never reach one -------------------
@pytest.mark.parametrize("absurd", [10**30, 10**20, 2**41])
def test_one_absurd_step_size_does_not_poison_the_counters(absurd: int) -> None:
    with lenient() as h:
        mon = h.monitor
        with mon.decode(batch=absurd, context_tokens=absurd):
            pass
        for _ in range(5):
            with mon.decode(batch=3, context_tokens=100):
                pass
        assert h.value(TOKENS, phase="decode") == 15  # exact: nothing absorbed the later increments
        assert h.count(STEP, phase="decode") == 5
        assert h.value(ERRORS) == 1


@pytest.mark.parametrize("n", [float("nan"), 1.5, float("inf"), -1, "3", None, True, 2**60])
def test_odd_token_counts_are_refused_and_counted(n: Any) -> None:
    with lenient(otel=None) as h:
        req = h.monitor.request(prompt_tokens=4)
        req.tokens(1)
        req.tokens(n)  # type: ignore[arg-type]
        req.tokens(2)
        req.finish()
        assert req.output_tokens == 3
        assert h.value(ERRORS) == 1
        if h.exporter is not None:
            [span] = [s for s in h.spans() if s.parent is None]
            assert span.attributes["gen_ai.usage.output_tokens"] == 3


def test_measured_values_of_the_wrong_type_are_refused_and_counted() -> None:
    with lenient() as h:
        mon = h.monitor
        mon.record_latencies(None)  # type: ignore[arg-type]
        mon.record_latencies(ttft_s="0.1")  # type: ignore[arg-type]
        mon.record_finished(e2e_s=float("nan"))
        mon.record_step("decode", 0.01, batch="8")  # type: ignore[arg-type]
        mon.record_step("verify", 0.01)
        assert h.value(ERRORS) == 5
        mon.record_latencies(ttft_s=[0.1])
        assert h.count("gen_ai_server_time_to_first_token_seconds") == 1


def test_a_finish_before_arrival_never_makes_a_negative_duration() -> None:
    clock = FakeClock()
    with lenient(clock=clock) as h:
        req = h.monitor.request(prompt_tokens=1)
        clock.advance(0.5)
        req.finish(t_ns=req.arrival_ns - 10**9)
        assert h.count(E2E) == 1
        assert h.sum(E2E) >= 0
        assert h.value(ERRORS) == 1


# ---- item 4: the hot path never raises on values; strict mode does -------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [{"batch": -1}, {"batch": 1.5}, {"context_tokens": "many"}, {"batch": float("nan")}, {"context_tokens": 10**70}],
)
def test_a_bad_size_is_dropped_counted_and_logged_once_with_the_value(
    kwargs: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    with lenient() as h, caplog.at_level(logging.ERROR, logger="perfsdk"):
        ran = 0
        for _ in range(3):
            with h.monitor.decode(**kwargs):
                ran += 1
        assert ran == 3
        assert h.value(ERRORS) == 3
        assert h.count(STEP, phase="decode") == 0
        logged = [r for r in caplog.records if "decode() sizes" in r.getMessage()]
        assert len(logged) == 1
        assert repr(next(iter(kwargs.values()))) in str(logged[0].exc_info[1])  # the value is in the log


def test_strict_mode_raises_for_the_same_values() -> None:
    with monitor_harness() as h:  # the harness is strict
        with pytest.raises(ConfigError, match="batch"):
            h.monitor.decode(batch=-1)
        with pytest.raises(ConfigError, match=r"request\.tokens"):
            h.monitor.request().tokens(1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="batch"):
        perfsdk.Monitor(registry=CollectorRegistry(), strict=True, otel=False).decode(batch=-1)


# ---- item 5: every numeric setting is validated, arguments and environment alike ------------------------
@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"poll_interval": float("nan")}, "poll_interval"),
        ({"poll_interval": float("inf")}, "poll_interval"),
        ({"poll_interval": 1e10}, "poll_interval"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"queue_size": 1.9}, "queue_size"),
        ({"queue_size": True}, "queue_size"),
        ({"export_interval": -1}, "export_interval"),
        ({"step_span_rate": float("nan")}, "step_span_rate"),
        ({"event_pool_size": 2**40}, "event_pool_size"),
        ({"timing_every": 0.5}, "timing_every"),
    ],
)
def test_bad_settings_fail_at_construction(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        perfsdk.Monitor(registry=CollectorRegistry(), otel=False, **kw)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("PERFSDK_METRICS_PORT", "abc"),
        ("PERFSDK_QUEUE_SIZE", "1.9"),
        ("PERFSDK_POLL_INTERVAL", "nan"),
        ("PERFSDK_ENABLED", "maybe"),
        ("PERFSDK_STEP_SPAN_RATE", "2"),
        ("PERFSDK_METRICS_PORT", "70000"),
    ],
)
def test_bad_environment_settings_name_the_variable(var: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError, match=f"{var} \\(environment\\)"):
        perfsdk.Monitor(registry=CollectorRegistry(), otel=False)


def test_the_collector_survives_an_extreme_but_valid_poll_interval() -> None:
    with lenient(poll_interval=10) as h:  # the longest allowed idle sleep: flush still wakes everything
        with h.monitor.decode(batch=1):
            pass
        assert h.monitor.flush(20)
        assert h.count(STEP, phase="decode") == 1


def test_serving_metrics_again_on_another_port_is_refused() -> None:
    with lenient() as h:
        srv = h.monitor.serve_metrics(port=0)
        assert h.monitor.serve_metrics() is srv and h.monitor.serve_metrics(port=srv.port) is srv
        with pytest.raises(ConfigError, match="already serves"):
            h.monitor.serve_metrics(port=srv.port + 1)
        with pytest.raises(ConfigError, match="port"):
            perfsdk.Monitor(registry=CollectorRegistry(), otel=False).serve_metrics(port="9400")  # type: ignore[arg-type]


# ---- item 9: a slow span exporter holds back spans only; close(timeout) keeps its word --------------------
class SlowExporter:
    """A span exporter that takes 0.5 s per span (behind a SimpleSpanProcessor: synchronous)."""

    def __init__(self) -> None:
        self.exported = 0
        self.release = threading.Event()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.release.wait(0.5)
        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_slow_span_exporter_never_holds_back_metrics() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    slow = SlowExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(slow))  # type: ignore[arg-type]
    reg = CollectorRegistry()
    mon = perfsdk.Monitor(
        model=MODEL, hardware=HW, registry=reg, tracer_provider=provider, timing="host", nvtx=False, model_name="m"
    )
    for _ in range(50):
        with mon.request(prompt_tokens=8) as req:
            req.tokens(1)
    for _ in range(20_000):
        with mon.decode(batch=1):
            pass
    mon.flush(timeout=1.0)  # the spans are not all out by then: 50 of them take 25 s
    assert reg.get_sample_value(f"{STEP}_count", {"model": "m", "phase": "decode"}) == 20_000
    assert reg.get_sample_value(f"{E2E}_count", {"model": "m"}) == 50
    mon.close(timeout=1.0)
    assert slow.exported < 50  # close() kept to its timeout instead of waiting out every export
    slow.release.set()
    provider.shutdown()


# ---- issue 20, item 9: a span dropped by any cap is counted, in stats() and in Prometheus ------------------
DROPPED_SPANS = "perfsdk_dropped_spans_total"


def test_step_spans_beyond_the_per_interval_cap_are_counted() -> None:
    pytest.importorskip("opentelemetry.sdk")
    with lenient(step_span_rate=1.0, export_interval=60) as h:
        for _ in range(5000):  # one export interval: at most 4,096 sampled steps become spans
            h.monitor.record_step("decode", 0.001, batch=1)
        built = len([s for s in h.spans() if s.name == "decode step"])
        dropped = h.monitor.stats()["dropped_spans"]
        assert built + dropped == 5000
        assert dropped > 0
        assert h.value(DROPPED_SPANS, reason="sample_cap") == dropped


def test_spans_a_full_span_queue_drops_are_exported_with_their_reason() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    slow = SlowExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(slow))  # type: ignore[arg-type]
    reg = CollectorRegistry()
    mon = perfsdk.Monitor(
        registry=reg,
        tracer_provider=provider,
        timing="host",
        nvtx=False,
        model_name="m",
        step_span_rate=1.0,
        export_interval=60,
    )
    try:
        for _ in range(3):  # 3 x 4,096 spans handed to a span thread stuck on its first: its queue holds 8,192
            for _ in range(4096):
                mon.record_step("decode", 0.001)
            assert mon.flush(30, sinks=False)
        queue_full = reg.get_sample_value(DROPPED_SPANS, {"reason": "queue_full"})
        assert queue_full is not None and queue_full > 0
        assert mon.stats()["dropped_spans"] == queue_full  # nothing else dropped any
    finally:
        slow.release.set()
        mon.close(timeout=5)
        provider.shutdown()


# ---- issue 20, item 12: a negative duration from any clock is dropped and counted, never observed ----------
def test_a_step_whose_clock_goes_backwards_is_counted_untimed_never_observed() -> None:
    clock = FakeClock()
    with lenient(clock=clock) as h:
        mon = h.monitor
        with mon.decode(batch=2, context_tokens=10):
            clock.advance(-1.0)  # the host clock went back a second inside the step
        with mon.decode(batch=2, context_tokens=10):
            clock.advance(0.002)
        assert h.count(STEP, phase="decode") == 1
        assert h.sum(STEP, phase="decode") == pytest.approx(0.002)
        assert h.value(TOKENS, phase="decode") == 4  # both steps count as steps
        assert mon.stats()["decode"]["steps"] == 2
        assert h.value(ERRORS) == 1


def test_request_durations_from_a_clock_that_goes_backwards_are_never_observed() -> None:
    clock = FakeClock()
    with lenient(clock=clock) as h:
        mon = h.monitor
        req = mon.request(prompt_tokens=4)
        clock.advance(0.1)
        req.tokens(1)  # TTFT 0.1
        clock.advance(0.2)
        req.tokens(1)  # ITL 0.2
        clock.advance(-0.25)
        req.finish()  # before its last token: e2e 0.05 < TTFT, a TPOT of -0.05
        late = mon.request(prompt_tokens=1)
        clock.advance(-1.0)
        late.scheduled()  # before its arrival: no queue time
        late.finish()  # before its arrival: no duration
        tpot = "gen_ai_server_time_per_output_token_seconds"
        assert h.count(tpot) == 0
        assert h.count(E2E) == 0
        assert h.count("perfsdk_request_queue_seconds") == 0
        assert h.count("gen_ai_server_time_to_first_token_seconds") == 1  # what did not go backwards still counts
        assert h.sum("perfsdk_inter_token_latency_seconds") == pytest.approx(0.2)
        assert h.value(ERRORS) == 3  # the first finish, the scheduled(), the second finish


def test_negative_times_an_engine_reports_are_counted_never_observed() -> None:
    with lenient() as h:
        mon = h.monitor
        mon.record_latencies(ttft_s=[-0.1, 0.1], itl_s=[-0.2])
        mon.record_finished(e2e_s=1.0, queue_s=-0.5, ttft_s=0.2, output_tokens=5)
        mon.record_finished(e2e_s=1.0, ttft_s=2.0, output_tokens=5)  # a TPOT of -0.25
        assert h.count("gen_ai_server_time_to_first_token_seconds") == 1
        assert h.count("perfsdk_inter_token_latency_seconds") == 0
        assert h.count("perfsdk_request_queue_seconds") == 0
        assert h.count("gen_ai_server_time_per_output_token_seconds") == 1  # the first request's, 0.2 s
        assert h.value(ERRORS) == 4


# ---- the property: arbitrary values through both hot paths ------------------------------------------------
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.integers(min_value=0, max_value=10_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
    st.text(max_size=3),
    st.lists(st.integers(min_value=-5, max_value=2**33), max_size=4),
)


def valid_count(v: Any) -> bool:
    return type(v) is int and 0 <= v <= MAX_COUNT


def expected_tokens(phase: str, batch: Any, tokens: Any, ctx: Any, lens: Any) -> int | None:
    """The tokens a valid step counts, None when perfsdk must refuse the step."""
    if not (valid_count(batch) and valid_count(ctx)) or not (tokens is None or valid_count(tokens)):
        return None
    if lens is not None:
        if not isinstance(lens, list) or not all(valid_count(n) for n in lens):
            return None
        if sum(n * n for n in lens) >= 2**62:
            return None
    if phase == "decode":
        return int(batch)
    if phase == "prefill":
        if lens is not None:
            return sum(lens)
        if tokens is None:
            return 0
        b = max(batch, 1)
        base, extra = divmod(tokens, b)
        return None if extra * (base + 1) ** 2 + (b - extra) * base * base >= 2**62 else int(tokens)
    return (sum(lens) if lens is not None else 0) + int(batch)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["decode", "prefill", "mixed"]), VALUES, VALUES, VALUES, st.one_of(st.none(), VALUES)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_arbitrary_values_never_raise_never_corrupt_and_always_count(calls: list[tuple[Any, ...]]) -> None:
    with lenient() as h:
        mon = h.monitor
        want_tokens = {"decode": 0, "prefill": 0, "mixed": 0}
        want_steps = dict(want_tokens)
        refused = 0
        for phase, batch, drawn_tokens, ctx, drawn_lens in calls:
            tokens = drawn_tokens if phase == "prefill" else None
            lens = None if phase == "decode" else drawn_lens
            exp = expected_tokens(phase, batch, tokens, ctx, lens)
            if phase == "decode":
                step = mon.decode(batch=batch, context_tokens=ctx)
            elif phase == "prefill":
                step = mon.prefill(tokens=tokens, batch=batch, seq_lens=lens, cached_tokens=ctx)
            else:
                step = mon.mixed(prefill_seq_lens=() if lens is None else lens, decode_batch=batch, context_tokens=ctx)
            if callable(batch) or callable(ctx):
                continue
            with step:
                pass
            if exp is None:
                refused += 1
            else:
                want_tokens[phase] += exp
                want_steps[phase] += 1
        assert mon.flush(10)
        for phase, want in want_tokens.items():
            got = h.value(TOKENS, phase=phase) or 0.0
            assert got == want and math.isfinite(got)
            assert h.count(STEP, phase=phase) == want_steps[phase]
        assert (h.value(ERRORS) or 0) == refused
