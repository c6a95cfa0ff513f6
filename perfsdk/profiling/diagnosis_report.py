"""What a diagnosis says, in words and in JSON: ``summary()`` and ``format_report()`` of
:class:`~perfsdk.profiling.analyze.Diagnosis`, built from its :class:`~perfsdk.profiling.totals.StepTotals`,
findings and kernel check (never from the steps again)::

    diag = analyze_trace("decode.pt.trace.json.gz")
    summary_of(diag.totals) == diag.summary()
    print(diag.format_report())       # the header, the profiler's inflation, the step picture, the findings
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from perfsdk.profiling.categories import CATEGORIES
from perfsdk.profiling.findings import Finding, findings_lines
from perfsdk.profiling.kernel_check import KernelCheck
from perfsdk.profiling.kernel_findings import kernel_lines
from perfsdk.profiling.observer import observer_lines
from perfsdk.profiling.totals import StepTotals

__all__ = ["report_lines", "summary_of"]


def summary_of(t: StepTotals) -> dict[str, Any]:
    """Aggregates over steps: idle split as shares of step time, per-step means, category shares."""
    cat_total = sum(t.category_us.values())
    per = t.per_step

    def share(us: float) -> float | None:
        return round(us / t.window_us, 4) if t.window_us > 0 else None

    comm = t.comm_share
    return {
        "step_time_us_mean": round(per.step_us, 2),
        "profiled_step_time_us_mean": round(t.profiled_step_us, 2),
        "idle_launch_wait_share": share(t.idle_launch_wait_us),
        "idle_after_sync_share": share(t.idle_after_sync_us),
        "idle_other_share": share(t.idle_other_us),
        "kernels_per_step": round(per.kernels, 2),
        "kernel_median_us": None if t.kernel_median_us is None else round(t.kernel_median_us, 3),
        "category_shares": {c: round(t.category_us[c] / cat_total, 4) for c in CATEGORIES if t.category_us.get(c)}
        if cat_total > 0
        else {},
        "host_syncs_per_step": round(per.host_syncs, 2),
        "d2h_copies_per_step": round(per.d2h_copies, 2),
        "h2d_pageable_copies_per_step": round(per.h2d_pageable_copies, 2),
        "graph_launches_per_step": round(per.graph_launches, 2),
        "host_reads_per_step": round(per.host_reads, 2),
        "communication_share": None if comm is None else round(comm, 4),
        "communication_us_mean": round(per.comm_us, 2),
    }


def report_lines(
    *,
    source: str,
    steps: int,
    step_source: str,
    summary: Mapping[str, Any],
    observer: Mapping[str, Mapping[str, Any]],
    unprofiled_note: str,
    has_gpu: bool,
    corrected: bool,
    basis: str,
    busy: float | None,
    kernel_check: KernelCheck | None,
    findings: Sequence[Finding],
) -> list[str]:
    """The report's lines: one header, the profiler's inflation, the step picture, the ranked findings."""
    s = summary
    name = os.path.basename(source)
    lines = [
        f"{name}: {steps} step(s) from {step_source}, mean {s['profiled_step_time_us_mean'] / 1000:.3f} ms profiled"
    ]
    lines.extend(observer_lines(observer, unprofiled_note, has_gpu, corrected))
    cats = ", ".join(
        f"{c} {v:.0%}" for c, v in sorted(s["category_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005
    )
    if not has_gpu:
        lines.append("  no GPU events in this trace (CPU-only profile): host-side findings only")
        lines.append(f"  host reads of tensor values per step: {s['host_reads_per_step']:g}")
        if cats:
            lines.append(f"  host operator time by category (self time): {cats}")
        if s["communication_us_mean"]:
            lines.append(
                f"  in collectives: {s['communication_share']:.0%} of {basis} "
                f"({s['communication_us_mean'] / 1000:.3f} ms per step, waits for other ranks included)"
            )
    elif busy is not None:
        lines.append(
            f"  GPU busy {busy:.0%} of {basis}; idle: waiting for launch "
            f"{s['idle_launch_wait_share']:.0%} (after a host sync {s['idle_after_sync_share']:.0%}), "
            f"other {s['idle_other_share']:.0%}"
        )
        med = s["kernel_median_us"]
        lines.append(
            f"  per step: {s['kernels_per_step']:g} kernels, median "
            f"{'-' if med is None else f'{med:.1f}'} µs; "
            f"{s['host_syncs_per_step']:g} host syncs; "
            f"{s['h2d_pageable_copies_per_step']:g} pageable H2D copies; "
            f"{s['graph_launches_per_step']:g} graph launches"
        )
        lines.append(f"  GPU time by category: {cats or '-'}")
        if kernel_check is not None:  # the kernels that a finding does not already list
            listed = any(f.kind in ("slow_kernels", "busy_unchecked") for f in findings)
            lines.extend(kernel_lines(kernel_check, basis, show_top=not listed))
        if s["communication_us_mean"]:
            lines.append(
                f"  in collectives, not overlapped: {s['communication_share']:.0%} of {basis} "
                f"({s['communication_us_mean'] / 1000:.3f} ms per step, waits for other ranks included)"
            )
    lines.extend(findings_lines(list(findings), "none above thresholds", basis))
    return lines
