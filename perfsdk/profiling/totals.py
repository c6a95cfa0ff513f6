"""What a diagnosis' steps add up to, taken once: :class:`StepTotals` (sums and per-step means).

Every number a :class:`~perfsdk.profiling.analyze.Diagnosis` reports about its steps as a whole — the GPU
busy fraction, the communication share, ``summary()``, the findings' shares and evidence, the kernel
check's window — is read from the one ``StepTotals`` it builds when it is made, so the report and the
findings cannot disagree::

    from perfsdk.profiling.analyze import analyze_trace

    diag = analyze_trace("decode.pt.trace.json.gz")
    t = diag.totals
    t.busy_share, t.comm_share, t.per_step.kernels, t.kernel_median_us

The totals are over the diagnosis' *basis* steps (against the unprofiled step where a reference was
given; :mod:`perfsdk.profiling.observer`): in a GPU trace the steps with a GPU window, in a CPU-only trace
every step. Sums keep the order and the operations the diagnosis always used (a share is a sum over the
steps divided by their total window), so the figures are the same to the last bit.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from perfsdk.profiling.steps import StepStats

__all__ = ["PerStep", "StepTotals"]


@dataclass(frozen=True)
class PerStep:
    """Means per counted step (see :class:`StepTotals`); all 0.0 when there is none."""

    step_us: float = 0.0  # the GPU window, or in a CPU-only trace the host step
    kernels: float = 0.0
    launches: float = 0.0
    graph_launches: float = 0.0
    host_syncs: float = 0.0
    stream_syncs: float = 0.0
    device_syncs: float = 0.0
    event_syncs: float = 0.0
    blocking_copies: float = 0.0
    d2h_copies: float = 0.0
    h2d_copies: float = 0.0
    h2d_pageable_copies: float = 0.0
    h2d_pageable_bytes: float = 0.0
    host_reads: float = 0.0
    comm_us: float = 0.0  # exposed collectives (GPU), or time in host collectives (CPU-only)

    @classmethod
    def of(cls, steps: Sequence[StepStats], has_gpu: bool) -> PerStep:
        if not steps:
            return cls()

        def mean(values: list[float]) -> float:
            return statistics.fmean(values)

        return cls(
            step_us=mean([s.gpu_window_us if has_gpu else s.host_dur_us for s in steps]),
            kernels=mean([float(s.kernels) for s in steps]),
            launches=mean([float(s.launches) for s in steps]),
            graph_launches=mean([float(s.graph_launches) for s in steps]),
            host_syncs=mean([float(s.host_syncs) for s in steps]),
            stream_syncs=mean([float(s.stream_syncs) for s in steps]),
            device_syncs=mean([float(s.device_syncs) for s in steps]),
            event_syncs=mean([float(s.event_syncs) for s in steps]),
            blocking_copies=mean([float(s.blocking_copies) for s in steps]),
            d2h_copies=mean([float(s.d2h_copies) for s in steps]),
            h2d_copies=mean([float(s.h2d_copies) for s in steps]),
            h2d_pageable_copies=mean([float(s.h2d_pageable_copies) for s in steps]),
            h2d_pageable_bytes=mean([float(s.h2d_pageable_bytes) for s in steps]),
            host_reads=mean([float(s.host_reads) for s in steps]),
            comm_us=mean([s.exposed_comm_us if has_gpu else s.host_comm_us for s in steps]),
        )


@dataclass(frozen=True)
class StepTotals:
    """Sums over a diagnosis' basis steps and their per-step means, computed once (:meth:`of`).

    *Counted* steps: in a GPU trace those with a GPU window, in a CPU-only trace every step. GPU sums are
    over the steps with a GPU window, host sums over every basis step. Times in µs.
    """

    has_gpu: bool
    steps: int = 0  # counted steps
    window_us: float = 0.0  # the GPU windows, summed (0 in a CPU-only trace)
    busy_us: float = 0.0
    idle_launch_wait_us: float = 0.0  # includes idle_after_sync_us
    idle_after_sync_us: float = 0.0
    idle_other_us: float = 0.0
    launch_wait_us: float = 0.0  # waiting for a launch not right after a sync: the launch_bound share's time
    sync_blocked_us: float = 0.0
    copy_us: float = 0.0
    copy_bytes: int = 0
    exposed_comm_us: float = 0.0
    host_us: float = 0.0  # the host steps, summed (the CPU-only shares are of this)
    host_comm_us: float = 0.0
    host_read_us: float = 0.0
    kernel_median_us: float | None = None  # the median of the GPU steps' kernel medians
    category_us: dict[str, float] = field(default_factory=dict)  # GPU time (CPU-only: host self time)
    per_step: PerStep = field(default_factory=PerStep)
    profiled_step_us: float = 0.0  # the mean step as measured under the profiler (not the basis)

    @classmethod
    def of(cls, measured: Sequence[StepStats], basis: Sequence[StepStats], has_gpu: bool) -> StepTotals:
        """The totals of *basis* (the steps as diagnosed), and the profiled mean of *measured* (as recorded)."""
        gpu = [s for s in basis if s.gpu_window_us > 0]
        counted = gpu if has_gpu else list(basis)
        category_us: dict[str, float] = {}
        for s in counted:
            for c, v in s.category_us.items():
                category_us[c] = category_us.get(c, 0.0) + v
        medians = [s.kernel_median_us for s in gpu if s.kernel_median_us is not None]
        profiled_steps = [s for s in measured if s.gpu_window_us > 0] if has_gpu else list(measured)
        profiled = [s.gpu_window_us if has_gpu else s.host_dur_us for s in profiled_steps]
        return cls(
            has_gpu=has_gpu,
            steps=len(counted),
            window_us=sum(s.gpu_window_us for s in gpu),
            busy_us=sum(s.gpu_busy_us for s in gpu),
            idle_launch_wait_us=sum(s.idle_launch_wait_us for s in gpu),
            idle_after_sync_us=sum(s.idle_after_sync_us for s in gpu),
            idle_other_us=sum(s.idle_other_us for s in gpu),
            launch_wait_us=sum(s.idle_launch_wait_us - s.idle_after_sync_us for s in gpu),
            sync_blocked_us=sum(s.sync_blocked_us for s in gpu),
            copy_us=sum(s.copy_us for s in gpu),
            copy_bytes=sum(s.copy_bytes for s in gpu),
            exposed_comm_us=sum(s.exposed_comm_us for s in gpu),
            host_us=sum(s.host_dur_us for s in basis),
            host_comm_us=sum(s.host_comm_us for s in basis),
            host_read_us=sum(s.host_read_us for s in basis),
            kernel_median_us=statistics.median(medians) if medians else None,
            category_us=category_us,
            per_step=PerStep.of(counted, has_gpu),
            profiled_step_us=statistics.fmean(profiled) if profiled else 0.0,
        )

    def share(self, us: float) -> float | None:
        """*us* (a sum over the GPU steps) as a share of their window; None without a window."""
        return us / self.window_us if self.window_us > 0 else None

    @property
    def busy_share(self) -> float | None:
        """The GPU busy fraction: busy time over the window."""
        return self.share(self.busy_us)

    @property
    def comm_share(self) -> float | None:
        """Share of step time in collectives nothing overlapped (GPU: kernels; CPU-only: host ranges)."""
        if self.has_gpu:
            return self.share(self.exposed_comm_us)
        return self.host_comm_us / self.host_us if self.host_us > 0 else None
