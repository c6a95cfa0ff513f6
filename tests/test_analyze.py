"""``perfsdk analyze`` on CPU traces captured here with the real torch.profiler.

A CPU-only trace has no GPU events: the analyser must say so, report the steps it found, give
host-side findings only (reads of tensor values) and exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfsdk.cli import main
from perfsdk.profiling.analyze import analyze_trace

torch = pytest.importorskip("torch")


def capture_cpu_trace(path: Path, *, read_item: bool, annotate: bool = True) -> Path:
    """Five profiled steps (schedule wait=1, warmup=1, active=3) of a small matmul + activation."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    x, w = torch.randn(64, 128), torch.randn(128, 128)

    def on_ready(prof: object) -> None:
        prof.export_chrome_trace(str(path))  # type: ignore[attr-defined]

    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=3, repeat=1),
        on_trace_ready=on_ready,
    ) as prof:
        for _ in range(6):
            if annotate:
                with record_function("perfsdk.decode"):
                    y = torch.nn.functional.silu(x @ w)
                    if read_item:
                        y.sum().item()
            else:
                torch.nn.functional.silu(x @ w)
            prof.step()
    return path


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    return {
        "item": capture_cpu_trace(d / "item.pt.trace.json.gz", read_item=True),
        "plain": capture_cpu_trace(d / "plain.json", read_item=False),
        "bare": capture_cpu_trace(d / "bare.json.gz", read_item=False, annotate=False),
    }


def test_cpu_trace_with_item_reads_gets_a_host_side_sync_finding(traces: dict[str, Path]) -> None:
    d = analyze_trace(traces["item"])
    assert not d.has_gpu
    assert d.gpu_busy_fraction is None
    assert d.step_source == "perfsdk"
    assert len(d.steps) == 3
    assert all(s.host_reads == 1 for s in d.steps)
    assert [f.kind for f in d.findings] == ["sync_bound"]
    assert "host-side only" in d.findings[0].evidence


def test_cpu_trace_without_reads_has_no_findings(traces: dict[str, Path]) -> None:
    d = analyze_trace(traces["plain"])
    assert len(d.steps) == 3
    assert d.findings == []
    assert all(s.host_dur_us > 0 for s in d.steps)


def test_profiler_steps_are_used_when_there_are_no_perfsdk_ranges(traces: dict[str, Path]) -> None:
    d = analyze_trace(traces["bare"])
    assert d.step_source == "ProfilerStep"
    assert all(s.name.startswith("ProfilerStep#") for s in d.steps)
    assert len(d.steps) == 3


def test_cli_report_says_cpu_only_and_exits_0(
    traces: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(traces["item"]), "--plot", str(tmp_path / "x.png")]) == 0
    out = capsys.readouterr().out
    assert "no GPU events" in out
    assert "sync_bound" in out
    assert "not drawn" in out
    assert not (tmp_path / "x.png").exists()


def test_cli_json_shape(traces: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(traces["item"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpu_busy_fraction"] is None
    assert out["has_gpu"] is False
    assert out["step_count"] == len(out["steps"]) == 3
    assert [set(f) for f in out["findings"]] == [{"kind", "share", "evidence", "suggestion"}]


def test_cli_unreadable_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8bnot really gzip")
    assert main(["analyze", str(bad)]) == 2
    assert "trace" in capsys.readouterr().err


def test_cpu_only_trace_reports_host_operator_time_by_category(tmp_path: Path) -> None:
    """A CPU-only trace has no kernels: the report splits host operator self time by category instead."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from perfsdk.profiling.analyze import analyze_trace

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("perfsdk.decode"):
                x = torch.nn.functional.linear(a, b)
                x = torch.nn.functional.silu(x) * x
                torch.nn.functional.layer_norm(x, (256,))
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    diag = analyze_trace(str(path))
    shares = diag.summary()["category_shares"]
    assert set(shares) >= {"gemm", "elementwise", "normalization"}
    assert abs(sum(shares.values()) - 1.0) < 0.01  # self times: nested ops are not counted twice
    assert "host operator time by category" in diag.format_report()
