"""Compare two saved runs: ``perfsdk bench compare A.json B.json``.

For each headline number the table shows A, B, the change B − A and the
relative change, and marks it ``better`` or ``worse`` (lower is better for
latencies and failures, higher for throughput and goodput). Differences in the
run configuration (rate, lengths, model, seed, ...) are listed above the table,
because a delta between two different experiments is not a regression::

    from perfsdk.bench.compare import compare_results, format_comparison
    rows = compare_results(BenchResult.load("a.json"), BenchResult.load("b.json"))
    print(format_comparison(rows, config_diff(a, b)))
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfsdk.bench.report import LATENCY_KEYS, percentile_key
from perfsdk.bench.result import BenchResult

__all__ = ["ComparisonRow", "compare_results", "config_diff", "format_comparison"]

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

_IGNORED_CONFIG = frozenset({"save_result", "plot", "base_url", "url"})


@dataclass(frozen=True)
class ComparisonRow:
    metric: str
    a: float | None
    b: float | None
    higher_is_better: bool

    @property
    def delta(self) -> float | None:
        return None if self.a is None or self.b is None else self.b - self.a

    @property
    def relative(self) -> float | None:
        if self.delta is None or not self.a:
            return None
        return self.delta / abs(self.a)

    @property
    def verdict(self) -> str:
        d = self.delta
        if d is None or d == 0 or (self.relative is not None and abs(self.relative) < 0.005):
            return ""
        return "better" if (d > 0) == self.higher_is_better else "worse"


def compare_results(a: BenchResult, b: BenchResult) -> list[ComparisonRow]:
    """Rows for the headline numbers both summaries have."""
    rows: list[ComparisonRow] = []
    for key, name, higher in _SCALARS:
        rows.append(ComparisonRow(name, _num(a.summary.get(key)), _num(b.summary.get(key)), higher))
    pcts = sorted({*_pcts(a), *_pcts(b)}, key=lambda k: float(k[1:]))
    for key in LATENCY_KEYS:
        short = key.removesuffix("_ms").upper()
        sa, sb = a.summary.get(key) or {}, b.summary.get(key) or {}
        for stat in ("mean", "median", *pcts):
            label = stat if stat in ("mean", "median") else stat.upper()
            rows.append(ComparisonRow(f"{short} {label} (ms)", _num(sa.get(stat)), _num(sb.get(stat)), False))
    return rows


def config_diff(a: BenchResult, b: BenchResult) -> dict[str, tuple[Any, Any]]:
    """Configuration fields that differ between the two runs: ``{field: (a, b)}``."""
    keys = (set(a.config) | set(b.config)) - _IGNORED_CONFIG
    return {k: (a.config.get(k), b.config.get(k)) for k in sorted(keys) if a.config.get(k) != b.config.get(k)}


def format_comparison(
    rows: list[ComparisonRow],
    diff: dict[str, tuple[Any, Any]] | None = None,
    *,
    names: tuple[str, str] = ("A", "B"),
) -> str:
    lines: list[str] = []
    if diff:
        lines.append("Note: the runs differ in configuration:")
        lines.extend(f"  {k}: {va!r} -> {vb!r}" for k, (va, vb) in diff.items())
        lines.append("")
    header = f"{'metric':<32}{names[0]:>12}{names[1]:>12}{'delta':>12}{'delta %':>10}  "
    lines.append(header)
    lines.append("-" * (len(header) + 6))
    for r in rows:
        rel = f"{r.relative * 100:+.1f}%" if r.relative is not None else "n/a"
        delta = f"{r.delta:+,.2f}" if r.delta is not None else "n/a"
        lines.append(f"{r.metric:<32}{_f(r.a):>12}{_f(r.b):>12}{delta:>12}{rel:>10}  {r.verdict}")
    return "\n".join(lines)


def _pcts(result: BenchResult) -> list[str]:
    stats = result.summary.get("ttft_ms") or {}
    return [k for k in stats if k.startswith("p") and k != percentile_key(50.0)]


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:,.2f}"
