"""The ladder's rows are typed (perfsdk.demo.ladder_rows) and ``ladder.json`` is exactly their ``to_dict()``:
the same keys, in the order the ladder has always written them; and the ladder reads the engines through
their public attributes only. Fast: no model or server (the end-to-end ladder is tests/test_demo_ladder.py,
which checks the same round trip on the file a real run writes)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from perfsdk.demo.ladder import format_table
from perfsdk.demo.ladder_log import explain
from perfsdk.demo.ladder_rows import (
    DecodeSteps,
    EngineInfo,
    FindingShare,
    Health,
    LoadRun,
    Profile,
    RegressCheck,
    RungRow,
    ServedB1,
    SpecInfo,
    Standalone,
)

ROOT = Path(__file__).resolve().parents[1]


def full_row(rung: str = "graph") -> RungRow:
    return RungRow(
        rung=rung,
        change="capture the decode step in CUDA graphs",
        why="the eager step is launch-bound",
        engine=EngineInfo(
            class_name="GraphEngine",
            name=rung,
            build_s=1.5,
            graphs=12,
            capture_s=0.4,
            compile_s=0.0,
            attention="sdpa",
            failed_requests=0,
        ),
        spec=SpecInfo(
            params=1.0e9,
            weight_bytes=2.0e9,
            dtype="bfloat16",
            kv_bytes_per_token=32768.0,
            step_weight_bytes=1.9e9,
            embedding_row_bytes=4096.0,
        ),
        standalone_b1=Standalone(
            batch=1,
            context=1024,
            steps=64,
            wall_ms=210.0,
            tokens_per_s=305.0,
            step_ms_p50=3.2,
            step_ms_mean=3.3,
            mbu=0.127,
            mbu_calibrated=0.153,
        ),
        load=LoadRun(
            bench="bench-graph.json",
            completed=64,
            failed=0,
            output_tokens_per_s=1500.0,
            decode_steps=600,
            batch_mean=14.5,
            context_mean=700.0,
            step_ms_p50=3.5,
            step_ms_mean=3.6,
            mbu=0.105,
        ),
        profile=Profile(
            captured=True,
            steady=False,
            trace="t.pt.trace.json.gz",
            verdict="perfsdk profile: ...",
            kind="memory_bound",
            share=0.85,
            findings=[FindingShare("memory_bound", 0.85)],
            gpu_busy=0.9,
            decode=DecodeSteps(
                steps=4,
                gpu_window_us=3400.0,
                gpu_busy_us=3100.0,
                kernels=46.0,
                graph_launches=1.0,
                category_shares={"gemm": 0.8},
            ),
            kernel_utilisation=0.7,
            report="t: 4 step(s) ...",
        ),
        served_b1=ServedB1(tpot_ms_p50=3.1, tokens_per_s=322.0, completed=3),
        standalone_load=Standalone(batch=15, context=700, steps=64, step_ms_p50=3.5),
        served_over_standalone=1.0,
        monitor=Health(internal_errors=0, dropped_records=0),
        compare="output throughput (tok/s) ...",
        regress=RegressCheck(passed=True, regressions=[], markdown="ok\n"),
    )


def test_a_row_is_written_with_the_ladders_keys_in_its_order_and_read_back_whole() -> None:
    row = full_row()
    explain(row, full_row("eager"))
    d = row.to_dict()
    assert list(d) == [
        "rung",
        "change",
        "why",
        "skipped",
        "engine",
        "spec",
        "standalone_b1",
        "load",
        "profile",
        "served_b1",
        "standalone_load",
        "served_over_standalone",
        "monitor",
        "hypothesis",
        "predicted_step_ms",
        "prediction_held",
        "result",
        "compare",
        "regress",
    ]
    assert list(d["engine"]) == [
        "class",
        "name",
        "build_s",
        "cuda_graphs",
        "compiled",
        "graphs",
        "capture_s",
        "compile_s",
        "int8_kernel",
        "attention",
        "attention_rejected",
        "failed_requests",
    ]
    assert list(d["profile"])[:3] == ["captured", "error", "steady"] and list(d["profile"])[-1] == "report"
    assert d["profile"]["findings"] == [{"kind": "memory_bound", "share": 0.85}]
    assert d["predicted_step_ms"] is not None and d["hypothesis"].startswith("eager was memory_bound")
    text = json.dumps(d)
    assert json.dumps(RungRow.from_dict(json.loads(text)).to_dict()) == text  # read back whole, key for key


def test_rows_that_did_not_measure_everything_keep_their_short_forms() -> None:
    assert RungRow(rung="compile", skipped="torch.compile on a CPU").to_dict() == {
        "rung": "compile",
        "skipped": "torch.compile on a CPU",
    }
    failed = RungRow(rung="int8", skipped="failed: RuntimeError: boom", error="Traceback ...").to_dict()
    assert list(failed) == ["rung", "skipped", "error"]
    missed = Profile(missing="the load ended before the window captured").to_dict()
    assert missed == {
        "captured": False,
        "verdict": None,
        "kind": None,
        "reason": "the load ended before the window captured",
    }
    first = full_row("eager")
    first.standalone_load = first.compare = first.regress = None  # no decode steps to redo; no rung before
    assert not {"standalone_load", "served_over_standalone", "compare", "regress"} & set(first.to_dict())


def test_an_older_ladder_json_is_read_and_rendered() -> None:
    """Committed results predate some keys (attention, the decode steps): a key missing is None."""
    path = ROOT / "benchmarks" / "results" / "h200_ladder.json"
    ladder = json.loads(path.read_text())["ladders"]["1b"]
    rows = [RungRow.from_dict(r) for r in ladder["rungs"]]
    assert [r.rung for r in rows] == ["eager", "graph", "compile", "int8"]
    assert rows[0].engine is not None and rows[0].engine.attention is None
    assert rows[1].profile is not None and rows[1].profile.kind == "memory_bound"
    assert "memory_bound 85%" in format_table(ladder)


def test_the_ladder_reads_no_private_attribute() -> None:
    """Engines are read through what they publish (graph_count, capture_seconds ...), never their internals."""
    for path in sorted((ROOT / "perfsdk" / "demo").glob("ladder*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                raise AssertionError(f"{path.name}:{node.lineno} reads .{node.attr}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) > 1
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
            ):
                raise AssertionError(f"{path.name}:{node.lineno} getattr of {node.args[1].value!r}")
