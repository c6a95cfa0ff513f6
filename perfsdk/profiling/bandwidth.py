"""Are the kernels fast? The bytes and FLOPs a step must move, over the time its kernels ran, against the peaks.

A GPU that is busy is not necessarily doing well: it may be busy running slow kernels. The seeds name
three zoom levels — the request (TTFT, TPOT), the timeline (:mod:`perfsdk.profiling.analyze`: where
the step's time goes) and one kernel (Nsight Compute: how close it gets to the chip's limits). This
module decides whether the third is needed, and for which kernels::

    from perfsdk.hardware import get
    from perfsdk.model import ModelSpec
    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.bandwidth import StepCost

    cost = StepCost.decode(ModelSpec.named("llama-3-8b"), get("h200"), batch=1, context_tokens=1024)
    diag = analyze_trace("decode.pt.trace.json.gz", cost=cost)   # or cost={"decode": c1, "prefill": c2}
    diag.kernel_check.utilisation      # 0.34: the kernels moved the step's bytes at 34 % of the peak
    diag.findings[0].kind              # "slow_kernels"
    diag.kernel_check.ncu              # ncu --set full -k regex:'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT|...' -c 5 ...

    StepCost(bytes=313.5e6, peak_bandwidth=4.8e12, source="my model on an H200")   # figures directly

**The check.** Per step, *kernel time* is the GPU's busy time less copies and exposed collectives
(those have findings of their own); the *floor* is the least time the step's work allows,
``max(bytes / peak bandwidth, FLOPs / peak FLOP/s)``; the larger term says whether the step is
memory- or compute-bound, from the figures, never from the step's name. ``utilisation = floor /
kernel time``: how close the kernels came to the chip's limit while they ran (MBU or MFU over the busy
time only, so launch gaps do not count against the kernels). Then:

* ``memory_bound`` / ``compute_bound`` — healthy: the GPU is kept busy (:data:`HEALTHY_BUSY_FRACTION`
  of the step in kernels) *and* the kernels reach :data:`HEALTHY_BANDWIDTH_FRACTION` of the peak
  bandwidth (memory-bound) or :data:`HEALTHY_FLOPS_FRACTION` of the peak FLOP/s (compute-bound);
* ``slow_kernels`` — the kernels run below that, and the time they take beyond the floor is at least
  :data:`SLOW_KERNELS_MIN_SHARE` of the step: the finding names the kernels that hold the time (share of
  the step, and their own bandwidth or FLOP rate where the trace recorded their operators' input shapes:
  ``record_shapes=True``, which perfsdk's window sets) and the Nsight Compute command for them;
* ``utilisation_suspect`` — the floor is *longer* than the kernel time: the step moved its bytes faster
  than the chip can, which is impossible, so the peak (wrong part, sparse figure) or the step's bytes
  (model, batch, context) is wrong. No verdict on the kernels is given;
* ``busy_unchecked`` — busy, but no bytes/FLOPs or peak were given (``perfsdk analyze`` on a bare
  trace): the check could not be made, and the report says so rather than calling the step healthy.

**Thresholds** (shares of the datasheet peak, which nothing reaches):

* :data:`HEALTHY_BANDWIDTH_FRACTION` = 0.60. A tuned device copy reaches ~85 % of the datasheet bandwidth
  (an H200: 4.1 of 4.8 TB/s, ``perfsdk calibrate``) and the weight-reading GEMV kernels of a compiled
  decode 70-85 % (the seeds' healthy decode is ~80 % MBU *including* its gaps). Below 60 % a third or
  more of the kernel time is more than a tuned kernel needs for those bytes: a kernel question.
* :data:`HEALTHY_FLOPS_FRACTION` = 0.50. A large bf16 GEMM reaches 75-80 % of the dense peak (an H200:
  757-763 of 989 TFLOP/s); a whole prefill step, with attention, norms and elementwise kernels, 50-65 %.
* :data:`SLOW_KERNELS_MIN_SHARE` = 0.10, the same tenth as ``launch_bound``: below it the kernels' lost
  time is not where the step's time is, and the seeds' rule is to zoom in only where the time is.
* :data:`SUSPECT_UTILISATION` = 1.0: above the peak is impossible, whatever the tolerance of a clock.

**The parts.** This module is the question's entry point and re-exports its parts: the step's work and
the peaks (:mod:`~perfsdk.profiling.step_cost`: :class:`StepCost`), each kernel's time and, from recorded
shapes, its bytes and FLOPs (:mod:`~perfsdk.profiling.kernel_shapes`), the check itself with the top
kernels and the Nsight Compute command (:mod:`~perfsdk.profiling.kernel_check`, where the thresholds
are), and its finding and report lines (:mod:`~perfsdk.profiling.kernel_findings`).
"""

from __future__ import annotations

from perfsdk.profiling.kernel_check import (
    HEALTHY_BANDWIDTH_FRACTION,
    HEALTHY_BUSY_FRACTION,
    HEALTHY_FLOPS_FRACTION,
    NCU_LAUNCHES,
    SLOW_KERNELS_MIN_SHARE,
    SUSPECT_UTILISATION,
    TOP_KERNELS,
    KernelCheck,
    KernelRow,
    check_kernels,
    ncu_base_name,
    ncu_command,
    top_kernels,
)
from perfsdk.profiling.kernel_findings import kernel_findings, kernel_lines, rate_text
from perfsdk.profiling.kernel_shapes import KernelTally, ShapeIndex, gemm_work, tally_kernels
from perfsdk.profiling.step_cost import StepCost

__all__ = [
    "HEALTHY_BANDWIDTH_FRACTION",
    "HEALTHY_BUSY_FRACTION",
    "HEALTHY_FLOPS_FRACTION",
    "NCU_LAUNCHES",
    "SLOW_KERNELS_MIN_SHARE",
    "SUSPECT_UTILISATION",
    "TOP_KERNELS",
    "KernelCheck",
    "KernelRow",
    "KernelTally",
    "ShapeIndex",
    "StepCost",
    "check_kernels",
    "gemm_work",
    "kernel_findings",
    "kernel_lines",
    "ncu_base_name",
    "ncu_command",
    "rate_text",
    "tally_kernels",
    "top_kernels",
]
