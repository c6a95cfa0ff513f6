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
