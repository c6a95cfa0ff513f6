"""A small HTTP server for a Monitor: ``GET /metrics``, ``GET /health``, ``POST /profile``.

Started by :meth:`perfsdk.Monitor.serve_metrics` on a daemon thread::

    srv = mon.serve_metrics(port=9400)              # 127.0.0.1:9400; port=0 picks a free port
    srv.url                                         # "http://127.0.0.1:9400"
    # curl -X POST 'http://127.0.0.1:9400/profile?steps=4&mode=torch'   -> a profiler window

``/metrics`` is the Monitor's registry in the Prometheus text format (every
process's values when ``PROMETHEUS_MULTIPROC_DIR`` is set), fresh: each scrape
first drains the Monitor's collector (:meth:`perfsdk.Monitor.metrics_text`,
waiting at most ``drain_timeout``, 1 s), so it holds every step and request
that finished before it began, not only what the last export (every
``export_interval``) carried. Other processes' values behind
``PROMETHEUS_MULTIPROC_DIR`` lag by at most their export interval. ``POST /profile``
asks for one profiler-window capture; it is open on loopback, and needs
``Authorization: Bearer <token>`` when the server binds any other address —
binding elsewhere without a token is refused at construction.

The server stays quiet on stderr: a client that hangs up mid-request (a scrape
aborted by Prometheus' timeout, a health check that closes early) is counted in
``srv.client_disconnects`` and logged at DEBUG on the ``perfsdk.metrics_server``
logger, never printed as a socket traceback. Any other error while handling a
request is counted in ``srv.errors`` and logged, with its traceback, once as a
WARNING and at DEBUG after that; a failing ``/metrics`` answers 500.

Lifecycle: :meth:`MetricsServer.close` returns within its *timeout* and is idempotent. In a process
forked from the one that started the server (``os.fork()``: gunicorn's pre-fork workers) the serving
thread does not exist: ``close()`` there only closes the child's copy of the listening socket, so the port
stays the parent's alone (``perfsdk.Monitor`` does that for its server right after the fork).
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from perfsdk._guard import ErrorGuard
from perfsdk.errors import ConfigError

__all__ = ["MetricsHost", "MetricsServer"]


class MetricsHost(Protocol):
    """What the server needs of its Monitor (perfsdk.Monitor is one): its metrics, drained, and the
    profiler-window trigger."""

    def metrics_text(self, drain_timeout: float | None = ...) -> tuple[bytes, str]: ...

    def profile(self, steps: int | None = None, mode: str | None = None, reason: str = "api") -> Any: ...

log = logging.getLogger(__name__)


def is_loopback(addr: str) -> bool:
    """Whether *addr* binds loopback only (``""`` binds every interface)."""
    if addr in ("localhost", ""):
        return addr == "localhost"
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


class MetricsServer:
    """``GET /metrics``, ``GET /health`` and ``POST /profile`` for *mon* (see the module docstring).

    The socket is bound at construction (a port in use is a :class:`~perfsdk.errors.ConfigError` then);
    requests are served from :meth:`start` on (*start* True: at once).
    """

    def __init__(self, mon: MetricsHost, port: int = 9400, addr: str = "127.0.0.1", token: str | None = None, *,
                 errors: ErrorGuard | None = None, drain_timeout: float = 1.0, start: bool = True) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port: expected an integer within 0..65535, got {port!r}")
        if not is_loopback(addr) and not token:
            raise ConfigError(
                f"addr: binding the metrics server to {addr!r} (not loopback) needs token=... to protect "
                "POST /profile; pass a token or bind 127.0.0.1"
            )
        self._mon = mon
        self._guard = errors if errors is not None else ErrorGuard()
        self._token = token
        self.drain_timeout = drain_timeout
        self._counts_lock = threading.Lock()
        self._client_disconnects = 0
        self._failures = 0
        handler = _make_handler(self)
        try:
            self._httpd = _QuietServer((addr, port), handler, self)
        except OSError as e:
            raise ConfigError(f"port: cannot serve metrics on {addr}:{port}: {e.strerror or e}") from e
        self.addr = addr
        self.port = int(self._httpd.server_address[1])
        self._pid = os.getpid()
        self._closed = False
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="perfsdk-metrics", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Serve requests (on a daemon thread); once."""
        if not self._closed and not self._thread.is_alive() and self._thread.ident is None:
            self._thread.start()

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}"

    @property
    def client_disconnects(self) -> int:
        """Requests whose client hung up before the answer was read (aborted scrapes)."""
        return self._client_disconnects

    @property
    def errors(self) -> int:
        """Requests that failed inside the server for any other reason (logged)."""
        return self._failures

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> bool:
        """Stop serving and close the socket, within *timeout* s (None: no limit); False if the serving
        thread had not stopped by then (it stops, and the socket closes, at its next poll). Idempotent.

        In a forked child (no serving thread there) it closes the child's copy of the socket at once.
        """
        if self._closed:
            return True
        self._closed = True
        httpd = self._httpd
        if self._pid != os.getpid() or not self._thread.is_alive():
            httpd.server_close()  # never shutdown(): it waits for a serve_forever loop that is not running
            return True

        def stop() -> None:
            httpd.shutdown()  # returns within serve_forever's poll interval (0.5 s)
            httpd.server_close()  # after the loop has left select(): nothing polls a closed socket

        stopper = threading.Thread(target=stop, name="perfsdk-metrics-close", daemon=True)
        stopper.start()
        stopper.join(timeout)
        return not stopper.is_alive()

    def _request_failed(self, client: Any, exc: BaseException | None) -> None:
        # ConnectionError covers BrokenPipe, ConnectionReset and ConnectionAborted; TimeoutError a client
        # that stalled mid-request: the client's doing, and routine for a scrape that timed out
        if isinstance(exc, (ConnectionError, TimeoutError)):
            with self._counts_lock:
                self._client_disconnects += 1
            log.debug("metrics server: client %s hung up: %s", client, exc)
            return
        with self._counts_lock:
            self._failures += 1
            first = self._failures == 1
        log.log(logging.WARNING if first else logging.DEBUG, "metrics server: a request from %s failed",
                client, exc_info=exc)

    # ---- request handling (server threads) --------------------------------
    def metrics(self) -> tuple[bytes, str]:
        """The drained exposition (all of one step export or none of it: bytes / seconds stay exact)."""
        return self._mon.metrics_text(self.drain_timeout)

    def authorized(self, header: str | None) -> bool:
        if self._token is None:
            return True
        expected = f"Bearer {self._token}"
        return header is not None and hmac.compare_digest(header.encode(), expected.encode())

    def trigger(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        try:
            steps = int(query["steps"][0]) if "steps" in query else None
            mode = query["mode"][0] if "mode" in query else None
        except ValueError:
            return 400, {"error": "steps must be an integer"}
        try:
            handle = self._mon.profile(steps=steps, mode=mode, reason="http")
        except ConfigError as e:
            return 400, {"error": str(e)}
        except Exception as e:  # a profiler problem is reported, never fatal to the server
            self._guard.record(e, "POST /profile")
            return 500, {"error": f"{type(e).__name__}: {e}"}
        info = handle.to_dict() if hasattr(handle, "to_dict") else {"accepted": bool(handle)}
        return (202 if info.get("accepted", True) else 409), info


class _QuietServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` whose request errors go to the owner, not to ``traceback.print_exc()``."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: MetricsServer) -> None:
        self._owner = owner
        super().__init__(address, handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver calls this from inside the except block: the exception is the current one
        self._owner._request_failed(client_address, sys.exc_info()[1])


def _make_handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes every few seconds
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: dict[str, Any]) -> None:
            self._send(code, json.dumps(obj).encode(), "application/json")

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/metrics":
                try:
                    body, ctype = server.metrics()
                except Exception as e:  # a failing collector: say so, and keep the server up
                    server._request_failed(self.client_address, e)
                    self._json(500, {"error": f"collecting metrics failed: {type(e).__name__}: {e}"})
                    return
                self._send(200, body, ctype)
            elif path in ("/health", "/"):
                self._json(200, {"status": "ok"})
            else:
                self._json(404, {"error": f"no route {path}; try /metrics"})

        def do_POST(self) -> None:
            url = urlparse(self.path)
            if url.path != "/profile":
                self._json(404, {"error": f"no route {url.path}; POST /profile triggers a profiler window"})
                return
            if not server.authorized(self.headers.get("Authorization")):
                self._json(401, {"error": "missing or wrong bearer token"})
                return
            code, obj = server.trigger(parse_qs(url.query))
            self._json(code, obj)

    return Handler
