"""``perfsdk regress``: real bench runs against a loopback server (one of them made slower on purpose), and
saved files with chosen values for what a server cannot be made to produce on demand (NaN, strings, noise).

Exit codes go through the real command line in a subprocess: 0 pass, 1 regression, 2 cannot compare."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench_server import FakeOpenAIServer

from perfsdk.bench.compare import ComparisonRow
from perfsdk.bench.result import BenchResult
from perfsdk.cli import main
from perfsdk.errors import ConfigError
from perfsdk.regress import CannotCompareError, Gate, GateResult, check, parse_gate, parse_tolerance

ROOT = Path(__file__).resolve().parents[1]


def _run(url: str, out: Path, *extra: str) -> None:
    rc = main(
        [
            "bench",
            "serve",
            "--base-url",
            url,
            "--model",
            "fake",
            "--num-prompts",
            "12",
            "--input-len",
            "uniform:8-16",
            "--output-len",
            "normal:6,1",
            "--seed",
            "3",
            "--no-progress",
            "--max-concurrency",
            "4",
            "--ignore-eos",
            "--save-result",
            str(out),
            *extra,
        ]
    )
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


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same loads, three repetitions each (`bench serve --repeat 3`)."""
    d = tmp_path_factory.mktemp("regress3")
    paths = {k: d / f"{k}.json" for k in ("base3", "slow3")}
    with FakeOpenAIServer(["ok"], token_delay_s=0.004) as fast:
        _run(fast.url, paths["base3"], "--repeat", "3")
    with FakeOpenAIServer(["ok"], token_delay_s=0.004, first_token_delay_s=0.15) as slow:
        _run(slow.url, paths["slow3"], "--repeat", "3")
    return paths


def _cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "perfsdk.cli", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _last_line(text: str) -> str:
    return text.rstrip("\n").splitlines()[-1]


@pytest.mark.slow
def test_the_gate_passes_a_rerun_and_fails_a_slower_first_token(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    baseline = tmp_path / "baseline.json"
    assert main(["regress", "save", str(runs["base"]), "--baseline", str(baseline)]) == 0
    stored = json.loads(baseline.read_text())
    assert "baseline_git_commit" in stored["environment"]
    assert "one repetition" in capsys.readouterr().out  # and says what that costs

    # the same server again passes. Latencies here are a few ms and a 2-core CI box can add tens of ms of
    # scheduling jitter to any of them, so the tolerances are wide: what is tested is the gate, not the box
    assert (
        main(
            [
                "regress",
                "check",
                str(runs["again"]),
                "--baseline",
                str(baseline),
                "--tolerance",
                "300%",
                "--min-delta-ms",
                "50",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert _last_line(out).startswith("PASS")
    assert "Noise unknown" in out  # one repetition a side: no interval is invented

    # 150 ms more to the first token: TTFT regresses, and the Markdown says so
    md = tmp_path / "summary.md"
    rc = main(["regress", "check", str(runs["slow"]), "--baseline", str(baseline), "--markdown", str(md)])
    out = capsys.readouterr().out
    assert rc == 1
    assert _last_line(out).startswith("FAIL") and "TTFT median (ms)" in out and "REGRESSION" in out
    text = md.read_text()
    assert "❌" in text and "| TTFT P99 (ms) |" in text and "**regression**" in text

    # JSON, and a custom gate that tolerates even that
    assert (
        main(
            [
                "regress",
                "check",
                str(runs["slow"]),
                "--baseline",
                str(baseline),
                "--json",
                "--only",
                "--gate",
                "TTFT median (ms)=1000000%",
            ]
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["exit_code"] == 0
    assert [r["metric"] for r in report["results"]] == ["TTFT median (ms)"]


@pytest.mark.slow
def test_a_regression_beyond_tolerance_and_noise_exits_1(
    runs: dict[str, Path], repeated: dict[str, Path], tmp_path: Path
) -> None:
    # three repetitions a side, real loads: the 150 ms first-token delay is far outside the noise
    base = BenchResult.load(repeated["base3"])
    assert len(base.repetitions) == 3
    md = tmp_path / "gate.md"
    done = _cli("regress", "check", repeated["slow3"], "--baseline", repeated["base3"], "--markdown", md)
    assert done.returncode == 1, done.stderr
    assert _last_line(done.stdout).startswith("FAIL: ") and "TTFT median (ms)" in _last_line(done.stdout)
    assert "Welch t" in done.stdout and "baseline: 3 repetitions, run: 3" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("TTFT median (ms)"))
    assert row.endswith("REGRESSION")
    low = float(row.split("[")[1].split(",")[0].replace(",", ""))
    assert low > 100  # the interval of the change excludes 0 by far: about +150 ms
    assert "Traceback" not in done.stderr
    assert "| TTFT median (ms) |" in md.read_text()

    # and one repetition against three still gets an interval (the single run assumed to spread alike)
    done = _cli("regress", "check", runs["slow"], "--baseline", repeated["base3"], "--json")
    assert done.returncode == 1
    ttft = next(r for r in json.loads(done.stdout)["results"] if r["metric"] == "TTFT median (ms)")
    assert ttft["status"] == "regression" and ttft["interval"][0] > 0
    # the number of repetitions is not a configuration difference: three against one compare
    done = _cli(
        "regress",
        "check",
        repeated["base3"],
        "--baseline",
        runs["base"],
        "--tolerance",
        "1000%",
        "--min-delta-ms",
        "1000",
    )
    assert done.returncode == 0, done.stdout


# ---- saved files with chosen values ---------------------------------------------------------------------


def _summary(ttft: float = 10.0, tput: float = 100.0, failed: int = 0) -> dict[str, Any]:
    """A summary with every default-gated number, as `bench serve` writes it (report.summarize's keys)."""
    s: dict[str, Any] = {
        "num_prompts": 20,
        "completed": 20 - failed,
        "failed": failed,
        "failures": {},
        "duration_s": 2.0,
        "request_throughput": tput / 10,
        "output_throughput": tput,
        "total_token_throughput": tput * 2,
        "goodput": None,
        "max_output_tokens_per_s": tput * 1.5,
        "max_concurrent_requests": 4,
    }
    for key, v in (("ttft_ms", ttft), ("tpot_ms", 5.0), ("itl_ms", 5.0), ("e2el_ms", 50.0)):
        s[key] = {
            "count": 20.0,
            "mean": v,
            "median": v,
            "std": 0.1 * v,
            "min": 0.5 * v,
            "max": 2 * v,
            "p50": v,
            "p99": 1.8 * v,
        }
    return s


def _file(path: Path, *summaries: dict[str, Any], seed: int = 0) -> Path:
    """A saved run: format 1 for one summary, format 2 (repetitions) for several."""
    data: dict[str, Any] = {
        "format": 1,
        "config": {"model": "fake", "seed": seed, "request_rate": "inf"},
        "seed": seed,
        "environment": {},
        "records": [],
        "warmup_records": [],
    }
    if len(summaries) == 1:
        data["summary"] = summaries[0]
    else:
        data["format"] = 2
        data["summary"] = summaries[0]
        data["repetitions"] = [{"summary": s, "records": [], "warmup_records": []} for s in summaries]
    path.write_text(json.dumps(data))  # allow_nan: NaN and Infinity are written as JSON's extensions
    return path


@pytest.mark.slow
def test_overlapping_repetitions_are_within_noise_and_do_not_fail(tmp_path: Path) -> None:
    # TTFT median 10/30/50 ms against 20/45/70 ms: the means differ by +50 % (and 15 ms), far beyond the 10 %
    # tolerance and the 1 ms floor, but the repetitions overlap: the interval of the change contains 0
    base = _file(tmp_path / "base.json", *(_summary(ttft=v) for v in (10.0, 30.0, 50.0)))
    run = _file(tmp_path / "run.json", *(_summary(ttft=v) for v in (20.0, 45.0, 70.0)))
    done = _cli("regress", "check", run, "--baseline", base)
    assert done.returncode == 0, done.stdout + done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("TTFT median (ms)"))
    assert "+50.0%" in row and row.endswith("within noise")
    assert _last_line(done.stdout).startswith("PASS") and "within noise" in _last_line(done.stdout)

    # bench compare says the same instead of "worse"
    done = _cli("bench", "compare", base, run)
    assert done.returncode == 0
    row = next(line for line in done.stdout.splitlines() if line.startswith("TTFT median (ms)"))
    assert row.endswith("within noise") and "worse" not in row

    # the same means without the spread (repetitions that agree) are a regression
    tight = _file(tmp_path / "tight.json", *(_summary(ttft=v) for v in (44.0, 45.0, 46.0)))
    base_tight = _file(tmp_path / "base_tight.json", *(_summary(ttft=v) for v in (29.0, 30.0, 31.0)))
    done = _cli("regress", "check", tight, "--baseline", base_tight)
    assert done.returncode == 1
    assert "TTFT median (ms)" in _last_line(done.stdout)


def test_gate_statuses_with_and_without_noise() -> None:
    def status(
        a: tuple[float, ...],
        b: tuple[float, ...],
        higher: bool = False,
        noise: bool = True,
        tol: float = 0.1,
        floor: float = 1.0,
    ) -> str:
        row = ComparisonRow("m", sum(a) / len(a), sum(b) / len(b), higher, a, b)
        return GateResult(Gate("m", tol, floor, noise=noise), row).status

    assert status((10.0, 30.0, 50.0), (20.0, 45.0, 70.0)) == "within noise"
    assert status((29.0, 30.0, 31.0), (44.0, 45.0, 46.0)) == "regression"
    assert status((100.0, 101.0, 99.0), (100.0, 102.0, 101.0)) == "within noise"  # within tolerance too
    assert status((29.0, 30.0, 31.0), (14.0, 15.0, 16.0)) == "improved"
    assert status((30.0,), (45.0,)) == "regression"  # one repetition a side: the tolerance alone decides
    assert status((29.0, 30.0, 31.0), (45.0,)) == "regression"  # one side repeated: an interval still
    # a count gated without a noise allowance: one failure in one repetition of three is a regression
    # (failed requests: tolerance 0, floor 0.5 a repetition)
    assert status((0.0, 0.0, 0.0), (0.0, 0.0, 3.0), noise=False, tol=0.0, floor=0.5) == "regression"
    assert status((0.0, 0.0, 0.0), (0.0, 0.0, 3.0), noise=True, tol=0.0, floor=0.5) == "within noise"


def test_a_regression_needs_both_the_relative_and_the_absolute_change() -> None:
    def gate(a: float | None, b: float | None, higher: bool, tol: float = 0.1, floor: float = 1.0) -> str:
        return GateResult(Gate("m", tol, floor), ComparisonRow("m", a, b, higher)).status

    assert gate(100.0, 115.0, higher=False) == "regression"  # latency up 15 %
    assert gate(100.0, 109.0, higher=False) == "ok"  # within 10 %
    assert gate(2.0, 2.8, higher=False) == "ok"  # +40 %, but under the 1 ms floor
    assert gate(100.0, 80.0, higher=False) == "improved"
    assert gate(100.0, 85.0, higher=True, floor=0.0) == "regression"  # throughput down 15 %
    assert gate(100.0, None, higher=True) == "missing"
    assert gate(0.0, 1.0, higher=False, tol=0.0, floor=0.5) == "regression"  # one failed request


# (JSON text put in place of a value, what the message calls it)
BAD_VALUES = [
    ("NaN", "is NaN"),
    ("Infinity", "is Infinity"),
    ("-Infinity", "is -Infinity"),
    ("null", "is null"),
    ('"12.5"', "is a string ('12.5'), not a number"),
    ("true", "is a boolean (true), not a number"),
    ("-3.0", "is negative"),
    ("[1, 2]", "is a list, not a number"),
]


@pytest.mark.slow
@pytest.mark.parametrize("side", ["baseline", "run"])
@pytest.mark.parametrize(("raw", "words"), BAD_VALUES)
def test_a_value_that_is_not_a_finite_number_is_refused(tmp_path: Path, side: str, raw: str, words: str) -> None:
    # before: each of these made its gate "missing", missing passed, and the check exited 0 (PASS) on nothing
    good = _file(tmp_path / "good.json", _summary())
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"p99": 18.0', f'"p99": {raw}', 1))  # the first p99: TTFT's
    assert bad.read_text() != good.read_text()
    base, run = (bad, good) if side == "baseline" else (good, bad)
    done = _cli("regress", "check", run, "--baseline", base)
    assert done.returncode == 2
    message = f"bad.json ({side}): summary.ttft_ms.p99 {words}"
    assert message in done.stderr and "Traceback" not in done.stderr
    assert _last_line(done.stdout).startswith("cannot compare: ") and message in done.stdout
    assert "PASS" not in done.stdout and "FAIL" not in done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("side", ["baseline", "run"])
def test_a_missing_value_or_a_bad_one_in_any_repetition_is_refused(tmp_path: Path, side: str) -> None:
    good = _file(tmp_path / "good.json", _summary(), _summary(), _summary())
    reps = [_summary(), _summary(), _summary()]
    del reps[1]["tpot_ms"]["median"]
    missing = _file(tmp_path / "missing.json", *reps)
    reps = [_summary(), _summary(), _summary()]
    reps[2]["output_throughput"] = math.nan
    nan = _file(tmp_path / "nan.json", *reps)
    for bad, message in (
        (missing, "missing.json ({}): repetitions[1].summary.tpot_ms.median is missing"),
        (nan, "nan.json ({}): repetitions[2].summary.output_throughput is NaN"),
    ):
        base, run = (bad, good) if side == "baseline" else (good, bad)
        done = _cli("regress", "check", run, "--baseline", base)
        assert done.returncode == 2
        assert message.format(side) in done.stderr and message.format(side) in done.stdout
        assert _last_line(done.stdout).startswith("cannot compare: ")


@pytest.mark.slow
def test_a_run_with_no_successful_request_cannot_pass(tmp_path: Path) -> None:
    base = _file(tmp_path / "base.json", _summary())
    dead = _summary(failed=20)
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        dead[key] = dict.fromkeys(dead[key])
    run = _file(tmp_path / "run.json", dead)
    done = _cli("regress", "check", run, "--baseline", base)
    assert done.returncode == 2
    assert "summary.ttft_ms.median is null" in done.stderr and "completed no request" in done.stderr
    # the JSON verdict and the CI summary say it too, instead of nothing (or a pass)
    md = tmp_path / "gate.md"
    done = _cli("regress", "check", run, "--baseline", base, "--json", "--markdown", md)
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["verdict"] == "cannot compare" and report["passed"] is False
    assert "summary.ttft_ms.median is null" in report["reason"]
    assert "cannot compare" in md.read_text() and "summary.ttft_ms.median is null" in md.read_text()


@pytest.mark.slow
def test_a_run_file_that_cannot_be_read_or_a_summary_that_cannot_be_written_exits_2(tmp_path: Path) -> None:
    base = _file(tmp_path / "base.json", _summary())
    for run, words in ((tmp_path / "none.json", "no such file"), (tmp_path, "cannot read")):
        done = _cli("regress", "check", run, "--baseline", base)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr
        assert _last_line(done.stdout).startswith("cannot compare: ")
    done = _cli("regress", "check", base, "--baseline", base, "--markdown", tmp_path / "no" / "such" / "dir.md")
    assert done.returncode == 2 and "--markdown: cannot write" in done.stderr and "Traceback" not in done.stderr
    assert _last_line(done.stdout).startswith("cannot compare: ")


# (what the file holds instead of a saved run, words of the message)
MALFORMED: list[tuple[str, str]] = [
    ('{"summary": "x"}', "summary: expected an object, got a string ('x')"),
    ('{"summary": {"ttft_ms": 5}}', "summary.ttft_ms: expected an object of statistics, got 5"),
    ('{"summary": {"completed": 1}, "records": {}}', "records: expected a list of requests, got an object"),
    ('{"summary": {"completed": 1}, "records": [{"warmup": false}]}', "records[0]: not a request record"),
    ('{"summary": {"completed": 1}, "records": [7]}', "records[0]: expected an object, got 7"),
    ('{"summary": {"completed": 1}, "config": [1]}', "config: expected an object, got a list"),
    ('{"summary": {}, "repetitions": []}', "repetitions: expected a non-empty list"),
    ('{"summary": {}, "repetitions": [{"records": []}]}', "repetitions[0].summary is missing"),
    ("[1, 2]", "not a perfsdk bench result"),
    ('{"summary": {', "is not JSON"),
    ('{"summary": {}}', "summary is empty"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("text", "words"), MALFORMED)
def test_a_malformed_file_exits_2_with_a_message_not_a_traceback(tmp_path: Path, text: str, words: str) -> None:
    # before: a summary that is not an object (or a statistics entry that is not) was a traceback, exit 1
    good = _file(tmp_path / "good.json", _summary())
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    for args in (("regress", "check", bad, "--baseline", good), ("regress", "check", good, "--baseline", bad)):
        done = _cli(*args)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and words in done.stderr and "bad.json" in done.stderr
        assert _last_line(done.stdout).startswith("cannot compare: ") and words in done.stdout
    if words != "summary is empty":  # compare shows what it can; only the gate needs the numbers
        done = _cli("bench", "compare", good, bad)
        assert done.returncode == 2 and words in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_runs_that_cannot_be_compared_exit_2_and_say_so(runs: dict[str, Path], tmp_path: Path) -> None:
    # before: the table, then "PASS" (or "FAIL: 1 regression") on stdout, and exit 2
    done = _cli("regress", "check", runs["other"], "--baseline", runs["base"])
    assert done.returncode == 2
    last = _last_line(done.stdout)
    assert last.startswith("cannot compare: ") and "request_rate" in last and "--allow-config-diff" in last
    assert "FAIL" not in done.stdout and "PASS" not in done.stdout
    assert "request_rate" in done.stderr
    md = tmp_path / "gate.md"
    done = _cli("regress", "check", runs["other"], "--baseline", runs["base"], "--json", "--markdown", md)
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert report["verdict"] == "cannot compare" and report["passed"] is False and report["exit_code"] == 2
    assert "cannot compare" in md.read_text()

    done = _cli(
        "regress",
        "check",
        runs["other"],
        "--baseline",
        runs["base"],
        "--allow-config-diff",
        "--tolerance",
        "1000%",
        "--min-delta-ms",
        "1000",
    )
    assert done.returncode == 0
    assert "request_rate" in done.stdout and _last_line(done.stdout).startswith("PASS")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--baseline", "{tmp}/none.json"), "no baseline at"),
        (("--gate", "TTFT p99=5%"), "known: "),  # not a metric name: the names it could have been
        (("--gate", "TTFT P42 (ms)=5%"), "summary.ttft_ms.p42 is missing"),  # a percentile not recorded
        (("--gate", "TTFT P99 (ms)"), "--gate: expected METRIC=TOLERANCE"),
        (("--tolerance", "ten"), "tolerance: expected a fraction"),
        (("--tolerance=-5%",), "tolerance: expected a fraction"),
        (("--only",), "--only without any --gate"),
        (("--min-delta-ms", "nan"), "--min-delta-ms"),  # NaN compared False and passed every gate
        (("--min-delta-ms", "inf"), "--min-delta-ms"),  # inf made no latency ever fail
        (("--min-delta-ms", "-1"), "--min-delta-ms"),
    ],
)
def test_every_bad_flag_or_missing_file_exits_2(
    runs: dict[str, Path], tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    filled = [a.format(tmp=tmp_path) for a in args]
    if "--baseline" not in filled:
        filled += ["--baseline", str(runs["base"])]
    done = _cli("regress", "check", runs["again"], *filled)
    assert done.returncode == 2
    assert words in done.stderr and "Traceback" not in done.stderr
    # a flag argparse refuses (its type checks the number) is refused before anything is compared: only its
    # usage error, on stderr; everything else ends stdout with the verdict line
    assert not done.stdout.strip() or _last_line(done.stdout).startswith("cannot compare: ")


@pytest.mark.slow
def test_save_exit_paths(repeated: dict[str, Path], tmp_path: Path) -> None:
    baseline = tmp_path / "b.json"
    done = _cli("regress", "save", repeated["base3"], "--baseline", baseline)
    assert done.returncode == 0 and "one repetition" not in done.stdout
    assert len(BenchResult.load(baseline).repetitions) == 3
    done = _cli("regress", "save", tmp_path / "none.json", "--baseline", baseline)
    assert done.returncode == 2 and "no such file" in done.stderr
    nan = _summary()
    nan["ttft_ms"]["p99"] = math.nan
    done = _cli("regress", "save", _file(tmp_path / "nan.json", nan), "--baseline", baseline)
    assert done.returncode == 2 and "summary.ttft_ms.p99 is NaN" in done.stderr and "Traceback" not in done.stderr
    done = _cli("regress", "save", _file(tmp_path / "dead.json", _summary(failed=20)), "--baseline", baseline)
    assert done.returncode == 2 and "no completed request" in done.stderr
    assert len(BenchResult.load(baseline).repetitions) == 3  # the stored baseline was left alone


def test_check_in_python_raises_for_bad_values_and_reports_the_exit_code() -> None:
    good = BenchResult({"seed": 0}, _summary(), [])
    bad_summary = copy.deepcopy(_summary())
    bad_summary["itl_ms"]["p99"] = math.inf
    with pytest.raises(CannotCompareError, match=r"\(in memory\) \(run\): summary.itl_ms.p99 is Infinity"):
        check(good, BenchResult({"seed": 0}, bad_summary, []))
    report = check(good, BenchResult({"seed": 1}, _summary(), []))
    assert not report.comparable and report.exit_code == 2 and not report.passed
    assert report.format().splitlines()[-1].startswith("cannot compare: ")
    assert check(good, BenchResult({"seed": 0}, _summary(ttft=100.0), [])).exit_code == 1
    assert check(good, good).exit_code == 0


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
def test_check_help_lists_exit_codes() -> None:
    done = _cli("regress", "check", "--help")
    assert done.returncode == 0
    for words in ("0  pass", "1  regression", "2  cannot compare", "Welch"):
        assert words in done.stdout
