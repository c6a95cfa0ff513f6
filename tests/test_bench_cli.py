"""``perfsdk bench serve`` and ``perfsdk bench compare`` through perfsdk.cli.main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_server import FakeOpenAIServer, unused_port

from perfsdk.cli import main

pytestmark = pytest.mark.slow


def _serve_args(url: str, *extra: str) -> list[str]:
    return [
        "bench", "serve", "--base-url", url, "--model", "fake", "--num-prompts", "6",
        "--input-len", "uniform:8-16", "--output-len", "normal:5,1", "--seed", "1", "--no-progress",
        *extra,
    ]  # fmt: skip


def test_serve_save_plot_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b, png = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "a.png"
    with FakeOpenAIServer(["ok", "ok", "http500"]) as srv:
        rc = main(
            _serve_args(
                srv.url, "--endpoint", "chat", "--request-rate", "inf", "--burstiness", "0.5",
                "--max-concurrency", "2", "--warmup", "1", "--goodput", "ttft:60000", "tpot:60000",
                "--percentiles", "90", "99", "--timeout", "5", "--ignore-eos",
                "--save-result", str(a), "--plot", str(png),
            )
        )  # fmt: skip
        assert rc == 0
        assert srv.requests == 7  # 1 warm-up + 6
        assert main(_serve_args(srv.url, "--request-rate", "100", "--save-result", str(b))) == 0
    out = capsys.readouterr().out
    assert "Successful requests:" in out
    assert "http_500:" in out
    assert "P90 TTFT (ms):" in out
    assert "Request goodput" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads(a.read_text())
    assert saved["config"]["endpoint"] == "chat"
    assert saved["config"]["goodput"] == {"ttft": 60000.0, "tpot": 60000.0}
    assert saved["config"]["percentiles"] == [90.0, 99.0]
    assert saved["config"]["input_len"] == "uniform:8-16"
    assert len(saved["records"]) == 6
    assert len(saved["warmup_records"]) == 1

    assert main(["bench", "compare", str(a), str(b)]) == 0
    table = capsys.readouterr().out
    assert "TTFT P90 (ms)" in table
    assert "endpoint: 'chat' -> 'completions'" in table
    assert "failed requests" in table


def test_serve_exits_1_when_every_request_fails(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(_serve_args(f"http://127.0.0.1:{unused_port()}", "--timeout", "5"))
    assert rc == 1
    assert "connection_error:" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--input-len", "uniform:9-1", "input_len"),
        ("--goodput", "itl:5", "goodput"),
        ("--num-prompts", "0", "num_prompts"),
        ("--timeout", "inf", "timeout_s"),  # was an OverflowError traceback from aiohttp
        ("--temperature", "inf", "temperature"),
        ("--input-len", "normal:nan,5", "input_len"),  # was a ValueError traceback while drawing lengths
        ("--output-len", "1" + "0" * 400, "output_len"),  # was an OverflowError traceback
    ],
)
def test_bad_flags_are_config_errors(flag: str, value: str, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_serve_args("http://127.0.0.1:9"), flag, value]) == 2
    assert field in capsys.readouterr().err


def test_compare_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "compare", str(tmp_path / "nope.json"), str(tmp_path / "nope2.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_serve_repeat_records_every_repetition(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the same load three times against the real loopback server: three repetitions in the file, each with
    # its own summary and requests, the pooled summary on top, progress per repetition on stderr
    out, single = tmp_path / "three.json", tmp_path / "one.json"
    with FakeOpenAIServer(["ok"]) as srv:
        rc = main(_serve_args(srv.url, "--warmup", "1", "--repeat", "3", "--save-result", str(out)))
        assert rc == 0
        assert srv.requests == 1 + 3 * 6  # the warm-up once, then the load three times
        bodies = [b["prompt"] for b in srv.bodies[1:]]  # the warm-up was answered before the load began
        # the same requests each time (the same seed); sent all at once, they may arrive in any order
        assert sorted(bodies[:6]) == sorted(bodies[6:12]) == sorted(bodies[12:])
        assert len(set(bodies[:6])) == 6
        assert main(_serve_args(srv.url, "--save-result", str(single))) == 0
    printed = capsys.readouterr()
    assert "3 repetitions pooled" in printed.out and "Spread across 3 repetitions" in printed.out
    saved = json.loads(out.read_text())
    assert saved["format"] == 2 and saved["config"]["repeat"] == 3
    assert len(saved["repetitions"]) == 3
    for rep in saved["repetitions"]:
        assert len(rep["records"]) == 6 and rep["summary"]["completed"] == 6
    assert [len(rep["warmup_records"]) for rep in saved["repetitions"]] == [1, 0, 0]
    assert saved["summary"]["completed"] == 18 and saved["summary"]["repetitions"] == 3
    assert json.loads(single.read_text())["format"] == 1  # one repetition: the file as it always was

    # compare gives intervals once a side is repeated, and says the noise is unknown when neither is
    assert main(["bench", "compare", str(single), str(out)]) == 0
    table = capsys.readouterr().out
    assert "95% interval of delta" in table and "A: 1 repetition, B: 3" in table
    assert main(["bench", "compare", str(single), str(single)]) == 0
    assert "Noise unknown" in capsys.readouterr().out


def test_serve_shows_progress_per_repetition(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(["ok"]) as srv:
        args = [a for a in _serve_args(srv.url, "--repeat", "2") if a != "--no-progress"]
        assert main(args) == 0
    err = capsys.readouterr().err
    assert "repetition 1/2: 6 ok, 0 failed" in err and "repetition 2/2: 6 ok, 0 failed" in err


def test_repeat_must_be_a_positive_integer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_serve_args("http://127.0.0.1:9"), "--repeat", "0"]) == 2
    assert "repeat: must be >= 1" in capsys.readouterr().err
