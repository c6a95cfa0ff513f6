"""The findings of a diagnosis, from its :class:`~perfsdk.profiling.totals.StepTotals` alone.

The timeline's own — ``launch_bound``, ``sync_bound``, ``copy_bound``, ``communication_bound`` (and, in a
CPU-only trace, the host-side ``sync_bound``) — with their thresholds below, each with its reason; the
kernels' finding comes from :mod:`perfsdk.profiling.kernel_findings`. :func:`rank_findings` gives them all,
biggest share of step time first, which is what :class:`~perfsdk.profiling.analyze.Diagnosis` holds::

    from perfsdk.profiling.timeline_findings import rank_findings

    diag = analyze_trace("decode.pt.trace.json.gz")
    rank_findings(diag.totals, diag.basis_label, diag.kernel_check, decode_like=True) == diag.findings
"""

from __future__ import annotations

from collections.abc import Collection

from perfsdk.profiling.findings import Finding
from perfsdk.profiling.kernel_check import KernelCheck
from perfsdk.profiling.kernel_findings import kernel_findings
from perfsdk.profiling.totals import StepTotals

__all__ = [
    "COMM_BOUND_MIN_SHARE",
    "COMPUTE_KERNEL_MIN_US",
    "COPY_BOUND_MIN_SHARE",
    "LAUNCH_BOUND_MIN_SHARE",
    "SYNC_BOUND_MIN_PER_STEP",
    "decode_like",
    "host_findings",
    "rank_findings",
    "timeline_findings",
]

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
# HEALTHY_BUSY_FRACTION (perfsdk.profiling.kernel_check, with the other kernel thresholds): share of step
# time in kernels from which a step can be healthy at all.
# Median kernel duration above which an unlabelled busy step is worded as prefill-like (peak FLOP/s)
# when its bytes and FLOPs are unknown: decode kernels at small batch are weight reads of a few to tens of µs.
COMPUTE_KERNEL_MIN_US = 50.0


def rank_findings(t: StepTotals, basis: str, check: KernelCheck | None, *, decode_like: bool) -> list[Finding]:
    """Every finding over the totals' steps, biggest share first (*basis*: what the shares are of, in words;
    *check*: the kernel check, if made; *decode_like*: the steps read weights per token)."""
    if not t.has_gpu:
        return host_findings(t, basis)
    if t.window_us <= 0:
        return []
    out = timeline_findings(t, basis)
    # the kernels' own time: healthy only near the peak (perfsdk.profiling.bandwidth). Time spent copying
    # or in exposed collectives is already charged to its own finding, so it does not count as kernel time.
    if check is not None:
        working = max(t.busy_us / t.window_us - t.copy_us / t.window_us - t.exposed_comm_us / t.window_us, 0.0)
        out.extend(kernel_findings(check, working, t.window_us / t.steps, basis, decode_like))
    out.sort(key=lambda f: -f.share)
    return out


def decode_like(phases: Collection[str], step_source: str, default_phase: str, kernel_median_us: float | None) -> bool:
    """Whether steps of *phases* read weights per token (names the unchecked bound in words): not when they
    are all prefills, nor when unlabelled steps' kernels run as long as a prefill's."""
    median = kernel_median_us if kernel_median_us is not None else 0.0
    prefill_like = set(phases) == {"prefill"} or (
        step_source != "perfsdk" and default_phase == "decode" and median >= COMPUTE_KERNEL_MIN_US
    )
    return not prefill_like


def timeline_findings(t: StepTotals, basis: str) -> list[Finding]:
    """launch_bound, sync_bound, copy_bound, communication_bound over a GPU trace's totals (unsorted)."""
    window, per = t.window_us, t.per_step
    if window <= 0:
        return []
    out: list[Finding] = []
    busy = t.busy_us / window
    median = t.kernel_median_us if t.kernel_median_us is not None else 0.0

    launch_wait = t.launch_wait_us / window
    if launch_wait >= LAUNCH_BOUND_MIN_SHARE:
        suggestion = (
            "Capture the step in a CUDA graph (torch.cuda.CUDAGraph, or torch.compile "
            "mode='reduce-overhead') so one launch replaces many, and batch more requests per step "
            "so each kernel does more work."
        )
        if per.graph_launches >= 1:
            suggestion = (
                "The step already replays a CUDA graph: move the host work between replays "
                "(input preparation, sampling, scheduling) off the critical path or overlap it "
                "with the previous replay, and batch more requests per step."
            )
        out.append(
            Finding(
                "launch_bound",
                launch_wait,
                f"GPU idle {launch_wait:.0%} of {basis} waiting for the host to launch the next op; GPU busy "
                f"{busy:.0%}; {per.kernels:.0f} kernels per step with median {median:.1f} µs against "
                f"{per.launches:.0f} launch calls per step",
                suggestion,
            )
        )

    if per.host_syncs >= SYNC_BOUND_MIN_PER_STEP:
        after = t.idle_after_sync_us / window
        blocked = t.sync_blocked_us / window
        parts = [
            f"{label} ×{count:g}"
            for count, label in (
                (per.stream_syncs, "stream synchronize"),
                (per.device_syncs, "device synchronize"),
                (per.event_syncs, "event synchronize"),
                (per.blocking_copies, "synchronous cudaMemcpy"),
            )
            if count > 0
        ]
        d2h = per.d2h_copies
        reads = f"; {d2h:g} device-to-host copies per step (host reads of device values)" if d2h else ""
        # at stake: the GPU idle after each sync returns (the host refilling the queue). The time the
        # host spends blocked while the GPU is busy costs nothing by itself, so it is evidence, not share.
        out.append(
            Finding(
                "sync_bound",
                after,
                f"{per.host_syncs:g} host synchronisations per step ({', '.join(parts)}){reads}; GPU idle "
                f"{after:.0%} of {basis} right after a sync returned; host blocked {blocked:.0%}",
                "Remove host reads of device values inside the step (.item(), .tolist(), .cpu(), bool(tensor), "
                "torch.cuda.synchronize()); keep the value on the device, or copy it non_blocking into a pinned "
                "buffer and read it one step later.",
            )
        )

    copy = t.copy_us / window
    if copy >= COPY_BOUND_MIN_SHARE:
        copy_s = t.copy_us / 1e6
        gbps = t.copy_bytes / copy_s / 1e9 if copy_s > 0 else 0.0
        out.append(
            Finding(
                "copy_bound",
                copy,
                f"host<->device copies take {copy:.0%} of {basis}: {per.h2d_copies:g} host-to-device "
                f"per step ({per.h2d_pageable_copies:g} from pageable memory, "
                f"{per.h2d_pageable_bytes / 1e6:.1f} MB), {per.d2h_copies:g} device-to-host, at {gbps:.1f} GB/s",
                "Copy from pinned buffers (tensor.pin_memory(), reused each step) with non_blocking=True, "
                "or keep the tensor on the device so it is not copied every step.",
            )
        )

    comm = t.exposed_comm_us / window
    if comm >= COMM_BOUND_MIN_SHARE:
        out.append(
            Finding(
                "communication_bound",
                comm,
                f"collective kernels not overlapped by compute take {comm:.0%} of {basis} (time waiting for "
                "slower ranks included)",
                "First compare every rank's trace of the same steps (perfsdk analyze rank0.json rank1.json): "
                "part of this may be waiting for a straggler, which no interconnect change wins back. For the "
                "transfer itself: overlap communication with compute (async collectives, a separate stream), "
                "send fewer and larger all-reduces (fuse them), or lower the tensor-parallel degree.",
            )
        )
    return out


def host_findings(t: StepTotals, basis: str = "step time") -> list[Finding]:
    """A CPU-only trace's finding: host reads of tensor values, each a wait for the device on a GPU."""
    if not t.steps:
        return []
    reads = t.per_step.host_reads
    if reads < SYNC_BOUND_MIN_PER_STEP:
        return []
    share = t.host_read_us / t.host_us if t.host_us > 0 else 0.0
    return [
        Finding(
            "sync_bound",
            share,
            f"host-side only (no GPU events in this trace): {reads:g} reads of tensor values per step "
            "(aten::item / _local_scalar_dense); with tensors on a GPU each one blocks the host until the device "
            "catches up",
            "Remove host reads of device values inside the step (.item(), .tolist(), bool(tensor)); keep the "
            "value on the device, or read it one step later from a pinned buffer.",
        )
    ]
