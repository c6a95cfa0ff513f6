"""A regression gate for CI: a stored baseline run, and a check that fails when a new run is worse.

The runs are ``perfsdk bench serve --save-result`` files, best made with ``--repeat 3`` so that the
gate can tell a change from the noise. Store one as the baseline, then gate each change on a new run
against it::

    perfsdk bench serve --base-url http://127.0.0.1:8000 ... --repeat 3 --save-result run.json
    perfsdk regress save run.json                      # .perfsdk/baseline.json (commit it, or cache it)
    perfsdk regress check run.json                     # exit 1 when a gated number got worse
    perfsdk regress check run.json --tolerance 5% --gate "TTFT P99 (ms)=20%" --markdown summary.md

A number *regresses* when it moved in the bad direction by more than its relative tolerance **and**
by more than an absolute floor (``--min-delta-ms`` for latencies), so that a 0.3 ms wobble of a 2 ms
TTFT is not a failure, **and** beyond the noise: when the runs hold several repetitions, the 95 %
interval of the change (Welch's t over the per-repetition values, :mod:`perfsdk.bench.noise`) must
not contain 0. A change whose interval contains 0 is reported ``within noise`` and never fails.
With one repetition on both sides the noise is unknown: the report says so and the gate applies the
tolerance alone. Failed requests gate at zero tolerance and without a noise allowance: a failure is
not timing noise.

Exit codes of ``perfsdk regress check`` (:attr:`RegressionReport.exit_code`):

- 0: pass, no gated number got worse beyond its tolerance and the noise;
- 1: at least one regression;
- 2: cannot compare: no baseline, a file that is not a saved run, a gated value missing, null,
  NaN/±Infinity, negative or not a number in either file (the message names the file and the JSON
  path, e.g. ``summary.ttft_ms.p99``), runs made with a different configuration (rate, lengths,
  model, seed, …; unless ``--allow-config-diff``), or a bad flag. The verdict line on stdout then
  says ``cannot compare``, and the reason also goes to stderr.

What is gated is each repetition's own summary (``repetitions[i].summary``; a one-repetition file's
``summary``). A several-repetition file's top-level ``summary``, all repetitions' requests pooled, is for
people reading the file and is never gated, so nothing in it can make a gate pass or fail.

In Python::

    from perfsdk.regress import check
    report = check(BenchResult.load("baseline.json"), BenchResult.load("run.json"))
    report.passed, report.exit_code, report.format(), report.markdown()

:func:`check` raises :class:`CannotCompareError` for bad input and returns a report whose
``comparable`` is False for runs of different configurations.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsdk.bench.compare import ComparisonRow, compare_results, config_diff, format_interval, metric_path
from perfsdk.bench.noise import METHOD, Interval, mean
from perfsdk.bench.result import BenchResult
from perfsdk.config import clean, parse_float
from perfsdk.errors import ConfigError

__all__ = [
    "DEFAULT_BASELINE",
    "DEFAULT_GATES",
    "CannotCompareError",
    "Gate",
    "GateResult",
    "RegressionReport",
    "check",
    "parse_gate",
    "parse_tolerance",
    "save_baseline",
]

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

#: Counts, not measurements: gated on their change alone, without a noise allowance.
_NO_NOISE_ALLOWANCE = frozenset({"failed requests"})


class CannotCompareError(ConfigError):
    """The baseline and the run cannot be gated against each other; the message names the file and the field.

    ``perfsdk regress check`` exits 2 on it (a :class:`~perfsdk.errors.ConfigError`, which the CLI's
    ``main`` formats), after printing ``cannot compare: ...`` as the verdict on stdout.
    """


@dataclass(frozen=True)
class Gate:
    metric: str
    tolerance: float  # relative: 0.1 = 10 % worse is still a pass
    min_delta: float  # and the change must exceed this, in the metric's unit
    noise: bool = True  # and its 95 % interval must exclude 0 (when the noise is known)


@dataclass(frozen=True)
class GateResult:
    gate: Gate
    row: ComparisonRow

    @property
    def interval(self) -> Interval | None:
        """The 95 % interval of the change, None when the noise is unknown (one repetition per side)."""
        return self.row.interval

    @property
    def status(self) -> str:
        """``"regression"``, ``"within noise"``, ``"improved"``, ``"ok"``, or ``"missing"`` (never a pass)."""
        r = self.row
        if r.a is None or r.b is None:
            return "missing"
        delta = r.b - r.a
        worse = -delta if r.higher_is_better else delta
        if self.gate.noise and worse != 0 and r.within_noise:
            return "within noise"
        if worse <= 0:
            return "improved" if worse < 0 and abs(delta) > self.gate.min_delta else "ok"
        limit = self.gate.tolerance * abs(r.a)
        return "regression" if worse > limit and worse > self.gate.min_delta else "ok"


@dataclass
class RegressionReport:
    results: list[GateResult]
    config_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    #: False when the runs differ in configuration and ``allow_config_diff`` was not given
    comparable: bool = True
    names: tuple[str, str] = ("baseline", "run")

    @property
    def regressions(self) -> list[GateResult]:
        return [g for g in self.results if g.status == "regression"]

    @property
    def missing(self) -> list[GateResult]:
        return [g for g in self.results if g.status == "missing"]

    @property
    def passed(self) -> bool:
        """True only for comparable runs with every gated number present and none regressed."""
        return self.comparable and not self.missing and not self.regressions and bool(self.results)

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression, 2 cannot compare."""
        if not self.comparable or self.missing or not self.results:
            return 2
        return 1 if self.regressions else 0

    @property
    def verdict(self) -> str:
        return {0: "pass", 1: "regression", 2: "cannot compare"}[self.exit_code]

    @property
    def repetitions(self) -> tuple[int, int]:
        """How many repetitions the baseline and the run hold."""
        return (
            max((len(g.row.a_values) for g in self.results), default=0) or 1,
            max((len(g.row.b_values) for g in self.results), default=0) or 1,
        )

    def reason(self) -> str:
        """Why the runs cannot be compared ("" when they can)."""
        if not self.comparable:
            return (
                f"the runs were made with different settings ({', '.join(self.config_diff)}); re-run with the "
                "baseline's settings, or pass --allow-config-diff"
            )
        if self.missing:
            return f"no value for {', '.join(g.row.metric for g in self.missing)}"
        if not self.results:
            return "no gated metric"
        return ""

    def verdict_line(self) -> str:
        code = self.exit_code
        if code == 2:
            return f"cannot compare: {self.reason()}"
        if code == 1:
            n = len(self.regressions)
            names = ", ".join(g.row.metric for g in self.regressions)
            return f"FAIL: {n} regression{'s' if n > 1 else ''} beyond tolerance and noise: {names}"
        noisy = sum(1 for g in self.results if g.status == "within noise")
        extra = f" ({noisy} moved within noise)" if noisy else ""
        return f"PASS: no gated number got worse beyond its tolerance and the noise{extra}"

    def noise_note(self) -> str:
        na, nb = self.repetitions
        counts = f"{self.names[0]}: {na} repetition{'s' if na > 1 else ''}, {self.names[1]}: {nb}"
        if na == 1 and nb == 1:
            return (
                f"Noise unknown ({counts}): each gate applied its tolerance alone. Record both with "
                "`perfsdk bench serve --repeat 3` to gate beyond the noise."
            )
        return f"Intervals: {METHOD} ({counts}); a change whose interval contains 0 is within noise and does not fail."

    def format(self) -> str:
        lines = []
        if self.config_diff:
            lines.append("Note: the runs differ in configuration:")
            lines.extend(f"  {k}: {a!r} -> {b!r}" for k, (a, b) in self.config_diff.items())
            lines.append("")
        header = (
            f"{'metric':<28}{self.names[0]:>12}{self.names[1]:>12}{'change':>10}{'95% interval':>26}"
            f"{'allowed':>9}  verdict"
        )
        lines += [header, "-" * len(header)]
        for g in self.results:
            r = g.row
            change = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
            shown = g.status.upper() if g.status == "regression" else g.status
            lines.append(
                f"{r.metric:<28}{_f(r.a):>12}{_f(r.b):>12}{change:>10}{_interval(g):>26}"
                f"{g.gate.tolerance * 100:>8.0f}%  {shown}"
            )
        lines += ["", self.noise_note(), self.verdict_line()]
        return "\n".join(lines)

    def markdown(self) -> str:
        """A table for a CI summary (``$GITHUB_STEP_SUMMARY``) or a pull-request comment."""
        code = self.exit_code
        verdict = (
            "✅ no regression"
            if code == 0
            else f"❌ {len(self.regressions)} regression(s)"
            if code == 1
            else "⚠️ cannot compare"
        )
        lines = [
            f"### perfsdk regression gate: {verdict}",
            "",
            "| metric | baseline | run | change | 95% interval | allowed | verdict |",
            "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for g in self.results:
            r = g.row
            change = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
            mark = "**regression**" if g.status == "regression" else g.status
            lines.append(
                f"| {r.metric} | {_f(r.a)} | {_f(r.b)} | {change} | {_interval(g)} | "
                f"{g.gate.tolerance * 100:.0f}% | {mark} |"
            )
        lines += ["", self.noise_note()]
        if self.config_diff:
            lines += [
                "",
                "The runs differ in configuration: "
                + ", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in self.config_diff.items()),
            ]
        if code == 2:
            lines += ["", f"**cannot compare**: {self.reason()}"]
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        na, nb = self.repetitions
        return {
            "passed": self.passed,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "comparable": self.comparable,
            "reason": self.reason() or None,
            "config_diff": {k: list(v) for k, v in self.config_diff.items()},
            "noise": {
                "method": METHOD if na > 1 or nb > 1 else None,
                "baseline_repetitions": na,
                "run_repetitions": nb,
            },
            "results": [
                {
                    "metric": g.row.metric,
                    "baseline": g.row.a,
                    "run": g.row.b,
                    "baseline_values": list(g.row.a_values),
                    "run_values": list(g.row.b_values),
                    "relative": g.row.relative,
                    "interval": None if g.interval is None else [g.interval.low, g.interval.high],
                    "noise_allowance": g.gate.noise,
                    "tolerance": g.gate.tolerance,
                    "min_delta": g.gate.min_delta,
                    "status": g.status,
                }
                for g in self.results
            ],
        }


def cannot_compare_markdown(reason: str) -> str:
    """The CI summary when no report could be made (bad input): says so instead of leaving it empty."""
    return f"### perfsdk regression gate: ⚠️ cannot compare\n\n{reason}\n"


def parse_tolerance(text: str) -> float:
    """``"10%"`` or ``"0.1"`` → 0.1."""
    s = clean(str(text)) or ""
    percent = s.endswith("%")
    try:  # perfsdk.config's number rule, as for every number on the command line
        value = parse_float(s[:-1] if percent else s, 0, 1e6 if percent else 1e4)
    except ValueError:
        raise ConfigError(
            f"tolerance: expected a fraction or a percentage like 10% (at most 1000000%), got {text!r}"
        ) from None
    return value / 100 if percent else value


def parse_gate(text: str) -> tuple[str, float]:
    """``"TTFT P99 (ms)=15%"`` → ``("TTFT P99 (ms)", 0.15)``."""
    name, sep, tol = text.rpartition("=")
    if not sep or not name.strip():
        raise ConfigError(f"--gate: expected METRIC=TOLERANCE like 'TTFT P99 (ms)=15%', got {text!r}")
    return name.strip(), parse_tolerance(tol)


def check(
    baseline: BenchResult,
    run: BenchResult,
    *,
    tolerance: float = 0.10,
    min_delta_ms: float = 1.0,
    gates: dict[str, float | None] | None = None,
    allow_config_diff: bool = False,
) -> RegressionReport:
    """Compare *run* with *baseline* on the gated numbers (default :data:`DEFAULT_GATES`).

    Raises :class:`CannotCompareError` when a gated value is missing, null, not finite, negative or
    not a number in either run (the message names the file and the JSON path), and ConfigError for
    bad arguments. Runs of different configurations give a report with ``comparable`` False (exit
    code 2) unless *allow_config_diff*.
    """
    if (
        isinstance(min_delta_ms, bool)
        or not isinstance(min_delta_ms, (int, float))
        or not (math.isfinite(min_delta_ms) and min_delta_ms >= 0)
    ):  # NaN would compare False and pass every gate; inf would make no latency ever fail
        raise ConfigError(f"min_delta_ms (--min-delta-ms): must be a finite number of ms >= 0, got {min_delta_ms!r}")
    for name, tol in (("tolerance", tolerance), *(((f"gate {m!r}"), t) for m, t in (gates or {}).items())):
        if tol is not None and not (isinstance(tol, (int, float)) and math.isfinite(tol) and tol >= 0):
            raise ConfigError(f"{name}: a tolerance must be a finite fraction >= 0, got {tol!r}")
    wanted = dict(DEFAULT_GATES) if gates is None else dict(gates)
    if not wanted:
        raise ConfigError("regress: no gate to check (give at least one metric)")
    for role, result in (("baseline", baseline), ("run", run)):
        if not result.summary:
            raise CannotCompareError(
                f"{result.name} ({role}): summary is empty; a gate needs a file written by "
                "`perfsdk bench serve --save-result`"
            )
    results = []
    for metric, tol in wanted.items():
        found = metric_path(metric)
        if found is None:
            known = ", ".join(r.metric for r in compare_results(baseline, run))
            raise ConfigError(f"regress: no metric named {metric!r}; known: {known}")
        path, higher = found
        a = _gated_values(baseline, "baseline", metric, path)
        b = _gated_values(run, "run", metric, path)
        floor = min_delta_ms if metric.endswith("(ms)") else (0.5 if metric == "failed requests" else 0.0)
        gate = Gate(metric, tolerance if tol is None else tol, floor, noise=metric not in _NO_NOISE_ALLOWANCE)
        results.append(GateResult(gate, ComparisonRow(metric, mean(a), mean(b), higher, tuple(a), tuple(b))))
    diff = config_diff(baseline, run)
    return RegressionReport(results, diff, comparable=allow_config_diff or not diff)


def save_baseline(run_path: str | Path, baseline_path: str | Path = DEFAULT_BASELINE) -> Path:
    """Store *run_path* (a saved bench run) as the baseline, with the git commit it was made at.

    Refuses a run with no completed request, and one whose default-gated values are present but not
    finite non-negative numbers (a NaN baseline would let every later run pass).
    """
    run = BenchResult.load(run_path)
    if not run.summary or not all(rep.summary.get("completed") for rep in run.repetitions):
        raise CannotCompareError(
            f"regress save: {run_path} has a repetition with no completed request; it cannot be a baseline"
        )
    for metric in DEFAULT_GATES:
        found = metric_path(metric)
        assert found is not None  # the defaults are metric names
        _gated_values(run, "baseline", metric, found[0], allow_absent=True)
    out = Path(baseline_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(Path(run_path).read_text())
    data.setdefault("environment", {})["baseline_git_commit"] = _git_commit()
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(out)
    return out


def _gated_values(
    result: BenchResult, role: str, metric: str, path: tuple[str, ...], *, allow_absent: bool = False
) -> list[float]:
    """The gated number of each repetition, or CannotCompareError naming the file and the JSON path."""
    out: list[float] = []
    for rep in result.repetitions:
        x: Any = rep.summary
        where = rep.where
        for part in path:
            if not isinstance(x, dict):  # the loader checks the structure; a caller-made result may not be
                raise CannotCompareError(f"{result.name} ({role}): {where} is not an object; cannot read {metric!r}")
            where = f"{where}.{part}"
            if part not in x or (allow_absent and x[part] is None):
                if allow_absent:
                    return []
                raise CannotCompareError(
                    f"{result.name} ({role}): {where} is missing; the gate {metric!r} needs it "
                    f"in both runs{_hint(rep.summary, path)}"
                )
            x = x[part]
        problem = _not_a_number(x)
        if problem:
            hint = _hint(rep.summary, path) if x is None else ""
            raise CannotCompareError(
                f"{result.name} ({role}): {where} is {problem}; the gate {metric!r} needs a "
                f"finite number >= 0 in both runs{hint}"
            )
        out.append(float(x))
    return out


def _not_a_number(x: Any) -> str:
    """What is wrong with a gated value ("" when it is a finite number >= 0)."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return f"a boolean ({str(x).lower()}), not a number"
    if isinstance(x, str):
        return f"a string ({x[:40]!r}), not a number"
    if not isinstance(x, (int, float)):
        return f"{'a list' if isinstance(x, list) else 'an object'}, not a number"
    try:
        value = float(x)
    except OverflowError:
        return "a number beyond the float range"
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value < 0:
        return f"negative ({value:g})"
    return ""


def _hint(summary: dict[str, Any], path: tuple[str, ...]) -> str:
    if summary.get("completed") == 0:
        return " (that run completed no request)"
    if len(path) == 2 and path[1].startswith("p"):
        recorded = sorted(k for k in (summary.get(path[0]) or {}) if k.startswith("p"))
        return f" (the percentiles recorded: {', '.join(recorded) or 'none'}; `bench serve --percentiles` sets them)"
    return ""


def _interval(g: GateResult) -> str:
    if not g.gate.noise:
        return "n/a (a count)"
    return format_interval(g.interval)


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
