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
