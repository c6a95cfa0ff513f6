"""NVTX backend choice: off unless an NVTX tool is attached, forced on by request, real pushes."""

from __future__ import annotations

import pytest

from perfsdk.nvtx_ranges import make_nvtx, tool_attached
from perfsdk.testing import monitor_harness


def test_auto_is_off_without_a_tool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NVTX_INJECTION64_PATH", raising=False)
    monkeypatch.delenv("NVTX_INJECTION32_PATH", raising=False)
    assert not tool_attached()
    assert make_nvtx("auto").backend == "none"
    with monitor_harness(nvtx=None) as h:
        assert h.monitor.nvtx_backend == "none"


def test_auto_is_on_under_nsight(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nvtx")
    # what `nsys profile` sets for the process it launches
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nvidia/nsight-systems/target/libToolsInjection64.so")
    assert make_nvtx("auto").backend == "nvtx"


def test_forced_nvtx_package_pushes_and_pops_real_ranges() -> None:
    pytest.importorskip("nvtx")
    ranges = make_nvtx(True)
    assert ranges.backend == "nvtx"
    for batch in (1, 8, 1):
        ranges.push("decode", batch)
        ranges.pop()
    with monitor_harness(nvtx=True) as h:
        assert h.monitor.nvtx_backend == "nvtx"
        with h.monitor.decode(batch=4):
            pass
        assert h.count("perfsdk_step_seconds", phase="decode") == 1


def test_off() -> None:
    assert make_nvtx(False).backend == "none"
