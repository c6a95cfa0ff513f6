"""A PNG of one run: latency distributions and output tokens/s over time.

::

    from perfsdk.bench.plot import plot_result
    plot_result(result, "run.png")        # or: perfsdk bench serve ... --plot run.png

Four histograms (TTFT, TPOT, ITL, E2EL, in ms, with the median and p99 marked)
and a time series of output tokens/s with requests in flight. For a run of
several repetitions the histograms hold every repetition's requests and the
time series is the first repetition's (their clocks each start at zero). matplotlib is
imported here only, with the Agg backend, so no display is needed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfsdk.bench.report import percentile, throughput_series
from perfsdk.errors import MissingDependencyError

if TYPE_CHECKING:
    from perfsdk.bench.records import RequestRecord
    from perfsdk.bench.result import BenchResult

__all__ = ["plot_result"]


def plot_result(result: BenchResult, path: str | os.PathLike[str]) -> Path:
    """Write the figure to *path* (PNG) and return the path."""
    try:
        import matplotlib  # optional dependency

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise MissingDependencyError("matplotlib", "perfsdk bench --plot", extra="bench") from e

    ok = [r for r in result.records if r.ok]
    series: dict[str, list[float]] = {
        "TTFT (ms)": [r.ttft * 1000 for r in ok if r.ttft is not None],
        "TPOT (ms)": [t * 1000 for r in ok if (t := r.tpot) is not None],
        "ITL (ms)": [g * 1000 for r in ok for g in r.itl],
        "E2E latency (ms)": [r.e2el * 1000 for r in ok if r.e2el is not None],
    }
    fig = plt.figure(figsize=(12, 9), constrained_layout=True)
    grid = fig.add_gridspec(3, 2)
    for k, (title, values) in enumerate(series.items()):
        ax = fig.add_subplot(grid[k // 2, k % 2])
        _histogram(ax, title, values)

    ax = fig.add_subplot(grid[2, :])
    first = result.repetitions[0]
    duration = float(first.summary.get("duration_s") or 0.0)
    bucket = max(duration / 60.0, 0.05)  # about 60 points whatever the length of the run
    times, rates = throughput_series([r for r in first.records if r.ok], bucket)
    ax.step(times, rates, where="post", color="tab:blue", label="output tokens/s")
    ax.set_xlabel("time since first request (s)")
    ax.set_ylabel("output tokens/s")
    ax.grid(alpha=0.3)
    if len(result.repetitions) > 1:
        ax.set_title(f"repetition 1 of {len(result.repetitions)}")
    if first.records:
        inflight = ax.twinx()
        xs, ys = _in_flight(first.records)
        inflight.step(xs, ys, where="post", color="tab:orange", alpha=0.7, label="requests in flight")
        inflight.set_ylabel("requests in flight")
        handles = ax.get_legend_handles_labels()[0] + inflight.get_legend_handles_labels()[0]
        ax.legend(handles=handles, loc="upper right")
    cfg = result.config
    failed = result.summary.get("failed", 0)
    fig.suptitle(
        f"{cfg.get('model', '?')} @ {cfg.get('request_rate', '?')} req/s, "
        f"{result.summary.get('completed', 0)} ok, {failed} failed"
    )
    out = Path(path)
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out


def _histogram(ax: Any, title: str, values: list[float]) -> None:
    ax.set_title(title)
    if not values:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        return
    ax.hist(values, bins=min(50, max(5, len(values) // 4)), color="tab:blue", alpha=0.8)
    s = sorted(values)
    for p, style in ((50.0, "--"), (99.0, ":")):
        x = percentile(s, p)
        ax.axvline(x, color="black", linestyle=style, label=f"p{p:g} {x:.1f}")
    ax.legend(loc="upper right", fontsize="small")
    ax.set_ylabel("count")


def _in_flight(records: list[RequestRecord]) -> tuple[list[float], list[int]]:
    events: list[tuple[float, int]] = []
    for r in records:
        if r.stream_end is not None:
            events.append((r.start, 1))
            events.append((r.start + r.stream_end, -1))
    events.sort()
    xs, ys, cur = [0.0], [0], 0
    for t, d in events:
        cur += d
        xs.append(t)
        ys.append(cur)
    return xs, ys
