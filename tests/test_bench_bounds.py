"""Bounded memory per request and per run: endless and flooding streams against the real loopback server
(tests/bench_server.py), and prompts built as they are sent.

Sizes are asserted on the records and the result file (lengths, byte counts) and on how many requests were
built, never on RSS or the clock.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from bench_server import FakeOpenAIServer

import perfsdk.bench.run as bench_run
from perfsdk.bench import BenchConfig, BenchResult, RequestRecord, benchmark
from perfsdk.bench.arrivals import arrival_offsets, inter_arrival_gaps, iter_arrival_offsets
from perfsdk.bench.client import MAX_DERIVED_CHUNKS, chunk_limit
from perfsdk.bench.prompts import synthetic_prompt
from perfsdk.bench.records import GapSummary
from perfsdk.bench.workload import AHEAD_REQUESTS, PlannedRequest, build_ahead, planned_requests
from perfsdk.cli import main
from perfsdk.errors import ConfigError

pytestmark = pytest.mark.slow


def _cfg(url: str, **kw: object) -> BenchConfig:
    base: dict[str, object] = {
        "base_url": url,
        "model": "fake",
        "num_prompts": 3,
        "input_len": 16,
        "output_len": 6,
        "progress": False,
        "timeout_s": 30.0,
        "max_concurrency": 1,  # one at a time: the records in index order met the plan in order
    }
    base.update(kw)
    return BenchConfig(**base)  # type: ignore[arg-type]


def _by_index(records: list[RequestRecord]) -> list[RequestRecord]:
    return sorted(records, key=lambda r: r.index)


# -- one response, bounded --------------------------------------------------------------------------------


def test_an_endless_stream_fails_one_request_at_the_chunk_limit_and_keeps_a_summary(tmp_path: Path) -> None:
    # before: the client kept one gap per chunk until the timeout (6.17 M chunks, 193 MB of result file in 60 s)
    out = tmp_path / "run.json"
    with FakeOpenAIServer(["ok", "endless", "ok"]) as srv:
        result = benchmark(_cfg(srv.url, max_chunks=50, save_result=str(out)))
        assert srv.wait_for_disconnects(1) == 1  # the client hung up on the endless stream
        assert srv.hostile_chunks_sent >= 1000  # it really was sending far more than 50
    s = result.summary
    assert (s["completed"], s["failures"]) == (2, {"too_many_chunks": 1})
    ok1, endless, ok2 = _by_index(result.records)
    assert endless.error == "too_many_chunks"
    assert endless.error_detail is not None and "more than 50 text chunks" in endless.error_detail
    assert "max_chunks" in endless.error_detail
    assert endless.chunks == 50 and endless.ttft is not None
    assert endless.itl == []  # the gaps are summarised, not kept
    summary = endless.itl_summary
    assert summary is not None and summary.count == 49
    assert summary.min is not None and summary.max is not None and summary.p50 is not None
    assert summary.p90 is not None and summary.p99 is not None
    assert 0.0 <= summary.min <= summary.p50 <= summary.p90 <= summary.p99 <= summary.max <= summary.total
    for rec in (ok1, ok2):  # requests within their limits keep every gap, as before
        assert rec.ok and rec.itl_summary is None and len(rec.itl) == 5 == rec.chunks - 1

    saved = json.loads(out.read_text())
    record = saved["records"][endless.index]
    assert record["error"] == "too_many_chunks" and record["itl"] == []
    assert record["itl_summary"]["count"] == 49
    assert len(json.dumps(record)) < 2000  # a summary, not one number per chunk
    loaded = BenchResult.load(out)
    assert _by_index(loaded.records)[1].itl_summary == summary


def test_a_flood_of_tiny_chunks_stops_at_the_limit_derived_from_max_tokens() -> None:
    # 200,000 one-byte chunks, a thousand to a write, then [DONE]: before, a success holding 200,000 gaps
    with FakeOpenAIServer(["flood"], flood_chunks=200_000) as srv:
        result = benchmark(_cfg(srv.url, num_prompts=1, output_len=6))
        assert srv.wait_for_disconnects(1) == 1
    (rec,) = result.records
    limit = chunk_limit(6)
    assert limit == 4 * 6 + 64
    assert rec.error == "too_many_chunks" and rec.chunks == limit
    assert rec.error_detail is not None and "4 x max_tokens (6) + 64" in rec.error_detail
    assert rec.itl == [] and rec.itl_summary is not None and rec.itl_summary.count == limit - 1
    assert result.summary["failures"] == {"too_many_chunks": 1}


def test_an_endless_stream_past_its_timeout_keeps_a_summary_not_every_gap(tmp_path: Path) -> None:
    # a limit too high to reach: the time limit stops the stream, and the gaps are summarised just the same
    out = tmp_path / "run.json"
    with FakeOpenAIServer(["endless"]) as srv:
        result = benchmark(_cfg(srv.url, num_prompts=1, max_chunks=10**12, timeout_s=0.5, save_result=str(out)))
        assert srv.wait_for_disconnects(1) == 1
    (rec,) = result.records
    assert rec.error == "timeout" and rec.chunks > 1
    assert rec.itl == [] and rec.itl_summary is not None and rec.itl_summary.count == rec.chunks - 1
    assert len(json.dumps(json.loads(out.read_text())["records"][0])) < 2000


def test_the_chunk_limit_and_the_gap_summary() -> None:
    assert chunk_limit(128) == 576
    assert chunk_limit(128, 10) == 10  # explicit wins, even below the derived value
    assert chunk_limit(10_000_000) == MAX_DERIVED_CHUNKS
    gaps = list(np.random.default_rng(0).exponential(0.01, 1001))
    s = GapSummary.of(gaps)
    assert s.count == 1001 and s.total == pytest.approx(sum(gaps))
    assert (s.min, s.max) == (min(gaps), max(gaps))
    for q, value in ((50, s.p50), (90, s.p90), (99, s.p99)):
        assert value == pytest.approx(np.percentile(gaps, q))
    assert GapSummary.of([]) == GapSummary(0, 0.0)
    rec = RequestRecord(index=0, itl=[0.1, 0.3])
    rec.summarize_gaps()
    assert rec.itl == [] and rec.itl_summary is not None
    assert (rec.itl_summary.count, rec.itl_summary.min, rec.itl_summary.max) == (2, 0.1, 0.3)
    got = (rec.itl_summary.total, rec.itl_summary.p50, rec.itl_summary.p90, rec.itl_summary.p99)
    assert got == pytest.approx((0.4, 0.2, 0.28, 0.298))


def test_a_bad_gap_summary_in_a_file_is_a_config_error(tmp_path: Path) -> None:
    rec = RequestRecord(index=0).to_dict()
    rec["itl_summary"] = [1, 2]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": {}, "records": [rec]}))
    with pytest.raises(ConfigError, match=r"records\[0\]: not a request record \(itl_summary: expected an object"):
        BenchResult.load(bad)


@pytest.mark.parametrize(("field", "value"), [("max_chunks", 0), ("max_chunks", 2.5), ("duration_s", 0.0),
                                             ("duration_s", float("nan")), ("duration_s", float("inf"))])  # fmt: skip
def test_limits_are_checked_when_the_config_is_built(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"^{field}:"):
        _cfg("http://127.0.0.1:9", **{field: value})


# -- prompts built as they are sent ------------------------------------------------------------------------


def _count_built(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Wrap the run's request plan so that every request it builds is counted (by index)."""
    built: list[int] = []
    real = bench_run.planned_requests

    def counting(config: BenchConfig, **kw: Any) -> Iterator[PlannedRequest]:
        for req in real(config, **kw):
            built.append(req.index)
            yield req

    monkeypatch.setattr(bench_run, "planned_requests", counting)
    return built


@pytest.mark.parametrize("pace", [{"request_rate": 40.0}, {"max_concurrency": 2}])
def test_a_hundred_million_prompts_with_a_duration_send_at_once_and_build_few(
    monkeypatch: pytest.MonkeyPatch, pace: dict[str, object]
) -> None:
    # before: every prompt was built before the first was sent (1e8: 1.69 GB in 20 s and nothing sent), and
    # with --max-concurrency a waiting task per request
    built = _count_built(monkeypatch)
    cfg = _cfg("http://x", num_prompts=10**8, output_len=4, duration_s=0.4, max_concurrency=None, repeat=2)
    plan = planned_requests(cfg)
    assert inspect.isgenerator(plan) and next(plan).index == 0  # lazy: nothing is built before it is asked for
    with FakeOpenAIServer(token_delay_s=0.002) as srv:
        result = benchmark(dataclasses.replace(cfg, base_url=srv.url, **pace))  # type: ignore[arg-type]
        sent = srv.requests
    reps = result.repetitions
    assert len(reps) == 2
    assert sum(len(r.records) for r in reps) == sent
    for rep in reps:
        n = len(rep.records)
        assert 0 < n < 10**8 and rep.summary["num_prompts"] == n == rep.summary["completed"]
        assert [r.index for r in rep.records] == list(range(n))
    # each repetition built at most what it sent, the requests built ahead and the one that ended it
    assert len(built) <= sent + 2 * (AHEAD_REQUESTS + 1)
    assert result.config["duration_s"] == 0.4


def test_every_repetition_sends_the_same_requests_in_the_same_order() -> None:
    load: dict[str, Any] = {"num_prompts": 5, "warmup": 2, "repeat": 3, "seed": 11}
    with FakeOpenAIServer() as srv:
        result = benchmark(
            _cfg(srv.url, request_rate=500.0, input_len="uniform:4-40", output_len="uniform:2-9", **load)
        )
        bodies = [json.dumps(b, sort_keys=True) for b in srv.bodies]
    assert len(bodies) == 2 + 3 * 5  # the warm-up once
    sent = bodies[2:]
    assert sent[0:5] == sent[5:10] == sent[10:15]  # one at a time: the same bodies in the same order
    assert len(set(sent[0:5])) == 5 and not set(bodies[:2]) & set(sent)
    schedules = [[r.scheduled for r in rep.records] for rep in result.repetitions]
    assert schedules[0] == schedules[1] == schedules[2]


def _eager(cfg: BenchConfig) -> list[tuple[int, bool, str, int, int, float]]:
    """The requests as run.py built them up front before they were built lazily (kept here as the reference)."""
    n_warm, n = cfg.warmup, cfg.num_prompts
    rng = random.Random(f"perfsdk.bench.lengths:{cfg.seed}")
    in_lens = cfg.input_spec.sample(rng, n_warm + n)
    out_lens = cfg.output_spec.sample(rng, n_warm + n)
    prompt_rng = random.Random(f"perfsdk.bench.prompts:{cfg.seed}")
    prompts = [synthetic_prompt(in_lens[i], prompt_rng, index=i) for i in range(n_warm + n)]
    gaps = inter_arrival_gaps(n, rate=cfg.request_rate, burstiness=cfg.burstiness, seed=cfg.seed)
    offsets = [0.0, *itertools.accumulate(gaps[1:])]
    scheduled = [0.0] * n_warm + offsets
    return [(i, i < n_warm, prompts[i], in_lens[i], out_lens[i], scheduled[i]) for i in range(n_warm + n)]


def _lazy(cfg: BenchConfig) -> list[tuple[int, bool, str, int, int, float]]:
    return [(r.index, r.warmup, r.prompt, r.prompt_len, r.max_tokens, r.scheduled) for r in planned_requests(cfg)]


@pytest.mark.parametrize(
    ("input_len", "output_len", "as_before"),
    [("128", "uniform:2-300", True), ("normal:60,20", "64", True), ("32", "32", True),
     ("uniform:8-90", "normal:40,9", False)],
)  # fmt: skip
def test_the_lazy_plan_sends_what_the_eager_one_did(input_len: str, output_len: str, as_before: bool) -> None:
    cfg = _cfg("http://x", num_prompts=200, warmup=3, request_rate=7.0, burstiness=0.5, seed=5,
               input_len=input_len, output_len=output_len)  # fmt: skip
    eager, lazy = _eager(cfg), _lazy(cfg)
    if as_before:
        assert lazy == eager  # one length fixed: exactly the requests of earlier versions
    else:
        # both drawn: prompts, input lengths and send times as before; output lengths from their own stream
        assert [(i, w, p, il, s) for i, w, p, il, _, s in lazy] == [(i, w, p, il, s) for i, w, p, il, _, s in eager]
        assert [r[4] for r in lazy] != [r[4] for r in eager]
    # a repetition skips the warm-up and sends the same measured requests
    skipped = [(r.index, r.prompt, r.max_tokens, r.scheduled) for r in planned_requests(cfg, warmup=False)]
    assert skipped == [(i, p, o, s) for i, w, p, _, o, s in lazy if not w]


def test_build_ahead_builds_a_bounded_head_and_keeps_the_order() -> None:
    cfg = _cfg("http://x", num_prompts=10**8, input_len=1000)
    pulled: list[int] = []

    def plan() -> Iterator[PlannedRequest]:
        for req in planned_requests(cfg):
            pulled.append(req.index)
            yield req

    ahead = build_ahead(plan(), max_requests=50, max_bytes=10**9)
    assert len(pulled) == 50  # built before the clock starts
    assert [r.index for r in itertools.islice(ahead, 60)] == list(range(60))
    assert len(pulled) == 60  # the rest one at a time
    build_ahead(plan(), max_requests=50, max_bytes=5_000)
    assert len(pulled) == 60 + 5  # stopped by the bytes: five prompts of 1,000 bytes


def test_iter_arrival_offsets_is_the_list_lazily() -> None:
    for rate, burst in ((8.0, 1.0), (3.0, 0.3), (float("inf"), 1.0), (2.0, float("inf"))):
        lazy = iter_arrival_offsets(10**9, rate=rate, burstiness=burst, seed=4)
        assert list(itertools.islice(lazy, 500)) == arrival_offsets(500, rate=rate, burstiness=burst, seed=4)
    with pytest.raises(ConfigError, match="request_rate"):
        iter_arrival_offsets(10, rate=0.0)  # checked when called, not at the first value


# -- the command line -----------------------------------------------------------------------------------------


def _serve_args(url: str, *extra: str) -> list[str]:
    return ["bench", "serve", "--base-url", url, "--model", "fake", "--num-prompts", "6", "--input-len", "16",
            "--output-len", "6", "--no-progress", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-chunks", "0"), ("--max-chunks", "1.5"), ("--duration", "nan"), ("--duration", "-5"),
     ("--duration", "1e400"), ("--duration", "inf")],
)  # fmt: skip
def test_bad_limits_on_the_command_line_exit_2_naming_the_flag(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = main([*_serve_args("http://127.0.0.1:9"), flag, value])
    except SystemExit as e:  # argparse's own refusal (a value that is not a number at all)
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert re.search(flag.removeprefix("--").replace("-", "[-_]"), err), err
    assert "Traceback" not in err


def test_serve_stops_an_endless_stream_at_max_chunks_and_saves_a_bounded_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: the endless stream was read until --timeout, one gap per chunk in memory and in the file
    out = tmp_path / "run.json"
    with FakeOpenAIServer(["ok", "endless", "ok", "ok", "ok", "ok"]) as srv:
        rc = main(_serve_args(srv.url, "--max-concurrency", "1", "--max-chunks", "40", "--timeout", "60",
                              "--duration", "30", "--save-result", str(out)))  # fmt: skip
        assert srv.wait_for_disconnects(1) == 1
    assert rc == 0  # one failed request is counted, not fatal
    assert "too_many_chunks:" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["config"]["max_chunks"] == 40 and saved["config"]["duration_s"] == 30.0
    assert saved["summary"]["failures"] == {"too_many_chunks": 1}
    (endless,) = [r for r in saved["records"] if r["error"]]
    assert endless["chunks"] == 40 and endless["itl"] == [] and endless["itl_summary"]["count"] == 39
    assert out.stat().st_size < 50_000  # six requests: a summary for the endless one, not its every gap
