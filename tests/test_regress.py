"""``perfsdk regress``: real bench runs against a loopback server, one of them made slower on purpose."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bench_server import FakeOpenAIServer

from perfsdk.bench.compare import ComparisonRow
from perfsdk.cli import main
from perfsdk.errors import ConfigError
from perfsdk.regress import Gate, GateResult, parse_gate, parse_tolerance


def _run(url: str, out: Path, *extra: str) -> None:
    rc = main(["bench", "serve", "--base-url", url, "--model", "fake", "--num-prompts", "12",
               "--input-len", "uniform:8-16", "--output-len", "normal:6,1", "--seed", "3", "--no-progress",
               "--max-concurrency", "4", "--ignore-eos", "--save-result", str(out), *extra])
    assert rc == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("regress")
    paths = {k: d / f"{k}.json" for k in ("base", "again", "slow", "other")}
    with FakeOpenAIServer(["ok"], token_delay_s=0.004) as fast:
        _run(fast.url, paths["base"])
        _run(fast.url, paths["again"])
        _run(fast.url, paths["other"], "--request-rate", "50")  # a different experiment
    with FakeOpenAIServer(["ok"], token_delay_s=0.004, first_token_delay_s=0.15) as slow:
        _run(slow.url, paths["slow"])
    return paths


@pytest.mark.slow
def test_the_gate_passes_a_rerun_and_fails_a_slower_first_token(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    baseline = tmp_path / "baseline.json"
    assert main(["regress", "save", str(runs["base"]), "--baseline", str(baseline)]) == 0
    stored = json.loads(baseline.read_text())
    assert "baseline_git_commit" in stored["environment"]
    capsys.readouterr()

    # the same server again passes. Latencies here are a few ms and a 2-core CI box can add tens of ms of
    # scheduling jitter to any of them, so the tolerances are wide: what is tested is the gate, not the box
    assert main(["regress", "check", str(runs["again"]), "--baseline", str(baseline),
                 "--tolerance", "300%", "--min-delta-ms", "50"]) == 0
    assert "PASS" in capsys.readouterr().out

    # 150 ms more to the first token: TTFT regresses, and the Markdown says so
    md = tmp_path / "summary.md"
    rc = main(["regress", "check", str(runs["slow"]), "--baseline", str(baseline), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL" in out and "TTFT median (ms)" in out and "REGRESSION" in out
    text = md.read_text()
    assert "❌" in text and "| TTFT P99 (ms) |" in text and "**regression**" in text

    # JSON, and a custom gate that tolerates even that
    assert main(["regress", "check", str(runs["slow"]), "--baseline", str(baseline), "--json", "--only",
                 "--gate", "TTFT median (ms)=1000000%"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True
    assert [r["metric"] for r in report["results"]] == ["TTFT median (ms)"]


@pytest.mark.slow
def test_runs_that_cannot_be_compared_exit_2(runs: dict[str, Path], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regress", "check", str(runs["again"]), "--baseline", str(tmp_path / "none.json")]) == 2
    assert "no baseline" in capsys.readouterr().err
    # a different request rate is a different experiment
    assert main(["regress", "check", str(runs["other"]), "--baseline", str(runs["base"])]) == 2
    assert "request_rate" in capsys.readouterr().out
    rc = main(["regress", "check", str(runs["other"]), "--baseline", str(runs["base"]), "--allow-config-diff",
               "--tolerance", "1000%", "--min-delta-ms", "1000"])
    assert rc == 0
    # a metric that does not exist is a configuration error, with the names it could have been
    assert main(["regress", "check", str(runs["again"]), "--baseline", str(runs["base"]),
                 "--gate", "TTFT P42 (ms)=5%"]) == 2
    assert "known: " in capsys.readouterr().err


def _gate(a: float | None, b: float | None, higher: bool, tol: float = 0.1, floor: float = 1.0) -> str:
    return GateResult(Gate("m", tol, floor), ComparisonRow("m", a, b, higher)).status


def test_a_regression_needs_both_the_relative_and_the_absolute_change() -> None:
    assert _gate(100.0, 115.0, higher=False) == "regression"  # latency up 15 %
    assert _gate(100.0, 109.0, higher=False) == "ok"  # within 10 %
    assert _gate(2.0, 2.8, higher=False) == "ok"  # +40 %, but under the 1 ms floor
    assert _gate(100.0, 80.0, higher=False) == "improved"
    assert _gate(100.0, 85.0, higher=True, floor=0.0) == "regression"  # throughput down 15 %
    assert _gate(100.0, None, higher=True) == "missing"
    assert _gate(0.0, 1.0, higher=False, tol=0.0, floor=0.5) == "regression"  # one failed request


def test_tolerances_and_gates_parse_or_say_why_not() -> None:
    assert parse_tolerance("10%") == pytest.approx(0.1)
    assert parse_tolerance("0.25") == pytest.approx(0.25)
    assert parse_gate("TTFT P99 (ms)=15%") == ("TTFT P99 (ms)", pytest.approx(0.15))
    with pytest.raises(ConfigError, match="tolerance"):
        parse_tolerance("ten")
    with pytest.raises(ConfigError, match="tolerance"):
        parse_tolerance("-5%")
    with pytest.raises(ConfigError, match="--gate"):
        parse_gate("TTFT P99 (ms)")


@pytest.mark.slow
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_min_delta_must_be_a_finite_number(runs: dict[str, Path], value: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    # NaN compares False and passed every gate (exit 0 on any run); inf made no latency ever fail
    rc = main(["regress", "check", str(runs["slow"]), "--baseline", str(runs["base"]), "--min-delta-ms", value])
    assert rc == 2
    assert "--min-delta-ms" in capsys.readouterr().err
