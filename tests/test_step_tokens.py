"""One call per step for the tokens of every sequence in it: ``step.tokens(requests)`` and ``mon.tokens(requests)``.

Under a controlled clock each must record exactly what one ``req.tokens(n)`` per request at the same moment
records — counts, TTFT, inter-token gaps, TPOT, durations, spans — on both hot paths; the event is bounded like
every request event, and bad values are refused as ``req.tokens`` refuses them.
"""

from __future__ import annotations

import gc
import random
import sys
from typing import Any

import pytest
from prometheus_client import generate_latest

import perfsdk
from perfsdk.errors import ConfigError
from perfsdk.testing import FakeClock, monitor_harness

pytestmark = pytest.mark.usefixtures("each_hot_path")  # the C step wrappers and the Python reference

TTFT = "gen_ai_server_time_to_first_token_seconds"
ITL = "perfsdk_inter_token_latency_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"


def serve(how: str, seed: int) -> tuple[list[str], list[tuple[Any, ...]], list[int]]:
    """A decode loop over requests that arrive, emit one or several tokens a step and finish, with tokens recorded
    *how*: ``"each"`` (``req.tokens(n)`` per request right after the step), ``"step"`` (``step.tokens(running)``
    inside it) or ``"monitor"`` (``mon.tokens(running)`` right after it). Everything the Monitor exported."""
    rng = random.Random(seed)
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        mon = h.monitor
        running: list[perfsdk.Request] = []
        done: list[perfsdk.Request] = []
        for i in range(120):
            if rng.random() < 0.3 or not running:
                req = mon.request(prompt_tokens=rng.randrange(1, 100), request_id=f"r{i}")
                clock.advance(rng.choice((0.0, 0.001, 0.004)))
                req.scheduled()
                running.append(req)
            n = 2 if i % 5 == 0 else 1  # now and then a speculative burst: two tokens a step for everyone
            with mon.decode(batch=len(running), context_tokens=100 * len(running)) as step:
                clock.advance(rng.choice((0.010, 0.0125, 0.020)))  # the step's work
                if how == "step":
                    step.tokens(running, n)
            if how == "each":
                for r in running:
                    r.tokens(n)
            elif how == "monitor":
                mon.tokens(running, n=n)
            for r in [r for r in running if rng.random() < 0.1]:  # finished right after the step
                running.remove(r)
                r.finish("length" if rng.random() < 0.5 else "stop")
                done.append(r)
            clock.advance(rng.choice((0.0, 0.0002, 0.001)))  # the loop's own work between steps
        for r in running:
            r.finish()
            done.append(r)
        h.flush()
        text = generate_latest(h.registry).decode()
        base = mon.epoch_ns(0)  # span times are epoch times: each Monitor's offset differs
        spans = sorted(
            (s.name, s.start_time - base, s.end_time - base, tuple(sorted((s.attributes or {}).items())))
            for s in h.spans()
        )
        assert mon.stats()["internal_errors"] == 0
        return (
            [ln for ln in text.splitlines() if not ln.startswith("#") and "_created" not in ln],
            spans,
            [r.output_tokens for r in done],
        )


@pytest.mark.parametrize("seed", [1, 2])
def test_one_call_per_step_records_exactly_what_a_call_per_request_does(seed: int) -> None:
    each = serve("each", seed)
    assert serve("step", seed) == each
    assert serve("monitor", seed) == each
    lines, _, outputs = each
    assert sum(outputs) > 300  # the loop did emit tokens, and they are counted
    assert any(ln.startswith(TTFT + "_count") for ln in lines) and any(ln.startswith(ITL + "_count") for ln in lines)


def test_ttft_and_gaps_are_the_steps_exit_times() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        mon = h.monitor
        a, b = mon.request(), mon.request()
        clock.advance(0.100)
        with mon.decode(batch=2) as step:
            clock.advance(0.020)
            step.tokens([a, b])  # stamped with the exit, not the call
            clock.advance(0.005)
        clock.advance(0.001)
        with mon.decode(batch=1) as step:
            step.tokens((a,))
            clock.advance(0.030)
        a.finish()
        b.finish()
        assert h.count(TTFT) == 2
        assert h.sum(TTFT) == pytest.approx(2 * 0.125)
        assert h.count(ITL) == 1
        assert h.sum(ITL) == pytest.approx(0.031)
        assert (a.output_tokens, b.output_tokens) == (2, 1)  # read after the flush: the collector updated them
        assert a.token_ns == [a.arrival_ns + 125_000_000, a.arrival_ns + 156_000_000]


def test_a_request_finished_inside_the_step_does_not_get_its_tokens() -> None:
    """Finished before the step's exit, a request's record is closed, as ``req.tokens`` after ``finish`` is: so
    a request is finished after the step that emitted its last token."""
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        mon = h.monitor
        early, late = mon.request(), mon.request()
        with mon.decode(batch=2) as step:
            clock.advance(0.010)
            step.tokens([early, late])
            early.finish()  # inside the step: before the exit the tokens are stamped with
        late.finish()  # at the exit's time: its token counts
        h.flush()
        assert (early.output_tokens, late.output_tokens) == (0, 1)
        assert h.count(TTFT) == 1
        assert mon.stats()["internal_errors"] == 0


def test_tokens_outside_a_step_are_recorded_at_the_call() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        mon = h.monitor
        req = mon.request()
        step = mon.decode(batch=1)
        clock.advance(0.040)
        step.tokens([req])  # not entered: now
        clock.advance(0.010)
        mon.tokens([req], n=3)
        req.finish()
        assert h.sum(TTFT) == pytest.approx(0.040)
        assert h.sum(ITL) == pytest.approx(0.010)
        assert req.output_tokens == 4


def test_a_step_tokens_event_is_bounded_like_every_request_event() -> None:
    """A full request queue drops the step's tokens event and counts it; the step itself is still recorded."""
    clock = FakeClock()
    with monitor_harness(clock=clock, queue_size=2, export_interval=60) as h:
        mon = h.monitor
        req = mon.request()
        h.flush()  # the collector's round is over: it sleeps until woken
        mon.tokens([req])
        clock.advance(0.01)
        mon.tokens([req])  # the queue is full now
        with mon.decode(batch=1) as step:
            clock.advance(0.01)
            step.tokens([req])  # dropped, counted
        assert mon.stats()["dropped_records"] == 1
        h.flush()  # a flush marker is never dropped: the collector reads the queue
        req.finish()
        h.flush()
        assert req.output_tokens == 2
        assert h.value("perfsdk_dropped_records_total") == 1
        assert h.count("perfsdk_step_seconds", phase="decode") == 1


def test_bad_values_raise_in_strict_mode() -> None:
    with monitor_harness() as h:
        mon = h.monitor
        req = mon.request()
        with mon.decode(batch=1) as step:
            with pytest.raises(ConfigError, match="n"):
                step.tokens([req], n=-1)
            with pytest.raises(ConfigError, match="n"):
                step.tokens([req], 1.5)  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="sequence of requests"):
                step.tokens("abc")  # type: ignore[arg-type]
            with pytest.raises(ConfigError, match="perfsdk requests"):
                step.tokens([req, "not a request"])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match="sequence of requests"):
            mon.tokens(5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            step.tokens()  # type: ignore[call-arg]


def test_bad_values_never_raise_into_the_server_and_are_counted() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock, strict=False) as h:
        mon = h.monitor
        req = mon.request()
        with mon.decode(batch=1) as step:
            step.tokens([req], n=-1)
            step.tokens(iter(()).__next__)  # type: ignore[arg-type]
            step.tokens([req, "not a request", None])  # type: ignore[list-item]
            step.tokens([], 1)
            step.tokens([req], 0)
        with mon.decode(batch=-1) as refused:  # a bad size: the step is not recorded, its tokens still are
            refused.tokens([req])
        req.finish()
        h.flush()
        assert req.output_tokens == 2  # the good emission in the step, and the refused step's
        assert mon.stats()["internal_errors"] == 5  # n=-1, not iterable, two non-requests, batch=-1


def test_a_disabled_or_closed_monitor_records_nothing() -> None:
    off = perfsdk.Monitor(enabled=False, prometheus=False, otel=False)
    req = off.request()
    with off.decode(batch=1) as step:
        step.tokens([req])
    off.tokens([req])
    assert req.output_tokens == 0
    with monitor_harness() as h:
        mon = h.monitor
        req = mon.request()
        with mon.decode(batch=2) as step:  # a disabled Monitor's request among them: nothing, and no error
            step.tokens([off.request(), req])
        h.flush()
        assert req.output_tokens == 1
        assert mon.stats()["internal_errors"] == 0
    mon.tokens([req])
    with mon.decode(batch=1) as step:
        step.tokens([req])
    assert mon.stats()["calls_after_close"] == 2  # the step and mon.tokens, each counted once


def test_no_reference_is_leaked_or_kept(each_hot_path: str) -> None:
    """A step keeps its requests until its exit hands them over, then lets go of them: after the collector has
    read every event, the list and the requests have the references they started with."""
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        mon = h.monitor
        running = [mon.request() for _ in range(8)]

        def run(n: int) -> None:
            for i in range(n):
                with mon.decode(batch=8) as step:
                    clock.advance(0.001)
                    step.tokens(running)
                    if i % 7 == 0:
                        step.tokens(tuple(running[:2]), n=2)  # a second call in the same step
                if i % 11 == 0:
                    mon.decode(batch=1).tokens(running)  # outside a step

        run(50)
        h.flush()
        gc.collect()
        before = (sys.getrefcount(running), [sys.getrefcount(r) for r in running])
        run(500)
        h.flush()
        gc.collect()
        assert (sys.getrefcount(running), [sys.getrefcount(r) for r in running]) == before
        assert running[0].output_tokens == 50 + 500 + 2 * (8 + 72) + 5 + 46
