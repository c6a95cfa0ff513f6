"""Real GPU traces, captured on an H200 by ``benchmarks/gpu_traces.py``, and the diagnosis each must get.

The fixtures are a small Llama-shaped bf16 decode (2 layers, hidden 2048, batch 1, ~46 kernels a
step) profiled with ``schedule(wait=2, warmup=2, active=4)`` and ``record_function("perfsdk.decode")``
around each step; ``benchmarks/results/h200_gpu_traces_summary.json.gz`` records the GPU, driver and torch
version they came from. To refresh them: ``OUT=/tmp/t python benchmarks/gpu_traces.py`` on a GPU
machine, then copy ``/tmp/t/h200_*.pt.trace.json.gz`` here.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perfsdk.cli import main
from perfsdk.hardware import get
from perfsdk.profiling.analyze import Diagnosis, analyze_trace
from perfsdk.profiling.bandwidth import HEALTHY_BANDWIDTH_FRACTION, StepCost
from perfsdk.profiling.observer import Unprofiled
from perfsdk.profiling.timeline_plot import plot_timeline

DATA = Path(__file__).parent / "data"
NAMES = ("eager", "cuda_graph", "item_sync", "pageable_copy")


def fixture_path(name: str) -> Path:
    path = DATA / f"h200_{name}.pt.trace.json.gz"
    if not path.exists():
        pytest.skip(f"{path.name} not captured yet: run benchmarks/gpu_traces.py on a GPU and copy it to tests/data/")
    return path


@pytest.fixture(scope="module", params=NAMES)
def case(request: pytest.FixtureRequest) -> tuple[str, Diagnosis]:
    return request.param, analyze_trace(fixture_path(request.param))


def kinds(d: Diagnosis) -> list[str]:
    return [f.kind for f in d.findings]


def test_every_fixture_is_a_real_gpu_trace_with_four_decode_steps(case: tuple[str, Diagnosis]) -> None:
    _, d = case
    assert d.has_gpu
    assert d.step_source == "perfsdk"
    assert [s.name for s in d.steps] == ["perfsdk.decode"] * 4
    assert all(s.kernels >= 30 for s in d.steps)  # the whole decode step, linked by correlation
    assert d.summary()["category_shares"]["gemm"] > 0.0
    shares = [f.share for f in d.findings]
    assert shares == sorted(shares, reverse=True)  # ranked by time at stake


def test_eager_decode_is_launch_bound() -> None:
    d = analyze_trace(fixture_path("eager"))
    assert kinds(d)[0] == "launch_bound"
    assert "sync_bound" not in kinds(d)
    assert "copy_bound" not in kinds(d)
    busy = d.gpu_busy_fraction
    assert busy is not None
    assert busy < 0.5
    assert d.steps[0].graph_launches == 0


def fixture_step_bytes() -> int:
    """What one fixture decode step must read: benchmarks/gpu_traces.py's model (2 layers, hidden 2048, 16
    heads, 4 KV heads, FFN 5632, vocab 32000, bf16) at batch 1 over a 512-token KV cache."""
    hidden, ffn, vocab, layers, heads, kv_heads, head_dim, ctx = 2048, 5632, 32000, 2, 16, 4, 128, 512
    per_layer = (
        (heads + 2 * kv_heads) * head_dim * hidden + hidden * hidden + 2 * ffn * hidden + hidden * ffn + 2 * hidden
    )
    weights = layers * per_layer + vocab * hidden + hidden + hidden  # + final norm + one embedding row
    kv = layers * 2 * kv_heads * ctx * head_dim
    return 2 * (weights + kv)


def test_cuda_graph_decode_is_busy_and_not_launch_bound() -> None:
    d = analyze_trace(fixture_path("cuda_graph"))
    assert "launch_bound" not in kinds(d)
    busy = d.gpu_busy_fraction
    assert busy is not None
    assert busy >= 0.8
    # busy, but nothing said what the step must read: not "healthy", and the report says so
    assert kinds(d)[0] == "busy_unchecked"
    assert "memory_bound" not in kinds(d)
    assert all(s.graph_launches == 1 for s in d.steps)
    eager = analyze_trace(fixture_path("eager")).gpu_busy_fraction
    assert eager is not None
    assert busy > eager


def test_cuda_graph_decode_far_below_the_h200_bandwidth_is_slow_kernels_not_healthy() -> None:
    """Before: 'memory_bound 89%: healthy decode'. Its kernels read 0.31 GB in 0.19 ms: ~1.6 of 4.8 TB/s."""
    h200 = get("h200")
    cost = StepCost(bytes=fixture_step_bytes(), peak_bandwidth=h200.memory_bandwidth, source="fixture model")
    d = analyze_trace(fixture_path("cuda_graph"), cost=cost)
    assert "memory_bound" not in kinds(d)
    assert kinds(d)[0] == "slow_kernels"
    kc = d.kernel_check
    assert kc is not None and kc.bound == "memory" and kc.utilisation is not None
    assert kc.utilisation < HEALTHY_BANDWIDTH_FRACTION
    assert kc.utilisation == pytest.approx(fixture_step_bytes() / (kc.kernel_us * 1e-6) / h200.memory_bandwidth)
    # the kernels that hold the time, by name, with their share of the step, and the ncu command for them
    slow = d.findings[0]
    assert kc.top[0].name.startswith("nvjet_sm90") and kc.top[0].name in slow.evidence
    assert kc.top == sorted(kc.top, key=lambda r: -r.us_per_step)
    assert slow.suggestion.count("ncu --set full -k regex:'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT|") == 1
    # the eager fixture reads the same bytes as slowly, but its time is in launch gaps: zoom in there first
    eager = analyze_trace(fixture_path("eager"), cost=cost)
    assert kinds(eager)[0] == "launch_bound" and "slow_kernels" not in kinds(eager)


def test_the_same_kernels_near_the_peak_would_be_healthy() -> None:
    """The check itself on the real trace: a peak the kernels do come near makes the step healthy."""
    d0 = analyze_trace(fixture_path("cuda_graph"))
    kernel_s = statistics.fmean(s.gpu_busy_us for s in d0.steps) * 1e-6
    near = StepCost(bytes=fixture_step_bytes(), peak_bandwidth=fixture_step_bytes() / kernel_s / 0.9)
    assert kinds(analyze_trace(fixture_path("cuda_graph"), cost=near))[0] == "memory_bound"


def test_item_every_step_is_found_as_a_sync() -> None:
    d = analyze_trace(fixture_path("item_sync"))
    assert "sync_bound" in kinds(d)
    assert all(s.stream_syncs >= 1 and s.d2h_copies >= 1 for s in d.steps)
    assert sum(s.idle_after_sync_us for s in d.steps) > 0.0


def test_pageable_copy_every_step_is_copy_bound() -> None:
    d = analyze_trace(fixture_path("pageable_copy"))
    assert kinds(d)[0] == "copy_bound"
    assert all(s.h2d_pageable_copies == 1 for s in d.steps)
    assert all(s.h2d_pageable_bytes == 16 * 1024 * 1024 for s in d.steps)


def test_cli_json_and_plot_on_a_real_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = fixture_path("eager")
    png = tmp_path / "eager.png"
    assert main(["analyze", str(path), "--json", "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["kind"] == "launch_bound"
    assert set(out["findings"][0]) == {"kind", "share", "evidence", "suggestion"}
    assert 0.0 < out["gpu_busy_fraction"] < 0.5
    assert len(out["steps"]) == 4
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert plot_timeline(fixture_path("cuda_graph"), tmp_path / "graph.png") == str(tmp_path / "graph.png")


def test_shares_against_the_unprofiled_step_on_a_real_trace() -> None:
    """The vLLM case in small: the profiled eager step is 2.7 ms; unprofiled, say 0.4 ms. The kernels' busy
    time is kept, the launch gaps shrink to the rest, and every share is of the unprofiled step."""
    measured = analyze_trace(fixture_path("eager"))
    busy_us = statistics.fmean(s.gpu_busy_us for s in measured.steps)
    window_us = statistics.fmean(s.gpu_window_us for s in measured.steps)
    d = analyze_trace(fixture_path("eager"), unprofiled=Unprofiled(step_us=400.0, source="bench"))
    assert d.gpu_busy_fraction == pytest.approx(busy_us / 400.0, rel=1e-6)
    assert measured.gpu_busy_fraction is not None and d.gpu_busy_fraction > 5 * measured.gpu_busy_fraction
    assert d.observer["decode"]["inflation"] == pytest.approx(window_us / 400.0, abs=1e-3)
    top = d.findings[0]
    assert top.kind == "launch_bound"
    assert top.share == pytest.approx(1 - busy_us / 400.0, abs=0.01)  # the rest of the unprofiled step
    assert "of the unprofiled step" in top.evidence
    report = d.format_report()
    assert "profiling inflated decode steps" in report and "(bench)" in report
    assert [s.gpu_window_us for s in d.steps] == [s.gpu_window_us for s in measured.steps]  # steps as measured
    # without a reference, the report says the shares are of the profiled step
    assert "no unprofiled step time" in measured.format_report()


def test_cli_checks_the_kernels_and_corrects_for_the_profiler(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(fixture_path("cuda_graph"))
    assert main(["analyze", path, "--step-bytes", str(fixture_step_bytes()), "--gpu", "h200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["findings"][0]["kind"] == "slow_kernels"
    assert out["kernel_check"]["bound"] == "memory" and out["kernel_check"]["utilisation"] < 0.6
    assert out["kernel_check"]["ncu"].startswith("ncu --set full -k regex:'nvjet_sm90")
    assert out["observer"] is None and out["basis"] == "step time"
    assert main(["analyze", path, "--model", "llama-3.2-1b", "--gpu", "h200-sxm", "--unprofiled-ms", "0.25"]) == 0
    text = capsys.readouterr().out
    inflation = statistics.fmean(s.gpu_window_us for s in analyze_trace(path).steps) / 250.0
    assert f"profiling inflated decode steps {inflation:.2f}x" in text and "of the unprofiled step" in text
    # a real model's bytes in these tiny kernels' time would exceed the peak: suspect, never healthy
    assert "utilisation_suspect" in text and "memory_bound" not in text
    assert main(["analyze", path]) == 0
    assert "busy_unchecked" in capsys.readouterr().out


@pytest.mark.parametrize(
    "bad",
    [
        ["--step-bytes", "-5"],
        ["--unprofiled-ms", "0"],
        ["--batch", "0", "--gpu", "h200"],
        ["--gpu", "no-such-gpu"],
        ["--model", "no-such-model"],
        ["--tflops", "nan"],
    ],
)
def test_cli_bad_options_exit_2_with_a_message(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(fixture_path("cuda_graph")), *bad]) == 2
    err = capsys.readouterr().err
    # argparse refuses a bad number (the flag named), the analyzer a name it does not know
    assert ("error: argument " + bad[0] in err or err.startswith("perfsdk: error: ")) and "Traceback" not in err
