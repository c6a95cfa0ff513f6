"""A Monitor's life: construction that fails, ``os.fork()`` (pre-fork servers), and calls after ``close()``.

Every test runs on both hot paths (``each_hot_path``). Forks are real ``os.fork()`` calls: the child runs a
body, sends what it saw back through a pipe as JSON and leaves with ``os._exit`` (its status is the
parent's to check); a child that hangs is killed and the test fails.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

import perfsdk
from perfsdk import lifecycle
from perfsdk.errors import ConfigError, MonitorClosedError
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.sinks.prometheus import update_lock
from perfsdk.testing import FakeClock, ScriptedGpu, scripted_monitor

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=1e15, flops={"bf16": 1e18})  # no step here is above peak
STEP = "perfsdk_step_seconds"
TTFT = "gen_ai_server_time_to_first_token_seconds"

pytestmark = [
    pytest.mark.usefixtures("each_hot_path"),
    pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork() is POSIX"),
    pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning"),  # 3.12+
]


def in_child(body: Callable[[], dict[str, Any]], hang_limit: float = 120.0) -> tuple[int, dict[str, Any]]:
    """Run *body* in an ``os.fork()`` child: ``(exit status, what it returned)``. The limit only catches a hang."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            out = json.dumps(body()).encode()
            code = 0
        except BaseException:
            out = json.dumps({"error": traceback.format_exc()}).encode()
        finally:
            try:
                os.write(w, out)
            finally:
                os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + hang_limit
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
        elif time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        else:
            time.sleep(0.02)
    while chunk := os.read(r, 1 << 16):
        chunks.append(chunk)
    os.close(r)
    payload = json.loads(b"".join(chunks) or b"{}")
    assert "error" not in payload, payload.get("error")
    return status, payload


def scrape(url: str, name: str, labels: str) -> float | None:
    body = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    for line in body.splitlines():
        if line.startswith(f"{name}{{{labels}") and "}" in line:
            return float(line.rsplit(" ", 1)[1])
    return None


class LogRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname} {record.getMessage()}")


# ---- item 1: fork --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("timing", ["host", "cuda-events"])
def test_a_forked_child_counts_exactly_serves_its_own_metrics_and_closes(timing: str) -> None:
    """gunicorn --preload: the Monitor (and its server) made before the fork, steps in the child."""
    clock = FakeClock()
    reg = CollectorRegistry()
    gpu = ScriptedGpu(capacity=256) if timing == "cuda-events" else None
    mon = scripted_monitor(gpu, model=MODEL, hardware=HW, registry=reg, otel=False, nvtx=False, clock=clock)
    parent_srv = mon.serve_metrics(port=0)
    for _ in range(10):
        with mon.decode(batch=2, context_tokens=100):
            clock.advance(0.001)
            if gpu is not None:
                gpu.now_ms += 1.0
    assert mon.flush(30)
    assert mon.timing == ("cuda" if gpu is not None else "host")

    logs = LogRecords()  # the child logs from the fork hook on, before its body runs

    def child() -> dict[str, Any]:
        for _ in range(1000):
            with mon.decode(batch=2, context_tokens=100):
                clock.advance(0.002)
        with mon.request(prompt_tokens=3) as req:
            clock.advance(0.05)
            req.tokens(1)
        flushed = mon.flush(30)
        stats = mon.stats()
        own = mon.serve_metrics(port=0)  # the parent's server is not this process's
        out = {
            "flushed": flushed,
            "timing": mon.timing,
            "steps": stats["decode"]["steps"],
            "step_ms": stats["decode"]["step_ms_mean"],
            "dropped": stats["dropped_records"],
            "errors": stats["internal_errors"],
            "own_port": own.port,
            "own_count": scrape(own.url, f"{STEP}_count", 'model="llama-3-8b",phase="decode"'),
            "own_sum": scrape(own.url, f"{STEP}_sum", 'model="llama-3-8b",phase="decode"'),
            "own_ttft": scrape(own.url, f"{TTFT}_count", 'model="llama-3-8b"'),
            "parent_count": scrape(parent_srv.url, f"{STEP}_count", 'model="llama-3-8b",phase="decode"'),
        }
        mon.close(timeout=3)
        out["closed_ports"] = [port_is_free(parent_srv.port), port_is_free(own.port)]
        out["logs"] = logs.messages
        return out

    logging.getLogger("perfsdk").addHandler(logs)
    try:
        status, got = in_child(child)
    finally:
        logging.getLogger("perfsdk").removeHandler(logs)
    try:
        assert status == 0
        assert got["flushed"] is True
        assert got["steps"] == 1000  # the child's own steps, exactly; the parent's 10 are the parent's
        assert got["step_ms"] == pytest.approx(2.0)  # host-timed in the child (CUDA is the parent's)
        assert got["timing"] == "host"
        assert got["dropped"] == 0 and got["errors"] == 0
        assert got["own_port"] != parent_srv.port
        # without PROMETHEUS_MULTIPROC_DIR the child's registry began as a copy of the parent's (docs/metrics.md)
        assert got["own_count"] == 1010
        assert got["own_sum"] == pytest.approx(10 * 0.001 + 1000 * 0.002)
        assert got["own_ttft"] == 1
        assert got["parent_count"] == 10  # the parent's port is still the parent's server
        # the child closed its copy of the parent's socket (the port is still bound: by the parent) and its own
        assert got["closed_ports"] == [False, True]
        if gpu is not None:
            assert any("host clock" in m and m.startswith("WARNING") for m in got["logs"])
        assert any(parent_srv.url in m for m in got["logs"])  # the child is told where its metrics are not
        # the parent goes on as before: its server up, its counts its own
        with mon.decode(batch=2, context_tokens=100):
            clock.advance(0.001)
            if gpu is not None:
                gpu.now_ms += 1.0
        assert mon.flush(30)
        assert mon.stats()["decode"]["steps"] == 11
        assert scrape(parent_srv.url, f"{STEP}_count", 'model="llama-3-8b",phase="decode"') == 11
    finally:
        mon.close()


@pytest.mark.parametrize("timing", ["host", "cuda-events"])
def test_a_child_that_only_steps_is_told_where_its_metrics_are_not(timing: str) -> None:
    """The fork notices are logged at the child's first export of a step, even when a flush takes it."""
    clock = FakeClock()
    gpu = ScriptedGpu(capacity=256) if timing == "cuda-events" else None
    mon = scripted_monitor(
        gpu, model=MODEL, hardware=HW, registry=CollectorRegistry(), otel=False, nvtx=False, clock=clock
    )
    srv = mon.serve_metrics(port=0)
    logs = LogRecords()

    def child() -> dict[str, Any]:
        for _ in range(50):
            with mon.decode(batch=2, context_tokens=100):
                clock.advance(0.002)
        flushed = mon.flush(30)  # the steps leave through the flush, not a round of their own
        mon.close(timeout=3)
        return {"flushed": flushed, "logs": logs.messages}

    logging.getLogger("perfsdk").addHandler(logs)
    try:
        status, got = in_child(child)
    finally:
        logging.getLogger("perfsdk").removeHandler(logs)
    try:
        assert status == 0 and got["flushed"] is True
        assert any(srv.url in m for m in got["logs"]), got["logs"]
        if gpu is not None:
            assert any("host clock" in m for m in got["logs"]), got["logs"]
    finally:
        mon.close()


def test_a_copy_that_stays_idle_in_the_child_says_nothing() -> None:
    """A worker that makes a Monitor of its own leaves the inherited one idle: no warning from that one."""
    mon = scripted_monitor(ScriptedGpu(), registry=CollectorRegistry(), otel=False, nvtx=False)
    srv = mon.serve_metrics(port=0)
    logs = LogRecords()

    def child() -> dict[str, Any]:
        flushed = mon.flush(30)
        mon.close(timeout=3)
        return {"flushed": flushed, "logs": logs.messages}

    logging.getLogger("perfsdk").addHandler(logs)
    try:
        status, got = in_child(child)
    finally:
        logging.getLogger("perfsdk").removeHandler(logs)
        mon.close()
    assert status == 0 and got["flushed"] is True
    assert not [m for m in got["logs"] if "forked" in m or srv.url in m]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no owner
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_profiler_window_set_before_the_fork_drives_the_childs_steps(tmp_path: Path) -> None:
    """The window is set in one place (``Recorder.set_window``): the child of a Monitor that timed with CUDA events
    binds its hot path again, for host timing, and keeps the window — the next step starts the capture the child
    asked for. (The C hot path's rebuilt ``Hot`` used to lose it: the capture stayed "ready" for ever.)"""
    mon = scripted_monitor(ScriptedGpu(), registry=CollectorRegistry(), otel=False, nvtx=False)
    window = mon.enable_profiler(directory=tmp_path, min_free_mb=0, steps=1)

    def child() -> dict[str, Any]:
        accepted = window.trigger(steps=1, steady=False).accepted
        before = window.state
        with mon.decode(batch=1):
            pass
        return {"timing": mon.timing, "accepted": accepted, "before": before, "after": window.state}

    try:
        status, seen = in_child(child)
    finally:
        mon.close()
    assert status == 0
    assert seen == {"timing": "host", "accepted": True, "before": "ready", "after": "running"}


def test_a_fork_while_perfsdk_holds_a_lock_says_to_recreate_the_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """If a perfsdk lock stays held past FORK_QUIESCE, the child's Monitor records nothing, counted and logged."""
    monkeypatch.setattr(lifecycle, "FORK_QUIESCE", 0.05)
    reg = CollectorRegistry()
    mon = perfsdk.Monitor(registry=reg, otel=False, nvtx=False)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # a scrape that takes its time
        with update_lock(reg):
            holding.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    holding.wait(30)

    def child() -> dict[str, Any]:
        logs = LogRecords()
        logging.getLogger("perfsdk").addHandler(logs)  # the error comes at the first call, not at the fork
        for _ in range(100):
            with mon.decode(batch=2):
                pass
        mon.request(prompt_tokens=1).finish()
        try:
            mon.serve_metrics(port=0)
            refused = ""
        except MonitorClosedError as e:
            refused = str(e)
        mon.close(timeout=3)
        return {"late": mon.stats()["calls_after_close"], "refused": refused, "logs": logs.messages}

    try:
        status, got = in_child(child)
    finally:
        release.set()
        t.join()
    try:
        assert status == 0
        assert got["late"] == 101
        assert "forked" in got["refused"] and "after the fork" in got["refused"]
        assert sum("Create the Monitor after the fork" in m for m in got["logs"]) == 1
        with mon.decode(batch=2):  # the parent is unaffected
            pass
        assert mon.flush(30)
        assert mon.stats()["decode"]["steps"] == 1
    finally:
        mon.close()


class StuckExporter:
    """A span exporter stuck in its first export (a backend that does not answer)."""

    def __init__(self) -> None:
        self.entered, self.release = threading.Event(), threading.Event()

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.entered.set()
        self.release.wait(60)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_a_fork_during_a_span_export_drops_the_childs_spans_counted_and_keeps_its_metrics(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    monkeypatch.setattr(lifecycle, "FORK_QUIESCE", 0.05)
    stuck = StuckExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(stuck))  # type: ignore[arg-type]
    reg = CollectorRegistry()
    mon = perfsdk.Monitor(registry=reg, tracer_provider=provider, nvtx=False)
    with mon.request(prompt_tokens=1) as req:
        req.tokens(1)
    mon.flush(1)  # its span goes to the exporter, which does not come back
    assert stuck.entered.wait(30)

    def child() -> dict[str, Any]:
        for _ in range(3):
            with mon.request(prompt_tokens=1) as r:
                r.tokens(1)
        flushed = mon.flush(30)
        stats = mon.stats()
        mon.close(timeout=3)
        ttft = reg.get_sample_value(f"{TTFT}_count", {"model": "unknown"})
        return {"flushed": flushed, "spans": stats["dropped_spans"], "ttft": ttft}

    try:
        status, got = in_child(child)
    finally:
        stuck.release.set()
        mon.close()
        provider.shutdown()
    assert status == 0
    assert got == {"flushed": True, "spans": 3, "ttft": 4}  # the parent's one (a copy) and the child's three


def test_forked_children_write_their_own_multiprocess_files(tmp_path: Path) -> None:
    """PROMETHEUS_MULTIPROC_DIR: each process its own files; the directory adds the parent's and children's."""
    mp = tmp_path / "mp"
    mp.mkdir()
    code = textwrap.dedent("""
        import os, sys
        import perfsdk
        from perfsdk.sinks.prometheus import multiprocess_registry
        mon = perfsdk.Monitor(otel=False, nvtx=False, model_name="mp", hardware="h100-sxm")
        for _ in range(7):
            with mon.decode(batch=1):
                pass
        assert mon.flush(30)
        kids = []
        for k in range(2):
            pid = os.fork()
            if pid == 0:
                for _ in range(100 * (k + 1)):
                    with mon.decode(batch=1):
                        pass
                ok = mon.flush(30)
                mon.close(timeout=5)
                os._exit(0 if ok else 1)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
        reg = multiprocess_registry()
        print(codes, reg.get_sample_value("perfsdk_step_seconds_count", {"model": "mp", "phase": "decode"}),
              reg.get_sample_value("perfsdk_hardware_peak_bandwidth_bytes", {"device": "h100-sxm"}))
        mon.close()
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[0,", "0]", "307.0", "3350000000000.0"]


# ---- item 2: a constructor that fails leaves nothing running ----------------------------------------------------
def perfsdk_threads() -> int:
    """perfsdk's threads in this process: Python ones by name, the C step core's by its OS name."""
    py = sum(t.name.startswith("perfsdk") for t in threading.enumerate())
    native = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            native += (task / "comm").read_text().strip() == "perfsdk-steps"
        except OSError:
            pass
    return py + native


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the OS threads from /proc")
@pytest.mark.parametrize("case", ["port-in-use", "port-beyond-65535", "address-without-token"])
def test_a_constructor_that_fails_leaves_no_thread_and_no_metric(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        if case == "port-in-use":
            monkeypatch.setenv("PERFSDK_METRICS_PORT", str(taken.getsockname()[1]))
            match = "cannot serve metrics"
        elif case == "port-beyond-65535":
            monkeypatch.setenv("PERFSDK_METRICS_PORT", "65535")
            monkeypatch.setenv("LOCAL_RANK", "3")
            match = r"PERFSDK_METRICS_PORT \(environment\): 65535 plus LOCAL_RANK=3 is port 65538"
        else:
            monkeypatch.setenv("PERFSDK_METRICS_PORT", "0")
            monkeypatch.setenv("PERFSDK_METRICS_ADDR", "0.0.0.0")
            match = r"PERFSDK_METRICS_ADDR \(environment\).*token"
        gc.collect()
        baseline = perfsdk_threads()
        for _ in range(10):
            reg = CollectorRegistry()
            with pytest.raises(ConfigError, match=match):
                perfsdk.Monitor(registry=reg, otel=True, nvtx=False)
            assert list(reg.collect()) == []  # failed before any metric was registered
        assert perfsdk_threads() == baseline
    finally:
        taken.close()


def test_a_monitor_whose_threads_fail_to_start_stops_what_had_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anything failing once threads run (here: the collector cannot start) stops the core again."""
    from perfsdk.collector import Collector

    def refuse(self: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(Collector, "start", refuse)
    gc.collect()
    baseline = perfsdk_threads()
    for _ in range(5):
        with pytest.raises(RuntimeError, match="new thread"):
            perfsdk.Monitor(registry=CollectorRegistry(), otel=False, nvtx=False)
    assert perfsdk_threads() == baseline


# ---- item 10: a closed Monitor ---------------------------------------------------------------------------------
def test_every_call_on_a_closed_monitor_is_a_counted_no_op_or_a_clear_error(caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock()
    reg = CollectorRegistry()
    mon = perfsdk.Monitor(registry=reg, otel=False, nvtx=False, clock=clock)
    kept = mon.decode(batch=2)  # a step object made before close, entered after
    with kept:
        clock.advance(0.001)
    begun = mon.request(prompt_tokens=1)  # a request begun before close, finished after

    @mon.decode(batch=1)  # decorated before close, called after
    def step() -> int:
        return 7

    mon.close()
    assert mon.flush() is True  # close exported everything; nothing left to do
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        for _ in range(3):
            with mon.decode(batch=2):
                pass
            with mon.prefill(tokens=4):
                pass
        assert step() == 7
        assert step() == 7
        with kept:
            pass
        assert mon.request(prompt_tokens=1).finished is False
        begun.finish()
        mon.record_step("decode", 0.01)
        mon.record_latencies(ttft_s=[0.1])
        mon.record_finished(e2e_s=1.0)
    stats = mon.stats()
    assert stats["calls_after_close"] == 3 * 2 + 2 + 1 + 1 + 3  # steps, decorated calls, kept, request, record_*
    assert stats["dropped_records"] == 1  # the request begun before close
    assert stats["decode"]["steps"] == 1
    assert sum("closed Monitor" in r.getMessage() for r in caplog.records) == 1  # logged once
    for call in (lambda: mon.serve_metrics(port=0), lambda: mon.profile(steps=1), mon.enable_profiler):
        with pytest.raises(MonitorClosedError, match="is closed"):
            call()
    assert reg.get_sample_value(f"{STEP}_count", {"model": "unknown", "phase": "decode"}) == 1
    assert b"perfsdk_step_seconds_count" in mon.metrics_text()[0]  # the final values, still readable
    mon.close()  # idempotent


def test_a_server_started_before_close_is_stopped_by_it() -> None:
    mon = perfsdk.Monitor(registry=CollectorRegistry(), otel=False, nvtx=False)
    srv = mon.serve_metrics(port=0)
    mon.close(timeout=10)
    assert srv.closed
    assert port_is_free(srv.port)
