"""Repetitions and noise without a server: the interval method against SciPy, the pooled summary of
repetitions, the result file's two formats, and compare's "within noise"."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from perfsdk.bench import BenchResult, RequestRecord
from perfsdk.bench.compare import ComparisonRow, compare_results, format_comparison, metric_path
from perfsdk.bench.noise import difference_interval, t_quantile
from perfsdk.bench.report import format_spread, summarize, summarize_repetitions
from perfsdk.bench.result import Repetition
from perfsdk.errors import ConfigError


@pytest.mark.parametrize("df", [1, 2, 3, 4, 5.5, 7, 30, 120, 1e4, 0.7])
def test_t_quantile_matches_scipy(df: float) -> None:
    assert t_quantile(df) == pytest.approx(stats.t.ppf(0.975, df), rel=1e-9)
    assert t_quantile(df, 0.9) == pytest.approx(stats.t.ppf(0.95, df), rel=1e-9)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True])
def test_t_quantile_refuses_bad_degrees_of_freedom(bad: float) -> None:
    with pytest.raises(ValueError, match="df"):
        t_quantile(bad)


def test_the_interval_is_welchs_and_the_single_run_case_is_pooled() -> None:
    rng = np.random.default_rng(1)
    for na, nb in ((3, 3), (3, 5), (2, 4), (10, 3)):
        a, b = list(rng.normal(10, 2, na)), list(rng.normal(12, 0.5, nb))
        ci = difference_interval(a, b)
        assert ci is not None
        ref = stats.ttest_ind(b, a, equal_var=False).confidence_interval(0.95)
        assert (ci.low, ci.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    # one run against three: the single run is taken to spread like the repeated side (pooled t)
    ci = difference_interval([10.2], [11.8, 14.0, 12.2])
    ref = stats.ttest_ind([11.8, 14.0, 12.2], [10.2], equal_var=True).confidence_interval(0.95)
    assert ci is not None and (ci.low, ci.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
    # one value a side: no noise estimate, no interval
    assert difference_interval([10.0], [30.0]) is None
    # no spread at all: the interval is the point
    point = difference_interval([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    assert point is not None and (point.low, point.high) == (1.0, 1.0) and not point.spans_zero


def test_compare_rows_say_within_noise_when_the_interval_spans_zero() -> None:
    noisy = ComparisonRow("TTFT median (ms)", 30.0, 45.0, False, (10.0, 30.0, 50.0), (20.0, 45.0, 70.0))
    assert noisy.interval is not None and noisy.interval.spans_zero
    assert noisy.verdict == "within noise"
    clear = ComparisonRow("TTFT median (ms)", 30.0, 45.0, False, (29.0, 30.0, 31.0), (44.0, 45.0, 46.0))
    assert clear.verdict == "worse" and clear.interval is not None and clear.interval.low > 0
    single = ComparisonRow("TTFT median (ms)", 30.0, 45.0, False)
    assert single.interval is None and single.verdict == "worse"
    table = format_comparison([single])
    assert "Noise unknown" in table and "--repeat 3" in table and "interval" not in table.splitlines()[0]
    table = format_comparison([noisy, clear])
    assert "95% interval of delta" in table and "Welch t" in table


def test_metric_names_map_back_to_summary_paths() -> None:
    assert metric_path("failed requests") == (("failed",), False)
    assert metric_path("output throughput (tok/s)") == (("output_throughput",), True)
    assert metric_path("TTFT P99 (ms)") == (("ttft_ms", "p99"), False)
    assert metric_path("ITL P99.9 (ms)") == (("itl_ms", "p99.9"), False)
    assert metric_path("TPOT median (ms)") == (("tpot_ms", "median"), False)
    assert metric_path("TTFT p99") is None
    assert metric_path("XYZ P99 (ms)") is None


def _rec(i: int, start: float, ttft: float, gaps: int) -> RequestRecord:
    r = RequestRecord(index=i, start=start, ttft=ttft, itl=[0.01] * gaps, output_tokens=gaps + 1, prompt_len=8)
    r.e2el = ttft + 0.01 * gaps
    r.stream_end = r.e2el
    return r


def _reps() -> list[list[RequestRecord]]:
    return [[_rec(0, 0.0, 0.1, 4), _rec(1, 0.0, 0.2, 4)], [_rec(0, 0.0, 0.3, 4), _rec(1, 0.5, 0.4, 4)]]


def test_repetitions_pool_into_one_summary_with_per_repetition_peaks() -> None:
    reps = _reps()
    summaries = [summarize(r, duration_s=1.0) for r in reps]
    pooled = summarize_repetitions(reps, summaries)
    assert pooled["repetitions"] == 2
    assert pooled["completed"] == 4 and pooled["duration_s"] == pytest.approx(2.0)
    assert pooled["ttft_ms"]["median"] == pytest.approx(250.0)  # every request of both repetitions
    assert pooled["request_throughput"] == pytest.approx(2.0)  # 4 requests over 2 s
    # both repetitions start at t = 0: pooled records would count 3 in flight, none ever was more than 2
    assert pooled["max_concurrent_requests"] == 2
    spread = format_spread(summaries)
    assert "Spread across 2 repetitions" in spread and "Mean TTFT (ms)" in spread


def test_result_files_one_repetition_is_format_1_several_are_format_2(tmp_path: Path) -> None:
    reps = _reps()
    summaries = [summarize(r, duration_s=1.0) for r in reps]
    single = BenchResult({"seed": 0}, summaries[0], reps[0])
    single.save(tmp_path / "one.json")
    data = json.loads((tmp_path / "one.json").read_text())
    assert data["format"] == 1 and "repetitions" not in data and len(data["records"]) == 2  # as before --repeat

    repeated = BenchResult(
        {"seed": 0},
        summarize_repetitions(reps, summaries),
        [r for rr in reps for r in rr],
        [],
        {},
        [Repetition(s, r) for s, r in zip(summaries, reps, strict=True)],
    )
    repeated.save(tmp_path / "three.json")
    data = json.loads((tmp_path / "three.json").read_text())
    assert data["format"] == 2 and len(data["repetitions"]) == 2 and data["records"] == []
    loaded = BenchResult.load(tmp_path / "three.json")
    assert [rep.where for rep in loaded.repetitions] == ["repetitions[0].summary", "repetitions[1].summary"]
    assert len(loaded.records) == 4
    assert loaded.repetitions[1].summary["ttft_ms"]["mean"] == pytest.approx(350.0)
    assert "Spread across 2 repetitions" in loaded.format()

    # a file written before repetitions existed (format 1, no "repetitions") reads as one repetition
    old = BenchResult.load(tmp_path / "one.json")
    assert len(old.repetitions) == 1 and old.repetitions[0].summary == old.summary
    rows = {r.metric: r for r in compare_results(old, loaded)}
    ttft = rows["TTFT mean (ms)"]
    assert ttft.a_values == (pytest.approx(150.0),) and len(ttft.b_values) == 2
    assert ttft.b == pytest.approx(250.0)  # the mean of the repetitions' means
    assert ttft.interval is not None  # one run against two: the pooled interval


def test_a_wrong_structure_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}, "repetitions": [{"summary": {"tpot_ms": []}}]}))
    with pytest.raises(ConfigError, match=r"bad.json.*repetitions\[0\].summary.tpot_ms: expected an object"):
        BenchResult.load(bad)
