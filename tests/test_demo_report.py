"""The demo's report on real steps: utilisations bounded by 1, and an impossible one shown as suspect.

A real demo server (the tiny model on this CPU), real HTTP load, the Monitor's own statistics, then
``build_report`` and ``format_report`` as ``perfsdk demo`` runs them. The hardware is given, not
calibrated, so each test knows which side of 100 % the figures must fall: a peak far above this machine
(every MBU/MFU a plausible fraction) and one far below it (every step "faster than the hardware allows").
"""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from perfsdk.demo import stack as demo_stack
from perfsdk.demo.report import build_report, format_report
from perfsdk.demo.stack import start_demo
from perfsdk.hardware import HardwareSpec

pytestmark = pytest.mark.slow

ABOVE = HardwareSpec(name="far-above", memory_bandwidth=1e12, flops={"fp32": 1e13}, source="test: far above")
BELOW = HardwareSpec(name="far-below", memory_bandwidth=1e6, flops={"fp32": 1e6}, source="test: far below")


def _report(monkeypatch: pytest.MonkeyPatch, hw: HardwareSpec) -> tuple[dict[str, Any], str]:
    from perfsdk.bench import BenchConfig, benchmark

    monkeypatch.setattr(demo_stack, "_hardware", lambda device, calibrate: (hw, hw.source))
    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=256) as demo:
        bench = benchmark(
            BenchConfig(
                base_url=demo.server.base_url,
                model=demo.model_name,
                num_prompts=6,
                request_rate=20.0,
                input_len="uniform:16-32",
                output_len="8",
                ignore_eos=True,
                seed=1,
                progress=False,
            ),
            progress=False,
        )
        assert demo.engine.wait_idle()
        assert demo.monitor.flush(timeout=10.0)
        r = build_report(stack=demo, bench=bench, config={}, monitor_stats=demo.monitor.stats())
    return r, format_report(r)


def _steps_table(text: str) -> str:
    return text[text.index("Steps") : text.index("Floors")]


def test_every_utilisation_the_report_shows_is_a_fraction_of_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    r, text = _report(monkeypatch, ABOVE)
    for phase, key in (("decode", "mbu_mean"), ("prefill", "mfu_mean")):
        value = r["steps"][phase][key]
        assert value is not None and 0 < value <= 1, (phase, key, value)
        assert not r["steps"][phase].get(key.replace("_mean", "_suspect"))
    table = _steps_table(text)
    shown = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", table)]
    assert len(shown) == 2 and all(0 < v <= 100 for v in shown), table
    assert "suspect" not in table and "warning" not in table


def test_an_impossible_utilisation_is_shown_as_suspect_with_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    r, text = _report(monkeypatch, BELOW)
    assert r["steps"]["decode"]["mbu_suspect"] and r["steps"]["prefill"]["mfu_suspect"]
    table = _steps_table(text)
    rows = {line.split()[0]: line.split() for line in table.splitlines()[2:4]}
    assert rows["decode"][4] == "suspect" and rows["prefill"][5] == "suspect", table
    assert not re.findall(r"\d%", table.split("warning")[0]), table  # no figure above 100 % shown as a result
    assert "warning: decode:" in table and "The peak in use: 0.001 GB/s" in table, table
    assert "warning: prefill:" in table and "TFLOP/s" in table, table
