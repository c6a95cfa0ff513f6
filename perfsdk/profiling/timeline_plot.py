"""Draw one step's GPU timeline with its idle gaps (``perfsdk analyze TRACE --plot step.png``).

::

    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.timeline_plot import plot_timeline

    plot_timeline("decode.pt.trace.json.gz", "step.png")          # a trace path, events or a Diagnosis
    plot_timeline(analyze_trace(path), "step3.png", step=3)

One row per GPU stream (ops coloured by category) and one row of the host's launch calls;
idle gaps are shaded: red while the GPU waited for the host to launch, orange right after a host
synchronisation, grey otherwise. matplotlib is imported here only (Agg backend, no display).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from perfsdk.errors import ConfigError, MissingDependencyError
from perfsdk.profiling.analyze import Diagnosis, analyze_trace
from perfsdk.profiling.categories import CATEGORIES, categorize
from perfsdk.profiling.trace_events import Trace

__all__ = ["plot_timeline"]

_CATEGORY_COLORS = {
    "gemm": "#1f77b4",
    "attention": "#9467bd",
    "normalization": "#2ca02c",
    "elementwise": "#17becf",
    "communication": "#e377c2",
    "memcpy": "#8c564b",
    "other": "#7f7f7f",
}
_GAP_COLORS = {"launch_wait": "#d62728", "after_sync": "#ff7f0e", "other": "#bbbbbb"}


def _pick_step(diag: Diagnosis, step: int | None) -> int:
    with_gpu = [s for s in diag.steps if s.gpu_window_us > 0]
    if not with_gpu:
        raise ConfigError("plot: the trace has no GPU ops inside any step, nothing to draw")
    if step is None:  # the step of median length: representative, not an outlier
        med = statistics.median_low([s.gpu_window_us for s in with_gpu])
        return next(s.index for s in with_gpu if s.gpu_window_us == med)
    if not 0 <= step < len(diag.steps) or diag.steps[step].gpu_window_us <= 0:
        raise ConfigError(
            f"step: {step} is not a step with GPU work (steps with GPU work: {[s.index for s in with_gpu]})"
        )
    return step


def plot_timeline(
    diagnosis_or_trace: Diagnosis | Trace | str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    step: int | None = None,
) -> str:
    """Draw step *step* (default: the median-length step) to *path*; returns the path written."""
    src = diagnosis_or_trace
    diag = src if isinstance(src, Diagnosis) else analyze_trace(src)
    if diag.trace is None:
        raise ConfigError("plot: this Diagnosis carries no trace events to draw")
    idx = _pick_step(diag, step)
    st = diag.steps[idx]
    t0, t1 = st.gpu_start_us, st.gpu_end_us
    if t0 is None or t1 is None:  # _pick_step only returns steps with a GPU window
        raise ConfigError(f"step: {idx} has no GPU window")
    try:
        # matplotlib is optional and heavy: imported only when a plot is asked for
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise MissingDependencyError("matplotlib", "perfsdk analyze --plot", extra="bench") from e

    trace = diag.trace
    ops = [o for o in trace.gpu_ops if o.end > t0 and o.ts < t1]
    streams = sorted({o.stream if o.stream is not None else -1 for o in ops})
    rows = {s: i for i, s in enumerate(streams)}
    host_row = len(streams)
    launches = [c for c in trace.runtime if c.end > t0 and c.ts < t1]

    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.5 * (len(streams) + 1)))
    for g in diag.gaps:
        if g.end > t0 and g.start < t1:
            ax.axvspan(
                (max(g.start, t0) - t0) / 1e3,
                (min(g.end, t1) - t0) / 1e3,
                color=_GAP_COLORS[g.reason],
                alpha=0.35,
                lw=0,
            )
    for o in ops:
        y = rows[o.stream if o.stream is not None else -1]
        ax.broken_barh(
            [((o.ts - t0) / 1e3, max(o.dur, 0.05) / 1e3)],
            (y - 0.4, 0.8),
            color=_CATEGORY_COLORS[categorize(o.name, o.cat)],
            lw=0,
        )
    if launches:
        ax.broken_barh(
            [((c.ts - t0) / 1e3, max(c.dur, 0.05) / 1e3) for c in launches],
            (host_row - 0.4, 0.8),
            color="#444444",
            lw=0,
        )
    ax.set_yticks(range(host_row + 1))
    ax.set_yticklabels([f"stream {s}" if s >= 0 else "GPU" for s in streams] + ["host CUDA calls"])
    ax.set_xlim(0, (t1 - t0) / 1e3)
    ax.set_xlabel("ms from the step's first GPU op")
    busy = st.gpu_busy_fraction or 0.0
    ax.set_title(
        f"{os.path.basename(diag.source)} — step {idx} ({st.name}): GPU busy {busy:.0%}, "
        f"waiting for launch {st.idle_launch_wait_us / st.gpu_window_us:.0%}"
    )
    used = {categorize(o.name, o.cat) for o in ops}
    handles = [Patch(color=_CATEGORY_COLORS[c], label=c) for c in CATEGORIES if c in used]
    handles += [Patch(color=_GAP_COLORS[r], alpha=0.35, label=f"idle: {r.replace('_', ' ')}") for r in _GAP_COLORS]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=5, fontsize=8, frameon=False)
    fig.tight_layout()
    out = os.fspath(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
