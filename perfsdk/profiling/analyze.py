"""Diagnose a torch.profiler chrome trace: where did the step's time go, and what to change next.

Works on any Kineto trace — perfsdk's profiler window, vLLM's or SGLang's ``--profile`` output,
a user's ``prof.export_chrome_trace("t.json.gz")``::

    $ perfsdk analyze decode.pt.trace.json.gz            # short human report
    $ perfsdk analyze decode.pt.trace.json.gz --json     # machine-readable
    $ perfsdk analyze decode.pt.trace.json.gz --plot step.png

    from perfsdk.profiling.analyze import analyze_trace

    diag = analyze_trace("decode.pt.trace.json.gz")      # or a list of trace-event dicts
    diag.gpu_busy_fraction                               # 0.23
    diag.findings[0].kind                                # "launch_bound"
    print(diag.format_report())
    json.dumps(diag.to_dict())        # {"findings": [...], "gpu_busy_fraction", "steps", ...}

**Steps.** perfsdk's own ``record_function`` ranges (``perfsdk.decode``, ``perfsdk.prefill``,
``perfsdk.mixed``) when present, else torch.profiler's ``ProfilerStep#N``, else the whole trace
as one step (``step_pattern=`` picks other range names, e.g. an engine's own). A step's GPU work
is what the host calls made inside its range enqueued (linked by correlation id), and its GPU
window runs from its first GPU op to the start of the next step's first op, so the idle time
between back-to-back steps is charged to the step that left the GPU idle.

**Per step.** GPU busy fraction (union of kernels, memcpys and memsets over all streams); idle
time split into *waiting for launch* — the op that ended the gap was launched by the host after
the GPU had run dry, so the GPU starved waiting for the host; HTA calls this host wait — (and,
within it, the part right after a host synchronisation returned), and *other*; kernels and their
median duration; kernel-time shares by category (see :mod:`perfsdk.profiling.categories`);
host synchronisations (stream, device and event synchronise, device-to-host copies);
host-to-device copies from pageable memory.

**Findings**, ranked by the share of step time at stake, each with its evidence and the next
change to try: ``launch_bound``, ``sync_bound``, ``copy_bound``, ``communication_bound``, and, for the
kernels' own time, :mod:`perfsdk.profiling.bandwidth`'s: the healthy ``memory_bound`` /
``compute_bound`` only when the bytes (FLOPs) the step must move over its kernels' time come near the
peak, ``slow_kernels`` (with the kernels that hold the time and the Nsight Compute command for them)
when they do not, ``utilisation_suspect`` when they would exceed the peak, and ``busy_unchecked`` when
no bytes or peak were given (``cost=``; ``perfsdk analyze --model/--gpu/--batch/--context``)::

    from perfsdk.profiling.bandwidth import StepCost
    diag = analyze_trace(path, cost=StepCost.decode(spec, hw, batch=1, context_tokens=1024))

The thresholds (``LAUNCH_BOUND_MIN_SHARE`` and the others below, each with its reason beside it; the
kernel check's in :mod:`perfsdk.profiling.bandwidth`): a finding needs a tenth of the step (launch gaps,
exposed collectives, slow kernels' lost time), a twentieth for copies (a cheap, certain fix), half a sync
per step. Healthy needs the GPU in kernels 80 % of the step *and* the kernels at 60 % of the datasheet
bandwidth (a tuned copy reaches ~85 %, a compiled decode's GEMVs 70-85 %) or 50 % of the dense peak FLOP/s
(a large GEMM reaches 75-80 %, a whole prefill 50-65 %); above 100 % is impossible and called suspect.

**The profiler's own slowdown.** A profiled step is slower than the same step unprofiled; its kernels
are not. Given the unprofiled step time (``unprofiled=Unprofiled(step_us=...)``, ``perfsdk analyze
--unprofiled-ms``; perfsdk's window supplies its own), every share is of the unprofiled step, and the
inflation (profiled / unprofiled) is reported: :mod:`perfsdk.profiling.observer`. ``diag.steps`` stay
as measured. Without one the report says the shares are of the profiled step.

**Phases.** A step's phase is its ``perfsdk.<phase>`` range, else *phase* (default ``"decode"``);
``cost`` and ``unprofiled`` may be given per phase, and ``diag.select("decode")`` diagnoses the
decode steps alone (perfsdk's window does: its verdict is about the decode steps it was asked for,
not the prefills it happened to catch).

A trace without GPU events (CPU-only profiling) still gets step times and host-side findings:
reads of tensor values (``aten::item``), which on a GPU each wait for the device, and the time
the step spent in collectives (gloo's ``gloo:all_reduce`` ranges, which run on gloo's own threads
and include the wait for the slowest rank).

**Communication share.** ``summary()["communication_share"]`` is the share of step time spent in
collectives that nothing else overlapped: NCCL (and custom all-reduce) kernels on a GPU, gloo/NCCL
ranges on the host in a CPU-only trace. In tensor parallelism it includes the *wait* for the slowest
rank; comparing it across the ranks of one group separates waiting from transfer:
:mod:`perfsdk.profiling.ranks` (``perfsdk analyze rank0.json rank1.json``).
"""

from __future__ import annotations

import bisect
import itertools
import os
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.bandwidth import (
    HEALTHY_BUSY_FRACTION,
    KernelCheck,
    KernelTally,
    ShapeIndex,
    StepCost,
    check_kernels,
    kernel_findings,
    kernel_lines,
    tally_kernels,
)
from perfsdk.profiling.categories import CATEGORIES, categorize, categorize_cpu_op
from perfsdk.profiling.findings import Finding, findings_lines
from perfsdk.profiling.observer import Unprofiled, correct_step, observer_lines, observer_summary
from perfsdk.profiling.trace_events import DEFAULT_MAX_BYTES, Event, Trace, load_trace

__all__ = [
    "COMM_BOUND_MIN_SHARE",
    "COPY_BOUND_MIN_SHARE",
    "HEALTHY_BUSY_FRACTION",
    "LAUNCH_BOUND_MIN_SHARE",
    "PERFSDK_STEP_NAMES",
    "PHASES",
    "SYNC_BOUND_MIN_PER_STEP",
    "Diagnosis",
    "Finding",
    "Gap",
    "StepCost",
    "StepStats",
    "Unprofiled",
    "analyze_trace",
    "findings_lines",
    "step_phase",
]

# --- thresholds -------------------------------------------------------------------------------
# GPU idle spent waiting for the host to launch, as a share of step time, above which the step is
# called launch-bound. An eager batch-1 decode on an H100/H200 sits at 50-90%; under a CUDA graph
# it is ~0. 10% is where a CUDA graph starts to pay for its capture complexity.
LAUNCH_BOUND_MIN_SHARE = 0.10
# Host synchronisations per step (averaged) from which sync_bound is reported whatever its
# measured cost: one sync per step already stops the host from running ahead of the GPU, and in a
# launch-bound loop its cost hides inside the launch gaps, so the count is the evidence.
SYNC_BOUND_MIN_PER_STEP = 0.5
# Host<->device copy time as a share of step time above which copies are worth removing: at 5%
# pinned buffers or keeping the tensor resident is a cheap, certain win.
COPY_BOUND_MIN_SHARE = 0.05
# Exposed communication (collective kernels not overlapped by compute on another stream) as a
# share of step time; tensor-parallel decode spends 5-10% here when healthy.
COMM_BOUND_MIN_SHARE = 0.10
# HEALTHY_BUSY_FRACTION (imported from perfsdk.profiling.bandwidth with the other kernel thresholds):
# share of step time in kernels from which a step can be healthy at all.
# Median kernel duration above which an unlabelled busy step is worded as prefill-like (peak FLOP/s)
# when its bytes and FLOPs are unknown: decode kernels at small batch are weight reads of a few to tens of µs.
COMPUTE_KERNEL_MIN_US = 50.0
# Clock slack when matching "the host sync returned" against "the GPU ran dry" (µs): the GPU and
# host timestamps in a Kineto trace are aligned but not to better than a few µs.
SYNC_SLACK_US = 5.0

PERFSDK_STEP_NAMES: frozenset[str] = frozenset({"perfsdk.decode", "perfsdk.prefill", "perfsdk.mixed"})
PHASES: tuple[str, ...] = ("decode", "prefill", "mixed")
_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")

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


def step_phase(name: str, default: str = "decode") -> str:
    """The phase of a step named *name*: its ``perfsdk.<phase>`` range, else *default*."""
    if name in PERFSDK_STEP_NAMES:
        return name.split(".", 1)[1]
    return default


@dataclass(frozen=True, slots=True)
class Gap:
    """A stretch where no GPU op ran on any stream, and why (``launch_wait``, ``after_sync``, ``other``)."""

    start: float
    end: float
    reason: str

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass
class StepStats:
    """Everything measured for one step. Times in µs."""

    index: int
    name: str
    host_start_us: float
    host_dur_us: float
    gpu_start_us: float | None = None
    gpu_end_us: float | None = None
    gpu_busy_us: float = 0.0
    idle_launch_wait_us: float = 0.0  # includes idle_after_sync_us
    idle_after_sync_us: float = 0.0
    idle_other_us: float = 0.0
    kernels: int = 0
    kernel_median_us: float | None = None
    category_us: dict[str, float] = field(default_factory=dict)
    launches: int = 0
    graph_launches: int = 0
    stream_syncs: int = 0
    device_syncs: int = 0
    event_syncs: int = 0
    d2h_copies: int = 0
    blocking_copies: int = 0  # synchronous cudaMemcpy calls (the host waits for the copy)
    sync_blocked_us: float = 0.0
    h2d_copies: int = 0
    h2d_pageable_copies: int = 0
    h2d_pageable_bytes: int = 0
    copy_us: float = 0.0
    copy_bytes: int = 0
    exposed_comm_us: float = 0.0
    host_comm_us: float = 0.0  # CPU-only traces: time inside collectives (any thread), within the step
    host_reads: int = 0
    host_read_us: float = 0.0
    # per kernel name (communication kernels aside): time, launches, and bytes/FLOPs where shapes allow
    kernel_tally: dict[str, KernelTally] = field(default_factory=dict, repr=False)

    @property
    def gpu_window_us(self) -> float:
        if self.gpu_start_us is None or self.gpu_end_us is None:
            return 0.0
        return self.gpu_end_us - self.gpu_start_us

    @property
    def gpu_busy_fraction(self) -> float | None:
        w = self.gpu_window_us
        return self.gpu_busy_us / w if w > 0 else None

    @property
    def host_syncs(self) -> int:
        """Calls that stall the host on the GPU: synchronise calls and synchronous ``cudaMemcpy``.

        A D2H ``cudaMemcpyAsync`` is not counted on its own: torch's ``.item()``/``.tolist()`` issue one
        followed by a ``cudaStreamSynchronize``, which is the one stall (counted once, as that sync).
        """
        return self.stream_syncs + self.device_syncs + self.event_syncs + self.blocking_copies

    def category_shares(self) -> dict[str, float]:
        total = sum(self.category_us.values())
        if total <= 0:
            return {}
        return {c: round(self.category_us[c] / total, 4) for c in CATEGORIES if self.category_us.get(c)}

    def to_dict(self) -> dict[str, Any]:
        busy = self.gpu_busy_fraction
        return {
            "index": self.index,
            "name": self.name,
            "host_dur_us": round(self.host_dur_us, 2),
            "gpu_window_us": round(self.gpu_window_us, 2),
            "gpu_busy_us": round(self.gpu_busy_us, 2),
            "gpu_busy_fraction": None if busy is None else round(busy, 4),
            "idle_launch_wait_us": round(self.idle_launch_wait_us, 2),
            "idle_after_sync_us": round(self.idle_after_sync_us, 2),
            "idle_other_us": round(self.idle_other_us, 2),
            "kernels": self.kernels,
            "kernel_median_us": None if self.kernel_median_us is None else round(self.kernel_median_us, 3),
            "category_shares": self.category_shares(),
            "launches": self.launches,
            "graph_launches": self.graph_launches,
            "syncs": {"stream": self.stream_syncs, "device": self.device_syncs, "event": self.event_syncs,
                      "d2h_copies": self.d2h_copies, "blocked_us": round(self.sync_blocked_us, 2)},
            "h2d_copies": self.h2d_copies,
            "h2d_pageable_copies": self.h2d_pageable_copies,
            "h2d_pageable_bytes": self.h2d_pageable_bytes,
            "copy_us": round(self.copy_us, 2),
            "exposed_comm_us": round(self.exposed_comm_us, 2),
            "host_comm_us": round(self.host_comm_us, 2),
            "host_reads": self.host_reads,
        }


@dataclass
class Diagnosis:
    """The result of :func:`analyze_trace`; ``to_dict()`` is what ``--json`` prints.

    ``steps`` are as measured under the profiler; every share, fraction and finding is computed over
    ``basis``: the same steps against the unprofiled step time where one was given (see
    :mod:`perfsdk.profiling.observer`), else the same list.
    """

    source: str
    has_gpu: bool
    step_source: str  # "perfsdk", "ProfilerStep", "pattern" or "whole trace"
    steps: list[StepStats]
    findings: list[Finding]
    gaps: list[Gap] = field(default_factory=list, repr=False)
    trace: Trace | None = field(default=None, repr=False, compare=False)
    costs: dict[str, StepCost] = field(default_factory=dict, repr=False)
    unprofiled: dict[str, Unprofiled] = field(default_factory=dict, repr=False)
    phase: str = "decode"  # the phase of steps that are not perfsdk.<phase> ranges
    basis: list[StepStats] = field(default_factory=list, repr=False)
    observer: dict[str, dict[str, Any]] = field(default_factory=dict)  # per phase: the profiler's inflation
    unprofiled_note: str = ""  # why there is no unprofiled reference (perfsdk's window says)
    kernel_check: KernelCheck | None = None

    def phase_of(self, step: StepStats) -> str:
        return step_phase(step.name, self.phase)

    def _finish(self) -> Diagnosis:
        """Correct for the profiler where a reference exists, check the kernels, rank the findings."""
        phases = [self.phase_of(s) for s in self.steps]
        self.basis = [correct_step(s, self.unprofiled[p], self.has_gpu) if p in self.unprofiled else s
                      for s, p in zip(self.steps, phases, strict=True)]
        self.observer = {}
        for p, ref in self.unprofiled.items():
            mine = [s for s, q in zip(self.steps, phases, strict=True) if q == p]
            if mine:
                self.observer[p] = observer_summary(mine, ref, self.has_gpu, p)
        self.kernel_check = None
        if self.has_gpu:
            pairs = [(s, p) for s, p in zip(self.basis, phases, strict=True) if s.gpu_window_us > 0]
            if pairs:
                window = sum(s.gpu_window_us for s, _ in pairs)
                self.kernel_check = check_kernels([s for s, _ in pairs], [p for _, p in pairs], self.costs, window)
        self.findings = _findings(self)
        return self

    def select(self, phase: str) -> Diagnosis | None:
        """The diagnosis of this trace's *phase* steps alone (None if it has none)."""
        steps = [s for s in self.steps if self.phase_of(s) == phase]
        if not steps:
            return None
        if len(steps) == len(self.steps):
            return self
        return Diagnosis(source=self.source, has_gpu=self.has_gpu, step_source=self.step_source, steps=steps,
                         findings=[], gaps=self.gaps, trace=self.trace, costs=self.costs,
                         unprofiled=self.unprofiled, phase=self.phase, unprofiled_note=self.unprofiled_note)._finish()

    @property
    def corrected(self) -> bool:
        """Whether every step is measured against an unprofiled reference (shares of the unprofiled step)."""
        return bool(self.steps) and all(self.phase_of(s) in self.observer for s in self.steps)

    @property
    def basis_label(self) -> str:
        """What the shares are shares of, in words."""
        if self.corrected:
            return "the unprofiled step"
        return "step time (unprofiled where known)" if self.observer else "step time"

    def _basis(self) -> list[StepStats]:
        return self.basis if len(self.basis) == len(self.steps) else self.steps

    def _gpu_steps(self) -> list[StepStats]:
        return [s for s in self._basis() if s.gpu_window_us > 0]

    @property
    def gpu_busy_fraction(self) -> float | None:
        steps = self._gpu_steps()
        window = sum(s.gpu_window_us for s in steps)
        return sum(s.gpu_busy_us for s in steps) / window if window > 0 else None

    @property
    def communication_share(self) -> float | None:
        """Share of step time in collectives nothing overlapped (GPU: kernels; CPU-only: host ranges)."""
        if self.has_gpu:
            steps = self._gpu_steps()
            window = sum(s.gpu_window_us for s in steps)
            return sum(s.exposed_comm_us for s in steps) / window if window > 0 else None
        basis = self._basis()
        host = sum(s.host_dur_us for s in basis)
        return sum(s.host_comm_us for s in basis) / host if host > 0 else None

    def _mean(self, attr: str) -> float:
        steps = self._gpu_steps() if self.has_gpu else self._basis()
        return statistics.fmean(float(getattr(s, attr)) for s in steps) if steps else 0.0

    def summary(self) -> dict[str, Any]:
        """Aggregates over steps: idle split as shares of step time, per-step means, category shares."""
        steps = self._gpu_steps()
        window = sum(s.gpu_window_us for s in steps)
        cat_us: dict[str, float] = {}
        for s in steps if self.has_gpu else self._basis():  # CPU-only: host operator self time
            for c, v in s.category_us.items():
                cat_us[c] = cat_us.get(c, 0.0) + v
        cat_total = sum(cat_us.values())
        medians = [s.kernel_median_us for s in steps if s.kernel_median_us is not None]

        def share(attr: str) -> float | None:
            return round(sum(getattr(s, attr) for s in steps) / window, 4) if window > 0 else None

        measured = [s for s in self.steps if s.gpu_window_us > 0] if self.has_gpu else self.steps
        profiled = [s.gpu_window_us if self.has_gpu else s.host_dur_us for s in measured]
        return {
            "step_time_us_mean": round(self._mean("gpu_window_us" if self.has_gpu else "host_dur_us"), 2),
            "profiled_step_time_us_mean": round(statistics.fmean(profiled), 2) if profiled else 0.0,
            "idle_launch_wait_share": share("idle_launch_wait_us"),
            "idle_after_sync_share": share("idle_after_sync_us"),
            "idle_other_share": share("idle_other_us"),
            "kernels_per_step": round(self._mean("kernels"), 2),
            "kernel_median_us": round(statistics.median(medians), 3) if medians else None,
            "category_shares": {c: round(cat_us[c] / cat_total, 4) for c in CATEGORIES if cat_us.get(c)}
            if cat_total > 0 else {},
            "host_syncs_per_step": round(self._mean("host_syncs"), 2),
            "d2h_copies_per_step": round(self._mean("d2h_copies"), 2),
            "h2d_pageable_copies_per_step": round(self._mean("h2d_pageable_copies"), 2),
            "graph_launches_per_step": round(self._mean("graph_launches"), 2),
            "host_reads_per_step": round(self._mean("host_reads"), 2),
            "communication_share": None if (comm := self.communication_share) is None else round(comm, 4),
            "communication_us_mean": round(self._mean("exposed_comm_us" if self.has_gpu else "host_comm_us"), 2),
        }

    def to_dict(self) -> dict[str, Any]:
        busy = self.gpu_busy_fraction
        return {
            "trace": self.source,
            "has_gpu": self.has_gpu,
            "step_source": self.step_source,
            "step_count": len(self.steps),
            "gpu_busy_fraction": None if busy is None else round(busy, 4),
            "basis": self.basis_label,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
            "observer": dict(self.observer) or None,
            "unprofiled_note": self.unprofiled_note or None,
            "kernel_check": None if self.kernel_check is None else self.kernel_check.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
        }

    def format_report(self) -> str:
        """A short human report: one header, the profiler's inflation, the step picture, the ranked findings."""
        s = self.summary()
        name = os.path.basename(self.source)
        basis = self.basis_label
        lines = [f"{name}: {len(self.steps)} step(s) from {self.step_source}, "
                 f"mean {s['profiled_step_time_us_mean'] / 1000:.3f} ms profiled"]
        lines.extend(observer_lines(self.observer, self.unprofiled_note, self.has_gpu, self.corrected))
        busy = self.gpu_busy_fraction
        if not self.has_gpu:
            lines.append("  no GPU events in this trace (CPU-only profile): host-side findings only")
            lines.append(f"  host reads of tensor values per step: {s['host_reads_per_step']:g}")
            cats = ", ".join(f"{c} {v:.0%}" for c, v in
                             sorted(s["category_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
            if cats:
                lines.append(f"  host operator time by category (self time): {cats}")
            if s["communication_us_mean"]:
                lines.append(f"  in collectives: {s['communication_share']:.0%} of {basis} "
                             f"({s['communication_us_mean'] / 1000:.3f} ms per step, waits for other ranks included)")
        elif busy is not None:
            lines.append(f"  GPU busy {busy:.0%} of {basis}; idle: waiting for launch "
                         f"{s['idle_launch_wait_share']:.0%} (after a host sync {s['idle_after_sync_share']:.0%}), "
                         f"other {s['idle_other_share']:.0%}")
            med = s["kernel_median_us"]
            lines.append(f"  per step: {s['kernels_per_step']:g} kernels, median "
                         f"{'-' if med is None else f'{med:.1f}'} µs; "
                         f"{s['host_syncs_per_step']:g} host syncs; "
                         f"{s['h2d_pageable_copies_per_step']:g} pageable H2D copies; "
                         f"{s['graph_launches_per_step']:g} graph launches")
            cats = ", ".join(f"{c} {v:.0%}" for c, v in
                             sorted(s["category_shares"].items(), key=lambda kv: -kv[1]) if v >= 0.005)
            lines.append(f"  GPU time by category: {cats or '-'}")
            if self.kernel_check is not None:  # the kernels that a finding does not already list
                listed = any(f.kind in ("slow_kernels", "busy_unchecked") for f in self.findings)
                lines.extend(kernel_lines(self.kernel_check, basis, show_top=not listed))
            if s["communication_us_mean"]:
                lines.append(f"  in collectives, not overlapped: {s['communication_share']:.0%} of {basis} "
                             f"({s['communication_us_mean'] / 1000:.3f} ms per step, waits for other ranks included)")
        lines.extend(findings_lines(self.findings, "none above thresholds", basis))
        return "\n".join(lines)


# --- steps ------------------------------------------------------------------------------------


@dataclass
class _StepSpan:
    name: str
    thread: tuple[str, str] | None  # None: the whole trace, every thread
    start: float
    end: float


def _step_spans(trace: Trace, step_pattern: str | None) -> tuple[list[_StepSpan], str]:
    ann = trace.annotations
    if step_pattern is not None:
        try:
            rx = re.compile(step_pattern)
        except re.error as e:
            raise ConfigError(f"step_pattern: not a regular expression ({e})") from e
        chosen, source = [a for a in ann if rx.fullmatch(a.name)], "pattern"
    else:
        chosen, source = [a for a in ann if a.name in PERFSDK_STEP_NAMES], "perfsdk"
        if not chosen:
            chosen, source = [a for a in ann if _PROFILER_STEP.fullmatch(a.name)], "ProfilerStep"
    # drop ranges nested in another chosen range on the same thread (a decode inside a mixed step)
    spans: list[_StepSpan] = []
    for a in chosen:
        if spans and spans[-1].thread == a.thread and a.end <= spans[-1].end:
            continue
        spans.append(_StepSpan(a.name, a.thread, a.ts, a.end))
    if spans:
        return spans, source
    everything = [*trace.gpu_ops, *trace.runtime, *trace.cpu_ops, *trace.annotations]
    if not everything:
        return [], "whole trace"
    whole = _StepSpan("trace", None, min(e.ts for e in everything), max(e.end for e in everything))
    return [whole], "whole trace"


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

    def started_in(self, span: _StepSpan) -> list[Event]:
        """Host events that started inside *span* (on its thread, if it has one)."""
        evs, starts = self._all if span.thread is None else self._by_thread.get(span.thread, ([], []))
        return evs[bisect.bisect_left(starts, span.start):bisect.bisect_left(starts, span.end)]


def _by_thread(events: Iterable[Event]) -> dict[tuple[str, str], list[Event]]:
    out: dict[tuple[str, str], list[Event]] = {}
    for e in events:
        out.setdefault(e.thread, []).append(e)
    return out


# --- GPU timeline -----------------------------------------------------------------------------


def _merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            if e > merged[-1][1]:
                merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def _overlap(merged: list[tuple[float, float]], starts: list[float], s: float, e: float) -> float:
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


def _classify_gaps(trace: Trace, ops: list[Event]) -> list[Gap]:
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


# --- the analysis -----------------------------------------------------------------------------


def analyze_trace(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | Trace,
    *,
    step_pattern: str | None = None,
    cost: StepCost | Mapping[str, StepCost] | None = None,
    unprofiled: Unprofiled | Mapping[str, Unprofiled] | None = None,
    phase: str = "decode",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Diagnosis:
    """Diagnose a chrome trace (path to ``.json``/``.json.gz``, event dicts, or a loaded Trace).

    ``step_pattern`` is a regular expression matched against whole ``record_function`` names to
    pick the step ranges; by default perfsdk's ``perfsdk.*`` ranges, then ``ProfilerStep#N``.
    ``cost``: what a step must move and the peaks (:class:`~perfsdk.profiling.bandwidth.StepCost`),
    for every step or per phase; ``unprofiled``: the step time without the profiler
    (:class:`~perfsdk.profiling.observer.Unprofiled`), for every step or per phase; ``phase``: the
    phase of steps that are not ``perfsdk.<phase>`` ranges. ``max_bytes``: the most JSON read from a file,
    after decompression (2 GiB; None: no limit), as in :func:`~perfsdk.profiling.trace_events.load_trace`.
    """
    if phase not in PHASES:
        raise ConfigError(f"phase: expected one of {', '.join(PHASES)}, got {phase!r}")
    costs = _per_phase("cost", cost, StepCost)
    refs = _per_phase("unprofiled", unprofiled, Unprofiled)
    trace = source if isinstance(source, Trace) else load_trace(source, max_bytes=max_bytes)
    spans, step_source = _step_spans(trace, step_pattern)
    if not spans:
        raise ConfigError(
            f"trace: {trace.source!r} holds no timed events (complete 'X' events of torch.profiler's "
            "categories: kernels, CUDA runtime calls, operators, record_function ranges): "
            "it is not a profiler trace with steps to analyse"
        )
    runtime_in = _SpanIndex(trace.runtime)
    cpu_in = _SpanIndex(trace.cpu_ops)
    ops = trace.gpu_ops
    # CPU-only traces: time inside collectives, on any thread (gloo works on its own threads)
    host_comm = [] if trace.has_gpu else _merge(
        (e.ts, e.end) for e in (*trace.annotations, *trace.cpu_ops) if _HOST_COLLECTIVE.match(e.name))
    host_comm_starts = [b[0] for b in host_comm]

    steps: list[StepStats] = []
    step_of_corr: dict[int, int] = {}
    step_calls: list[list[Event]] = []
    for i, span in enumerate(spans):
        st = StepStats(index=i, name=span.name, host_start_us=span.start, host_dur_us=span.end - span.start)
        calls = runtime_in.started_in(span)
        step_calls.append(calls)
        for c in calls:
            if c.correlation is not None:
                step_of_corr.setdefault(c.correlation, i)
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
        cpu_in_step = cpu_in.started_in(span)
        if not trace.has_gpu and host_comm:
            st.host_comm_us = _overlap(host_comm, host_comm_starts, span.start, span.end)
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

    # GPU ops of each step: by correlation with the step's host calls; by time when a trace
    # carries no correlation ids at all (old Kineto, some converters)
    step_ops: list[list[Event]] = [[] for _ in steps]
    if steps:
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

    gaps = _classify_gaps(trace, ops)
    gap_starts = [g.start for g in gaps]
    busy = _merge((op.ts, op.end) for op in ops)
    busy_starts = [b[0] for b in busy]
    non_comm = _merge((op.ts, op.end) for op in ops if categorize(op.name, op.cat) != "communication")
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
        st.gpu_busy_us = _overlap(busy, busy_starts, start, end)
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
        kernel_durs = []
        for op in mine:
            category = categorize(op.name, op.cat)
            st.category_us[category] = st.category_us.get(category, 0.0) + op.dur
            if op.cat == "kernel":
                kernel_durs.append(op.dur)
                if category == "communication":
                    st.exposed_comm_us += op.dur - _overlap(non_comm, non_comm_starts, op.ts, op.end)
            elif op.cat == "gpu_memcpy":
                is_h2d, is_d2h = "HtoD" in op.name, "DtoH" in op.name
                if is_h2d or is_d2h:
                    st.copy_us += op.dur
                    st.copy_bytes += op.nbytes or 0
                if is_d2h:
                    st.d2h_copies += 1
                    call = trace.launch_of(op)
                    if call is not None and call.name != "cudaMemcpy":  # cudaMemcpy counted above
                        st.sync_blocked_us += call.dur
                if is_h2d:
                    st.h2d_copies += 1
                    if "Pageable" in op.name:
                        st.h2d_pageable_copies += 1
                        st.h2d_pageable_bytes += op.nbytes or 0
        st.kernels = len(kernel_durs)
        st.kernel_median_us = statistics.median(kernel_durs) if kernel_durs else None
        st.kernel_tally = tally_kernels(
            trace, (op for op in mine if op.cat == "kernel" and categorize(op.name, op.cat) != "communication"),
            shapes)

    return Diagnosis(source=trace.source, has_gpu=trace.has_gpu, step_source=step_source, steps=steps,
                     findings=[], gaps=gaps, trace=trace, costs=costs, unprofiled=refs, phase=phase)._finish()


def _per_phase(name: str, value: Any, kind: type) -> dict[str, Any]:
    """``{phase: value}`` from one value for every phase or a mapping by phase; checks the types."""
    if value is None:
        return {}
    if isinstance(value, kind):
        return dict.fromkeys(PHASES, value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k not in PHASES:
                raise ConfigError(f"{name}: keys are phases ({', '.join(PHASES)}), got {k!r}")
            if not isinstance(v, kind):
                raise ConfigError(f"{name}[{k!r}]: expected a {kind.__name__}, got {v!r}")
            out[k] = v
        return out
    raise ConfigError(f"{name}: expected a {kind.__name__} or a mapping of phase to {kind.__name__}, got {value!r}")


# --- findings ---------------------------------------------------------------------------------


def _findings(diag: Diagnosis) -> list[Finding]:
    """The ranked findings over the diagnosis' basis steps (unprofiled where a reference was given)."""
    basis = diag.basis_label
    if not diag.has_gpu:
        return _host_findings(diag._basis(), basis)
    steps = diag._gpu_steps()
    window = sum(s.gpu_window_us for s in steps)
    if window <= 0:
        return []
    n = len(steps)

    def per_step(attr: str) -> float:
        return sum(float(getattr(s, attr)) for s in steps) / n

    out: list[Finding] = []
    busy = sum(s.gpu_busy_us for s in steps) / window
    kernels = per_step("kernels")
    medians = [s.kernel_median_us for s in steps if s.kernel_median_us is not None]
    median = statistics.median(medians) if medians else 0.0
    graphs = per_step("graph_launches")

    launch_wait = sum(s.idle_launch_wait_us - s.idle_after_sync_us for s in steps) / window
    if launch_wait >= LAUNCH_BOUND_MIN_SHARE:
        suggestion = ("Capture the step in a CUDA graph (torch.cuda.CUDAGraph, or torch.compile "
                      "mode='reduce-overhead') so one launch replaces many, and batch more requests per step "
                      "so each kernel does more work.")
        if graphs >= 1:
            suggestion = ("The step already replays a CUDA graph: move the host work between replays "
                          "(input preparation, sampling, scheduling) off the critical path or overlap it "
                          "with the previous replay, and batch more requests per step.")
        out.append(Finding(
            "launch_bound", launch_wait,
            f"GPU idle {launch_wait:.0%} of {basis} waiting for the host to launch the next op; GPU busy "
            f"{busy:.0%}; {kernels:.0f} kernels per step with median {median:.1f} µs against "
            f"{per_step('launches'):.0f} launch calls per step",
            suggestion))

    syncs = per_step("host_syncs")
    if syncs >= SYNC_BOUND_MIN_PER_STEP:
        after = sum(s.idle_after_sync_us for s in steps) / window
        blocked = sum(s.sync_blocked_us for s in steps) / window
        parts = [f"{label} ×{per_step(a):g}" for a, label in
                 (("stream_syncs", "stream synchronize"), ("device_syncs", "device synchronize"),
                  ("event_syncs", "event synchronize"), ("blocking_copies", "synchronous cudaMemcpy"))
                 if per_step(a) > 0]
        d2h = per_step("d2h_copies")
        reads = f"; {d2h:g} device-to-host copies per step (host reads of device values)" if d2h else ""
        # at stake: the GPU idle after each sync returns (the host refilling the queue). The time the
        # host spends blocked while the GPU is busy costs nothing by itself, so it is evidence, not share.
        out.append(Finding(
            "sync_bound", after,
            f"{syncs:g} host synchronisations per step ({', '.join(parts)}){reads}; GPU idle {after:.0%} "
            f"of {basis} right after a sync returned; host blocked {blocked:.0%}",
            "Remove host reads of device values inside the step (.item(), .tolist(), .cpu(), bool(tensor), "
            "torch.cuda.synchronize()); keep the value on the device, or copy it non_blocking into a pinned "
            "buffer and read it one step later."))

    copy = sum(s.copy_us for s in steps) / window
    if copy >= COPY_BOUND_MIN_SHARE:
        pageable = per_step("h2d_pageable_copies")
        copy_s = sum(s.copy_us for s in steps) / 1e6
        gbps = sum(s.copy_bytes for s in steps) / copy_s / 1e9 if copy_s > 0 else 0.0
        out.append(Finding(
            "copy_bound", copy,
            f"host<->device copies take {copy:.0%} of {basis}: {per_step('h2d_copies'):g} host-to-device "
            f"per step ({pageable:g} from pageable memory, {per_step('h2d_pageable_bytes') / 1e6:.1f} MB), "
            f"{per_step('d2h_copies'):g} device-to-host, at {gbps:.1f} GB/s",
            "Copy from pinned buffers (tensor.pin_memory(), reused each step) with non_blocking=True, "
            "or keep the tensor on the device so it is not copied every step."))

    comm = sum(s.exposed_comm_us for s in steps) / window
    if comm >= COMM_BOUND_MIN_SHARE:
        out.append(Finding(
            "communication_bound", comm,
            f"collective kernels not overlapped by compute take {comm:.0%} of {basis} (time waiting for "
            "slower ranks included)",
            "First compare every rank's trace of the same steps (perfsdk analyze rank0.json rank1.json): "
            "part of this may be waiting for a straggler, which no interconnect change wins back. For the "
            "transfer itself: overlap communication with compute (async collectives, a separate stream), send "
            "fewer and larger all-reduces (fuse them), or lower the tensor-parallel degree."))

    # the kernels' own time: healthy only near the peak (perfsdk.profiling.bandwidth). Time spent copying
    # or in exposed collectives is already charged to its own finding, so it does not count as kernel time.
    working = max(busy - copy - comm, 0.0)
    if diag.kernel_check is not None:
        phases = {diag.phase_of(s) for s in steps}
        prefill_like = phases == {"prefill"} or (
            diag.step_source != "perfsdk" and diag.phase == "decode" and median >= COMPUTE_KERNEL_MIN_US)
        out.extend(kernel_findings(diag.kernel_check, working, window / n, basis, not prefill_like))
    out.sort(key=lambda f: -f.share)
    return out


def _host_findings(steps: Sequence[StepStats], basis: str = "step time") -> list[Finding]:
    if not steps:
        return []
    reads = statistics.fmean(s.host_reads for s in steps)
    if reads < SYNC_BOUND_MIN_PER_STEP:
        return []
    host = sum(s.host_dur_us for s in steps)
    share = sum(s.host_read_us for s in steps) / host if host > 0 else 0.0
    return [Finding(
        "sync_bound", share,
        f"host-side only (no GPU events in this trace): {reads:g} reads of tensor values per step "
        "(aten::item / _local_scalar_dense); with tensors on a GPU each one blocks the host until the device "
        "catches up",
        "Remove host reads of device values inside the step (.item(), .tolist(), bool(tensor)); keep the "
        "value on the device, or read it one step later from a pinned buffer.")]
