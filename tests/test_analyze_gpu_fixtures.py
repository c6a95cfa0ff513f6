"""Real GPU traces, captured on an H200 by ``benchmarks/gpu_traces.py``, and the diagnosis each must get.

The fixtures are a small Llama-shaped bf16 decode (2 layers, hidden 2048, batch 1, ~46 kernels a
step) profiled with ``schedule(wait=2, warmup=2, active=4)`` and ``record_function("perfsdk.decode")``
around each step; ``benchmarks/results/h200_gpu_traces_summary.json.gz`` records the GPU, driver and torch
version they came from. To refresh them: ``OUT=/tmp/t python benchmarks/gpu_traces.py`` on a GPU
machine, then copy ``/tmp/t/h200_*.pt.trace.json.gz`` here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsdk.cli import main
from perfsdk.profiling.analyze import Diagnosis, analyze_trace
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


def test_cuda_graph_decode_is_busy_and_not_launch_bound() -> None:
    d = analyze_trace(fixture_path("cuda_graph"))
    assert "launch_bound" not in kinds(d)
    busy = d.gpu_busy_fraction
    assert busy is not None
    assert busy >= 0.8
    assert kinds(d)[0] == "memory_bound"  # healthy decode
    assert all(s.graph_launches == 1 for s in d.steps)
    eager = analyze_trace(fixture_path("eager")).gpu_busy_fraction
    assert eager is not None
    assert busy > eager


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
