"""Compare two saved runs: ``perfsdk bench compare A.json B.json``.

For each headline number the table shows A, B, the change B − A and the relative change, and marks
it ``better`` or ``worse`` (lower is better for latencies and failures, higher for throughput and
goodput). Differences in the run configuration (rate, lengths, model, seed, ...) are listed above
the table, because a delta between two different experiments is not a regression::

    from perfsdk.bench.compare import compare_results, format_comparison
    rows = compare_results(BenchResult.load("a.json"), BenchResult.load("b.json"))
    print(format_comparison(rows, config_diff(a, b)))
    rows[0].interval, rows[0].verdict      # Interval(low, high, df) or None; "within noise", "worse", ...

**Noise.** Two identical runs of a server differ, sometimes by tens of percent on a busy machine, so
a delta alone is not a change. When the files hold several repetitions (``perfsdk bench serve
--repeat 3``), A and B are the means of the per-repetition values, and each delta comes with a 95 %
interval (Welch's t over those values; :mod:`perfsdk.bench.noise` says why that method). A delta
whose interval contains 0 is marked ``within noise`` instead of better or worse. With one
repetition on each side there is no measure of the noise: the table says so below it instead of
inventing an interval, and better/worse then mean only "moved this way". One side repeated and the
other not still gives an interval (the single run is assumed to spread like the repeated one).
``repeat`` itself is not a configuration difference: a mean of repetitions is comparable with a
single run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfsdk.bench.noise import METHOD, Interval, difference_interval
from perfsdk.bench.report import LATENCY_KEYS, percentile_key
from perfsdk.bench.result import BenchResult

__all__ = ["ComparisonRow", "compare_results", "config_diff", "format_comparison", "metric_path"]

# (summary key, display name, True when higher is better)
_SCALARS: tuple[tuple[str, str, bool], ...] = (
    ("completed", "completed requests", True),
    ("failed", "failed requests", False),
    ("request_throughput", "request throughput (req/s)", True),
    ("goodput", "goodput (req/s)", True),
    ("output_throughput", "output throughput (tok/s)", True),
    ("total_token_throughput", "total throughput (tok/s)", True),
    ("max_output_tokens_per_s", "peak output (tok/s)", True),
)

# not part of the experiment: where it was saved, the server's address, how many times it was repeated
_IGNORED_CONFIG = frozenset({"save_result", "plot", "base_url", "url", "repeat"})

_LATENCY_NAME = re.compile(r"^(?P<short>[A-Z0-9]+) (?P<stat>mean|median|std|min|max|P[0-9.]+) \(ms\)$")


@dataclass(frozen=True)
class ComparisonRow:
    """One headline number of two runs: A and B (means over their repetitions) and each repetition's value."""

    metric: str
    a: float | None
    b: float | None
    higher_is_better: bool
    a_values: tuple[float, ...] = ()  # one per repetition; empty when a value is missing (or not given)
    b_values: tuple[float, ...] = ()

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        if self.delta is None or not self.a:
            return None
        return self.delta / abs(self.a)

    @property
    def interval(self) -> Interval | None:
        """The 95 % interval of B − A, or None when the noise is unknown (one value per side, or a value missing)."""
        av = self.a_values or ((self.a,) if self.a is not None else ())
        bv = self.b_values or ((self.b,) if self.b is not None else ())
        if not av or not bv:
            return None
        return difference_interval(av, bv)

    @property
    def within_noise(self) -> bool:
        ci = self.interval
        return ci is not None and ci.spans_zero

    @property
    def verdict(self) -> str:
        """``"better"``, ``"worse"``, ``"within noise"`` (the interval spans 0), or ``""`` (no change)."""
        d = self.delta
        if d is None or d == 0 or (self.relative is not None and abs(self.relative) < 0.005):
            return ""
        if self.within_noise:
            return "within noise"
        return "better" if (d > 0) == self.higher_is_better else "worse"


def metric_path(metric: str) -> tuple[tuple[str, ...], bool] | None:
    """Where a display name's value sits in a summary, and whether higher is better.

    ``"failed requests"`` → ``(("failed",), False)``; ``"TTFT P99 (ms)"`` → ``(("ttft_ms", "p99"), False)``;
    None for a name that is no metric.
    """
    for key, name, higher in _SCALARS:
        if metric == name:
            return (key,), higher
    m = _LATENCY_NAME.match(metric)
    if m is None:
        return None
    key = m["short"].lower() + "_ms"
    if key not in LATENCY_KEYS:
        return None
    stat = m["stat"]
    if stat.startswith("P"):
        try:
            stat = percentile_key(float(stat[1:]))
        except ValueError:
            return None
    return (key, stat), False


def compare_results(a: BenchResult, b: BenchResult) -> list[ComparisonRow]:
    """Rows for the headline numbers of both runs (``None`` where a run lacks a finite number)."""
    rows: list[ComparisonRow] = []
    for key, name, higher in _SCALARS:
        rows.append(_row(name, (key,), higher, a, b))
    pcts = sorted({*_pcts(a), *_pcts(b)}, key=_pct_order)
    for key in LATENCY_KEYS:
        short = key.removesuffix("_ms").upper()
        for stat in ("mean", "median", *pcts):
            label = stat if stat in ("mean", "median") else stat.upper()
            rows.append(_row(f"{short} {label} (ms)", (key, stat), False, a, b))
    return rows


def config_diff(a: BenchResult, b: BenchResult) -> dict[str, tuple[Any, Any]]:
    """Configuration fields that differ between the two runs: ``{field: (a, b)}``."""
    keys = (set(a.config) | set(b.config)) - _IGNORED_CONFIG
    return {k: (a.config.get(k), b.config.get(k)) for k in sorted(keys) if a.config.get(k) != b.config.get(k)}


def format_comparison(
    rows: list[ComparisonRow], diff: dict[str, tuple[Any, Any]] | None = None, *, names: tuple[str, str] = ("A", "B")
) -> str:
    lines: list[str] = []
    if diff:
        lines.append("Note: the runs differ in configuration:")
        lines.extend(f"  {k}: {va!r} -> {vb!r}" for k, (va, vb) in diff.items())
        lines.append("")
    intervals = [r.interval for r in rows]
    shown = any(ci is not None for ci in intervals)
    header = f"{'metric':<32}{names[0]:>12}{names[1]:>12}{'delta':>12}{'delta %':>10}"
    if shown:
        header += f"{'95% interval of delta':>26}"
    header += "  verdict"
    lines.append(header)
    lines.append("-" * len(header))
    for r, ci in zip(rows, intervals, strict=True):
        rel = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
        delta = f"{r.delta:+,.2f}" if r.delta is not None else "n/a"
        line = f"{r.metric:<32}{_f(r.a):>12}{_f(r.b):>12}{delta:>12}{rel:>10}"
        if shown:
            line += f"{format_interval(ci):>26}"
        lines.append(f"{line}  {r.verdict}".rstrip())
    lines.append("")
    lines.append(noise_note(rows, names))
    return "\n".join(lines)


def format_interval(ci: Interval | None) -> str:
    return "unknown" if ci is None else f"[{ci.low:+,.2f}, {ci.high:+,.2f}]"


def noise_note(rows: Sequence[ComparisonRow], names: tuple[str, str] = ("A", "B")) -> str:
    """The line under a comparison that says how the noise was judged, or that it could not be."""
    na = max((len(r.a_values) for r in rows), default=0) or 1
    nb = max((len(r.b_values) for r in rows), default=0) or 1
    counts = f"{names[0]}: {na} repetition{'s' if na > 1 else ''}, {names[1]}: {nb}"
    if na == 1 and nb == 1:
        return (
            f"Noise unknown ({counts}): a delta here may be noise, two identical runs can differ by tens of "
            "percent. Record both with `perfsdk bench serve --repeat 3` for intervals."
        )
    return f"Intervals: {METHOD} ({counts}); 'within noise' = the interval contains 0."


def _row(name: str, path: tuple[str, ...], higher: bool, a: BenchResult, b: BenchResult) -> ComparisonRow:
    av, bv = _values(a, path), _values(b, path)
    return ComparisonRow(
        name,
        math.fsum(av) / len(av) if av else None,
        math.fsum(bv) / len(bv) if bv else None,
        higher,
        tuple(av),
        tuple(bv),
    )


def _values(result: BenchResult, path: tuple[str, ...]) -> list[float]:
    """The number at *path* in each repetition's summary; empty when any repetition lacks a finite one."""
    out: list[float] = []
    for rep in result.repetitions:
        x: Any = rep.summary
        for part in path:
            x = x.get(part) if isinstance(x, dict) else None
        value = _num(x)
        if value is None:
            return []
        out.append(value)
    return out


def _pcts(result: BenchResult) -> list[str]:
    keys: set[str] = set()
    for rep in result.repetitions:
        stats = rep.summary.get("ttft_ms") or {}
        keys.update(k for k in stats if k.startswith("p") and k != percentile_key(50.0) and _pct_order(k) >= 0)
    return sorted(keys)


def _pct_order(key: str) -> float:
    try:
        return float(key[1:])
    except ValueError:  # a key like "p99x" in a hand-edited file: not a percentile, not shown
        return -1.0


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    try:
        value = float(x)
    except OverflowError:  # an integer beyond the float range
        return None
    return value if math.isfinite(value) else None


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.2f}"
