"""The metrics server under clients that misbehave: real sockets on loopback, stderr read at the fd."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from perfsdk.metrics_server import MetricsServer
from perfsdk.testing import monitor_harness


def _wait_for(condition: object, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)


def _hang_up(port: int, request: bytes) -> None:
    """Send *request* and reset the connection (SO_LINGER 0: an RST, as a killed scraper leaves)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def test_an_aborted_scrape_is_counted_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    # before: every aborted scrape printed "Exception occurred during processing of request ..." and a
    # ConnectionResetError traceback on the server's stderr
    with monitor_harness() as h:
        srv: MetricsServer = h.monitor.serve_metrics(port=0)
        for _ in range(3):
            # the headers never end: the server is reading them when the reset arrives
            _hang_up(srv.port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        _wait_for(lambda: srv.client_disconnects >= 3)
        assert srv.client_disconnects == 3
        assert srv.errors == 0
        # and the server still answers
        assert urllib.request.urlopen(f"{srv.url}/metrics", timeout=10).status == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err and "Exception occurred" not in err


class _BrokenCollector:
    def collect(self) -> Iterator[object]:
        raise RuntimeError("collector exploded")


def test_a_failing_collector_answers_500_and_the_server_stays_up(capfd: pytest.CaptureFixture[str]) -> None:
    # before: the exception escaped the handler: the connection dropped without an answer and a
    # traceback went to stderr
    with monitor_harness() as h:
        srv: MetricsServer = h.monitor.serve_metrics(port=0)
        broken = _BrokenCollector()
        h.registry.register(broken)  # type: ignore[arg-type]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{srv.url}/metrics", timeout=10)
        assert e.value.code == 500
        assert "collector exploded" in json.loads(e.value.read())["error"]
        assert srv.errors == 1
        h.registry.unregister(broken)  # type: ignore[arg-type]
        assert urllib.request.urlopen(f"{srv.url}/metrics", timeout=10).status == 200
    assert "Exception occurred" not in capfd.readouterr().err


def test_a_scrape_holds_everything_that_finished_before_it() -> None:
    """Fresh scrapes: with an export interval of a minute, a scrape right after the work still has all of it
    (before: nothing until the next export; with the 1 s default, a scrape right after a load lacked it)."""
    with monitor_harness(export_interval=60) as h:
        mon = h.monitor
        srv: MetricsServer = mon.serve_metrics(port=0)
        time.sleep(0.2)  # the collector's first round is done: what follows waits for the next interval
        for _ in range(6):
            with mon.request(prompt_tokens=4) as req:
                req.scheduled()
                req.tokens(1)
                req.tokens(1)
        for _ in range(227):
            with mon.decode(batch=1, context_tokens=8):
                pass
        text = urllib.request.urlopen(f"{srv.url}/metrics", timeout=10).read().decode()
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    assert float(samples['gen_ai_server_time_to_first_token_seconds_count{model="unknown"}']) == 6
    assert float(samples['gen_ai_server_request_duration_seconds_count{model="unknown"}']) == 6
    assert float(samples['perfsdk_step_seconds_count{model="unknown",phase="decode"}']) == 227


def test_metrics_text_is_the_same_drained_exposition_for_a_route_of_your_own() -> None:
    with monitor_harness(export_interval=60) as h:
        time.sleep(0.2)
        with h.monitor.decode(batch=2):
            pass
        body, ctype = h.monitor.metrics_text()
        assert ctype.startswith("text/plain")
        assert b'perfsdk_step_seconds_count{model="unknown",phase="decode"} 1.0' in body
        # a drain that cannot wait (timeout 0) still answers at once, with what was exported
        with h.monitor.decode(batch=2):
            pass
        body, _ = h.monitor.metrics_text(drain_timeout=0)
        assert b"perfsdk_step_seconds_count" in body


# ---- stalled clients (issue 20, item 3): bounded connections, read and write timeouts ----------------------


def test_a_slow_loris_cannot_deny_a_scrape_and_threads_stay_bounded() -> None:
    """Another process keeps 100 idle connections open (reopening each one the server closes) and four that
    trickle a request one byte every 20 ms; scrapes still get their answer, the server closes the stalled
    clients, and its threads and connections stay within max_connections.

    Before: every idle socket held a thread forever (300 idle sockets, 306 threads; 256 exhausted the
    descriptors of a process limited to 256), and a trickled request was waited for indefinitely.
    """
    import subprocess
    import sys
    import threading
    from pathlib import Path

    with monitor_harness() as h:
        srv = MetricsServer(h.monitor, port=0, max_connections=8, read_timeout=0.5, write_timeout=5.0)
        base_threads = threading.active_count()
        attacker = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("slow_loris.py")), str(srv.port), "100", "4"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert attacker.stdout is not None and attacker.stdout.readline().strip() == "started"
            most_threads = most_connections = 0

            def sample() -> bool:
                nonlocal most_threads, most_connections
                most_threads = max(most_threads, threading.active_count() - base_threads)
                most_connections = max(most_connections, srv.open_connections)
                return srv.slow_clients >= 150  # the server has been cutting stalled clients for a while

            _wait_for(sample, 60)
            assert srv.slow_clients >= 150
            for _ in range(5):  # scrapes in the middle of it
                with urllib.request.urlopen(f"{srv.url}/metrics", timeout=30) as r:
                    assert r.status == 200 and b"perfsdk_dropped_records_total" in r.read()
                sample()
        finally:
            out, _ = attacker.communicate("", timeout=60)  # its stdin closes: it stops and reports
            srv.close()
    seen = json.loads(out.strip().splitlines()[-1])
    # handler threads: at most max_connections live, plus evicted ones still ending (2 x in all)
    assert most_threads <= 2 * 8, most_threads
    assert most_connections <= 2 * 8, most_connections
    assert seen["idle_closed"] >= 100, seen  # idle clients are closed, not kept
    assert seen["drips_cut"] >= 4 and seen["drips_completed"] == 0, seen  # none trickled a request in


class _HugeCollector:
    """A registry collector whose exposition is ~16 MiB: more than the kernel buffers between the server and a
    client that does not read."""

    def collect(self) -> Iterator[object]:
        from prometheus_client.core import GaugeMetricFamily

        g = GaugeMetricFamily("test_padding", "padding", labels=["pad"])
        pad = "p" * 240
        for i in range(64 * 1024):
            g.add_metric([f"{pad}{i}"], 0.0)
        yield g


def _request_and_stall(port: int, path: str = "/metrics") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that reads nothing, with a small window
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return s


def test_a_client_that_does_not_read_its_answer_is_cut_and_busy_slots_answer_503() -> None:
    """Two scrapes that never read their (large) answer fill both slots while the server writes; a third
    connection is answered 503 at once; after write_timeout both are closed and scrapes work again.

    Before: a client that did not read held its thread in sendall() forever, and there was no limit.
    """
    import threading

    with monitor_harness() as h:
        huge = _HugeCollector()
        h.registry.register(huge)  # type: ignore[arg-type]
        srv = MetricsServer(h.monitor, port=0, max_connections=2, read_timeout=5.0, write_timeout=1.0)
        base_threads = threading.active_count()
        try:
            stalled = [_request_and_stall(srv.port) for _ in range(2)]
            for s in stalled:  # the answer has begun: both slots are busy writing
                assert s.recv(1, socket.MSG_PEEK) == b"H"
            with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as third:
                assert third.recv(100).startswith(b"HTTP/1.0 503")
            assert srv.refused == 1
            _wait_for(lambda: srv.slow_clients >= 2 and srv.open_connections == 0, 60)
            assert srv.slow_clients == 2 and srv.open_connections == 0
            _wait_for(lambda: threading.active_count() <= base_threads, 30)
            assert threading.active_count() <= base_threads
            for s in stalled:  # the server gave up on them: what was sent, then the end
                received = 0
                try:
                    while chunk := s.recv(1 << 20):
                        received += len(chunk)
                except ConnectionResetError:
                    pass
                assert received < 16 << 20
                s.close()
            h.registry.unregister(huge)  # type: ignore[arg-type]
            assert urllib.request.urlopen(f"{srv.url}/metrics", timeout=30).status == 200
            assert srv.errors == 0
        finally:
            srv.close()


@pytest.mark.parametrize(
    "bad",
    [
        {"max_connections": 0},
        {"max_connections": True},
        {"read_timeout": 0},
        {"read_timeout": float("nan")},
        {"write_timeout": -1},
        {"write_timeout": float("inf")},
    ],
)
def test_connection_limits_are_checked_at_construction(bad: dict[str, object]) -> None:
    from perfsdk.errors import ConfigError

    with monitor_harness() as h, pytest.raises(ConfigError, match=next(iter(bad))):
        MetricsServer(h.monitor, port=0, **bad)  # type: ignore[arg-type]
