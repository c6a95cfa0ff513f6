"""``perfsdk demo --ladder`` end to end on a CPU: every rung a CPU runs, under real HTTP load, each
profiled by perfsdk's window, with the table, the loop's log, compare/regress and the plot written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_ladder_on_cpu_writes_the_table_the_log_and_the_plot(tmp_path: Path) -> None:
    out = tmp_path / "ladder"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PERFSDK_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "perfsdk.cli",
            "demo",
            "--ladder",
            "--out",
            str(out),
            "--num-prompts",
            "8",
            "--output-len",
            "48",
            "--concurrency",
            "4",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    table = proc.stdout
    for heading in ("rung", "step ms b1", "tok/s load", "MBU b1", "verdict", "next"):
        assert heading in table
    rows = {line.split()[0]: line for line in table.splitlines()[3:8] if line.strip()}
    assert set(rows) >= {"eager", "graph", "compile", "int8"}
    assert "skipped" in rows["compile"]
    assert "compile: skipped: torch.compile" in table  # and why

    result = json.loads((out / "ladder.json").read_text())
    # the file is the typed rows (perfsdk.demo.ladder_rows), key for key and in order
    from perfsdk.demo.ladder_rows import RungRow

    for r in result["rungs"]:
        assert json.dumps(RungRow.from_dict(r).to_dict()) == json.dumps(r)
    ran = [r for r in result["rungs"] if not r.get("skipped")]
    assert [r["rung"] for r in ran] == ["eager", "graph", "int8"]
    for r in ran:
        assert r["load"]["completed"] == 8 and r["load"]["failed"] == 0
        assert r["standalone_b1"]["step_ms_p50"] > 0
        assert r["monitor"]["internal_errors"] == 0
        assert r["profile"]["captured"], r["profile"]
        assert r["profile"]["verdict"].startswith("perfsdk profile:")
        assert r["hypothesis"] and r["result"]
    # every utilisation is a fraction of the peak, or the table calls it suspect: never a result above 100 %
    for r in ran:
        for part, key in (("standalone_b1", "mbu"), ("standalone_b1", "mbu_calibrated"), ("load", "mbu")):
            v = r[part].get(key)
            assert v is None or v > 0, (r["rung"], part, key, v)
            if v is not None and v > 1:
                assert "suspect" in rows[r["rung"]], rows[r["rung"]]
    shown = re.findall(r"(\d+(?:\.\d+)?)%", re.sub(r"suspect \(\d+%\)", "", "\n".join(rows.values())))
    assert shown and all(float(x) <= 100 for x in shown), rows
    # perfsdk's MBU of the int8 rung counts int8 bytes: fewer than the float32 rungs'
    assert ran[2]["spec"]["dtype"] == "int8"
    assert ran[2]["spec"]["weight_bytes"] < ran[1]["spec"]["weight_bytes"] / 3
    # bench compare and regress between consecutive rungs
    assert "output throughput (tok/s)" in ran[1]["compare"]
    assert isinstance(ran[2]["regress"]["passed"], bool)
    assert (out / "bench-eager.json").exists()

    log = (out / "ladder.md").read_text()
    assert "## The loop: hypothesis → change → result" in log
    for name in ("1. eager", "2. graph", "3. int8"):
        assert f"### {name}" in log
    assert "$ perfsdk bench compare bench-eager.json bench-graph.json" in log
    assert "$ perfsdk analyze" in log
    if "plot" in result["files"]:
        assert (out / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
