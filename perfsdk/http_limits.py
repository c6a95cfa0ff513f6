"""The metrics server's sockets: at most ``max_connections`` at once, each given ``read_timeout`` to send its
request and ``write_timeout`` to take its answer, so idle or trickling clients never keep a scraper out.

Used by :class:`perfsdk.metrics_server.MetricsServer` (its *owner*: the limits, the counters of slow and
refused clients, and where request errors are reported)::

    httpd = BoundedServer((addr, port), handler_class, owner)
    # in the handler: self.rfile = io.BufferedReader(RequestReader(httpd, sock)); self.wfile = SocketWriter(...)

When every slot is taken a new connection pushes out the oldest one still sending its request; if every slot
is busy answering, the newcomer gets a 503. ``read_timeout`` covers the whole request line and headers, even a
byte at a time; ``write_timeout`` the whole answer.
"""

from __future__ import annotations

import io
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

__all__ = ["BoundedServer", "Conn", "ConnectionOwner", "RequestReader", "SocketWriter"]


class ConnectionOwner(Protocol):
    """What the sockets need of their server: the limits, and where to count and report."""

    max_connections: int
    read_timeout: float
    write_timeout: float

    def _count(self, what: str) -> None: ...

    def _request_failed(self, client: Any, exc: BaseException | None) -> None: ...


class Conn:
    """One accepted connection: its socket, and whether its request has been read (then it is being answered)."""

    __slots__ = ("answering", "deadline", "evicted", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.answering = False
        self.evicted = False


class BoundedServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with bounded connections, and request errors that go to the owner, not to
    ``traceback.print_exc()``."""

    daemon_threads = True
    block_on_close = False  # server_close() wakes every handler (shuts its socket down) instead of joining it
    request_queue_size = 64  # listen backlog: a burst of connections waits for accept() rather than being reset

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], owner: ConnectionOwner) -> None:
        self._owner = owner
        self._conns: dict[socket.socket, Conn] = {}  # in accept order: the first still reading is the oldest
        self._conns_lock = threading.Lock()
        super().__init__(address, handler)

    def open_connections(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def conn(self, sock: socket.socket) -> Conn | None:
        with self._conns_lock:
            return self._conns.get(sock)

    def start_answering(self, sock: socket.socket) -> bool:
        """The request has been read: its connection may no longer be evicted (False if it was meanwhile)."""
        with self._conns_lock:
            c = self._conns.get(sock)
            if c is None or c.evicted:
                return False
            c.answering = True
            return True

    def process_request(self, request: Any, client_address: Any) -> None:
        owner = self._owner
        refuse = False
        with self._conns_lock:
            live = [c for c in self._conns.values() if not c.evicted]
            if len(live) >= owner.max_connections:
                # the oldest connection still sending its request: idle or trickling (a scraper sends at once)
                victim = next((c for c in live if not c.answering), None)
                if victim is None or len(self._conns) >= 2 * owner.max_connections:
                    refuse = True
                else:
                    victim.evicted = True
                    try:
                        victim.sock.shutdown(socket.SHUT_RDWR)  # wakes its handler: its read ends at once
                    except OSError:
                        pass
            if not refuse:
                self._conns[request] = Conn(request, time.monotonic() + owner.read_timeout)
        if refuse:
            owner._count("refused")
            try:  # a fresh socket's send buffer is empty: this never blocks the accepting thread
                request.send(
                    b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
                    b"Connection: close\r\n\r\n",
                    socket.MSG_DONTWAIT,
                )
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except Exception:  # no thread for it (the process is out of threads): close it, keep accepting
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def shutdown_request(self, request: Any) -> None:
        with self._conns_lock:
            self._conns.pop(request, None)
        super().shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with self._conns_lock:
            socks = list(self._conns)
        for sock in socks:  # each handler's read or write ends at once; its thread closes the socket
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver calls this from inside the except block: the exception is the current one
        self._owner._request_failed(client_address, sys.exc_info()[1])


class RequestReader(io.RawIOBase):
    """The socket's read side, under one deadline for the whole request (line and headers), however the
    client trickles it: each read waits at most the time left, and none starts once it has passed."""

    def __init__(self, server: BoundedServer, sock: socket.socket) -> None:
        self._server = server
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        conn = self._server.conn(self._sock)
        if conn is None:
            return 0
        left = conn.deadline - time.monotonic()
        if left <= 0 or conn.evicted:
            raise self._stalled(conn)
        self._sock.settimeout(left)
        try:
            n = self._sock.recv_into(buf)
        except TimeoutError:
            raise self._stalled(conn) from None
        except OSError:
            if conn.evicted:
                raise self._stalled(conn) from None
            raise
        if n == 0 and conn.evicted:
            raise self._stalled(conn)
        return n

    def _stalled(self, conn: Conn) -> TimeoutError:
        # BaseHTTPRequestHandler ends the connection quietly on a TimeoutError while it reads the request
        self._server._owner._count("slow")
        why = "evicted for a new connection" if conn.evicted else "read_timeout passed"
        return TimeoutError(f"the request was not complete: {why}")


class SocketWriter(io.BufferedIOBase):
    """The socket's write side: ``sendall`` under the socket's timeout (``write_timeout`` for the whole answer)."""

    def __init__(self, owner: ConnectionOwner, sock: socket.socket) -> None:
        self._owner = owner
        self._sock = sock

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        try:
            self._sock.sendall(b)
        except TimeoutError:
            # counted here: BaseHTTPRequestHandler ends the connection quietly on a TimeoutError
            self._owner._count("slow")
            raise
        with memoryview(b) as view:
            return view.nbytes
