"""The kernels' finding and report lines, from a :class:`~perfsdk.profiling.kernel_check.KernelCheck`:
healthy ``memory_bound`` / ``compute_bound``, ``slow_kernels``, ``utilisation_suspect`` or
``busy_unchecked`` (see :mod:`perfsdk.profiling.bandwidth` for when each is given, and why)::

    kernel_findings(check, working=0.9, window_us_per_step=2090.0, basis="step time", decode_like=True)
    kernel_lines(check, "step time")   # ["  kernels: 0.31 GB per step in 0.193 ms of kernels = ...", ...]
"""

from __future__ import annotations

from perfsdk.profiling.findings import Finding
from perfsdk.profiling.kernel_check import HEALTHY_BUSY_FRACTION, SLOW_KERNELS_MIN_SHARE, KernelCheck

__all__ = ["kernel_findings", "kernel_lines", "rate_text"]


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


# ---- findings -----------------------------------------------------------------------------------------


def kernel_findings(
    check: KernelCheck, working: float, window_us_per_step: float, basis: str, decode_like: bool
) -> list[Finding]:
    """The kernels' finding (at most one): healthy, slow, suspect or unchecked; see the module docstring.

    *working*: the share of the step the GPU spent in kernels; *window_us_per_step*: the (basis) step;
    *basis*: what shares are of, for the text; *decode_like*: the steps read weights per token (names the
    unchecked bound in words).
    """
    top = "; ".join(r.describe(basis) for r in check.top[:3])
    where = f" Where the kernel time is: {top}." if top else ""
    if not check.checked:
        if working < HEALTHY_BUSY_FRACTION:
            return []
        limit = "peak memory bandwidth" if decode_like else "peak FLOP/s"
        return [
            Finding(
                "busy_unchecked",
                working,
                f"GPU busy running kernels {working:.0%} of {basis}, but whether they run near the {limit} could "
                f"not be checked: {check.missing}.{where}",
                "Give the step's bytes and the GPU (perfsdk analyze TRACE --model NAME --gpu NAME --batch N "
                "--context N, or --step-bytes B --bandwidth-tb-s X) so the kernels' time can be compared with "
                "the floor; a busy GPU is not yet a fast one."
                + (f" To look at the kernels themselves: {check.ncu}" if check.ncu else ""),
            )
        ]
    assert check.utilisation is not None
    assert check.floor_us is not None
    util = check.utilisation
    rate = rate_text(check)
    if check.suspect:
        return [
            Finding(
                "utilisation_suspect",
                working,
                f"the step's kernels would move {rate}: {util:.0%} of the peak, which is impossible, so the peak or "
                f"the step's bytes/FLOPs are wrong ({check.source}); no verdict on the kernels",
                "Check the peak (the exact part and its dense figure; perfsdk calibrate measures this machine) and "
                "the step's bytes and FLOPs (model, dtype, batch, context) before trusting any utilisation.",
            )
        ]
    healthy = check.healthy_fraction or 0.0
    if util >= healthy:
        if working < HEALTHY_BUSY_FRACTION:
            return []
        if check.bound == "compute":
            return [
                Finding(
                    "compute_bound",
                    working,
                    f"GPU busy running kernels {working:.0%} of {basis}; they do {rate}: {util:.0%} of the peak "
                    f"(healthy from {healthy:.0%}; {check.source})",
                    "Healthy prefill: the GPU is busy doing math near its peak. Next: lower precision (FP8), fused "
                    "attention kernels, or fewer FLOPs (prefix caching, shorter prompts).",
                )
            ]
        return [
            Finding(
                "memory_bound",
                working,
                f"GPU busy running kernels {working:.0%} of {basis}; they read {rate}: {util:.0%} of the peak "
                f"(healthy from {healthy:.0%}; {check.source})",
                "Healthy decode: the kernels read the weights and KV cache near the peak bandwidth. Next: read "
                "fewer bytes per token (quantised weights or KV cache) or batch more requests per step.",
            )
        ]
    lost = max(check.kernel_us - check.floor_us, 0.0)
    share = lost / window_us_per_step if window_us_per_step > 0 else 0.0
    if share < SLOW_KERNELS_MIN_SHARE:
        return []
    verb = "read" if check.bound == "memory" else "do"
    return [
        Finding(
            "slow_kernels",
            share,
            f"the kernels ({working:.0%} of {basis}) {verb} {rate}: {util:.0%} of the peak, below the "
            f"{healthy:.0%} a healthy step reaches; at the peak they would take {check.floor_us / 1000:.3f} ms "
            f"({check.source}).{where}",
            f"Zoom in on these kernels with Nsight Compute (it replays each kernel to read its counters: use it to "
            f"understand them, never to time the server): {check.ncu}. Low DRAM throughput with low occupancy "
            "points at launch configuration or tiny shapes (batch more); high memory stalls at access patterns; "
            "a fused or better-tuned kernel (torch.compile, a Triton or CUTLASS kernel) moves the same bytes faster.",
        )
    ]


def rate_text(check: KernelCheck) -> str:
    """'0.31 GB per step in 0.193 ms of kernels = 1.63 of 4.80 TB/s' (FLOPs for a compute-bound step)."""
    secs = check.kernel_us / 1000
    if check.bound == "compute" and check.flops is not None and check.peak_flops:
        done = check.achieved_flops or 0.0
        return (
            f"{check.flops / 1e12:.2f} TFLOP per step in {secs:.3f} ms of kernels = {done / 1e12:.0f} of "
            f"{check.peak_flops / 1e12:.0f} TFLOP/s"
        )
    if check.bytes is not None and check.peak_bandwidth:
        done = check.achieved_bandwidth or 0.0
        return (
            f"{_fmt_bytes(check.bytes)} per step in {secs:.3f} ms of kernels = {done / 1e12:.2f} of "
            f"{check.peak_bandwidth / 1e12:.2f} TB/s"
        )
    return f"its work in {secs:.3f} ms of kernels"


def kernel_lines(check: KernelCheck, basis: str, show_top: bool = True) -> list[str]:
    """The report's lines on the kernels against the peak, and (*show_top*) the kernels that hold the time."""
    if check.utilisation is None:
        lines = [f"  kernels against the peak: not checked ({check.missing})"]
    else:
        verdict = (
            "above the peak: impossible, a figure is wrong"
            if check.suspect
            else f"{check.bound}-bound; healthy from {check.healthy_fraction:.0%}"
        )
        lines = [f"  kernels: {rate_text(check)}: {check.utilisation:.0%} of the peak ({verdict})"]
    if check.top and show_top:
        lines.append("  top kernels: " + "; ".join(r.describe(basis) for r in check.top[:3]))
    return lines
