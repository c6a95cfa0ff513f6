"""perfsdk.bench against a real aiohttp SSE server on loopback (tests/bench_server.py).

Counts are exact; timings are only compared with each other (orderings and
ratios between runs whose injected delays differ by 10x), never with the clock.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from bench_server import HOSTILE, FakeOpenAIServer, unused_port

from perfsdk.bench import BenchConfig, BenchResult, benchmark
from perfsdk.bench.compare import compare_results, config_diff, format_comparison

pytestmark = pytest.mark.slow

FAULTS = ["ok", "http500", "malformed", "cut", "no_done", "error_event", "stall"]


def _cfg(url: str, **kw: object) -> BenchConfig:
    base: dict[str, object] = {
        "base_url": url,
        "model": "fake",
        "num_prompts": 8,
        "input_len": 16,
        "output_len": 6,
        "progress": False,
        "timeout_s": 5.0,
    }
    base.update(kw)
    return BenchConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_every_fault_is_counted_with_its_reason(endpoint: str) -> None:
    with FakeOpenAIServer(FAULTS) as srv:
        result = benchmark(_cfg(srv.url, endpoint=endpoint, num_prompts=14, timeout_s=0.5))
        s = result.summary
        assert s["completed"] + s["failed"] == 14
        assert s["completed"] == 2
        assert s["failures"] == {
            "http_500": 2,
            "malformed_event": 2,
            "stream_cut": 4,  # one cut connection and one clean end without [DONE], per cycle
            "error_event": 2,
            "timeout": 2,
        }
        # the client hung up on the stalled and the malformed streams: the server saw each go
        assert srv.wait_for_disconnects(4) == 4
    assert srv.behaviours.count("ok") == 2
    examples = s["failure_examples"]
    assert "engine exploded" in examples["http_500"]
    assert "KV cache exhausted" in examples["error_event"]
    assert "not JSON" in examples["malformed_event"]
    assert "0.5 s" in examples["timeout"]
    for rec in result.records:
        if rec.ok:
            assert rec.output_tokens == 6
            assert rec.prompt_tokens == 16  # byte-level server: usage agrees with the target length
            assert len(rec.itl) == 5


def test_server_down_is_counted_not_raised() -> None:
    result = benchmark(_cfg(f"http://127.0.0.1:{unused_port()}", num_prompts=5))
    assert result.summary["completed"] == 0
    assert result.summary["failures"] == {"connection_error": 5}
    assert "cannot connect" in result.summary["failure_examples"]["connection_error"]
    assert result.summary["ttft_ms"]["mean"] is None
    assert "Failed requests" in result.format()


def test_timeout_closes_the_connection_and_the_server_sees_it() -> None:
    with FakeOpenAIServer(["stall"]) as srv:
        result = benchmark(_cfg(srv.url, num_prompts=3, timeout_s=0.3))
        assert result.summary["failures"] == {"timeout": 3}
        assert srv.wait_for_disconnects(3) == 3
    for rec in result.records:
        assert rec.chunks == 1  # it got the first token before the stall
        assert rec.ttft is not None


def test_ttft_and_itl_reflect_the_injected_delays() -> None:
    # a slow "prefill" then fast tokens; chat, so a role-only first chunk must not count as TTFT
    with FakeOpenAIServer(first_token_delay_s=0.05, token_delay_s=0.002) as srv:
        fast = benchmark(_cfg(srv.url, endpoint="chat", num_prompts=4, output_len=10, max_concurrency=1))
    with FakeOpenAIServer(first_token_delay_s=0.05, token_delay_s=0.02) as srv:
        slow = benchmark(_cfg(srv.url, endpoint="chat", num_prompts=4, output_len=10, max_concurrency=1))
    f, s = fast.summary, slow.summary
    assert f["completed"] == s["completed"] == 4
    # ordering: in the fast run the 50 ms wait for the first token dwarfs the 2 ms token gaps
    assert f["ttft_ms"]["min"] > 5 * f["itl_ms"]["median"]
    # ratio: 10x the per-token delay gives several times the ITL and TPOT
    assert s["itl_ms"]["median"] > 3 * f["itl_ms"]["median"]
    assert s["tpot_ms"]["mean"] > 3 * f["tpot_ms"]["mean"]
    # TPOT and mean ITL describe the same gaps when every chunk is one token
    assert s["tpot_ms"]["mean"] == pytest.approx(s["itl_ms"]["mean"], rel=0.05)
    # e2e = ttft + sum of the gaps, exactly, per request
    for rec in slow.records:
        assert rec.e2el == pytest.approx(rec.ttft + sum(rec.itl))  # type: ignore[operator]


def test_warmup_requests_are_sent_first_and_excluded() -> None:
    # the three warm-up requests are the first three the server sees: make them fail
    with FakeOpenAIServer(["http500"] * 3 + ["ok"] * 5) as srv:
        result = benchmark(_cfg(srv.url, num_prompts=5, warmup=3))
        assert srv.requests == 8
    assert len(result.warmup_records) == 3
    assert all(r.error == "http_500" and r.warmup for r in result.warmup_records)
    assert len(result.records) == 5
    assert result.summary["num_prompts"] == 5
    assert result.summary["failed"] == 0
    assert result.summary["completed"] == 5


def test_max_concurrency_is_respected() -> None:
    with FakeOpenAIServer(token_delay_s=0.004) as srv:
        capped = benchmark(_cfg(srv.url, num_prompts=12, output_len=8, max_concurrency=3))
        assert srv.max_in_flight == 3
    assert capped.summary["completed"] == 12
    assert capped.summary["max_concurrent_requests"] <= 3
    assert capped.summary["send_lag_ms"]["max"] > 0  # requests queued for a slot, and it shows
    with FakeOpenAIServer(token_delay_s=0.004) as srv:
        benchmark(_cfg(srv.url, num_prompts=12, output_len=8))
        assert srv.max_in_flight > 3  # without the cap, rate=inf really sends them together


def test_payload_seed_and_lengths() -> None:
    with FakeOpenAIServer() as srv:
        cfg = _cfg(srv.url, num_prompts=20, input_len="uniform:5-40", output_len="uniform:2-9", seed=3)
        a = benchmark(cfg)
        bodies_a = sorted(json.dumps(b, sort_keys=True) for b in srv.bodies)
    with FakeOpenAIServer() as srv:
        benchmark(_cfg(srv.url, num_prompts=20, input_len="uniform:5-40", output_len="uniform:2-9", seed=3))
        bodies_b = sorted(json.dumps(b, sort_keys=True) for b in srv.bodies)
        benchmark(_cfg(srv.url, num_prompts=20, input_len="uniform:5-40", output_len="uniform:2-9", seed=4))
        bodies_c = sorted(json.dumps(b, sort_keys=True) for b in srv.bodies[20:])
    assert bodies_a == bodies_b  # same seed, same requests
    assert bodies_a != bodies_c
    for rec in a.records:
        assert rec.prompt_tokens == rec.prompt_len
        assert rec.output_tokens == rec.max_tokens
        assert 5 <= rec.prompt_len <= 40
    body = json.loads(bodies_a[0])
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert "ignore_eos" not in body


def test_chat_payload_ignore_eos_and_no_usage() -> None:
    with FakeOpenAIServer(send_usage=False) as srv:
        result = benchmark(_cfg(srv.url, endpoint="chat", num_prompts=2, ignore_eos=True, output_len=4))
        body = srv.bodies[0]
    assert body["ignore_eos"] is True
    assert body["messages"][0]["role"] == "user"
    assert body["max_completion_tokens"] == 4
    for rec in result.records:
        assert rec.ok
        assert not rec.usage_reported
        assert rec.prompt_tokens is None
        assert rec.output_tokens == 4  # counted from the chunks
    assert result.summary["total_input_tokens"] == 2 * 16  # falls back to the target lengths


def test_goodput() -> None:
    with FakeOpenAIServer(["ok", "ok", "http500"]) as srv:
        loose = benchmark(_cfg(srv.url, num_prompts=6, goodput={"ttft": 60_000, "tpot": 60_000}))
        strict = benchmark(_cfg(srv.url, num_prompts=6, goodput={"e2el": 1e-6}))
    assert loose.summary["good_requests"] == 4  # every success, never a failure
    assert loose.summary["goodput"] == pytest.approx(loose.summary["request_throughput"])
    assert strict.summary["good_requests"] == 0
    assert strict.summary["goodput"] == 0.0


def test_result_json_round_trip_compare_and_plot(tmp_path: Path) -> None:
    a_path, b_path, png = tmp_path / "a.json", tmp_path / "sub" / "b.json", tmp_path / "run.png"
    with FakeOpenAIServer(["ok", "ok", "ok", "http500"], token_delay_s=0.002) as srv:
        a = benchmark(_cfg(srv.url, num_prompts=8, save_result=str(a_path), plot=str(png), api_key="s3cret"))
    with FakeOpenAIServer(token_delay_s=0.02) as srv:
        benchmark(_cfg(srv.url, num_prompts=8, request_rate=50.0, save_result=str(b_path)))

    raw = a_path.read_text()
    assert "s3cret" not in raw
    data = json.loads(raw)
    assert {"config", "seed", "environment", "summary", "records", "warmup_records"} <= set(data)
    assert data["seed"] == 0
    assert data["environment"]["python"]
    assert len(data["records"]) == 8
    loaded = BenchResult.load(a_path)
    assert loaded.summary == json.loads(json.dumps(a.summary))
    assert [r.to_dict() for r in loaded.records] == [r.to_dict() for r in a.records]

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    rows = {r.metric: r for r in compare_results(BenchResult.load(a_path), BenchResult.load(b_path))}
    assert rows["failed requests"].delta == -2
    assert rows["failed requests"].verdict == "better"
    assert rows["ITL median (ms)"].verdict == "worse"
    assert rows["ITL median (ms)"].b > rows["ITL median (ms)"].a  # type: ignore[operator]
    diff = config_diff(loaded, BenchResult.load(b_path))
    assert diff == {"request_rate": ("inf", 50.0)}
    text = format_comparison(list(rows.values()), diff)
    assert "request_rate" in text
    assert "TTFT P99 (ms)" in text
    assert math.isfinite(rows["TTFT mean (ms)"].relative or 0.0)


# what each hostile response of tests/bench_server.py must be counted as
HOSTILE_REASONS = {
    "deep": ("malformed_event", "nested too deeply"),
    "deep_error": ("malformed_event", "nested too deeply"),
    "long_line": ("malformed_event", "longer than"),
    "huge_usage": ("malformed_event", "usage.completion_tokens is not a token count"),
    "negative_usage": ("malformed_event", "usage.completion_tokens is not a token count"),
    "giant_event": ("malformed_event", "beyond 16 MiB"),
    "escape_error": ("error_event", "bad\\x1b[2J\\ud800 thing"),
    "rot13_500": ("http_500", "engine exploded"),
    "huge_500": ("http_500", "engine exploded"),
}


def test_hostile_responses_each_cost_one_request_never_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: the 100,000-deep event raised RecursionError out of the run (exit 1, nothing saved), the
    # 401-digit usage an OverflowError in the summary, the rot13 charset a LookupError; the lone
    # surrogate could not be printed and the escape cleared the terminal
    from perfsdk.cli import main

    assert set(HOSTILE) < set(HOSTILE_REASONS)  # every hostile stream of the server is exercised
    plan = ["ok", *HOSTILE_REASONS, "ok"]
    out = tmp_path / "run.json"
    with FakeOpenAIServer(plan) as srv:
        rc = main(
            [
                "bench",
                "serve",
                "--base-url",
                srv.url,
                "--model",
                "fake",
                "--num-prompts",
                str(len(plan)),
                "--input-len",
                "16",
                "--output-len",
                "6",
                "--max-concurrency",
                "1",
                "--timeout",
                "20",
                "--no-progress",
                "--save-result",
                str(out),
            ]
        )
        # the client hung up on each stream it gave up on before the end (the usage ones had ended)
        assert srv.wait_for_disconnects(5) == 5
    printed = capsys.readouterr().out
    assert rc == 0
    assert "Failed requests" in printed and "\x1b" not in printed
    result = BenchResult.load(out)
    s = result.summary
    assert s["completed"] == 2
    assert s["failures"] == {"malformed_event": 6, "error_event": 1, "http_500": 2}, s["failure_examples"]
    assert s["total_output_tokens"] == 12  # the absurd usage counts never reached the totals
    # one request at a time: records in index order met the plan in order
    by_behaviour = dict(zip(srv.behaviours, sorted(result.records, key=lambda r: r.index), strict=True))
    for behaviour, (reason, words) in HOSTILE_REASONS.items():
        rec = by_behaviour[behaviour]
        assert (rec.error, behaviour) == (reason, behaviour)
        assert rec.error_detail is not None and words in rec.error_detail, (behaviour, rec.error_detail)
        assert len(rec.error_detail) < 400 and rec.error_detail.isprintable()
        rec.error_detail.encode("utf-8")  # a lone surrogate would raise here, and when printed
