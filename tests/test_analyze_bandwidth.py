"""The kernels against the peak (perfsdk.profiling.bandwidth), on SYNTHETIC Kineto-shaped traces.

A busy GPU is only "healthy memory-bound" when the bytes a step must read over its kernels' time come near
the peak bandwidth (healthy compute-bound: FLOPs near the peak FLOP/s); far below, the finding is
``slow_kernels`` and names the kernels; above the peak it is ``utilisation_suspect``; without bytes or a
peak the check is not made and the report says so. The real H200 traces are checked in
tests/test_analyze_gpu_fixtures.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from perfsdk.errors import ConfigError
from perfsdk.hardware import get
from perfsdk.model import ModelSpec
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.bandwidth import (
    HEALTHY_BANDWIDTH_FRACTION,
    HEALTHY_FLOPS_FRACTION,
    StepCost,
    gemm_work,
    ncu_base_name,
    ncu_command,
)

HOST = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}
PEAK_BW = 4.8e12
PEAK_FLOPS = 989e12
GEMV = "void gemv2T_kernel_val<int, int, __nv_bfloat16, float, 128, 16, 4, 4, false>(float, float)"
NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int)"


class Builder:
    """Kineto-shaped events: step ranges, host operators (with recorded shapes), launches, kernels."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def step(self, name: str, ts: float, dur: float) -> None:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, **HOST})

    def op(self, name: str, ts: float, dur: float, dims: list[list[int]], types: list[str]) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "cpu_op",
                "name": name,
                "ts": ts,
                "dur": dur,
                **HOST,
                "args": {"Input Dims": dims, "Input type": types, "External id": 1},
            }
        )

    def kernel(self, name: str, ts: float, dur: float, *, launch_at: float) -> None:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": launch_at,
                "dur": 1.0,
                **HOST,
                "args": {"correlation": self.corr},
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": name,
                "ts": ts,
                "dur": dur,
                **GPU,
                "args": {"correlation": self.corr, "stream": 7},
            }
        )


def busy_trace(
    step: str = "perfsdk.decode", steps: int = 3, kernel_us: float = 100.0, kernels: int = 10
) -> list[dict[str, Any]]:
    """Steps whose kernels run back to back (launched well ahead): GPU busy ~100 %."""
    b = Builder()
    t = 0.0
    for _ in range(steps):
        b.step(step, t, 5.0)
        k = t + 2.0
        for i in range(kernels):
            b.kernel(GEMV if i % 2 == 0 else NORM, k, kernel_us, launch_at=t + 0.1 * i)
            k += kernel_us
        t = k
    return b.events


def kernel_us_per_step(events: list[dict[str, Any]]) -> float:
    d = analyze_trace(events)
    return sum(s.gpu_busy_us for s in d.steps) / len(d.steps)


def kinds(d: Any) -> list[str]:
    return [f.kind for f in d.findings]


def test_a_busy_decode_near_the_peak_bandwidth_is_healthy_memory_bound() -> None:
    events = busy_trace()
    busy_s = kernel_us_per_step(events) * 1e-6
    cost = StepCost(bytes=0.9 * PEAK_BW * busy_s, peak_bandwidth=PEAK_BW, source="synthetic")  # 90 % of the peak
    d = analyze_trace(events, cost=cost)
    assert kinds(d) == ["memory_bound"]
    assert d.kernel_check is not None and d.kernel_check.bound == "memory"
    assert d.kernel_check.utilisation == pytest.approx(0.9, rel=1e-6)
    assert "90% of the peak" in d.findings[0].evidence


def test_a_busy_decode_far_below_the_peak_is_slow_kernels_with_the_kernels_and_ncu() -> None:
    events = busy_trace()
    busy_s = kernel_us_per_step(events) * 1e-6
    d = analyze_trace(events, cost=StepCost(bytes=0.25 * PEAK_BW * busy_s, peak_bandwidth=PEAK_BW))
    assert "memory_bound" not in kinds(d)
    slow = d.findings[0]
    assert slow.kind == "slow_kernels"
    # at stake: the kernel time beyond the floor, 75 % of a fully busy step
    assert slow.share == pytest.approx(0.75, abs=0.02)
    assert "25% of the peak" in slow.evidence
    assert "gemv2T_kernel_val" in slow.evidence and "vectorized_layer_norm_kernel" in slow.evidence
    assert "ncu --set full -k regex:'gemv2T_kernel_val|vectorized_layer_norm_kernel' -c 5" in slow.suggestion
    top = d.kernel_check.top if d.kernel_check else []
    assert [r.name for r in top] == [GEMV, NORM]
    assert top[0].share == pytest.approx(0.5, abs=0.02) and top[0].calls_per_step == 5


def test_without_bytes_or_a_peak_a_busy_step_is_not_called_healthy() -> None:
    d = analyze_trace(busy_trace())
    assert kinds(d) == ["busy_unchecked"]
    assert "could not be checked" in d.findings[0].evidence
    assert "--model" in d.findings[0].suggestion
    report = d.format_report()
    assert "not checked" in report and "memory_bound" not in report
    # a peak without the step's bytes, and bytes without a peak: still not checked, and why
    no_bytes = analyze_trace(busy_trace(), cost=StepCost(peak_bandwidth=PEAK_BW))
    assert kinds(no_bytes) == ["busy_unchecked"] and "no bytes or FLOPs" in no_bytes.findings[0].evidence
    no_peak = analyze_trace(busy_trace(), cost=StepCost(bytes=1e9))
    assert kinds(no_peak) == ["busy_unchecked"] and "no GPU peaks" in no_peak.findings[0].evidence


def test_above_the_peak_is_suspect_never_healthy() -> None:
    events = busy_trace()
    busy_s = kernel_us_per_step(events) * 1e-6
    d = analyze_trace(events, cost=StepCost(bytes=1.3 * PEAK_BW * busy_s, peak_bandwidth=PEAK_BW))
    assert kinds(d) == ["utilisation_suspect"]
    assert d.kernel_check is not None and d.kernel_check.suspect
    assert "impossible" in d.findings[0].evidence
    assert d.to_dict()["kernel_check"]["suspect"] is True


def test_prefill_is_compute_bound_only_near_the_peak_flops() -> None:
    events = busy_trace("perfsdk.prefill", kernel_us=400.0)
    busy_s = kernel_us_per_step(events) * 1e-6
    near = analyze_trace(
        events, cost=StepCost(bytes=1e9, flops=0.7 * PEAK_FLOPS * busy_s, peak_bandwidth=PEAK_BW, peak_flops=PEAK_FLOPS)
    )
    assert kinds(near) == ["compute_bound"]
    assert near.kernel_check is not None and near.kernel_check.bound == "compute"
    far = analyze_trace(
        events, cost=StepCost(bytes=1e9, flops=0.2 * PEAK_FLOPS * busy_s, peak_bandwidth=PEAK_BW, peak_flops=PEAK_FLOPS)
    )
    assert kinds(far) == ["slow_kernels"]
    assert "TFLOP/s" in far.findings[0].evidence
    assert 0.2 < HEALTHY_FLOPS_FRACTION < 0.7 and 0.25 < HEALTHY_BANDWIDTH_FRACTION < 0.9


def test_the_bound_comes_from_the_figures_not_the_step_name() -> None:
    # a "decode" step whose FLOPs floor is far above its bytes floor (a huge batch) is compute-bound
    events = busy_trace("perfsdk.decode")
    busy_s = kernel_us_per_step(events) * 1e-6
    d = analyze_trace(
        events,
        cost=StepCost(
            bytes=0.01 * PEAK_BW * busy_s,
            flops=0.8 * PEAK_FLOPS * busy_s,
            peak_bandwidth=PEAK_BW,
            peak_flops=PEAK_FLOPS,
        ),
    )
    assert kinds(d) == ["compute_bound"]


def test_costs_per_phase_and_a_phase_without_one() -> None:
    b = Builder()
    b.step("perfsdk.prefill", 0.0, 5.0)
    b.kernel(GEMV, 2.0, 500.0, launch_at=0.1)
    b.step("perfsdk.decode", 502.0, 5.0)
    b.kernel(GEMV, 503.0, 100.0, launch_at=502.1)
    decode = StepCost(bytes=0.9 * PEAK_BW * 100e-6, peak_bandwidth=PEAK_BW)
    d = analyze_trace(b.events, cost={"decode": decode})
    assert d.kernel_check is not None and "prefill" in (d.kernel_check.missing or "")
    only = d.select("decode")
    assert only is not None and [s.name for s in only.steps] == ["perfsdk.decode"]
    assert kinds(only) == ["memory_bound"]
    assert d.select("mixed") is None
    with pytest.raises(ConfigError, match="cost"):
        analyze_trace(b.events, cost={"decoding": decode})
    with pytest.raises(ConfigError, match="phase"):
        analyze_trace(b.events, phase="verify")


def test_recorded_shapes_give_each_kernel_its_bandwidth_and_flop_rate() -> None:
    b = Builder()
    t = 0.0
    for _ in range(2):
        b.step("perfsdk.decode", t, 50.0)
        # aten::linear over a [1, 4096] bf16 activation and a [14336, 4096] bf16 weight, launched inside it
        b.op("aten::linear", t + 1.0, 20.0, [[1, 4096], [14336, 4096]], ["c10::BFloat16", "c10::BFloat16"])
        b.op("aten::mm", t + 2.0, 10.0, [[1, 4096], [4096, 14336]], ["c10::BFloat16", "c10::BFloat16"])
        b.kernel(GEMV, t + 30.0, 50.0, launch_at=t + 3.0)
        b.kernel(NORM, t + 80.0, 10.0, launch_at=t + 25.0)  # outside any product: no shapes
        t += 90.0
    d = analyze_trace(b.events, cost=StepCost(bytes=1.2e8, peak_bandwidth=PEAK_BW))
    assert d.kernel_check is not None
    gemv = next(r for r in d.kernel_check.top if r.name == GEMV)
    nbytes = 2 * (4096 + 4096 * 14336 + 14336)  # read a and the weight, write the result
    assert gemv.bandwidth == pytest.approx(nbytes / 50e-6)
    assert gemv.flop_rate == pytest.approx(2 * 4096 * 14336 / 50e-6)
    assert gemv.bandwidth_fraction == pytest.approx(nbytes / 50e-6 / PEAK_BW)
    norm = next(r for r in d.kernel_check.top if r.name == NORM)
    assert norm.bandwidth is None
    assert "TB/s" in gemv.describe("step time") and "of peak" in gemv.describe("step time")


def test_gemm_work_of_the_matrix_products() -> None:
    bf = "c10::BFloat16"
    assert gemm_work("aten::mm", [[8, 64], [64, 32]], ["float", "float"]) == (
        4.0 * (8 * 64 + 64 * 32 + 8 * 32),
        2.0 * 8 * 64 * 32,
    )
    assert gemm_work("aten::addmm", [[32], [8, 64], [64, 32], [], []], ["float"] * 3 + ["Scalar"] * 2) == (
        4.0 * (8 * 64 + 64 * 32 + 8 * 32 + 32),
        2.0 * 8 * 64 * 32,
    )
    assert gemm_work("aten::bmm", [[2, 3, 4], [2, 4, 5]], [bf, bf]) == (
        2.0 * (2 * 3 * 4 + 2 * 4 * 5 + 2 * 3 * 5),
        2.0 * 2 * 3 * 4 * 5,
    )
    assert gemm_work("aten::linear", [[2, 1, 64], [32, 64], [32]], [bf, bf, bf]) == (
        2.0 * (2 * 64 + 64 * 32 + 2 * 32 + 32),
        2.0 * 2 * 64 * 32,
    )
    assert gemm_work("aten::mm", [[8, 64], [65, 32]], ["float", "float"]) is None  # inner dims disagree
    assert gemm_work("aten::add", [[8], [8]], ["float", "float"]) is None
    assert gemm_work("aten::mm", [[8, 64], [64, 32]], ["weird", "float"]) is None


def test_ncu_names_are_the_kernels_function_names() -> None:
    assert ncu_base_name(NORM) == "vectorized_layer_norm_kernel"
    assert ncu_base_name(GEMV) == "gemv2T_kernel_val"
    assert ncu_base_name("nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT") == "nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT"
    assert ncu_base_name("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>(Params)") == "Kernel2"
    cmd = ncu_command([GEMV, GEMV.replace("128", "256"), NORM])
    assert re.search(r"-k regex:'gemv2T_kernel_val\|vectorized_layer_norm_kernel' -c 5 -o perfsdk-kernels", cmd)


def test_step_cost_from_a_model_and_a_gpu_and_bad_figures() -> None:
    m, h200 = ModelSpec.named("llama-3-8b"), get("h200")
    c = StepCost.decode(m, h200, batch=2, context_tokens=2048)
    assert c.bytes == pytest.approx(m.step_weight_bytes + 2 * m.embedding_row_bytes + m.kv_bytes_per_token * 2048)
    assert c.peak_bandwidth == h200.memory_bandwidth and c.peak_flops == h200.peak_flops("bf16")
    assert "batch 2" in c.source and h200.display_name in c.source
    p = StepCost.prefill(m, h200, [512, 512])
    assert p.flops is not None and p.flops > 2 * m.params * 1024
    assert not StepCost.decode(m, None).checkable and "no GPU peaks" in StepCost.decode(m, None).missing
    for bad in ({"bytes": -1.0}, {"peak_bandwidth": float("nan")}, {"flops": "many"}, {"peak_flops": True}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            StepCost(**bad)
    with pytest.raises(ConfigError, match="batch"):
        StepCost.decode(m, h200, batch=0)
    with pytest.raises(ConfigError, match="prompt"):
        StepCost.prefill(m, h200, [])
