"""A regression gate for CI: a stored baseline run, and a check that fails when a new run is worse.

The runs are ``perfsdk bench serve --save-result`` files. Store one as the baseline, then gate each
change on a new run against it::

    perfsdk bench serve --base-url http://127.0.0.1:8000 ... --save-result run.json
    perfsdk regress save run.json                      # .perfsdk/baseline.json (commit it, or cache it)
    perfsdk regress check run.json                     # exit 1 when a gated number got worse
    perfsdk regress check run.json --tolerance 5% --gate "TTFT P99 (ms)=20%" --markdown summary.md

A number *regresses* when it moved in the bad direction by more than its relative tolerance **and** by
more than an absolute floor (``--min-delta-ms`` for latencies), so that a 0.3 ms wobble of a 2 ms TTFT is
not a failure. Failed requests gate at zero tolerance. Runs made with a different configuration (rate,
lengths, model, seed, …) are not comparable: the check refuses them (exit 2) unless
``--allow-config-diff``. In Python::

    from perfsdk.regress import check
    report = check(BenchResult.load("baseline.json"), BenchResult.load("run.json"))
    report.passed, report.format(), report.markdown()
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsdk.bench.compare import ComparisonRow, compare_results, config_diff
from perfsdk.bench.result import BenchResult
from perfsdk.config import clean, parse_float
from perfsdk.errors import ConfigError

__all__ = ["DEFAULT_BASELINE", "DEFAULT_GATES", "Gate", "GateResult", "RegressionReport", "check", "parse_gate",
           "save_baseline"]

DEFAULT_BASELINE = Path(".perfsdk") / "baseline.json"

#: Gated by default (names as in ``perfsdk bench compare``), with their relative tolerance; None means
#: the ``--tolerance`` default. Percentiles other than P99 are gated when asked for with ``--gate``.
DEFAULT_GATES: dict[str, float | None] = {
    "failed requests": 0.0,
    "request throughput (req/s)": None,
    "output throughput (tok/s)": None,
    "TTFT median (ms)": None,
    "TTFT P99 (ms)": None,
    "TPOT median (ms)": None,
    "TPOT P99 (ms)": None,
    "ITL P99 (ms)": None,
}


@dataclass(frozen=True)
class Gate:
    metric: str
    tolerance: float  # relative: 0.1 = 10 % worse is still a pass
    min_delta: float  # and the change must exceed this, in the metric's unit


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    row: ComparisonRow

    @property
    def status(self) -> str:
        """``"regression"``, ``"improved"``, ``"ok"``, or ``"missing"`` (a run lacks the number)."""
        r = self.row
        if r.a is None or r.b is None:
            return "missing"
        delta = r.b - r.a
        worse = -delta if r.higher_is_better else delta
        if worse <= 0:
            return "improved" if worse < 0 and abs(delta) > self.gate.min_delta else "ok"
        limit = self.gate.tolerance * abs(r.a)
        return "regression" if worse > limit and worse > self.gate.min_delta else "ok"


@dataclass
class RegressionReport:
    results: list[GateResult]
    config_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def regressions(self) -> list[GateResult]:
        return [g for g in self.results if g.status == "regression"]

    @property
    def passed(self) -> bool:
        return not self.regressions

    def format(self) -> str:
        lines = []
        if self.config_diff:
            lines.append("Note: the runs differ in configuration:")
            lines.extend(f"  {k}: {a!r} -> {b!r}" for k, (a, b) in self.config_diff.items())
            lines.append("")
        header = f"{'metric':<30}{'baseline':>12}{'run':>12}{'change':>10}{'allowed':>10}  verdict"
        lines += [header, "-" * len(header)]
        for g in self.results:
            r = g.row
            change = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
            shown = g.status.upper() if g.status == "regression" else g.status
            lines.append(f"{r.metric:<30}{_f(r.a):>12}{_f(r.b):>12}{change:>10}"
                         f"{g.gate.tolerance * 100:>9.0f}%  {shown}")
        n = len(self.regressions)
        lines.append("")
        names = ", ".join(g.row.metric for g in self.regressions)
        lines.append(f"FAIL: {n} regression{'s' if n > 1 else ''}: {names}" if n else
                     "PASS: no gated number got worse beyond its tolerance")
        return "\n".join(lines)

    def markdown(self) -> str:
        """A table for a CI summary (``$GITHUB_STEP_SUMMARY``) or a pull-request comment."""
        verdict = "✅ no regression" if self.passed else f"❌ {len(self.regressions)} regression(s)"
        lines = [f"### perfsdk regression gate: {verdict}", "",
                 "| metric | baseline | run | change | allowed | verdict |",
                 "| --- | ---: | ---: | ---: | ---: | --- |"]
        for g in self.results:
            r = g.row
            change = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
            mark = "**regression**" if g.status == "regression" else g.status
            lines.append(f"| {r.metric} | {_f(r.a)} | {_f(r.b)} | {change} | {g.gate.tolerance * 100:.0f}% | {mark} |")
        if self.config_diff:
            lines += ["", "The runs differ in configuration: " +
                      ", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in self.config_diff.items())]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "config_diff": {k: list(v) for k, v in self.config_diff.items()},
                "results": [{"metric": g.row.metric, "baseline": g.row.a, "run": g.row.b,
                             "relative": g.row.relative, "tolerance": g.gate.tolerance,
                             "min_delta": g.gate.min_delta, "status": g.status} for g in self.results]}


def parse_tolerance(text: str) -> float:
    """``"10%"`` or ``"0.1"`` → 0.1."""
    s = clean(str(text)) or ""
    percent = s.endswith("%")
    try:  # perfsdk.config's number rule, as for every number on the command line
        value = parse_float(s[:-1] if percent else s, 0, 1e6 if percent else 1e4)
    except ValueError:
        raise ConfigError(f"tolerance: expected a fraction or a percentage like 10% (at most 1000000%), "
                          f"got {text!r}") from None
    return value / 100 if percent else value


def parse_gate(text: str) -> tuple[str, float]:
    """``"TTFT P99 (ms)=15%"`` → ``("TTFT P99 (ms)", 0.15)``."""
    name, sep, tol = text.rpartition("=")
    if not sep or not name.strip():
        raise ConfigError(f"--gate: expected METRIC=TOLERANCE like 'TTFT P99 (ms)=15%', got {text!r}")
    return name.strip(), parse_tolerance(tol)


def check(baseline: BenchResult, run: BenchResult, *, tolerance: float = 0.10, min_delta_ms: float = 1.0,
          gates: dict[str, float | None] | None = None) -> RegressionReport:
    """Compare *run* with *baseline* on the gated numbers (default :data:`DEFAULT_GATES`)."""
    if isinstance(min_delta_ms, bool) or not isinstance(min_delta_ms, (int, float)) or not (
        math.isfinite(min_delta_ms) and min_delta_ms >= 0
    ):  # NaN would compare False and pass every gate; inf would make no latency ever fail
        raise ConfigError(f"min_delta_ms (--min-delta-ms): must be a finite number of ms >= 0, got {min_delta_ms!r}")
    for name, tol in (("tolerance", tolerance), *(((f"gate {m!r}"), t) for m, t in (gates or {}).items())):
        if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise ConfigError(f"{name}: a tolerance must be a finite fraction >= 0, got {tol!r}")
    if not baseline.summary or not run.summary:
        raise ConfigError("regress: both runs need a summary (files written by `perfsdk bench serve --save-result`)")
    wanted = dict(DEFAULT_GATES) if gates is None else dict(gates)
    rows = {r.metric: r for r in compare_results(baseline, run)}
    unknown = [m for m in wanted if m not in rows]
    if unknown:
        raise ConfigError(f"regress: no metric named {unknown[0]!r}; known: {', '.join(rows)}")
    results = []
    for metric, tol in wanted.items():
        row = rows[metric]
        floor = min_delta_ms if metric.endswith("(ms)") else (0.5 if metric == "failed requests" else 0.0)
        results.append(GateResult(Gate(metric, tolerance if tol is None else tol, floor), row))
    return RegressionReport(results, config_diff(baseline, run))


def save_baseline(run_path: str | Path, baseline_path: str | Path = DEFAULT_BASELINE) -> Path:
    """Store *run_path* (a saved bench run) as the baseline, with the git commit it was made at."""
    run = BenchResult.load(run_path)
    if not run.summary or not run.summary.get("completed"):
        raise ConfigError(f"regress save: {run_path} has no completed requests; it cannot be a baseline")
    out = Path(baseline_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(Path(run_path).read_text())
    data.setdefault("environment", {})["baseline_git_commit"] = _git_commit()
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(out)
    return out


def _git_commit() -> str | None:
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.2f}"
