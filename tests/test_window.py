"""The profiler window: gate, triggers, one window at a time, disk guard, retention, failures.

End-to-end tests drive a real decode loop (``mon.decode(...)`` around small CPU ops, on its own
thread, the way a serving loop runs) and capture with the real torch.profiler; gate and
automatic-trigger tests feed ``observe_step`` directly with chosen step times and a fake clock.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import perfsdk
from perfsdk.errors import ConfigError
from perfsdk.metrics_server import MetricsServer
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.capture import prune
from perfsdk.profiling.window import ProfilerWindow

DATA = Path(__file__).parent / "data"
NAME = re.compile(r"^perfsdk-[A-Za-z0-9_.-]+-\d+-rank\d+-\d{8}T\d{6}\.\d{3}Z\.pt\.trace\.json\.gz$")


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class DecodeLoop:
    """A serving loop on its own thread: decode steps of a small matmul plus a short sleep.

    The sleep dominates the step time, so step times are steady enough for a loose CV gate
    even on a busy 2-core machine.
    """

    def __init__(self, mon: perfsdk.Monitor, batch: int = 2) -> None:
        import torch

        self.mon = mon
        self.batch = batch
        self.steps = 0
        self.errors: list[BaseException] = []
        self._x = torch.randn(32, 32)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="serving-loop", daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self.mon.decode(batch=self.batch, context_tokens=64 * self.batch):
                    y = self._x @ self._x
                    y.relu_()
                    time.sleep(0.002)
                self.steps += 1
        except BaseException as e:  # surfaced by the test
            self.errors.append(e)

    def __enter__(self) -> DecodeLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def wait_until(pred: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def mon(registry: CollectorRegistry) -> Iterator[perfsdk.Monitor]:
    m = perfsdk.Monitor(
        model=None, hardware=None, registry=registry, otel=False, nvtx=False, timing="host", poll_interval=0.002
    )
    yield m
    m.close()


def fast_window(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """Window settings for the end-to-end tests: a short gate, a loose CV, a temp directory."""
    cfg: dict[str, Any] = {
        "directory": tmp_path / "traces",
        "min_free_mb": 1,
        "steady_window": 8,
        "steady_cv": 0.5,
        "warmup_steps": 4,
        "steady_timeout_s": 60.0,
        "steps": 3,
    }
    cfg.update(extra)
    return cfg


# ---- the gate -------------------------------------------------------------------------------------


def test_disabled_window_costs_one_attribute_read(mon: perfsdk.Monitor) -> None:
    assert mon.profile_status() is None  # off unless enabled
    w = mon.enable_profiler(directory="unused", min_free_mb=0)
    assert w.wants_steps is False and w.state == "idle"
    with pytest.warns(DeprecationWarning, match="wants_steps"):
        assert w.hot is False  # the flag's old name, still read by code written for it
    with mon.decode(batch=1):
        pass
    assert mon.flush()
    assert w.wants_steps is False and w.state == "idle"


def test_gate_blocks_during_warmup_and_batch_change_then_opens_when_steady(
    mon: perfsdk.Monitor, tmp_path: Path
) -> None:
    clock = FakeClock()
    w = mon.enable_profiler(
        directory=tmp_path,
        min_free_mb=0,
        steady_window=4,
        steady_cv=0.05,
        warmup_steps=5,
        steady_timeout_s=100,
        clock=clock,
    )
    h = w.trigger()
    assert h.accepted
    for _ in range(5 + 3):  # 5 skipped + 3 of a 4-step window: not yet
        w.observe_step("decode", 0.010, 8, None)
        assert not w.wants_steps and w.state == "armed"
    w.observe_step("decode", 0.010, 4, None)  # a new batch size: skip 5 again, window restarts
    for _ in range(5 + 2):
        w.observe_step("decode", 0.010, 4, None)
    assert not w.wants_steps and w.state == "armed"
    w.observe_step("prefill", 0.5, 4, None)  # prefill steps are not what the gate watches
    w.observe_step("decode", 0.0101, 4, None)
    assert w.wants_steps and w.state == "ready"
    assert h.to_dict()["state"] == "ready"
    w.cancel()
    assert not w.wants_steps and w.state == "idle"


def test_gate_stays_closed_while_steps_vary(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    clock = FakeClock()
    w = mon.enable_profiler(
        directory=tmp_path,
        min_free_mb=0,
        steady_window=4,
        steady_cv=0.05,
        warmup_steps=0,
        steady_timeout_s=30,
        clock=clock,
    )
    w.trigger()
    for i in range(50):
        w.observe_step("decode", 0.010 if i % 2 else 0.020, 8, None)  # CV = 1/3
    assert w.state == "armed" and not w.wants_steps
    clock.t += 30  # the timeout: capture anyway, marked not steady
    w.observe_step("decode", 0.010, 8, None)
    assert w.state == "ready" and w.wants_steps and w.steady is False


def test_no_capture_during_warmup_on_a_real_loop(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(**fast_window(tmp_path, warmup_steps=10**6))
    h = w.trigger()
    with DecodeLoop(mon) as loop:
        assert wait_until(lambda: loop.steps >= 60)
        assert mon.flush()
        assert w.state == "armed" and not w.wants_steps
    assert not (tmp_path / "traces").exists() or not list((tmp_path / "traces").iterdir())
    w.close()
    assert h.wait(5) is None and h.to_dict()["state"] == "closed"


def test_timeout_captures_anyway_and_marks_not_steady(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    # a CV threshold no real timing meets, and a short timeout
    w = mon.enable_profiler(**fast_window(tmp_path, steady_cv=1e-12, steady_timeout_s=0.05, steps=2))
    with DecodeLoop(mon):
        h = w.trigger()
        result = h.wait(60)
    assert result is not None and result.error is None, result
    assert result.steady is False
    assert result.trace is not None and result.diagnosis_path is not None
    saved = json.loads(Path(result.diagnosis_path).read_text())
    assert saved["capture"]["steady"] is False
    assert "not steady" in (result.verdict or "")


# ---- API trigger, the trace, the diagnosis, retention ----------------------------------------------


def test_api_trigger_writes_a_trace_and_its_diagnosis(
    mon: perfsdk.Monitor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="perfsdk")
    traces = tmp_path / "traces"
    traces.mkdir()
    old = []
    for i in range(2):  # older captures: retention keeps the newest two in all
        p = traces / f"perfsdk-old-1-rank0-2020010{i}T000000000Z.pt.trace.json.gz"
        p.write_bytes(b"")
        Path(f"{p}.diagnosis.json").write_text("{}")
        os.utime(p, (1e9 + i, 1e9 + i))
        old.append(p)
    w = mon.enable_profiler(**fast_window(tmp_path, keep=2))
    with DecodeLoop(mon) as loop:
        h = mon.profile(steps=3)
        assert h.to_dict()["accepted"] is True
        result = h.wait(60)
        steps_at_end = loop.steps
        assert wait_until(lambda: loop.steps > steps_at_end)  # serving went on
    assert not loop.errors
    assert result is not None and result.error is None, result
    assert result.steady is True and result.trigger == "api" and result.batch == 2
    trace = Path(result.trace or "")
    assert trace.parent == traces and NAME.match(trace.name), trace.name
    assert f"-{os.getpid()}-rank0-" in trace.name
    with gzip.open(trace, "rt") as f:
        assert json.load(f)["traceEvents"]
    diag = analyze_trace(trace)
    assert diag.step_source == "perfsdk" and len(diag.steps) == 3  # exactly the active steps
    saved = json.loads(Path(f"{trace}.diagnosis.json").read_text())
    assert saved["step_count"] == 3 and saved["capture"]["steady"] is True
    assert saved["capture"]["trigger"] == "api"
    assert result.diagnosis is not None and result.diagnosis["step_count"] == 3
    assert any(r.getMessage().startswith("perfsdk profile: ") and str(trace) in r.getMessage() for r in caplog.records)
    # retention: the oldest capture and its diagnosis are gone, the next one stays
    assert not old[0].exists() and not Path(f"{old[0]}.diagnosis.json").exists()
    assert old[1].exists()
    assert not [p for p in traces.iterdir() if p.name.startswith(".")]  # no temp files left
    assert w.state == "idle" and not w.wants_steps and w.captures == 1
    assert h.to_dict()["state"] == "done" and h.to_dict()["result"]["trace"] == str(trace)


def test_prune_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(5):
        p = tmp_path / f"perfsdk-h-1-rank0-{i}.pt.trace.json.gz"
        p.write_bytes(b"x")
        os.utime(p, (1e9 + i, 1e9 + i))
    (tmp_path / "unrelated.json.gz").write_bytes(b"x")
    removed = prune(tmp_path, 2)
    assert len(removed) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "perfsdk-h-1-rank0-3.pt.trace.json.gz",
        "perfsdk-h-1-rank0-4.pt.trace.json.gz",
        "unrelated.json.gz",
    ]


def test_diagnosis_sets_the_gpu_busy_gauge(mon: perfsdk.Monitor, registry: CollectorRegistry, tmp_path: Path) -> None:
    trace = tmp_path / "h200_eager.pt.trace.json.gz"
    shutil.copy(DATA / "h200_eager.pt.trace.json.gz", trace)
    w = mon.enable_profiler(directory=tmp_path, min_free_mb=0)
    _, dpath, line = w.diagnose(str(trace), steady=True)
    busy = registry.get_sample_value("perfsdk_profile_gpu_busy_fraction", {"model": mon.model_name})
    assert busy is not None and busy == pytest.approx(analyze_trace(trace).gpu_busy_fraction)
    assert busy < 0.5
    assert line.startswith("perfsdk profile: launch_bound (") and str(trace) in line
    assert json.loads(Path(dpath).read_text())["findings"][0]["kind"] == "launch_bound"


def test_profile_gauges_appear_at_the_first_capture_not_before(
    mon: perfsdk.Monitor, registry: CollectorRegistry, tmp_path: Path
) -> None:
    labels = {"model": mon.model_name}
    # before any capture nothing is exported: a 0 would read as an idle GPU, or as the rank that waits least
    assert registry.get_sample_value("perfsdk_profile_gpu_busy_fraction", labels) is None
    assert registry.get_sample_value("perfsdk_profile_communication_fraction", labels) is None
    trace = tmp_path / "h200_eager.pt.trace.json.gz"
    shutil.copy(DATA / "h200_eager.pt.trace.json.gz", trace)
    mon.enable_profiler(directory=tmp_path, min_free_mb=0).diagnose(str(trace), steady=True)
    comm = registry.get_sample_value("perfsdk_profile_communication_fraction", labels)
    assert comm == analyze_trace(trace).communication_share == 0.0  # one GPU: no collectives in it
    assert registry.get_sample_value("perfsdk_profile_gpu_busy_fraction", labels) is not None


def test_steady_false_starts_the_capture_at_the_next_step(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    """No gate: ready at the trigger, so a loop that triggers between steps captures the steps after it
    (every rank of a tensor-parallel group that triggers at the same step captures the same steps)."""
    import torch

    w = mon.enable_profiler(**fast_window(tmp_path, warmup=1, steady_timeout_s=3600.0))
    with pytest.raises(ConfigError, match="steady"):
        mon.profile(steady="no")  # type: ignore[arg-type]
    x = torch.ones(4)
    h = None
    for i in range(8):  # far fewer steps than the gate's warm-up and window: a gated capture never starts
        if i == 2:
            h = mon.profile(steps=3, steady=False)
            assert h.to_dict()["state"] == "ready" and w.wants_steps
        with mon.decode(batch=1, context_tokens=16):
            for _ in range(i + 1):  # step i leaves i + 1 mul_ ops in a trace: the steps can be told apart
                x.mul_(1.0)
    assert h is not None
    result = h.wait(60)
    assert result is not None and result.error is None, result
    assert result.steady is False  # what the gate read at the trigger: not steady yet
    diag = analyze_trace(result.trace or "")
    assert diag.trace is not None and len(diag.steps) == 3
    # step 2 (the first after the trigger) is the profiler's warm-up; steps 3, 4, 5 are recorded
    muls = [
        sum(
            1
            for e in diag.trace.cpu_ops
            if e.name == "aten::mul_" and s.host_start_us <= e.ts < s.host_start_us + s.host_dur_us
        )
        for s in diag.steps
    ]
    assert muls == [4, 5, 6]


# ---- one window at a time, disk guard, nsys without CUDA -------------------------------------------


def test_one_window_at_a_time(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(directory=tmp_path, min_free_mb=0)
    first = mon.profile()
    second = mon.profile(steps=2)
    assert first.to_dict()["accepted"] is True
    info = second.to_dict()
    assert info["accepted"] is False and "one window at a time" in info["reason"]
    assert second.wait(0) is None
    w.cancel()
    assert mon.profile().to_dict()["accepted"] is True  # free again


def test_disk_guard_refuses_with_a_reason(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(directory=tmp_path, min_free_mb=1e12)
    info = mon.profile().to_dict()
    assert info["accepted"] is False
    assert info["reason"].startswith("disk: ") and "min_free_mb" in info["reason"]
    assert w.state == "idle"


def test_nsys_without_cuda_is_refused(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    mon.enable_profiler(directory=tmp_path, min_free_mb=0)
    info = mon.profile(mode="nsys").to_dict()
    assert info["accepted"] is False and info["reason"].startswith("nsys: ")


# ---- HTTP trigger -------------------------------------------------------------------------------------


def post(url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, method="POST", data=b"")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_http_trigger_on_loopback_without_token(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(**fast_window(tmp_path))
    srv = mon.serve_metrics(port=0)
    with DecodeLoop(mon):
        code, body = post(f"{srv.url}/profile?steps=2&mode=torch")
        assert code == 202 and body["accepted"] is True and body["trigger"] == "http" and body["steps"] == 2
        code2, body2 = post(f"{srv.url}/profile")
        assert code2 == 409 and body2["accepted"] is False and "one window at a time" in body2["reason"]
        assert post(f"{srv.url}/profile?steps=0")[0] == 400  # ConfigError names the field
        assert post(f"{srv.url}/profile?mode=perf")[0] == 400
        assert wait_until(lambda: w.last_result is not None, 60)
    last = w.last_result
    assert last.trigger == "http" and last.error is None and Path(last.trace).exists()


def test_http_trigger_with_token(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(directory=tmp_path, min_free_mb=0)
    srv = MetricsServer(mon, port=0, addr="127.0.0.1", token="s3cret")
    try:
        assert post(f"{srv.url}/profile")[0] == 401
        assert post(f"{srv.url}/profile", token="wrong")[0] == 401
        assert w.state == "idle"
        code, body = post(f"{srv.url}/profile?steps=2", token="s3cret")
        assert code == 202 and body["accepted"] is True and w.state == "armed"
    finally:
        srv.close()


def http(method: str, url: str, token: str | None = None) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(url, method=method, data=b"" if method != "GET" else None)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_get_shows_the_window_and_delete_cancels_the_capture(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    """Issue 20, item 15: a second POST used to get a bare 409 with no way to see or cancel the running capture,
    and the result was only in the log. Now GET /profile shows both and DELETE /profile cancels."""
    srv = MetricsServer(mon, port=0, token="s3cret")
    try:
        code, body = http("GET", f"{srv.url}/profile")
        assert code == 200 and body["enabled"] is False and body["state"] == "idle" and body["last"] is None
        # no decode steps come: the capture stays armed
        w = mon.enable_profiler(**fast_window(tmp_path))
        code, first = post(f"{srv.url}/profile?steps=2", token="s3cret")
        assert code == 202
        code, second = post(f"{srv.url}/profile", token="s3cret")
        assert code == 409 and "GET /profile" in second["see"] and "DELETE /profile" in second["see"]
        code, body = http("GET", f"{srv.url}/profile")  # open, like /metrics
        assert code == 200 and body["enabled"] is True and body["state"] == "armed"
        assert body["current"]["id"] == first["id"] and body["current"]["trigger"] == "http"
        assert body["current"]["steps"] == 2
        assert http("DELETE", f"{srv.url}/profile")[0] == 401  # a cancel needs the token, like a trigger
        assert http("DELETE", f"{srv.url}/profile", token="wrong")[0] == 401
        assert w.state == "armed"
        code, body = http("DELETE", f"{srv.url}/profile", token="s3cret")
        assert code == 200 and body["cancelled"] is True and body["capture"]["id"] == first["id"]
        assert body["state"] == "idle" and body["current"] is None
        code, body = http("DELETE", f"{srv.url}/profile", token="s3cret")
        assert code == 409 and body["cancelled"] is False and "no capture" in body["reason"]
        # and a capture that runs: its verdict, trace and findings are in GET afterwards, not only in the log
        with DecodeLoop(mon):
            code, third = post(f"{srv.url}/profile?steps=2", token="s3cret")
            assert code == 202
            assert wait_until(lambda: w.last_result is not None, 60)
        code, body = http("GET", f"{srv.url}/profile")
        last = body["last"]
        assert code == 200 and body["state"] == "idle" and body["captures"] == 1
        assert last["id"] == third["id"] and last["error"] is None
        assert Path(last["trace"]).exists() and last["verdict"].startswith("perfsdk profile:")
        assert isinstance(last["findings"], list) and all("kind" in f for f in last["findings"])
        assert "diagnosis" not in last
    finally:
        srv.close()


def test_delete_stops_a_running_capture_at_the_next_step(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    w = mon.enable_profiler(**fast_window(tmp_path, steps=1000, max_capture_s=600))
    srv = mon.serve_metrics(port=0)
    with DecodeLoop(mon):
        handle = mon.profile(steps=1000, steady=False)
        assert wait_until(lambda: w.state == "running", 30)
        code, body = http("DELETE", f"{srv.url}/profile")
        assert code == 200 and body["cancelled"] is True and body["capture"]["state"] == "running"
        assert "next step" in body["note"]
        assert handle.wait(30) is not None
    assert handle.result is not None and handle.result.error == "cancelled over HTTP"
    assert w.state == "idle" and http("GET", f"{srv.url}/profile")[1]["current"] is None


def test_binding_beyond_loopback_needs_a_token(mon: perfsdk.Monitor) -> None:
    with pytest.raises(ConfigError, match="addr"):
        mon.serve_metrics(port=0, addr="0.0.0.0")


# ---- SIGUSR2 ------------------------------------------------------------------------------------------


def test_sigusr2_triggers_and_close_restores_the_old_handler(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    seen: list[int] = []

    def previous(signum: int, frame: Any) -> None:
        seen.append(signum)

    old = signal.signal(signal.SIGUSR2, previous)
    try:
        w = mon.enable_profiler(directory=tmp_path, min_free_mb=0, signal=True)
        assert signal.getsignal(signal.SIGUSR2) is not previous
        os.kill(os.getpid(), signal.SIGUSR2)
        assert wait_until(lambda: w.state == "armed", 10)
        assert w.status()["current"]["trigger"] == "signal"
        w.close()
        assert signal.getsignal(signal.SIGUSR2) is previous
        os.kill(os.getpid(), signal.SIGUSR2)
        assert wait_until(lambda: seen == [signal.SIGUSR2], 10)
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_enabling_twice_then_closing_puts_the_process_handler_back(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    # before: the second window remembered the first one's handler and put it back on close, so a
    # perfsdk handler stayed installed for the life of the process
    def previous(signum: int, frame: Any) -> None:
        pass

    old = signal.signal(signal.SIGUSR2, previous)
    try:
        mon.enable_profiler(directory=tmp_path, min_free_mb=0, signal=True)
        second = mon.enable_profiler(directory=tmp_path, min_free_mb=0, signal=True)  # closes the first
        assert signal.getsignal(signal.SIGUSR2) is not previous
        second.close()
        assert signal.getsignal(signal.SIGUSR2) is previous
    finally:
        signal.signal(signal.SIGUSR2, old)


_NO_OPT_IN = """
import os, signal, sys, time
import perfsdk
assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL
mon = perfsdk.Monitor(otel=False, nvtx=False)
mon.serve_metrics(port=0)
mon.enable_profiler(directory=sys.argv[1], min_free_mb=0)   # every trigger but the signal
mon.profile()
with mon.decode(batch=1):
    pass
print("default" if signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL else "installed", flush=True)
os.kill(os.getpid(), signal.SIGUSR2)
time.sleep(10)
print("survived", flush=True)
"""


def test_a_process_that_did_not_opt_in_keeps_the_default_sigusr2(tmp_path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _NO_OPT_IN, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )  # it is meant to die of the signal
    assert proc.stdout.split() == ["default"], proc.stderr
    assert proc.returncode == -signal.SIGUSR2  # the default action, as without perfsdk


def test_signal_handler_only_from_the_main_thread(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    errors: list[BaseException] = []

    def build() -> None:
        try:
            ProfilerWindow(mon, directory=tmp_path, signal=True)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=build)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], ConfigError) and "signal" in str(errors[0])


# ---- automatic trigger ----------------------------------------------------------------------------------


def feed_mbu(w: ProfilerWindow, mbu: float, windows: int, steps_per_window: int = 2) -> None:
    for _ in range(windows * steps_per_window):
        w.observe_step("decode", 0.01, 8, mbu)


def test_automatic_trigger_with_cooldown_and_hourly_cap(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    clock = FakeClock()
    w = mon.enable_profiler(
        directory=tmp_path,
        min_free_mb=0,
        auto=True,
        auto_window_steps=2,
        auto_baseline_windows=3,
        auto_windows=2,
        auto_drop=0.2,
        cooldown_s=100,
        max_per_hour=2,
        steady_window=1000,
        clock=clock,
    )
    feed_mbu(w, 0.50, 3)  # baseline learnt
    feed_mbu(w, 0.45, 4)  # 10% lower: within tolerance
    assert w.state == "idle"
    feed_mbu(w, 0.30, 1)  # one low window is not enough
    assert w.state == "idle"
    feed_mbu(w, 0.30, 1)
    assert w.state == "armed" and w.status()["current"]["trigger"] == "auto"
    assert w.auto_fired == 1
    w.cancel()

    feed_mbu(w, 0.50, 3)  # the baseline is relearnt after a firing
    feed_mbu(w, 0.30, 2)  # a new drop inside the cooldown: suppressed
    assert w.state == "idle" and w.auto_suppressed == 1 and w.auto_fired == 1

    clock.t += 101
    feed_mbu(w, 0.50, 3)
    feed_mbu(w, 0.30, 2)
    assert w.state == "armed" and w.auto_fired == 2
    w.cancel()

    clock.t += 101  # past the cooldown, but two captures already in this hour
    feed_mbu(w, 0.50, 3)
    feed_mbu(w, 0.30, 2)
    assert w.state == "idle" and w.auto_suppressed == 2

    clock.t += 3600
    feed_mbu(w, 0.50, 3)
    feed_mbu(w, 0.30, 2)
    assert w.state == "armed" and w.auto_fired == 3


def test_a_sustained_drop_is_not_its_own_baseline(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    clock = FakeClock()
    w = mon.enable_profiler(
        directory=tmp_path,
        min_free_mb=0,
        auto=True,
        auto_window_steps=2,
        auto_baseline_windows=2,
        auto_windows=4,
        auto_drop=0.2,
        steady_window=1000,
        clock=clock,
    )
    feed_mbu(w, 0.50, 2)
    feed_mbu(w, 0.30, 3)
    assert w.state == "idle" and w.status()["mbu_baseline"] == pytest.approx(0.5)
    feed_mbu(w, 0.30, 1)
    assert w.state == "armed"


# ---- a failing profiler never stops serving -------------------------------------------------------------


def test_failing_profiler_leaves_the_loop_serving(
    mon: perfsdk.Monitor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch.profiler

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("profiler exploded")

    w = mon.enable_profiler(**fast_window(tmp_path))
    errors_before = mon.stats()["internal_errors"]
    with DecodeLoop(mon) as loop:
        monkeypatch.setattr(torch.profiler, "profile", broken)
        h = w.trigger()
        result = h.wait(60)
        assert result is not None and result.error is not None and "profiler exploded" in result.error
        assert w.state == "idle" and not w.wants_steps and w.failures == 1
        steps = loop.steps
        assert wait_until(lambda: loop.steps >= steps + 20)  # still serving
        monkeypatch.undo()
        again = w.trigger().wait(60)  # and the window works again
    assert not loop.errors
    assert mon.stats()["internal_errors"] == errors_before + 1
    assert again is not None and again.error is None and again.trace is not None
    assert mon.flush() and mon.stats()["decode"]["steps"] >= loop.steps - 1


# ---- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("mode", "perf"),
        ("steps", 0),
        ("steps", 2.5),
        ("wait", -1),
        ("keep", 0),
        ("min_free_mb", -1),
        ("steady_window", 1),
        ("steady_cv", 0),
        ("warmup_steps", -1),
        ("steady_timeout_s", 0),
        ("auto", "yes"),
        ("auto_drop", 1.0),
        ("auto_windows", 0),
        ("cooldown_s", -1),
        ("max_per_hour", 0),
        ("clock", 3),
        ("directory", ""),
    ],
)
def test_bad_config_names_the_field(mon: perfsdk.Monitor, field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        ProfilerWindow(mon, **{field: value})
    assert mon.profile_status() is None


def test_enable_profiler_again_replaces_the_window_and_stats_report_it(tmp_path: Path) -> None:
    from perfsdk.testing import monitor_harness

    with monitor_harness() as h:
        first = h.monitor.enable_profiler(directory=str(tmp_path), steps=2)
        assert h.monitor.enable_profiler() is first  # no settings: the same window
        second = h.monitor.enable_profiler(directory=str(tmp_path), steps=3)
        assert second is not first
        assert h.monitor.enable_profiler() is second
        assert "profiler" in h.monitor.stats()
        with pytest.raises(ConfigError):
            h.monitor.enable_profiler(steps=0)
        assert h.monitor.enable_profiler() is second  # a bad setting leaves the working window in place


# ---- against the unprofiled step, and the kernels against the peak -----------------------------------------


def fixture_model() -> perfsdk.ModelSpec:
    """benchmarks/gpu_traces.py's model (the H200 fixtures'): 2 layers, hidden 2048, 16 heads, 4 KV heads, bf16."""
    hidden, ffn, vocab = 2048, 5632, 32000
    per_layer = 24 * 128 * hidden + hidden * hidden + 2 * ffn * hidden + hidden * ffn + 2 * hidden
    params = 2 * per_layer + vocab * hidden + 2 * hidden
    return perfsdk.ModelSpec(params=params, weight_bytes=2.0 * params, layers=2, heads=16, kv_heads=4, head_dim=128)


def test_the_window_diagnoses_against_the_unprofiled_steps_the_monitor_timed(tmp_path: Path) -> None:
    """The vLLM case: steps of 2.09 ms unprofiled, a profiled trace of slower steps. The real Monitor's own
    decode steps (through its core, collector and the window's feed) are the reference; the diagnosis of the
    real H200 trace reports the inflation and its shares are of the 2.09 ms step."""
    from perfsdk.hardware import get

    h200 = get("h200")
    m = perfsdk.Monitor(
        model=fixture_model(),
        hardware=h200,
        registry=CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing="host",
        poll_interval=0.002,
    )
    try:
        w = m.enable_profiler(directory=tmp_path, min_free_mb=0)
        for _ in range(40):
            m.record_step("decode", 0.00209, batch=1, context_tokens=512)
            m.record_step("decode", 0.00400, batch=4, context_tokens=4 * 512)
        assert m.flush()
        trace = tmp_path / "h200_eager.pt.trace.json.gz"
        shutil.copy(DATA / "h200_eager.pt.trace.json.gz", trace)
        d, dpath, line = w.diagnose(str(trace), capture={"batch": 1})
    finally:
        m.close()
    measured = analyze_trace(trace)
    busy_us = sum(s.gpu_busy_us for s in measured.steps) / len(measured.steps)
    window_us = sum(s.gpu_window_us for s in measured.steps) / len(measured.steps)
    obs = d["observer"]["decode"]
    assert obs["unprofiled_step_us"] == pytest.approx(2090.0)
    assert obs["reference"]["batch"] == 1 and obs["reference"]["steps"] == 40
    assert obs["inflation"] == pytest.approx(window_us / 2090.0, abs=1e-3)
    assert d["gpu_busy_fraction"] == pytest.approx(busy_us / 2090.0, abs=1e-4)  # not busy_us / window_us
    assert d["basis"] == "the unprofiled step"
    assert d["findings"][0]["kind"] == "launch_bound"
    assert d["findings"][0]["share"] == pytest.approx(1 - busy_us / 2090.0, abs=0.01)
    assert f"of the unprofiled 2.09 ms step, GPU busy {busy_us / 2090.0:.0%}" in line
    assert f"profiling inflated steps {window_us / 2090.0:.1f}x" in line
    # the bytes a step must read come back from the Monitor's own MBU of those steps: the fixture's model at
    # batch 1 over a 512-token cache, checked against the H200's bandwidth
    kc = d["kernel_check"]
    assert kc["bytes"] == pytest.approx(fixture_model().weight_bytes + fixture_model().kv_bytes_per_token * 512)
    assert kc["peak_bandwidth"] == h200.memory_bandwidth and kc["bound"] == "memory"
    assert kc["utilisation"] < 0.6 and "batch 1, context 512" in kc["source"]
    saved = json.loads(Path(dpath).read_text())
    assert saved["observer"]["decode"]["inflation"] == obs["inflation"]
    assert "profiling inflated decode steps" in saved["report"]


def test_the_window_graph_trace_with_a_model_is_slow_kernels_not_healthy(tmp_path: Path) -> None:
    from perfsdk.hardware import get

    m = perfsdk.Monitor(
        model=fixture_model(),
        hardware=get("h200"),
        registry=CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing="host",
        poll_interval=0.002,
    )
    try:
        w = m.enable_profiler(directory=tmp_path, min_free_mb=0)
        for _ in range(20):
            m.record_step("decode", 0.00025, batch=1, context_tokens=512)
        assert m.flush()
        trace = tmp_path / "h200_cuda_graph.pt.trace.json.gz"
        shutil.copy(DATA / "h200_cuda_graph.pt.trace.json.gz", trace)
        d, _, line = w.diagnose(str(trace), capture={"batch": 1})
    finally:
        m.close()
    assert d["findings"][0]["kind"] == "slow_kernels"
    assert "memory_bound" not in [f["kind"] for f in d["findings"]]
    assert line.startswith("perfsdk profile: slow_kernels (")
    assert "ncu --set full -k regex:'nvjet_sm90" in d["findings"][0]["suggestion"]


def test_a_real_capture_reports_its_inflation_against_the_loops_unprofiled_steps(
    mon: perfsdk.Monitor, tmp_path: Path
) -> None:
    w = mon.enable_profiler(**fast_window(tmp_path))
    with DecodeLoop(mon, batch=2):
        result = w.trigger().wait(60)
    assert result is not None and result.error is None, result
    d = result.diagnosis or {}
    obs = d["observer"]["decode"]
    ref = obs["reference"]
    assert ref["batch"] == 2 and ref["steps"] >= 8 and "median of" in ref["source"]
    assert ref["step_us"] >= 2000.0  # every step of the loop sleeps 2 ms
    assert obs["inflation"] == pytest.approx(obs["profiled_step_us"] / obs["unprofiled_step_us"], abs=1e-3)
    assert "profiling inflated steps" in (result.verdict or "")
    assert "shares are of the unprofiled step" in d["report"]
    saved = json.loads(Path(result.diagnosis_path or "").read_text())
    assert saved["capture"]["unprofiled"]["batch"] == 2  # taken when the window opened


def test_without_an_unprofiled_reference_the_verdict_says_so(mon: perfsdk.Monitor, tmp_path: Path) -> None:
    import torch

    w = mon.enable_profiler(**fast_window(tmp_path))
    x = torch.ones(4)
    h = mon.profile(steps=2, steady=False)  # before any step: nothing to compare with
    for _ in range(5):
        with mon.decode(batch=1):
            x.mul_(1.0)
    result = h.wait(60)
    assert result is not None and result.error is None, result
    d = result.diagnosis or {}
    assert d["observer"] is None
    assert "no unprofiled decode step seen yet" in d["unprofiled_note"]
    assert "no unprofiled reference: no unprofiled decode step seen yet" in (result.verdict or "")
    assert "no unprofiled step time to compare with" in d["report"]
    assert w.state == "idle"


def decode_and_prefill_trace() -> list[dict[str, Any]]:
    """Three decode steps replaying a CUDA graph (50 µs of kernels, then 50 µs waiting for the host) and,
    between them, one eager prefill (20 small kernels, each launched after the GPU ran dry)."""
    host, gpu = {"pid": 1, "tid": 1}, {"pid": 0, "tid": 7}
    events: list[dict[str, Any]] = []
    corr = 0

    def launch(name: str, at: float, kernel: str, start: float, dur: float) -> None:
        nonlocal corr
        corr += 1
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": name,
                "ts": at,
                "dur": 1.0,
                **host,
                "args": {"correlation": corr},
            }
        )
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "ts": start,
                "dur": dur,
                **gpu,
                "args": {"correlation": corr, "stream": 7},
            }
        )

    t = 0.0
    for i in range(3):
        events.append({"ph": "X", "cat": "user_annotation", "name": "perfsdk.decode", "ts": t, "dur": 5.0, **host})
        launch("cudaGraphLaunch", t + 1.0, "void gemv_kernel", t + 3.0, 50.0)
        t += 100.0
        if i == 0:
            events.append(
                {"ph": "X", "cat": "user_annotation", "name": "perfsdk.prefill", "ts": t, "dur": 2000.0, **host}
            )
            for k in range(20):
                launch("cudaLaunchKernel", t + 100.0 * k + 80.0, "void elementwise_kernel", t + 100.0 * k + 82.0, 5.0)
            t += 2000.0
    return events


def test_the_window_verdict_is_about_its_decode_steps_not_a_prefill_it_caught(
    mon: perfsdk.Monitor, tmp_path: Path
) -> None:
    from perfsdk.demo.ladder import short_advice
    from perfsdk.demo.ladder_rows import RungRow
    from perfsdk.demo.ladder_rung import profile_of
    from perfsdk.profiling.window import CaptureResult

    trace = tmp_path / "mixed.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": decode_and_prefill_trace()}, f)
    w = mon.enable_profiler(directory=tmp_path, min_free_mb=0)
    d, _, line = w.diagnose(str(trace), capture={"batch": 1})
    assert d["step_count"] == 3 and d["phase"] == "decode"
    assert [s["name"] for s in d["other_steps"]] == ["perfsdk.prefill"]
    assert d["findings"][0]["kind"] == "launch_bound"
    assert d["summary"]["graph_launches_per_step"] == 1  # the decode steps replay a graph ...
    assert "already replays a CUDA graph" in d["findings"][0]["suggestion"]  # ... so graphs are not the advice
    assert "already replays a CUDA graph" in line or "move the host work" in line
    # the ladder's table takes the same verdict, and its "next" follows it
    row = RungRow(
        rung="graph",
        profile=profile_of(
            CaptureResult(id=1, mode="torch", trigger="ladder", steady=True, steps=3, trace=str(trace), diagnosis=d)
        ),
    )
    assert row.profile is not None and row.profile.kind == "launch_bound"
    assert short_advice(row) == "overlap host work, batch more"
