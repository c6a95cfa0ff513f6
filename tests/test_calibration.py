"""Calibration that knows its own noise (issue 19, item 1): rounds, median and spread; a noisy or implausible
result neither cached nor used; a cache that records its machine, expires, and is probed.

Measurements are real (torch on this CPU). Where a test needs a known outcome it passes ``clock=``, the
CPU timer :func:`perfsdk.hardware.calibrate` takes: ``TickingClock`` makes every timed operation last the
same time (a perfectly quiet machine), ``NoisyClock`` adds a random delay to each (a neighbour taking the
cores at random moments), and ``perfsdk.testing.FakeClock`` stands still (a timer that does not advance).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import torch

import perfsdk.hardware as hw
from perfsdk.cli import main
from perfsdk.errors import CalibrationError, ConfigError
from perfsdk.testing import FakeClock

ROOT = Path(__file__).resolve().parents[1]
BAD_FP32, BAD_BF16 = 1.4e9, 9.4e9  # the issue's cache


class TickingClock:
    """Every reading advances by *step_s*: each timed operation takes exactly that long."""

    def __init__(self, step_s: float = 0.002) -> None:
        self.now_ns = 10**9
        self.step_ns = round(step_s * 1e9)

    def __call__(self) -> int:
        self.now_ns += self.step_ns
        return self.now_ns


class NoisyClock:
    """The real clock plus a random delay of up to *max_delay_s* at every reading (seeded: repeatable)."""

    def __init__(self, max_delay_s: float = 0.1, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.offset_ns = 0
        self.max_delay_ns = max_delay_s * 1e9

    def __call__(self) -> int:
        self.offset_ns += int(self.rng.uniform(0, self.max_delay_ns))
        return time.perf_counter_ns() + self.offset_ns


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PERFSDK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PERFSDK_CALIBRATION_MAX_AGE_DAYS", raising=False)
    return tmp_path


def cache_file(cache_dir: Path) -> Path:
    path = hw.cache_path(hw.cpu_name())
    assert path.parent == cache_dir
    return path


def with_figures(cal: hw.Calibration, **figures: float) -> hw.Calibration:
    """*cal* with some figures replaced, their rounds all at the new value (a consistent record)."""
    spread = dict(cal.spread)
    flops = dict(cal.flops)
    copy = cal.copy_bandwidth
    for key, value in figures.items():
        spread[key] = hw.Spread.of([value] * spread[key].rounds)
        if key == "copy":
            copy = value
        else:
            flops[key] = value
    return dataclasses.replace(cal, copy_bandwidth=copy, flops=flops, spread=spread)


def write(path: Path, cal: hw.Calibration) -> None:
    data = cal.as_dict()
    data.pop("cache")
    data.pop("usable")
    path.write_text(json.dumps(data))


def old_format_cache(path: Path) -> None:
    """The issue's reproduction: a cache as perfsdk wrote it before schema 2, matching this machine."""
    path.write_text(
        json.dumps({
            "device": hw.cpu_name(), "copy_bandwidth": 10.9e9, "flops": {"fp32": BAD_FP32, "bf16": BAD_BF16},
            "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "torch_version": torch.__version__, "backend": "cpu", "quick": True,
            "details": {"threads": torch.get_num_threads(), "copy_bytes": 64 * 2**20, "repeats": 3},
        })
    )  # fmt: skip


def perfsdk_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("perfsdk")]


# ---------------------------------------------------------------- a real measurement


def test_a_real_cpu_calibration_reports_median_and_spread_of_every_figure(cache_dir: Path) -> None:
    cal = hw.calibrate("cpu", quick=True)
    assert cal.schema == hw.SCHEMA_VERSION
    assert set(cal.spread) == set(cal.figures) >= {"copy", "fp32"}
    for key, value in cal.figures.items():
        s = cal.spread[key]
        assert s.rounds in (5, 10)  # 5 quick rounds, 10 when the first attempt was not usable
        assert s.median == value
        assert s.low <= s.q1 <= s.median <= s.q3 <= s.high
        assert s.rel_iqr == pytest.approx((s.q3 - s.q1) / s.median)
    assert cal.machine["hostname"] and cal.machine["threads"] == torch.get_num_threads()
    assert cal.machine["memory_bytes"] > 0
    # usable and cached, or refused and not cached, with a reason naming a figure
    assert cal.usable == cache_file(cache_dir).exists()
    if cal.usable:
        assert cal.cache == f"written to {cache_file(cache_dir)}"
        assert json.loads(cache_file(cache_dir).read_text())["spread"]["copy"]["median"] == cal.copy_bandwidth
    else:
        assert all(p.startswith(("copy", "GEMM")) for p in cal.problems), cal.problems


# ---------------------------------------------------------------- noisy and implausible


def test_a_noisy_measurement_is_retried_then_neither_cached_nor_used(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="perfsdk"):
        cal = hw.calibrate("cpu", quick=True, clock=NoisyClock())
    assert not cal.usable
    noisy = [key for key, s in cal.spread.items() if s.rel_iqr > hw.MAX_SPREAD]
    assert noisy
    assert any("spread" in p and "MAX_SPREAD 25%" in p for p in cal.problems), cal.problems
    assert all(s.rounds == 10 for s in cal.spread.values())  # measured again with twice the 5 rounds
    assert any("measuring again with 10 rounds" in r.getMessage() for r in caplog.records)
    assert not list(cache_dir.iterdir())
    assert cal.cache.startswith("not written")
    with pytest.raises(CalibrationError, match="not usable"):
        cal.as_spec()


def test_a_noisy_calibration_falls_back_with_one_warning(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        spec, note = hw.calibrated_spec("cpu", quick=True, clock=NoisyClock())
    assert spec is None  # a CPU has no datasheet row: MBU/MFU off
    assert "MBU/MFU are off" in note and "not usable" in note
    (warning,) = perfsdk_warnings(caplog)
    assert "not used" in warning and "spread" in warning and "MBU/MFU are off" in warning
    assert not list(cache_dir.iterdir())


def test_a_timer_that_does_not_advance_gives_no_usable_rate(cache_dir: Path) -> None:
    cal = hw.calibrate("cpu", quick=True, clock=FakeClock())
    assert not cal.usable
    assert any(p.startswith("copy:") and "not a positive finite rate" in p for p in cal.problems), cal.problems
    assert not list(cache_dir.iterdir())


def gpu_calibration(copy: float, **flops: float) -> hw.Calibration:
    figures = {"copy": copy, **flops}
    return hw.Calibration(
        device="NVIDIA H100 80GB HBM3", copy_bandwidth=copy, flops=dict(flops), measured_at="2026-01-01T00:00:00+00:00",
        backend="cuda", spread={k: hw.Spread.of([v] * 10) for k, v in figures.items()},
        machine={"memory_bytes": 80 * 10**9},
    )  # fmt: skip


def test_far_below_or_above_the_datasheet_is_implausible() -> None:
    cal = gpu_calibration(0.2e12, bf16=760e12, fp32=80e12)
    row = cal.datasheet()
    assert row is not None and row.name == "h100-sxm"
    problems = cal.check(row)
    assert len(problems) == 2, problems
    assert problems[0].startswith(
        "copy: 200 GB/s is 6.0% of the datasheet 3.35 TB/s of h100-sxm, below DATASHEET_FLOOR"
    )
    assert problems[1].startswith("GEMM fp32: 80 TFLOP/s is 119% of the datasheet 67 TFLOP/s of h100-sxm, above")
    assert gpu_calibration(2.9e12, bf16=760e12, fp32=50e12).check(row) == ()  # a healthy H100
    assert cal.check(None) == ()  # no datasheet: nothing to compare with


def test_the_fallback_is_the_gpus_datasheet_row_or_nothing_on_a_cpu() -> None:
    cal = dataclasses.replace(gpu_calibration(0.2e12, bf16=760e12), problems=("copy: ...",))
    spec, what = cal.fallback()
    assert spec is hw.get("h100-sxm")
    assert "h100-sxm" in what
    with pytest.raises(CalibrationError, match="falls back to the datasheet row h100-sxm"):
        cal.as_spec()
    unknown = dataclasses.replace(cal, device="NVIDIA Mystery GPU")
    assert unknown.fallback()[0] is None
    assert "not in the datasheet table" in unknown.fallback()[1]
    cpu = dataclasses.replace(cal, device="AMD EPYC", backend="cpu")
    assert cpu.fallback() == (None, "no hardware spec, so MBU/MFU are off")


def test_a_record_whose_figure_is_not_the_median_of_its_rounds_is_refused() -> None:
    cal = gpu_calibration(2.9e12, bf16=760e12)
    edited = dataclasses.replace(cal, flops={"bf16": 1e12})
    assert edited.check() == ("GEMM bf16: 1 TFLOP/s is not the median of its rounds (760 TFLOP/s)",)


# ---------------------------------------------------------------- the cache


def test_the_cache_records_machine_schema_date_and_spread_and_serves_the_same_result(cache_dir: Path) -> None:
    clock = TickingClock()
    cal = hw.calibrate("cpu", quick=True, clock=clock)
    assert cal.usable, cal.problems
    data = json.loads(cache_file(cache_dir).read_text())
    assert data["schema"] == hw.SCHEMA_VERSION
    assert data["spread"]["fp32"]["rounds"] == 5 and len(data["spread"]["fp32"]["samples"]) == 5
    assert data["machine"]["hostname"] == cal.machine["hostname"]
    assert data["machine"]["threads"] == torch.get_num_threads()
    assert {"memory_bytes", "cuda_version", "driver", "cpu"} <= set(data["machine"])
    assert datetime.fromisoformat(data["measured_at"]) > datetime.now(timezone.utc) - timedelta(minutes=5)
    again = hw.calibrate("cpu", quick=True, clock=clock)
    assert again == cal
    assert again.cache == f"read from {cache_file(cache_dir)}"
    spec = again.as_spec()
    assert spec.memory_bandwidth == cal.copy_bandwidth
    assert spec.source.startswith(f"calibrated on {cal.device} at ")


def test_a_cache_for_another_torch_or_unreadable_is_measured_again(cache_dir: Path) -> None:
    clock = TickingClock()
    path = cache_file(cache_dir)
    first = hw.calibrate("cpu", quick=True, clock=clock)
    write(path, dataclasses.replace(with_figures(first, copy=1e9), torch_version="0.0.1"))
    again = hw.calibrate("cpu", quick=True, clock=clock)
    assert again.copy_bandwidth == first.copy_bandwidth
    assert again.cache == f"written to {path}"
    path.write_text("{not json")
    assert hw.calibrate("cpu", quick=True, clock=clock).cache == f"written to {path}"
    assert json.loads(path.read_text())["device"] == first.device  # rewritten


def test_a_full_calibration_serves_a_quick_request_not_the_reverse(cache_dir: Path) -> None:
    path = cache_file(cache_dir)
    quick = hw.calibrate("cpu", quick=True, clock=TickingClock())
    full = dataclasses.replace(with_figures(quick, copy=123e12, fp32=5e14, bf16=5e14), quick=False)
    write(path, full)
    assert hw.calibrate("cpu", quick=True).copy_bandwidth == 123e12
    spec = hw.resolve("calibrate")  # a full calibration, read from the cache
    assert spec is not None
    assert spec.memory_bandwidth == 123e12
    assert full.as_spec("mine").name == "mine"
    write(path, quick)
    assert hw.calibrate("cpu", rounds=3, clock=TickingClock()).cache == f"written to {path}"  # quick does not serve


def test_the_issues_old_format_cache_is_ignored_and_replaced(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = cache_file(cache_dir)
    old_format_cache(path)
    with caplog.at_level(logging.INFO, logger="perfsdk"):
        cal = hw.calibrate("cpu", quick=True)
    assert cal.flops["fp32"] != BAD_FP32
    assert any("older perfsdk" in r.getMessage() and "no schema" in r.getMessage() for r in caplog.records)
    if cal.usable:  # replaced by the new measurement
        assert json.loads(path.read_text())["flops"]["fp32"] == cal.flops["fp32"]
    else:  # or, on a machine too busy to measure, removed
        assert not path.exists()
    spec, _ = hw.calibrated_spec("cpu", quick=True)
    assert spec is None or spec.peak_flops("fp32") != BAD_FP32


def test_a_cache_a_probe_proves_wrong_is_discarded_and_measured_again(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = cache_file(cache_dir)
    good = hw.calibrate("cpu", quick=True, clock=TickingClock())
    write(path, with_figures(good, fp32=BAD_FP32))  # a current-format record, consistent, and far too low
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        cal = hw.calibrate("cpu", quick=True)  # the real clock: the probe runs a real 512³ GEMM
    assert cal.flops["fp32"] != BAD_FP32
    (warning,) = [w for w in perfsdk_warnings(caplog) if "is wrong" in w]
    assert "GEMM fp32: the cache says 1.4 GFLOP/s, a probe just measured" in warning
    assert not path.exists() or json.loads(path.read_text())["flops"]["fp32"] != BAD_FP32


def test_a_probe_that_does_not_beat_the_cache_keeps_it(cache_dir: Path) -> None:
    path = cache_file(cache_dir)
    good = hw.calibrate("cpu", quick=True, clock=TickingClock())
    high = with_figures(good, copy=5e12, fp32=5e14, bf16=5e14)  # beyond anything a CPU probe reaches
    write(path, high)
    cal = hw.calibrate("cpu", quick=True)
    assert cal.cache == f"read from {path}"
    assert cal.figures == high.figures


def test_an_expired_cache_is_measured_again(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = TickingClock()
    path = cache_file(cache_dir)
    cal = hw.calibrate("cpu", quick=True, clock=clock)
    eight_days_ago = (datetime.now(timezone.utc) - timedelta(days=8)).isoformat(timespec="seconds")
    write(path, dataclasses.replace(cal, measured_at=eight_days_ago))
    with caplog.at_level(logging.INFO, logger="perfsdk"):
        again = hw.calibrate("cpu", quick=True, clock=clock)
    assert again.measured_at != eight_days_ago
    assert again.cache == f"written to {path}"
    assert any("8.0 days ago" in r.getMessage() and "7 days" in r.getMessage() for r in caplog.records)
    # a longer limit, by argument or environment, keeps it
    write(path, dataclasses.replace(cal, measured_at=eight_days_ago))
    assert hw.calibrate("cpu", quick=True, clock=clock, max_age_days=10).measured_at == eight_days_ago
    os.environ["PERFSDK_CALIBRATION_MAX_AGE_DAYS"] = "30"
    try:
        assert hw.calibrate("cpu", quick=True, clock=clock).measured_at == eight_days_ago
    finally:
        del os.environ["PERFSDK_CALIBRATION_MAX_AGE_DAYS"]


def test_a_cache_from_another_host_or_thread_count_is_measured_again(cache_dir: Path) -> None:
    clock = TickingClock()
    path = cache_file(cache_dir)
    cal = hw.calibrate("cpu", quick=True, clock=clock)
    for change in ({"hostname": "another-host"}, {"threads": 64}, {"memory_bytes": 1}):
        write(path, dataclasses.replace(cal, machine={**cal.machine, **change}, measured_at="2026-01-01T00:00:00"))
        assert hw.calibrate("cpu", quick=True, clock=clock).cache == f"written to {path}", change


def test_a_hand_edited_noisy_record_in_the_cache_is_refused(cache_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = TickingClock()
    path = cache_file(cache_dir)
    cal = hw.calibrate("cpu", quick=True, clock=clock)
    noisy = dict(cal.spread)
    noisy["copy"] = hw.Spread.of([cal.copy_bandwidth * f for f in (0.3, 0.5, 1.0, 1.5, 2.0)])
    write(path, dataclasses.replace(cal, spread=noisy))
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        assert hw.calibrate("cpu", quick=True, clock=clock).cache == f"written to {path}"
    assert any("copy: spread" in w for w in perfsdk_warnings(caplog))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"rounds": 2}, "rounds"),
        ({"rounds": True}, "rounds"),
        ({"max_age_days": 0}, "max_age_days"),
        ({"max_age_days": float("nan")}, "max_age_days"),
        ({"clock": 5}, "clock"),
    ],
)
def test_calibrate_validates_its_new_arguments(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}"):
        hw.calibrate("cpu", cache=False, **kwargs)


def test_a_bad_max_age_in_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_CALIBRATION_MAX_AGE_DAYS", "a week")
    with pytest.raises(ConfigError, match=r"^PERFSDK_CALIBRATION_MAX_AGE_DAYS"):
        hw.calibrate("cpu", quick=True)


# ---------------------------------------------------------------- the CLI


def test_cli_prints_median_and_spread_of_each_figure(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["calibrate", "--device", "cpu", "--quick"])
    out = capsys.readouterr().out
    assert "median" in out and "spread" in out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    for row in ("copy (read+write)", "GEMM fp32"):
        assert "%" in lines[row] and " - " in lines[row], out  # the spread and the slowest to fastest round
    if rc == 0:
        assert "written to" in out and cache_file(cache_dir).exists()
    else:
        assert rc == 1 and "NOT USABLE" in out and not cache_file(cache_dir).exists()


def test_cli_json_carries_spread_machine_and_limits(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["calibrate", "--device", "cpu", "--json", "--no-cache", "--quick", "--rounds", "4"])
    out = json.loads(capsys.readouterr().out)
    assert rc == (0 if out["usable"] else 1)
    assert out["schema"] == hw.SCHEMA_VERSION
    assert out["spread"]["copy"]["median"] == out["copy_bandwidth"]
    assert out["spread"]["fp32"]["median"] == out["flops"]["fp32"]
    for s in out["spread"].values():
        assert s["rounds"] in (4, 8) and len(s["samples"]) == s["rounds"]
        assert s["min"] <= s["median"] <= s["max"] and s["rel_iqr"] >= 0
    assert out["machine"]["threads"] == torch.get_num_threads()
    assert out["limits"] == {"max_spread": 0.25, "datasheet_floor": 0.1, "datasheet_ceiling": 1.1,
                             "probe_margin": 1.5, "max_age_days": 7.0}  # fmt: skip
    assert out["datasheet"] is None
    assert not list(cache_dir.iterdir())


def test_cli_says_a_noisy_calibration_is_not_used_and_exits_1(
    cache_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the command as it is, on a machine whose timer sees a neighbour at random moments
    real = hw.calibrate
    monkeypatch.setattr(hw, "calibrate", functools.partial(real, clock=NoisyClock()))
    assert main(["calibrate", "--device", "cpu", "--quick"]) == 1
    captured = capsys.readouterr()
    assert "NOT USABLE" in captured.out and "above MAX_SPREAD 25%" in captured.out
    assert re.search(r"\ninstead +perfsdk uses no hardware spec, so MBU/MFU are off\n", captured.out), captured.out
    assert "neither cached nor used" in captured.err
    assert not list(cache_dir.iterdir())

    monkeypatch.setattr(hw, "calibrate", functools.partial(real, clock=FakeClock()))  # a timer that stands still
    assert main(["calibrate", "--device", "cpu", "--quick", "--json"]) == 1

    def no_constants(name: str) -> None:
        raise AssertionError(f"{name} in JSON output")

    out = json.loads(capsys.readouterr().out, parse_constant=no_constants)
    assert out["usable"] is False and out["problems"]
    assert out["copy_bandwidth"] is None  # an infinite rate, written as null
    assert out["fallback"] == {"spec": None, "description": "no hardware spec, so MBU/MFU are off"}


@pytest.mark.parametrize("args", [["--rounds", "2"], ["--max-age-days", "nan"], ["--max-age-days", "-1"]])
def test_cli_refuses_bad_rounds_and_ages(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--device", "cpu", "--quick", *args]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and args[0].lstrip("-").replace("-", "_") in err.replace("-", "_")


# ---------------------------------------------------------------- the Monitor and the demo


def test_the_demos_hardware_with_the_issues_bad_cache(cache_dir: Path) -> None:
    """``perfsdk demo`` on a CPU gets its hardware from ``calibrated_spec("cpu", quick=True)``."""
    old_format_cache(cache_file(cache_dir))
    spec, note = hw.calibrated_spec("cpu", quick=True)
    if spec is not None:
        assert note.startswith("calibrated:")
        assert spec.peak_flops("fp32") != BAD_FP32 and spec.peak_flops("bf16") != BAD_BF16
    else:
        assert "not usable" in note


def test_monitor_hardware_calibrate_uses_a_usable_cache(cache_dir: Path) -> None:
    import perfsdk

    good = hw.calibrate("cpu", quick=True, clock=TickingClock())
    full = dataclasses.replace(with_figures(good, copy=5e12, fp32=5e14, bf16=5e14), quick=False)
    write(cache_file(cache_dir), full)
    mon = perfsdk.Monitor(hardware="calibrate", prometheus=False, otel=False)
    try:
        assert mon.hardware is not None
        assert mon.hardware.memory_bandwidth == 5e12
        assert mon.hardware.source.startswith("calibrated on")
    finally:
        mon.close()


@pytest.mark.slow
def test_monitor_hardware_calibrate_with_the_issues_bad_cache(
    cache_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import perfsdk

    path = cache_file(cache_dir)
    old_format_cache(path)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "quick": False}))  # what Monitor(hardware="calibrate") would have read
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        mon = perfsdk.Monitor(model="llama-3-8b", hardware="calibrate", prometheus=False, otel=False)
    try:
        if mon.hardware is not None:
            assert mon.hardware.peak_flops("fp32") != BAD_FP32
            assert not perfsdk_warnings(caplog)
        else:  # too busy to measure: one warning, saying what perfsdk fell back to
            (warning,) = perfsdk_warnings(caplog)
            assert "not used" in warning and "MBU/MFU are off" in warning
    finally:
        mon.close()


@pytest.mark.slow
def test_perfsdk_demo_does_not_use_the_issues_bad_cache(cache_dir: Path) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("aiohttp")
    old_format_cache(cache_file(cache_dir))
    proc = subprocess.run(
        [sys.executable, "-m", "perfsdk.cli", "demo", "--duration", "2", "--request-rate", "4", "--output-len", "8",
         "--json"],
        cwd=ROOT, env={**os.environ, "PERFSDK_CACHE_DIR": str(cache_dir), "PYTHONUNBUFFERED": "1"},
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "older perfsdk" in proc.stderr  # the old cache was seen and ignored
    report = json.loads(proc.stdout)
    floors = report["floors"]
    assert floors.get("peak_flops") not in (BAD_FP32, BAD_BF16)
    if floors.get("peak_flops") is None:  # the measurement was not usable: no MFU at all
        assert "not usable" in floors["hardware"]
        assert report["steps"]["prefill"]["mfu_mean"] is None
    else:
        assert floors["hardware"].startswith("calibrated:")
