"""Histogram bounds that resolve a GPU: fine where decode steps and tokens live, a superset of the semconv bounds."""

from __future__ import annotations

import pytest

from perfsdk import buckets
from perfsdk.buckets import BUCKETS, SEMCONV_DURATION, SEMCONV_TPOT, SEMCONV_TTFT, bucket_index
from perfsdk.testing import FakeClock, monitor_harness


@pytest.mark.parametrize(
    ("name", "semconv"), [("ttft", SEMCONV_TTFT), ("tpot", SEMCONV_TPOT), ("duration", SEMCONV_DURATION)]
)
def test_a_superset_of_the_semconv_bounds(name: str, semconv: tuple[float, ...]) -> None:
    # a query written for the semantic conventions' buckets (le="0.1") still finds its bucket
    assert set(semconv) <= set(BUCKETS[name])


@pytest.mark.parametrize("name", sorted(BUCKETS))
def test_bounds_are_increasing(name: str) -> None:
    b = BUCKETS[name]
    assert list(b) == sorted(set(b)) and b[0] > 0


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("step", 0.0005),
        ("step", 0.0013),
        ("step", 0.0021),
        ("tpot", 0.001),
        ("tpot", 0.0021),
        ("itl", 0.001),
        ("itl", 0.0032),
    ],
)
def test_a_gpu_step_and_token_are_resolved(name: str, value: float) -> None:
    """An H200 decode step of 0.5-2 ms and a 1-3 ms TPOT land in a bucket at most a third wide, not in the first."""
    b = BUCKETS[name]
    i = bucket_index(b, value)
    assert 0 < i < len(b)
    assert b[i] / b[i - 1] <= 4 / 3


def test_ttft_and_queue_reach_past_ten_seconds() -> None:
    for name in ("ttft", "queue"):
        assert BUCKETS[name][-1] >= 60 and 30.0 in BUCKETS[name]


def test_server_quantiles_of_millisecond_tokens_are_not_one_bucket() -> None:
    """Three requests at 1.0, 1.5 and 2.2 ms per output token: three different buckets (one before)."""
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        for gap in (0.001, 0.0015, 0.0022):
            req = h.monitor.request(prompt_tokens=8)
            clock.advance(0.01)
            for _ in range(11):
                req.tokens(1)
                clock.advance(gap)
            req.finish("length")
        tpot = "gen_ai_server_time_per_output_token_seconds_bucket"
        cumulative = [h.value(tpot, le=repr(b)) or 0 for b in buckets.TPOT]
        assert len({c for c in cumulative if 0 < c < 3}) == 2  # they split: 1, 2 and then all 3
