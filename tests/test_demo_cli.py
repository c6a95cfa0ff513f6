"""``perfsdk demo`` end to end, as a newcomer runs it: a subprocess, a readable report, exit code 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
pytest.importorskip("aiohttp")

from perfsdk.demo.report import HEADINGS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 120, cache: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if cache is not None:  # a fresh clone: no calibration cached yet
        env["PERFSDK_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", "perfsdk.cli", "demo", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_perfsdk_demo_prints_the_report_and_exits_zero(tmp_path: Path) -> None:
    proc = _run("--duration", "8", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    positions = [out.find(h) for h in HEADINGS]
    assert all(p >= 0 for p in positions), f"missing headings in:\n{out}"
    assert positions == sorted(positions), "report sections out of order"
    for row in ("TTFT", "TPOT", "ITL", "prefill", "decode", "/metrics", "/debug/profile"):
        assert row in out
    assert "Traceback" not in proc.stderr
    assert ", 0 failed" in out
    # the CPU was measured, so floors and MBU/MFU are on; or the machine was too busy to measure, and it says so
    assert "calibrated" in out or "the calibration was not usable" in out


def test_a_bad_calibration_never_reaches_the_report_as_a_utilisation_above_100_percent(tmp_path: Path) -> None:
    """Issue 19's reproduction: a cached CPU calibration with fp32 at 1.4 GFLOP/s gave "MFU 2,674.8 %".

    Whatever perfsdk makes of that cache (refuses it, or uses it), no MBU or MFU above 100 % is presented as a
    result: a figure that came out impossible reads "suspect", with a warning naming the peak in use.
    """
    import torch

    from perfsdk.hardware import _cache_path, _cpu_name

    env_cache = tmp_path / "cache"
    env_cache.mkdir()
    old = os.environ.get("PERFSDK_CACHE_DIR")
    os.environ["PERFSDK_CACHE_DIR"] = str(env_cache)
    try:
        path = _cache_path(_cpu_name())
    finally:
        if old is None:
            del os.environ["PERFSDK_CACHE_DIR"]
        else:
            os.environ["PERFSDK_CACHE_DIR"] = old
    path.write_text(
        json.dumps(
            {
                "device": _cpu_name(),
                "copy_bandwidth": 10.9e9,
                "flops": {"fp32": 1.4e9, "bf16": 9.4e9},
                "measured_at": "2026-12-01T00:00:00+00:00",
                "torch_version": torch.__version__,
                "backend": "cpu",
                "quick": True,
                "details": {"threads": torch.get_num_threads()},
            }
        )
    )
    proc = _run("--duration", "3", cache=env_cache)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    table = out[out.index("Steps") : out.index("Floors")]
    shown = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?)%", table.split("warning")[0])]
    assert all(v <= 100 for v in shown), table
    # either the (re-measured) calibration was used, or it was refused and the report says so
    assert shown or "the calibration was not usable" in out, out
    if "suspect" in table:
        assert "The peak in use" in table and "TFLOP/s" in table, table


def test_perfsdk_demo_json_counts_agree() -> None:
    proc = _run("--duration", "2", "--request-rate", "4", "--output-len", "8", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    counts = report["counts"]
    assert counts["client_completed"] == report["load"]["num_prompts"] == 8
    if report["monitor"]["available"]:
        assert counts["server_requests"] == counts["server_first_tokens"] == 8
    assert counts["client_output_tokens"] == counts["engine_tokens"] == 64


def test_bad_flags_are_reported_without_a_traceback() -> None:
    proc = _run("--model-size", "huge", timeout=60)
    assert proc.returncode == 2
    assert "huge" in proc.stderr and "tiny" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--duration", "nan"),
        ("--duration", "inf"),
        ("--request-rate", "nan"),
        ("--request-rate", "inf"),
        ("--duration", "1e400"),
        ("--num-prompts", "0"),
        ("--port", "65536"),
    ],
)
def test_bad_numbers_exit_2_naming_the_flag(flag: str, value: str) -> None:
    """Were a ValueError (nan) and an OverflowError (inf) traceback from round(rate * duration)."""
    proc = _run(flag, value, timeout=60)
    assert proc.returncode == 2
    assert f"argument {flag}: " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_load_beyond_the_demo_is_refused_before_building_anything() -> None:
    proc = _run("--device", "cpu", "--duration", "86400", "--request-rate", "10000", timeout=60)
    assert proc.returncode == 2
    assert "--request-rate × --duration is 864,000,000 requests" in proc.stderr
    assert "building" not in proc.stderr and "Traceback" not in proc.stderr


def test_serve_keeps_serving_after_the_report_until_ctrl_c() -> None:
    import httpx

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "perfsdk.cli", "demo", "--serve", "--port", "0", "--duration", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        url = None
        for line in proc.stderr:
            found = re.search(r"serving at (http://\S+)", line)
            if found and url is None:
                url = found.group(1)
            if "still serving" in line:
                break
        assert url is not None, "the demo never said where it serves"
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "after the report", "max_tokens": 3}, timeout=30)
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] <= 3
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ---- issue 20, item 7: SIGTERM as clean as Ctrl-C; no open profiler trigger off loopback -------------------


def _start(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """``perfsdk demo ARGS`` in a subprocess; returns it and its base URL once it serves."""
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if k != "PERFSDK_PROFILE_TOKEN"}
    env.update(PYTHONUNBUFFERED="1", **extra)
    cmd = [sys.executable, "-m", "perfsdk.cli", "demo", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        found = re.search(r"serving at (http://\S+)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    raise AssertionError(f"the demo never said where it serves: {proc.communicate()}")


def test_sigterm_while_serving_stops_as_cleanly_as_ctrl_c_and_off_loopback_the_trigger_needs_the_token() -> None:
    """Before: SIGTERM killed the demo with the default action (no shutdown, no message, exit -15), and
    --host 0.0.0.0 exposed POST /debug/profile to anyone."""
    import httpx

    proc, url = _start(
        "--serve",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--duration",
        "1",
        "--no-calibrate",
        env={"PERFSDK_PROFILE_TOKEN": "s3cret"},
    )
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if "still serving" in line:
                break
        url = url.replace("0.0.0.0", "127.0.0.1")
        assert httpx.post(f"{url}/debug/profile", timeout=30).status_code == 401
        assert httpx.delete(f"{url}/debug/profile", timeout=30).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{url}/debug/profile", headers=ok, timeout=30).status_code == 202
        assert httpx.get(f"{url}/debug/profile", timeout=30).json()["state"] in ("armed", "ready", "running")
        assert httpx.delete(f"{url}/debug/profile", headers=ok, timeout=30).status_code == 200
        proc.send_signal(signal.SIGTERM)  # what kill, docker stop and systemd send
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-3000:]
        assert "stopped (SIGTERM)" in err
        assert "Traceback" not in err
        assert "Where to look next" in out  # the report, printed before it kept serving
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_during_the_load_prints_the_report_so_far_and_exits_143() -> None:
    import httpx

    proc, url = _start("--duration", "120", "--no-calibrate")
    try:
        # wait until the server has finished a few requests of the load (its own /metrics says so)
        def finished() -> float:
            text = httpx.get(f"{url}/metrics", timeout=30).text
            found = re.search(r"^gen_ai_server_request_duration_seconds_count\{[^}]*\} (\S+)$", text, re.MULTILINE)
            return float(found.group(1)) if found else 0.0

        deadline = time.monotonic() + 120
        while finished() < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert finished() >= 3
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    positions = [out.find(h) for h in HEADINGS]
    assert all(p >= 0 for p in positions), f"missing headings in:\n{out}"
    assert "interrupted: SIGTERM during the load" in out
    server = re.search(r"requests: client -, server (\d+)", out)
    assert server is not None and int(server.group(1)) >= 3, out
    assert "load stopped" in err and "stopped (SIGTERM); exit code 143" in err
    assert "Traceback" not in err


def test_binding_off_loopback_without_a_token_exits_2() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PERFSDK_PROFILE_TOKEN"}
    proc = subprocess.run(
        [sys.executable, "-m", "perfsdk.cli", "demo", "--host", "0.0.0.0", "--duration", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--host" in proc.stderr and "token" in proc.stderr and "PERFSDK_PROFILE_TOKEN" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "building" not in proc.stderr  # refused before anything was built
