"""The timeline question, measured: what each step's host calls did and where its GPU time went.

:func:`measure_steps` fills one :class:`~perfsdk.profiling.steps.StepStats` per step range from a loaded
trace, and returns the idle :class:`~perfsdk.profiling.steps.Gap`\\ s of the whole GPU timeline::

    from perfsdk.profiling.steps import step_spans
    from perfsdk.profiling.timeline import measure_steps
    from perfsdk.profiling.trace_events import load_trace

    trace = load_trace("decode.pt.trace.json.gz")
    spans, source = step_spans(trace, None)
    steps, gaps = measure_steps(trace, spans)

**Host side** (each step's range, on its thread): launches and graph launches, host synchronisations
(stream, device and event synchronise, synchronous ``cudaMemcpy``) and the time they blocked, reads of
tensor values (``aten::item``); in a CPU-only trace, the host operators' self time by category and the
time in collectives on any thread (gloo works on its own threads).

**GPU side.** A step's GPU work is what its host calls enqueued (linked by correlation id; by time when a
trace carries no correlation ids at all), and its GPU window runs from its first GPU op to the start of
the next step's first op, so the idle time between back-to-back steps is charged to the step that left
the GPU idle. In it: busy time (the union of kernels, memcpys and memsets over all streams), idle time
split by why the GPU waited (:func:`classify_gaps`), kernels and their median, kernel time by category,
copies, exposed collectives and the per-kernel tallies the kernel check prices.
"""

from __future__ import annotations

import bisect
import itertools
import re
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from perfsdk.profiling.categories import categorize, categorize_cpu_op
from perfsdk.profiling.kernel_shapes import ShapeIndex, tally_kernels
from perfsdk.profiling.steps import Gap, StepSpan, StepStats
from perfsdk.profiling.trace_model import Event, Trace

__all__ = ["SYNC_SLACK_US", "classify_gaps", "measure_steps", "merge", "overlap"]

# Clock slack when matching "the host sync returned" against "the GPU ran dry" (µs): the GPU and
# host timestamps in a Kineto trace are aligned but not to better than a few µs.
SYNC_SLACK_US = 5.0

_STREAM_SYNC = frozenset({"cudaStreamSynchronize", "cuStreamSynchronize"})
_DEVICE_SYNC = frozenset({"cudaDeviceSynchronize", "cuCtxSynchronize"})
_EVENT_SYNC = frozenset({"cudaEventSynchronize", "cuEventSynchronize"})
_HOST_SYNCS = _STREAM_SYNC | _DEVICE_SYNC | _EVENT_SYNC
_LAUNCH_PREFIXES = ("cudaLaunch", "cuLaunch", "cudaGraphLaunch", "cuGraphLaunch")
_GRAPH_LAUNCH = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "cudaGraphLaunch_v10000"})
# host reads of a tensor value: item() / bool() / tolist() all end in _local_scalar_dense
_HOST_READ_OPS = frozenset({"aten::_local_scalar_dense"})
# host-side collectives (CPU-only traces): torch.distributed's record_function ranges ("gloo:all_reduce",
# "nccl:all_reduce", ...) and its c10d ops. gloo runs the collective on its own threads, so these are
# looked for on every thread, and their union (ranges nest and overlap) is the time spent in them.
_HOST_COLLECTIVE = re.compile(r"^(?:gloo|nccl|mpi|ucc|xccl):|^c10d::")


def measure_steps(trace: Trace, spans: Sequence[StepSpan]) -> tuple[list[StepStats], list[Gap]]:
    """One :class:`StepStats` per span (in order), and the idle gaps of the whole GPU timeline."""
    steps, step_of_corr = _host_side(trace, spans)
    ops = trace.gpu_ops
    step_ops = _ops_of_steps(ops, spans, step_of_corr) if steps else []
    gaps = classify_gaps(trace, ops)
    _gpu_side(trace, steps, step_ops, gaps)
    return steps, gaps


def _host_side(trace: Trace, spans: Sequence[StepSpan]) -> tuple[list[StepStats], dict[int, int]]:
    """The steps with their host-side counts, and the step each correlation id was launched in."""
    runtime_in = _SpanIndex(trace.runtime)
    cpu_in = _SpanIndex(trace.cpu_ops)
    # CPU-only traces: time inside collectives, on any thread (gloo works on its own threads)
    host_comm = (
        []
        if trace.has_gpu
        else merge((e.ts, e.end) for e in (*trace.annotations, *trace.cpu_ops) if _HOST_COLLECTIVE.match(e.name))
    )
    host_comm_starts = [b[0] for b in host_comm]
    steps: list[StepStats] = []
    step_of_corr: dict[int, int] = {}
    for i, span in enumerate(spans):
        st = StepStats(index=i, name=span.name, host_start_us=span.start, host_dur_us=span.end - span.start)
        for c in runtime_in.started_in(span):
            if c.correlation is not None:
                step_of_corr.setdefault(c.correlation, i)
            _count_call(st, c)
        cpu_in_step = cpu_in.started_in(span)
        if not trace.has_gpu and host_comm:
            st.host_comm_us = overlap(host_comm, host_comm_starts, span.start, span.end)
        for op in cpu_in_step:
            if op.name in _HOST_READ_OPS:
                st.host_reads += 1
                st.host_read_us += op.dur
        if not trace.has_gpu:
            # a CPU-only trace: where the host's operator time went, by *self* time so that
            # aten::linear -> aten::addmm nesting is not counted twice
            for op, self_us in _self_times(cpu_in_step):
                category = categorize_cpu_op(op.name)
                st.category_us[category] = st.category_us.get(category, 0.0) + self_us
        steps.append(st)
    return steps, step_of_corr


def _count_call(st: StepStats, c: Event) -> None:
    """One host API call of the step: a launch, a synchronisation, a blocking copy."""
    if c.name.startswith(_LAUNCH_PREFIXES):
        st.launches += 1
    if c.name in _GRAPH_LAUNCH:
        st.graph_launches += 1
    if c.name in _STREAM_SYNC:
        st.stream_syncs += 1
    elif c.name in _DEVICE_SYNC:
        st.device_syncs += 1
    elif c.name in _EVENT_SYNC:
        st.event_syncs += 1
    if c.name == "cudaMemcpy":
        st.blocking_copies += 1
    if c.name in _HOST_SYNCS or c.name == "cudaMemcpy":
        st.sync_blocked_us += c.dur


def _ops_of_steps(ops: list[Event], spans: Sequence[StepSpan], step_of_corr: dict[int, int]) -> list[list[Event]]:
    """The GPU ops of each step: by correlation with the step's host calls; by time when a trace
    carries no correlation ids at all (old Kineto, some converters)."""
    step_ops: list[list[Event]] = [[] for _ in spans]
    if any(op.correlation in step_of_corr for op in ops):
        for op in ops:
            k = step_of_corr.get(op.correlation) if op.correlation is not None else None
            if k is not None:
                step_ops[k].append(op)
    else:
        # the first span (in order) with start <= ts < end: spans are sorted by start, so among
        # those that started by ts it is the first whose end, and so whose running maximum of
        # ends, passes ts
        span_starts = [sp.start for sp in spans]
        max_ends = list(itertools.accumulate((sp.end for sp in spans), max))
        for op in ops:
            k = bisect.bisect_right(max_ends, op.ts)
            if k < bisect.bisect_right(span_starts, op.ts):
                step_ops[k].append(op)
    return step_ops


def _gpu_side(trace: Trace, steps: list[StepStats], step_ops: list[list[Event]], gaps: list[Gap]) -> None:
    """Each step's GPU window, busy and idle time, kernels, copies and exposed collectives."""
    ops = trace.gpu_ops
    gap_starts = [g.start for g in gaps]
    busy = merge((op.ts, op.end) for op in ops)
    busy_starts = [b[0] for b in busy]
    non_comm = merge((op.ts, op.end) for op in ops if categorize(op.name, op.cat) != "communication")
    non_comm_starts = [b[0] for b in non_comm]
    first_start = [min((o.ts for o in so), default=None) for so in step_ops]
    op_starts = [o.ts for o in ops]
    shapes = ShapeIndex(trace) if ops else None

    for i, st in enumerate(steps):
        mine = step_ops[i]
        if not mine:
            continue
        start = first_start[i]
        assert start is not None
        end = max(o.end for o in mine)
        # charge the idle time before the next step's first op to this step, when the next
        # GPU op after this step's work is indeed the next step's (back-to-back steps)
        j = bisect.bisect_left(op_starts, end)
        nxt = first_start[i + 1] if i + 1 < len(steps) else None
        if nxt is not None and j < len(ops) and ops[j].ts >= nxt >= end:
            end = nxt
        st.gpu_start_us, st.gpu_end_us = start, end
        st.gpu_busy_us = overlap(busy, busy_starts, start, end)
        _charge_idle(st, gaps, gap_starts, start, end)
        kernel_durs = []
        for op in mine:
            category = categorize(op.name, op.cat)
            st.category_us[category] = st.category_us.get(category, 0.0) + op.dur
            if op.cat == "kernel":
                kernel_durs.append(op.dur)
                if category == "communication":
                    st.exposed_comm_us += op.dur - overlap(non_comm, non_comm_starts, op.ts, op.end)
            elif op.cat == "gpu_memcpy":
                _count_copy(trace, st, op)
        st.kernels = len(kernel_durs)
        st.kernel_median_us = statistics.median(kernel_durs) if kernel_durs else None
        st.kernel_tally = tally_kernels(
            trace, (op for op in mine if op.cat == "kernel" and categorize(op.name, op.cat) != "communication"), shapes
        )


def _charge_idle(st: StepStats, gaps: list[Gap], gap_starts: list[float], start: float, end: float) -> None:
    """The idle time inside [start, end), by why the GPU waited."""
    k = max(bisect.bisect_right(gap_starts, start) - 1, 0)
    while k < len(gaps) and gaps[k].start < end:
        g = gaps[k]
        d = min(g.end, end) - max(g.start, start)
        if d > 0:
            if g.reason == "other":
                st.idle_other_us += d
            else:
                st.idle_launch_wait_us += d
                if g.reason == "after_sync":
                    st.idle_after_sync_us += d
        k += 1


def _count_copy(trace: Trace, st: StepStats, op: Event) -> None:
    """One GPU memcpy of the step: host<->device time and bytes, pageable H2D, the host blocked on a D2H."""
    is_h2d, is_d2h = "HtoD" in op.name, "DtoH" in op.name
    if is_h2d or is_d2h:
        st.copy_us += op.dur
        st.copy_bytes += op.nbytes or 0
    if is_d2h:
        st.d2h_copies += 1
        call = trace.launch_of(op)
        if call is not None and call.name != "cudaMemcpy":  # cudaMemcpy counted with the host calls
            st.sync_blocked_us += call.dur
    if is_h2d:
        st.h2d_copies += 1
        if "Pageable" in op.name:
            st.h2d_pageable_copies += 1
            st.h2d_pageable_bytes += op.nbytes or 0


def _self_times(ops: list[Event]) -> list[tuple[Event, float]]:
    """Each op's duration minus its children's (ops nest by time on one thread)."""
    out: list[tuple[Event, float]] = []
    by_tid: dict[Any, list[Event]] = {}
    for op in ops:
        by_tid.setdefault(op.tid, []).append(op)
    for tid_ops in by_tid.values():
        tid_ops.sort(key=lambda o: (o.ts, -o.dur))
        stack: list[list[Any]] = []  # [op, children's time]
        for op in tid_ops:
            while stack and op.ts >= stack[-1][0].end:
                done = stack.pop()
                out.append((done[0], max(done[0].dur - done[1], 0.0)))
            if stack:
                stack[-1][1] += op.dur
            stack.append([op, 0.0])
        while stack:
            done = stack.pop()
            out.append((done[0], max(done[0].dur - done[1], 0.0)))
    return out


class _SpanIndex:
    """Host events by thread with their start times, built once: each step's lookup is two bisects."""

    def __init__(self, events: list[Event]) -> None:
        self._all = (events, [e.ts for e in events])
        self._by_thread = {t: (evs, [e.ts for e in evs]) for t, evs in _by_thread(events).items()}

    def started_in(self, span: StepSpan) -> list[Event]:
        """Host events that started inside *span* (on its thread, if it has one)."""
        evs, starts = self._all if span.thread is None else self._by_thread.get(span.thread, ([], []))
        return evs[bisect.bisect_left(starts, span.start) : bisect.bisect_left(starts, span.end)]


def _by_thread(events: Iterable[Event]) -> dict[tuple[str, str], list[Event]]:
    out: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        out.setdefault(e.thread, []).append(e)
    return out


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of *intervals*, as sorted disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def overlap(merged: list[tuple[float, float]], starts: list[float], s: float, e: float) -> float:
    """Length of [s, e) covered by sorted disjoint *merged* intervals (``starts`` = their starts)."""
    total = 0.0
    i = max(bisect.bisect_right(starts, s) - 1, 0)
    while i < len(merged) and merged[i][0] < e:
        lo, hi = max(merged[i][0], s), min(merged[i][1], e)
        if hi > lo:
            total += hi - lo
        i += 1
    return total


def _is_blocking_d2h(op: Event) -> bool:
    return op.cat == "gpu_memcpy" and "DtoH" in op.name


def classify_gaps(trace: Trace, ops: list[Event]) -> list[Gap]:
    """Idle stretches between GPU ops on any stream, each with the reason the GPU waited."""
    syncs_by_thread = _by_thread(c for c in trace.runtime if c.name in _HOST_SYNCS or c.name == "cudaMemcpy")
    # a pageable/blocking D2H cudaMemcpyAsync stalls the host like a sync does
    for op in ops:
        if _is_blocking_d2h(op):
            call = trace.launch_of(op)
            if call is not None:
                syncs_by_thread.setdefault(call.thread, []).append(call)
    sync_ends = {t: sorted(c.end for c in calls) for t, calls in syncs_by_thread.items()}

    gaps: list[Gap] = []
    running_end = None
    for op in ops:  # sorted by start
        if running_end is not None and op.ts > running_end:
            reason = "other"
            call = trace.launch_of(op)
            if call is not None and call.ts >= running_end:
                reason = "launch_wait"
                ends = sync_ends.get(call.thread, [])
                j = bisect.bisect_left(ends, running_end - SYNC_SLACK_US)
                if j < len(ends) and ends[j] <= call.ts:
                    reason = "after_sync"
            gaps.append(Gap(running_end, op.ts, reason))
        running_end = op.end if running_end is None else max(running_end, op.end)
    return gaps
