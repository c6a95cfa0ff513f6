"""SYNTHETIC unit tests of the trace classifier.

CI has no GPU, so the GPU-side logic (idle split, sync/copy/communication detection, step windows)
is exercised here on small hand-built event lists that use Kineto's exact field names
("ph": "X", "cat": "kernel" / "gpu_memcpy" / "cuda_runtime", args "correlation", "stream",
"bytes", "ac2g" flows). They test the classifier's rules, not what real GPUs do: the real H200
traces are checked in tests/test_analyze_gpu_fixtures.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfsdk.errors import ConfigError
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.categories import categorize
from perfsdk.profiling.timeline_plot import plot_timeline

HOST = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}


class Builder:
    """Build a Kineto-shaped event list: host launches linked to GPU ops by correlation id."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.corr = 0

    def step(self, name: str, ts: float, dur: float) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "ts": ts,
                "dur": dur,
                **HOST,
                "args": {"External id": 1},
            }
        )

    def call(self, name: str, ts: float, dur: float = 2.0) -> int:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "ts": ts,
                "dur": dur,
                **HOST,
                "args": {"correlation": self.corr, "cbid": 211},
            }
        )
        return self.corr

    def gpu(self, corr: int, name: str, ts: float, dur: float, cat: str = "kernel", **args: Any) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "ts": ts,
                "dur": dur,
                **GPU,
                "args": {"correlation": corr, "stream": 7, "device": 0, **args},
            }
        )

    def kernel_launched(self, ts: float, dur: float, *, launch_at: float, name: str = "void gemv_kernel") -> None:
        self.gpu(self.call("cudaLaunchKernel", launch_at), name, ts, dur)


def launch_bound_trace(steps: int = 3) -> list[dict[str, Any]]:
    """Each 5 µs kernel is launched 5 µs after the previous one ended: the GPU starves."""
    b = Builder()
    t = 0.0
    for _ in range(steps):
        b.step("perfsdk.decode", t, 100.0)
        for _k in range(10):
            b.kernel_launched(t + 3.0, 5.0, launch_at=t)  # kernel starts 3 µs after its launch call
            t += 10.0
    return b.events


def test_launch_bound_classified_as_waiting_for_launch() -> None:
    d = analyze_trace(launch_bound_trace())
    assert d.has_gpu
    assert len(d.steps) == 3
    assert d.gpu_busy_fraction == pytest.approx(0.5, abs=0.02)
    assert d.findings[0].kind == "launch_bound"
    assert d.findings[0].share == pytest.approx(0.5, abs=0.02)
    s = d.steps[0]
    assert s.kernels == 10
    assert s.kernel_median_us == pytest.approx(5.0)
    assert s.idle_other_us == pytest.approx(0.0)
    assert s.category_shares() == {"gemm": 1.0}
    assert "CUDA graph" in d.findings[0].suggestion


def test_cuda_graph_replay_is_busy_and_not_launch_bound() -> None:
    b = Builder()
    t = 0.0
    for _ in range(3):
        b.step("perfsdk.decode", t, 5.0)
        corr = b.call("cudaGraphLaunch", t + 1.0)
        k = t + 10.0
        for _i in range(20):  # all graph nodes share the replay's correlation id
            b.gpu(corr, "void at::native::vectorized_elementwise_kernel<silu>", k, 9.0, **{"graph id": 3})
            k += 10.0
        t += 200.0  # host runs ahead: next replay launched long before this one finished
    d = analyze_trace(b.events)
    kinds = [f.kind for f in d.findings]
    assert "launch_bound" not in kinds
    # busy, but no bytes or peak were given: not called healthy (tests/test_analyze_bandwidth.py has the check)
    assert kinds[0] == "busy_unchecked"
    assert d.gpu_busy_fraction is not None
    assert d.gpu_busy_fraction >= 0.85
    assert d.steps[0].graph_launches == 1
    assert d.steps[0].idle_launch_wait_us == pytest.approx(0.0)


def test_sync_after_item_is_found_and_gap_attributed_to_it() -> None:
    b = Builder()
    t = 0.0
    for _ in range(3):
        b.step("perfsdk.decode", t, 80.0)
        b.kernel_launched(t + 5.0, 30.0, launch_at=t)
        # .item(): cudaMemcpyAsync (D2H) then cudaStreamSynchronize, which returns when the GPU is done
        corr = b.call("cudaMemcpyAsync", t + 3.0, 2.0)
        b.gpu(corr, "Memcpy DtoH (Device -> Pageable)", t + 35.0, 1.0, cat="gpu_memcpy", bytes=8)
        b.call("cudaStreamSynchronize", t + 6.0, 31.0)  # ends at t+37, after the copy
        t += 100.0  # the host does 60 µs of work before the next launch: GPU idles after the sync
    d = analyze_trace(b.events)
    kinds = [f.kind for f in d.findings]
    assert "sync_bound" in kinds
    s = d.steps[0]
    # one .item(): a D2H cudaMemcpyAsync plus its stream synchronize is one stall, not two
    assert (s.stream_syncs, s.d2h_copies, s.host_syncs) == (1, 1, 1)
    assert s.idle_after_sync_us > 50.0
    # the idle after the sync is the sync's cost, not counted again as plain launch-bound
    assert "launch_bound" not in kinds
    sync = next(f for f in d.findings if f.kind == "sync_bound")
    assert "stream synchronize ×1" in sync.evidence
    assert sync.share > 0.5


def test_pageable_host_to_device_copy_is_copy_bound() -> None:
    b = Builder()
    t = 0.0
    for _ in range(2):
        b.step("perfsdk.decode", t, 700.0)
        corr = b.call("cudaMemcpyAsync", t, 600.0)
        b.gpu(corr, "Memcpy HtoD (Pageable -> Device)", t + 10.0, 600.0, cat="gpu_memcpy", bytes=16 << 20)
        for k in range(5):
            b.kernel_launched(t + 620.0 + 20 * k, 18.0, launch_at=t + 605.0 + k)
        t += 720.0
    d = analyze_trace(b.events)
    assert d.findings[0].kind == "copy_bound"
    assert d.steps[0].h2d_pageable_copies == 1
    assert d.steps[0].h2d_pageable_bytes == 16 << 20
    assert d.findings[0].share > 0.5
    assert "pinned" in d.findings[0].suggestion
    assert d.summary()["category_shares"]["memcpy"] > 0.8


def test_exposed_all_reduce_is_communication_bound() -> None:
    b = Builder()
    b.step("perfsdk.decode", 0.0, 10.0)
    b.kernel_launched(2.0, 40.0, launch_at=0.0)
    b.kernel_launched(42.0, 60.0, launch_at=1.0, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL(Args)")
    b.kernel_launched(102.0, 40.0, launch_at=2.0)
    d = analyze_trace(b.events)
    comm = next(f for f in d.findings if f.kind == "communication_bound")
    assert comm.share == pytest.approx(60.0 / 140.0, abs=0.01)


def test_prefill_step_busy_is_unchecked_without_flops_and_worded_as_prefill() -> None:
    b = Builder()
    b.step("perfsdk.prefill", 0.0, 10.0)
    for k in range(4):
        b.kernel_launched(5.0 + 300.0 * k, 299.0, launch_at=float(k), name="sm90_xmma_gemm_bf16bf16_bf16f32")
    d = analyze_trace(b.events)
    assert [f.kind for f in d.findings] == ["busy_unchecked"]
    assert "peak FLOP/s" in d.findings[0].evidence


def test_profiler_steps_used_without_perfsdk_ranges_and_whole_trace_without_any() -> None:
    events = [e for e in launch_bound_trace() if e["cat"] != "user_annotation"]
    assert analyze_trace(events).step_source == "whole trace"
    with_steps = [
        *events,
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 0.0, "dur": 150.0, **HOST},
    ]
    d = analyze_trace(with_steps)
    assert d.step_source == "ProfilerStep"
    assert d.steps[0].name == "ProfilerStep#7"
    assert d.steps[0].kernels == 15
    assert analyze_trace(events, step_pattern=r"nothing.*").step_source == "whole trace"


def test_flow_events_recover_a_missing_correlation() -> None:
    events = launch_bound_trace(steps=1)
    for e in events:
        if e["cat"] == "kernel":
            corr = e["args"].pop("correlation")
            events.append(
                {
                    "ph": "f",
                    "cat": "ac2g",
                    "name": "ac2g",
                    "id": corr,
                    "bp": "e",
                    "ts": e["ts"],
                    "pid": e["pid"],
                    "tid": e["tid"],
                }
            )
    d = analyze_trace(events)
    assert d.findings[0].kind == "launch_bound"
    assert d.steps[0].kernels == 10


def test_json_and_gzip_files_load_the_same(tmp_path: Path) -> None:
    doc = {"traceEvents": launch_bound_trace(), "displayTimeUnit": "ms"}
    plain, gz = tmp_path / "t.json", tmp_path / "t.pt.trace.json.gz"
    plain.write_text(json.dumps(doc))
    gz.write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert analyze_trace(plain).to_dict()["findings"] == analyze_trace(gz).to_dict()["findings"]


def test_unreadable_traces_raise_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="trace"):
        analyze_trace(bad)
    with pytest.raises(ConfigError, match="trace"):
        analyze_trace(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="step_pattern"):
        analyze_trace(launch_bound_trace(), step_pattern="(")


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_tn>", "kernel", "gemm"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "kernel", "gemm"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64, 4>>", "kernel", "attention"),
        (
            "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
            "kernel",
            "normalization",
        ),
        ("void at::native::vectorized_elementwise_kernel<4, silu_kernel>", "kernel", "elementwise"),
        ("void at::native::distribution_elementwise_grid_stride_kernel<normal_kernel>", "kernel", "other"),
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgs)", "kernel", "communication"),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>", "kernel", "communication"),
        ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "memcpy"),
        ("Memset (Device)", "gpu_memset", "memcpy"),
        ("void at::native::reduce_kernel<512, 1, at::native::ArgMaxOps<float>>", "kernel", "other"),
    ],
)
def test_kernel_categories(name: str, cat: str, expected: str) -> None:
    assert categorize(name, cat) == expected


def test_plot_draws_a_png_of_one_step(tmp_path: Path) -> None:
    d = analyze_trace(launch_bound_trace())
    out = plot_timeline(d, tmp_path / "step.png", step=1)
    assert Path(out).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ConfigError, match="step"):
        plot_timeline(d, tmp_path / "x.png", step=9)
