"""The ladder's table: its "next" column follows perfsdk's finding (never the rung's name), and a utilisation
above 100 % is shown as suspect, not as a result. Fast: built from result rows, no model or server (the
end-to-end ladder is tests/test_demo_ladder.py; the window's decode-only verdict, tests/test_window.py)."""

from __future__ import annotations

from typing import Any

import pytest

from perfsdk.demo.ladder import format_markdown, format_table, short_advice


def row(rung: str, kind: str | None, **profile: Any) -> dict[str, Any]:
    return {
        "rung": rung,
        "skipped": None,
        "change": "one change",
        "spec": {"dtype": "bfloat16"},
        "profile": {"captured": True, "kind": kind, "share": 0.9, "gpu_busy": 0.9, **profile},
        "standalone_b1": {"step_ms_p50": 1.0, "tokens_per_s": 1000.0, "mbu": 0.3, "mbu_calibrated": 0.35},
        "load": {"output_tokens_per_s": 5000.0, "mbu": 0.25},
        "served_b1": {"tokens_per_s": 900.0},
        "served_over_standalone": 1.0,
    }


@pytest.mark.parametrize("rung", ["eager", "graph", "compile", "int8"])
def test_next_follows_the_finding_whatever_the_rung(rung: str) -> None:
    # a busy step whose kernels read far below the peak: not "fewer bytes", not "CUDA graphs"
    slow = row(rung, "slow_kernels", kernel_utilisation=0.34, graph_launches_per_step=1.0)
    assert short_advice(slow) == "faster kernels (34% of peak): ncu"
    # launch-bound steps that already replay a CUDA graph: not "CUDA graphs" again
    assert short_advice(row(rung, "launch_bound", graph_launches_per_step=1.0)) == "overlap host work, batch more"
    assert short_advice(row(rung, "launch_bound", graph_launches_per_step=0.0)) == "CUDA graphs"
    assert short_advice(row(rung, "utilisation_suspect")) == "check the peak and bytes"
    assert short_advice(row(rung, "busy_unchecked")) == "give model and GPU"
    assert short_advice(row(rung, "memory_bound")).startswith("fewer bytes")


def result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "settings": {
            "size": "1b",
            "device": "cuda",
            "context": 1024,
            "num_prompts": 64,
            "concurrency": 16,
            "input_len": "uniform:32-128",
            "output_len": "128",
        },
        "model": {"params": 1.2e9},
        "hardware": {"note": "datasheet: NVIDIA H200 SXM 141GB"},
        "environment": {},
        "rungs": rows,
    }


def test_a_utilisation_above_100_percent_is_suspect_not_a_result() -> None:
    r = row("int8", "memory_bound")
    r["standalone_b1"]["mbu_calibrated"] = 1.18  # against a calibrated bandwidth measured too low
    table = format_table(result([row("compile", "slow_kernels", kernel_utilisation=0.3), r]))
    assert "118.0%" not in table
    assert "suspect (118%)" in table
    assert "which no step can reach" in table and "int8 MBU b1 cal" in table
    md = format_markdown(result([r]))
    assert "suspect (118%)" in md and "118.0%" not in md
    assert "suspect" not in format_table(result([row("compile", "memory_bound")]))
