"""Unit tests of perfsdk.bench that need no server: lengths, config, arrivals, statistics."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import numpy as np
import pytest
from scipy import stats

from perfsdk.bench import BenchConfig, LengthSpec, RequestRecord
from perfsdk.bench.arrivals import arrival_offsets, inter_arrival_gaps
from perfsdk.bench.config import parse_goodput
from perfsdk.bench.prompts import synthetic_prompt
from perfsdk.bench.report import latency_stats, peak_concurrency, summarize
from perfsdk.errors import ConfigError

# -- LengthSpec ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("128", LengthSpec("fixed", 128)),
        (" 7 ", LengthSpec("fixed", 7)),
        (5, LengthSpec("fixed", 5)),
        ("uniform:64-256", LengthSpec("uniform", 64, 256)),
        ("UNIFORM:3-3", LengthSpec("uniform", 3, 3)),
        ("normal:128,32", LengthSpec("normal", 128, 32)),
        ("normal:10.5,0", LengthSpec("normal", 10.5, 0)),
    ],
)
def test_length_spec_parses(text: str | int, expected: LengthSpec) -> None:
    spec = LengthSpec.parse(text)
    assert spec == expected
    assert LengthSpec.parse(str(spec)) == spec  # str() is the canonical text


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "0",
        "-3",
        "1.5",
        "uniform:9-3",
        "uniform:5",
        "uniform:a-b",
        "normal:1",
        "normal:0,1",
        "normal:5,-1",
        "poisson:3",
        "uniform:0-4",
    ],
)
def test_length_spec_rejects_bad_text_naming_the_field(text: str) -> None:
    with pytest.raises(ConfigError, match=r"^input_len"):
        LengthSpec.parse(text, field="input_len")


def test_length_sampling_is_seeded_and_within_bounds() -> None:
    spec = LengthSpec.parse("uniform:10-20")
    a = spec.sample(random.Random(3), 500)
    assert a == spec.sample(random.Random(3), 500)
    assert min(a) == 10
    assert max(a) == 20
    normal = LengthSpec.parse("normal:100,10").sample(random.Random(0), 4000)
    assert statistics.fmean(normal) == pytest.approx(100, abs=1.0)
    assert statistics.pstdev(normal) == pytest.approx(10, rel=0.1)
    assert min(LengthSpec.parse("normal:2,50").sample(random.Random(0), 200)) == 1  # clamped


# -- BenchConfig ----------------------------------------------------------------------------------


def _cfg(**kw: object) -> BenchConfig:
    base: dict[str, object] = {"base_url": "http://127.0.0.1:9", "model": "m"}
    base.update(kw)
    return BenchConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_url", "127.0.0.1:8000"),
        ("model", ""),
        ("endpoint", "embeddings"),
        ("num_prompts", 0),
        ("num_prompts", 2.5),
        ("request_rate", 0),
        ("request_rate", -1.0),
        ("burstiness", 0),
        ("max_concurrency", 0),
        ("input_len", "uniform:5-1"),
        ("output_len", "normal:x,y"),
        ("warmup", -1),
        ("goodput", {"latency": 5}),
        ("goodput", {"ttft": -5}),
        ("percentiles", (0.0,)),
        ("percentiles", (101.0,)),
        ("timeout_s", 0),
        # non-finite or out-of-range numbers that used to be accepted and crashed (or hung) the run
        ("timeout_s", math.inf),  # aiohttp: OverflowError arming the connect timeout
        ("timeout_s", True),
        ("temperature", math.inf),  # sent as the invalid JSON token Infinity
        ("request_rate", 5e-324),  # gaps of inf seconds: the run never ends
        ("request_rate", 1e-300),  # with burstiness 1e-300 below: rate x burstiness underflows to 0
        ("input_len", "normal:nan,5"),  # round(nan) raised while drawing lengths
        ("input_len", "normal:100,inf"),
        pytest.param("output_len", 10**400, id="output_len-10**400"),  # float() of it raised OverflowError
        pytest.param("output_len", "1" + "0" * 400, id="output_len-'1e400'"),
        ("input_len", "uniform:1-100000000000000000000"),  # prompts built in memory: never finishes
        ("input_len", "1000000000000"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    extra = {"burstiness": 1e-300} if value == 1e-300 else {}
    with pytest.raises(ConfigError, match=rf"^{field}"):
        _cfg(**{field: value}, **extra)


def test_config_normalises_inputs() -> None:
    c = _cfg(base_url="http://h:1/v1/", input_len=64, output_len="uniform:1-9", percentiles=(99, 90, 99))
    assert c.url == "http://h:1/v1/completions"
    assert _cfg(endpoint="chat").url.endswith("/v1/chat/completions")
    assert c.input_len == LengthSpec("fixed", 64)
    assert c.percentiles == (90.0, 99.0)
    assert c.to_dict()["request_rate"] == "inf"
    assert "api_key" not in c.to_dict()
    assert "secret" not in repr(_cfg(api_key="secret"))


def test_parse_goodput() -> None:
    assert parse_goodput(["ttft:500", "TPOT:50", "e2el:2000"]) == {"ttft": 500, "tpot": 50, "e2el": 2000}
    assert parse_goodput(None) == {}
    for bad in (["ttft"], ["ttft:x"], ["itl:5"], ["ttft:0"]):
        with pytest.raises(ConfigError, match=r"^goodput"):
            parse_goodput(bad)


# -- arrival process --------------------------------------------------------------------------------

N_GAPS = 20_000


def test_poisson_arrivals_have_exponential_gaps() -> None:
    rate = 8.0
    gaps = np.array(inter_arrival_gaps(N_GAPS, rate=rate, burstiness=1.0, seed=1234))
    # exponential(rate): mean 1/rate, variance 1/rate²; standard errors at n=20000 are < 1% and ~1.5%
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)
    assert gaps.var() == pytest.approx(1 / rate**2, rel=0.06)
    ks = stats.kstest(gaps, "expon", args=(0, 1 / rate))
    assert ks.pvalue > 0.01
    # and the counts in unit windows are Poisson: index of dispersion ~1
    t = np.cumsum(gaps)
    counts = np.bincount(t.astype(int))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.1)


@pytest.mark.parametrize("burstiness", [0.5, 2.0])
def test_gamma_burstiness_sets_the_coefficient_of_variation(burstiness: float) -> None:
    rate = 4.0
    gaps = np.array(inter_arrival_gaps(N_GAPS, rate=rate, burstiness=burstiness, seed=99))
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.03)  # burstiness never changes the rate
    cv = gaps.std() / gaps.mean()
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    ks = stats.kstest(gaps, "gamma", args=(burstiness, 0, 1 / (rate * burstiness)))
    assert ks.pvalue > 0.01
    # and it is not exponential: the KS test against Poisson gaps rejects it
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue < 1e-6


def test_arrivals_are_seeded_and_infinite_rate_sends_at_once() -> None:
    a = arrival_offsets(50, rate=10.0, seed=7)
    assert a == arrival_offsets(50, rate=10.0, seed=7)
    assert a != arrival_offsets(50, rate=10.0, seed=8)
    assert a[0] == 0.0
    assert all(x <= y for x, y in itertools.pairwise(a))
    assert arrival_offsets(5, rate=math.inf) == [0.0] * 5
    assert inter_arrival_gaps(3, rate=2.0, burstiness=math.inf) == [0.5] * 3
    with pytest.raises(ConfigError, match=r"^burstiness"):
        inter_arrival_gaps(3, rate=2.0, burstiness=0.0)


# -- prompts and statistics --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 17, 128, 1000])
def test_synthetic_prompt_has_exact_byte_length(n: int) -> None:
    text = synthetic_prompt(n, random.Random(0), index=42)
    assert len(text.encode()) == n
    assert text.isascii()


def test_latency_stats_match_numpy() -> None:
    values = list(np.random.default_rng(0).gamma(2.0, 0.01, size=501))
    s = latency_stats(values, (90.0, 99.0, 99.9))
    ms = np.array(values) * 1000
    assert s["mean"] == pytest.approx(ms.mean())
    assert s["std"] == pytest.approx(ms.std())  # population std, as vLLM reports
    assert s["median"] == pytest.approx(np.median(ms))
    for p in (50, 90, 99, 99.9):
        assert s[f"p{p:g}"] == pytest.approx(np.percentile(ms, p))
    empty = latency_stats([], (99.0,))
    assert empty["mean"] is None
    assert empty["p99"] is None
    assert empty["count"] == 0


def _rec(i: int, ttft: float, itl: list[float], tokens: int, error: str | None = None) -> RequestRecord:
    r = RequestRecord(index=i, start=float(i), ttft=ttft, itl=itl, output_tokens=tokens, prompt_len=10)
    r.e2el = ttft + sum(itl)
    r.stream_end = r.e2el
    r.error = error
    return r


def test_summary_tpot_goodput_and_failures() -> None:
    recs = [
        _rec(0, 0.100, [0.010] * 9, 10),  # tpot 10 ms
        _rec(1, 0.300, [0.050] * 4, 5),  # tpot 50 ms
        _rec(2, 0.050, [], 1),  # one token: no TPOT, counts as 0 for goodput
        _rec(3, 0.010, [0.001], 2, error="stream_cut"),
    ]
    s = summarize(recs, duration_s=2.0, percentiles=(99.0,), goodput={"ttft": 200, "tpot": 20})
    assert s["completed"] == 3
    assert s["failed"] == 1
    assert s["failures"] == {"stream_cut": 1}
    assert s["tpot_ms"]["count"] == 2
    assert s["tpot_ms"]["mean"] == pytest.approx(30.0)
    assert s["itl_ms"]["count"] == 13  # pooled gaps of successful requests only
    assert s["good_requests"] == 2  # request 1 misses both SLOs
    assert s["goodput"] == pytest.approx(1.0)
    assert s["total_output_tokens"] == 16
    assert s["output_throughput"] == pytest.approx(8.0)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert summarize(recs, duration_s=2.0)["goodput"] is None


def test_peak_concurrency_counts_overlaps() -> None:
    recs = [_rec(0, 0.1, [0.1] * 20, 21), _rec(1, 0.1, [0.1] * 20, 21), _rec(5, 0.1, [], 1)]
    # intervals [0, 2.1), [1, 3.1), [5, 5.1)
    assert peak_concurrency(recs) == 2
