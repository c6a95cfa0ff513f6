"""Summary statistics of a run and the human-readable table.

:func:`summarize` turns the measured (non-warm-up) records into the
``BenchResult.summary`` dict. Latencies are in milliseconds; each latency key
maps to ``{"count", "mean", "median", "std", "min", "max", "p50", "p99", ...}``
with one ``p<N>`` per requested percentile (``p99.9`` for 99.9). ``std`` is the
population standard deviation and percentiles interpolate linearly, as numpy
(and so ``vllm bench serve``) computes them. With no successful request every
statistic is ``None``.

Summary keys:

========================== ===============================================================
``ttft_ms``                time to first token, over successful requests
``tpot_ms``                time per output token after the first, requests with >= 2 tokens
``itl_ms``                 every gap between text chunks, pooled over successful requests
``e2el_ms``                request start to last text chunk
``send_lag_ms``            how late each request was sent against its schedule (waiting on
                           ``max_concurrency`` or an overloaded client shows up here)
``num_prompts``            measured requests sent (warm-up excluded; fewer than asked
                           when ``duration_s`` stopped the run)
``completed``, ``failed``  counts; ``completed + failed == num_prompts``
``failures``               ``{reason: count}``, most frequent first
``failure_examples``       ``{reason: the first failure's detail}``
``total_input_tokens``     prompt tokens (server ``usage`` when sent, else target length)
``total_output_tokens``    generated tokens of successful requests
``duration_s``             first send to last completion
``request_throughput``     completed requests / s
``output_throughput``      output tokens / s
``total_token_throughput`` (input + output tokens) / s
``goodput``                requests / s meeting every SLO, ``None`` without ``--goodput``
``good_requests``          how many met every SLO (``None`` without SLOs)
``goodput_slo_ms``         the SLOs used
``max_output_tokens_per_s`` busiest one-second bucket
``max_concurrent_requests`` most requests in flight at once
``usage_reported``         successful requests whose server sent a ``usage`` block
========================== ===============================================================

Goodput follows vLLM: a request is good when each given SLO is >= its TTFT,
TPOT and E2EL (a one-token request counts TPOT as 0).

A run of several repetitions (``--repeat N``) keeps one summary per repetition;
:func:`summarize_repetitions` pools them into the run's summary (every request
of every repetition in the latency statistics, counts summed, throughputs over
the summed durations, the peaks the largest of any repetition, and
``repetitions``: N), and :func:`format_spread` prints how much the headline
numbers moved between repetitions.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from perfsdk.bench.records import RequestRecord, percentile

__all__ = [
    "LATENCY_KEYS",
    "format_spread",
    "format_summary",
    "latency_stats",
    "peak_concurrency",
    "percentile",
    "percentile_key",
    "summarize",
    "summarize_repetitions",
    "throughput_series",
]

#: The latency entries of a summary, in display order, with their titles.
LATENCY_KEYS: dict[str, str] = {
    "ttft_ms": "Time to first token",
    "tpot_ms": "Time per output token (excl. 1st)",
    "itl_ms": "Inter-token latency",
    "e2el_ms": "End-to-end latency",
}


def percentile_key(p: float) -> str:
    """``99.0 -> "p99"``, ``99.9 -> "p99.9"``."""
    return f"p{p:g}"


def latency_stats(values_s: Iterable[float], percentiles: Sequence[float]) -> dict[str, float | None]:
    """Statistics in milliseconds of latencies given in seconds."""
    values = sorted(v * 1000.0 for v in values_s)
    pcts = sorted({50.0, *percentiles})
    out: dict[str, float | None] = {"count": float(len(values))}
    if not values:
        out.update(dict.fromkeys(["mean", "median", "std", "min", "max"]))
        out.update({percentile_key(p): None for p in pcts})
        return out
    mean = math.fsum(values) / len(values)
    out["mean"] = mean
    out["median"] = percentile(values, 50.0)
    out["std"] = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
    out["min"] = values[0]
    out["max"] = values[-1]
    for p in pcts:
        out[percentile_key(p)] = percentile(values, p)
    return out


def peak_concurrency(records: Iterable[RequestRecord]) -> int:
    """Most requests in flight at once (half-open [start, end) intervals)."""
    events: list[tuple[float, int]] = []
    for r in records:
        if r.stream_end is None:
            continue
        events.append((r.start, 1))
        events.append((r.start + r.stream_end, -1))
    events.sort()  # at equal times -1 sorts first: an end frees its slot before a start takes it
    peak = cur = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


def throughput_series(records: Iterable[RequestRecord], bucket_s: float = 1.0) -> tuple[list[float], list[float]]:
    """Output tokens/s in buckets of *bucket_s* from the run's start: (bucket start times, rates).

    A chunk's tokens are spread evenly over the request's chunks when usage says
    there were more tokens than chunks.
    """
    counts: dict[int, float] = {}
    for r in records:
        if not r.ok:
            continue
        times = r.token_times()
        if not times:
            continue
        per_chunk = r.output_tokens / len(times)
        for t in times:
            b = int(t // bucket_s)
            counts[b] = counts.get(b, 0.0) + per_chunk
    if not counts:
        return [], []
    n = max(counts) + 1
    return [i * bucket_s for i in range(n)], [counts.get(i, 0.0) / bucket_s for i in range(n)]


def summarize(
    records: Sequence[RequestRecord],
    *,
    duration_s: float,
    percentiles: Sequence[float] = (99.0,),
    goodput: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The summary dict described in the module docstring, from measured records."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    reasons = Counter(r.error for r in failed if r.error is not None)
    examples: dict[str, str] = {}
    for r in failed:
        if r.error is not None and r.error not in examples:
            examples[r.error] = r.error_detail or ""
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    tpots = [t for r in ok if (t := r.tpot) is not None]
    itls = [g for r in ok for g in r.itl]
    e2els = [r.e2el for r in ok if r.e2el is not None]
    total_in = sum(r.input_tokens for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    dur = duration_s if duration_s > 0 else math.nan

    good: int | None = None
    if goodput:
        good = sum(1 for r in ok if _meets_slo(r, goodput))
    _, rates = throughput_series(ok, 1.0)

    summary: dict[str, Any] = {}
    for key, values in (("ttft_ms", ttfts), ("tpot_ms", tpots), ("itl_ms", itls), ("e2el_ms", e2els)):
        summary[key] = latency_stats(values, percentiles)
    summary["send_lag_ms"] = latency_stats((max(0.0, r.start - r.scheduled) for r in records), percentiles)
    summary.update(
        {
            "num_prompts": len(records),
            "completed": len(ok),
            "failed": len(failed),
            "failures": dict(reasons.most_common()),
            "failure_examples": examples,
            "total_input_tokens": total_in,
            "total_output_tokens": total_out,
            "duration_s": duration_s,
            "request_throughput": _finite(len(ok) / dur),
            "output_throughput": _finite(total_out / dur),
            "total_token_throughput": _finite((total_in + total_out) / dur),
            "goodput": None if good is None else _finite(good / dur),
            "good_requests": good,
            "goodput_slo_ms": dict(goodput or {}),
            "max_output_tokens_per_s": max(rates) if rates else 0.0,
            "max_concurrent_requests": peak_concurrency(records),
            "usage_reported": sum(1 for r in ok if r.usage_reported),
        }
    )
    return summary


def summarize_repetitions(
    records_per_repetition: Sequence[Sequence[RequestRecord]],
    summaries: Sequence[Mapping[str, Any]],
    *,
    percentiles: Sequence[float] = (99.0,),
    goodput: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One summary of several repetitions of the same load (see the module docstring)."""
    pooled = [r for records in records_per_repetition for r in records]
    duration = math.fsum(float(s.get("duration_s") or 0.0) for s in summaries)
    out = summarize(pooled, duration_s=duration, percentiles=percentiles, goodput=goodput)
    # the records' times are offsets within their own repetition: peaks of the pooled records would
    # stack repetitions that never overlapped, so the peak is the largest of any single repetition
    out["max_output_tokens_per_s"] = max(float(s.get("max_output_tokens_per_s") or 0.0) for s in summaries)
    out["max_concurrent_requests"] = max(int(s.get("max_concurrent_requests") or 0) for s in summaries)
    out["repetitions"] = len(summaries)
    return out


#: The headline numbers whose spread across repetitions is printed: (label, summary key, statistic).
_SPREAD_ROWS: tuple[tuple[str, str, str | None], ...] = (
    ("Request throughput (req/s)", "request_throughput", None),
    ("Output throughput (tok/s)", "output_throughput", None),
    ("Mean TTFT (ms)", "ttft_ms", "mean"),
    ("Median TTFT (ms)", "ttft_ms", "median"),
    ("Median TPOT (ms)", "tpot_ms", "median"),
    ("Median ITL (ms)", "itl_ms", "median"),
    ("Median E2EL (ms)", "e2el_ms", "median"),
)


def format_spread(summaries: Sequence[Mapping[str, Any]]) -> str:
    """Each headline number's mean, standard deviation (n − 1) and range across repetitions."""
    width = 60
    lines = [
        f" Spread across {len(summaries)} repetitions ".center(width, "-"),
        f"{'':<27}{'mean':>9}{'std %':>7}{'min':>8}{'max':>9}",
    ]
    for label, key, stat in _SPREAD_ROWS:
        values: list[float] = []
        for s in summaries:
            v = s.get(key)
            if stat is not None:
                v = v.get(stat) if isinstance(v, Mapping) else None
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                values.append(float(v))
        if len(values) != len(summaries):
            lines.append(f"{label:<27}{'n/a':>9}")
            continue
        m = math.fsum(values) / len(values)
        std = math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
        cv = f"{std / abs(m) * 100:.0f}%" if m else "n/a"
        lines.append(f"{label:<27}{m:>9,.2f}{cv:>7}{min(values):>8,.2f}{max(values):>9,.2f}")
    lines.append("std %: the repetitions' standard deviation (n - 1) over their mean.")
    lines.append("=" * width)
    return "\n".join(lines)


def _meets_slo(r: RequestRecord, slo_ms: Mapping[str, float]) -> bool:
    measured = {
        "ttft": r.ttft,
        "tpot": r.tpot if r.tpot is not None else 0.0,  # vLLM counts a one-token request's TPOT as 0
        "e2el": r.e2el,
    }
    for name, limit in slo_ms.items():
        value = measured.get(name)
        if value is None or value * 1000.0 > limit:
            return False
    return True


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return f"{x:,}" if isinstance(x, int) else str(x)


def format_summary(summary: Mapping[str, Any], *, title: str = "Serving Benchmark Result") -> str:
    """The summary as a fixed-width table, in the layout of ``vllm bench serve``."""
    width = 60
    lines = [f" {title} ".center(width, "=")]

    def row(label: str, value: Any, digits: int = 2) -> None:
        lines.append(f"{label:<42}{_fmt(value, digits):>18}")

    row("Successful requests:", summary.get("completed"))
    row("Failed requests:", summary.get("failed"))
    examples = summary.get("failure_examples", {})
    for reason, count in summary.get("failures", {}).items():
        row(f"  {reason}:", count)
        detail = str(examples.get(reason, ""))
        if detail:
            lines.append(f"      e.g. {detail[:120]}")
    row("Benchmark duration (s):", summary.get("duration_s"))
    row("Total input tokens:", summary.get("total_input_tokens"))
    row("Total generated tokens:", summary.get("total_output_tokens"))
    row("Request throughput (req/s):", summary.get("request_throughput"))
    if summary.get("goodput") is not None:
        slo = ", ".join(f"{k}<={v:g}ms" for k, v in summary.get("goodput_slo_ms", {}).items())
        row(f"Request goodput (req/s, {slo}):", summary.get("goodput"))
        row("  requests meeting every SLO:", summary.get("good_requests"))
    row("Output token throughput (tok/s):", summary.get("output_throughput"))
    row("Peak output token throughput (tok/s):", summary.get("max_output_tokens_per_s"))
    row("Peak concurrent requests:", summary.get("max_concurrent_requests"))
    row("Total token throughput (tok/s):", summary.get("total_token_throughput"))
    for key, name in LATENCY_KEYS.items():
        stats = summary.get(key) or {}
        short = key.removesuffix("_ms").upper()
        lines.append(f" {name} ".center(width, "-"))
        for stat in ("mean", "median", "std"):
            row(f"{stat.capitalize()} {short} (ms):", stats.get(stat))
        for pk in [k for k in stats if k.startswith("p") and k != "p50"]:
            row(f"P{pk[1:]} {short} (ms):", stats.get(pk))
    lag = summary.get("send_lag_ms") or {}
    if (lag.get("max") or 0.0) > 0.0:
        lines.append(" Client send lag (behind schedule) ".center(width, "-"))
        row("Mean send lag (ms):", lag.get("mean"))
        row("Max send lag (ms):", lag.get("max"))
    lines.append("=" * width)
    return "\n".join(lines)
