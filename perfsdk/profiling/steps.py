"""A trace's steps: which ranges are steps (:func:`step_spans`), their phase (:func:`step_phase`), and
what was measured for each (:class:`StepStats`, filled in by :mod:`perfsdk.profiling.timeline`), with the
idle stretches between GPU ops (:class:`Gap`). Re-exported by :mod:`perfsdk.profiling.analyze`::

    from perfsdk.profiling.analyze import analyze_trace

    step = analyze_trace("decode.pt.trace.json.gz").steps[0]     # a StepStats; times in µs
    step.gpu_busy_fraction, step.idle_launch_wait_us, step.host_syncs, step.to_dict()

**Steps.** perfsdk's own ``record_function`` ranges (``perfsdk.decode``, ``perfsdk.prefill``,
``perfsdk.mixed``) when present, else torch.profiler's ``ProfilerStep#N``, else the whole trace as one
step; ``step_pattern`` picks other range names. A range nested in another chosen range on the same
thread (a decode inside a mixed step) is not a step of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.categories import CATEGORIES
from perfsdk.profiling.kernel_shapes import KernelTally
from perfsdk.profiling.trace_model import Trace

__all__ = ["PERFSDK_STEP_NAMES", "PHASES", "Gap", "StepSpan", "StepStats", "step_phase", "step_spans"]

PERFSDK_STEP_NAMES: frozenset[str] = frozenset({"perfsdk.decode", "perfsdk.prefill", "perfsdk.mixed"})
PHASES: tuple[str, ...] = ("decode", "prefill", "mixed")
_PROFILER_STEP = re.compile(r"ProfilerStep#\d+")


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
            "syncs": {
                "stream": self.stream_syncs,
                "device": self.device_syncs,
                "event": self.event_syncs,
                "d2h_copies": self.d2h_copies,
                "blocked_us": round(self.sync_blocked_us, 2),
            },
            "h2d_copies": self.h2d_copies,
            "h2d_pageable_copies": self.h2d_pageable_copies,
            "h2d_pageable_bytes": self.h2d_pageable_bytes,
            "copy_us": round(self.copy_us, 2),
            "exposed_comm_us": round(self.exposed_comm_us, 2),
            "host_comm_us": round(self.host_comm_us, 2),
            "host_reads": self.host_reads,
        }


@dataclass
class StepSpan:
    """One step's range: its name, its host thread (None: the whole trace) and its start and end (µs)."""

    name: str
    thread: tuple[str, str] | None  # None: the whole trace, every thread
    start: float
    end: float


def step_spans(trace: Trace, step_pattern: str | None) -> tuple[list[StepSpan], str]:
    """The steps' ranges, in order, and where they came from: ``perfsdk``, ``ProfilerStep``, ``pattern`` or
    ``whole trace`` (none: no timed event at all)."""
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
    spans: list[StepSpan] = []
    for a in chosen:
        if spans and spans[-1].thread == a.thread and a.end <= spans[-1].end:
            continue
        spans.append(StepSpan(a.name, a.thread, a.ts, a.end))
    if spans:
        return spans, source
    everything = [*trace.gpu_ops, *trace.runtime, *trace.cpu_ops, *trace.annotations]
    if not everything:
        return [], "whole trace"
    whole = StepSpan("trace", None, min(e.ts for e in everything), max(e.end for e in everything))
    return [whole], "whole trace"
