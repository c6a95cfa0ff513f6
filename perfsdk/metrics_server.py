"""A small HTTP server for a Monitor: ``GET /metrics``, ``GET /health``, and the profiler window at ``/profile``.

Started by :meth:`perfsdk.Monitor.serve_metrics` on a daemon thread::

    srv = mon.serve_metrics(port=9400)              # 127.0.0.1:9400; port=0 picks a free port
    srv.url                                         # "http://127.0.0.1:9400"
    # curl -X POST 'http://127.0.0.1:9400/profile?steps=4&mode=torch'   -> a profiler window
    # curl 'http://127.0.0.1:9400/profile'                              -> its state and the last result
    # curl -X DELETE 'http://127.0.0.1:9400/profile'                    -> cancel the capture under way

``/metrics`` is the Monitor's registry in the Prometheus text format (every
process's values when ``PROMETHEUS_MULTIPROC_DIR`` is set), fresh: each scrape
first drains the Monitor's collector (:meth:`perfsdk.Monitor.metrics_text`,
waiting at most ``drain_timeout``, 1 s), so it holds every step and request
that finished before it began, not only what the last export (every
``export_interval``) carried. Other processes' values behind
``PROMETHEUS_MULTIPROC_DIR`` lag by at most their export interval. ``/profile``
is :mod:`perfsdk.profiling.endpoint`: ``POST`` arms one profiler-window capture,
``GET`` shows the window and the last result, ``DELETE`` cancels. ``POST`` and
``DELETE`` are open on loopback, and need ``Authorization: Bearer <token>`` when
the server binds any other address — binding elsewhere without a token is
refused at construction.

**Stalled clients cannot deny the scrapers.** The server holds at most
``max_connections`` connections (default 32), one handler thread each, and gives
every client ``read_timeout`` seconds (default 5) in all for its request line and
headers — however it trickles them — and ``write_timeout`` seconds (default 10)
in all to take the answer. A client past either is closed and counted in
``srv.slow_clients``. When every slot is taken, a new connection evicts the
oldest one still sending its request (a scraper sends its request at once, so
only an idle or trickling client is ever evicted; counted in
``srv.slow_clients`` too); when every slot is busy answering, the new connection
gets ``503`` and is closed at once (``srv.refused``). So idle sockets, however
many, cost at most ``max_connections`` descriptors and threads, and a scrape
still gets through.

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

import io
import json
import logging
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any, Protocol
from urllib.parse import parse_qs, urlparse

from perfsdk._guard import ErrorGuard
from perfsdk.config import check_int, check_number
from perfsdk.errors import ConfigError
from perfsdk.http_limits import BoundedServer, RequestReader, SocketWriter
from perfsdk.profiling import endpoint

__all__ = ["MetricsHost", "MetricsServer"]


class MetricsHost(Protocol):
    """What the server needs of its Monitor (perfsdk.Monitor is one): its metrics, drained, and the
    profiler window's trigger, status and cancel."""

    def metrics_text(self, drain_timeout: float | None = ...) -> tuple[bytes, str]: ...

    def profile(self, steps: int | None = None, mode: str | None = None, reason: str = "api") -> Any: ...

    def profile_status(self) -> dict[str, Any] | None: ...

    def cancel_profile(self, reason: str = "cancelled") -> bool: ...


log = logging.getLogger(__name__)


#: Defaults of the connection limits (see the module docstring).
MAX_CONNECTIONS = 32
READ_TIMEOUT = 5.0
WRITE_TIMEOUT = 10.0


# what perfsdk.config.metrics_endpoint checks an address with (one rule: profiling.endpoint's)
is_loopback = endpoint.is_loopback


class MetricsServer:
    """``GET /metrics``, ``GET /health`` and ``POST /profile`` for *mon* (see the module docstring).

    The socket is bound at construction (a port in use is a :class:`~perfsdk.errors.ConfigError` then);
    requests are served from :meth:`start` on (*start* True: at once).
    """

    def __init__(
        self,
        mon: MetricsHost,
        port: int = 9400,
        addr: str = "127.0.0.1",
        token: str | None = None,
        *,
        errors: ErrorGuard | None = None,
        drain_timeout: float = 1.0,
        max_connections: int = MAX_CONNECTIONS,
        read_timeout: float = READ_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        start: bool = True,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ConfigError(f"port: expected an integer within 0..65535, got {port!r}")
        endpoint.check_bind(
            addr,
            token,
            "addr",
            "the metrics server",
            "token=... to protect POST and DELETE /profile; pass a token or bind 127.0.0.1",
        )
        self.max_connections = check_int("max_connections", max_connections, 1, 4096)
        self.read_timeout = check_number("read_timeout", read_timeout, 0, 3600, open_low=True)
        self.write_timeout = check_number("write_timeout", write_timeout, 0, 3600, open_low=True)
        self._mon = mon
        self._guard = errors if errors is not None else ErrorGuard()
        self._token = token
        self.drain_timeout = drain_timeout
        self._counts_lock = threading.Lock()
        self._client_disconnects = 0
        self._failures = 0
        self._slow = 0
        self._refused = 0
        handler = _make_handler(self)
        try:
            self._httpd = BoundedServer((addr, port), handler, self)
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

    @property
    def slow_clients(self) -> int:
        """Connections closed because the client was too slow: its request took longer than ``read_timeout``,
        it took longer than ``write_timeout`` to read the answer, or it was evicted, still sending its
        request, to make room for a new connection."""
        return self._slow

    @property
    def refused(self) -> int:
        """Connections answered 503 and closed at once because every slot was busy answering."""
        return self._refused

    @property
    def open_connections(self) -> int:
        """Connections held now (at most ``max_connections``, plus evicted ones whose thread is ending)."""
        return self._httpd.open_connections()

    def _count(self, what: str) -> None:
        with self._counts_lock:
            if what == "slow":
                self._slow += 1
            else:
                self._refused += 1

    def _request_failed(self, client: Any, exc: BaseException | None) -> None:
        # ConnectionError covers BrokenPipe, ConnectionReset and ConnectionAborted; TimeoutError a client
        # too slow (counted in slow_clients where it happened): the client's doing, and routine for a scrape
        # that timed out
        if isinstance(exc, TimeoutError):
            log.debug("metrics server: client %s too slow: %s", client, exc)
            return
        if isinstance(exc, ConnectionError):
            with self._counts_lock:
                self._client_disconnects += 1
            log.debug("metrics server: client %s hung up: %s", client, exc)
            return
        with self._counts_lock:
            self._failures += 1
            first = self._failures == 1
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "metrics server: a request from %s failed",
            client,
            exc_info=exc,
        )

    # ---- request handling (server threads) --------------------------------
    def metrics(self) -> tuple[bytes, str]:
        """The drained exposition (all of one step export or none of it: bytes / seconds stay exact)."""
        return self._mon.metrics_text(self.drain_timeout)

    def authorized(self, header: str | None) -> bool:
        return endpoint.bearer_ok(self._token, header)

    def trigger(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """``POST /profile``."""
        try:
            steps = int(query["steps"][0]) if "steps" in query else None
            mode = query["mode"][0] if "mode" in query else None
        except ValueError:
            return 400, {"error": "steps must be an integer"}
        return self._guarded("POST /profile", lambda: endpoint.arm(self._mon, steps, mode, "/profile")[:2])

    def profile_status(self) -> tuple[int, dict[str, Any]]:
        """``GET /profile``."""
        return self._guarded("GET /profile", lambda: endpoint.status(self._mon))

    def cancel(self) -> tuple[int, dict[str, Any]]:
        """``DELETE /profile``."""
        return self._guarded("DELETE /profile", lambda: endpoint.cancel(self._mon, "/profile"))

    def _guarded(self, where: str, answer: Callable[[], tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
        """*answer*'s reply, or a 500 naming the error: a profiler problem is reported, never fatal to the server."""
        try:
            return answer()
        except Exception as e:
            self._guard.record(e, where)
            return 500, {"error": f"{type(e).__name__}: {e}"}


def _make_handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def setup(self) -> None:
            # StreamRequestHandler.setup, with a reader under the request's deadline
            httpd: BoundedServer = self.server  # type: ignore[assignment]
            self.connection = self.request
            self.rfile = io.BufferedReader(RequestReader(httpd, self.connection))
            self.wfile = SocketWriter(server, self.connection)

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            httpd: BoundedServer = self.server  # type: ignore[assignment]
            if not httpd.start_answering(self.connection):
                self.close_connection = True
                return False
            # the request is read (perfsdk reads no body): from here on the socket only writes, all within this
            self.connection.settimeout(server.write_timeout)
            return True

        def log_message(self, format: str, *args: Any) -> None:  # quiet: scrapes every few seconds
            pass

        def _send(self, code: int, body: bytes, ctype: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: dict[str, Any]) -> None:
            self._send(code, json.dumps(obj, default=str).encode(), "application/json")

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
            elif path == "/profile":
                self._json(*server.profile_status())
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

        def do_DELETE(self) -> None:
            url = urlparse(self.path)
            if url.path != "/profile":
                self._json(404, {"error": f"no route {url.path}; DELETE /profile cancels a profiler capture"})
                return
            if not server.authorized(self.headers.get("Authorization")):
                self._json(401, {"error": "missing or wrong bearer token"})
                return
            self._json(*server.cancel())

    return Handler
