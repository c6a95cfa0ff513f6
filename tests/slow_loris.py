"""A slow-loris client, run as its own process by tests/test_metrics_server.py.

    python tests/slow_loris.py PORT IDLE DRIPS

Opens IDLE connections at once, then keeps that many open, sending nothing (reopening each one the
server closes, as an attacker does), and DRIPS connections that send a valid request one byte at a
time, one byte every 20 ms (their request is 2 kB: 40 s to send it in full). Prints "started" once the
first IDLE are open, runs until its stdin closes, then prints one JSON line: ``idle_opened``,
``idle_closed`` (idle connections the server closed), ``drips_cut`` (dripping connections the server
closed before the request was complete) and ``drips_completed`` (ones that got their whole request in).
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time

HOST = "127.0.0.1"
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 2000 + b"\r\n\r\n"


def main() -> int:
    port, n_idle, n_drips = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    stop = threading.Event()
    counts = {"idle_opened": 0, "idle_closed": 0, "drips_cut": 0, "drips_completed": 0}
    lock = threading.Lock()

    def bump(key: str) -> None:
        with lock:
            counts[key] += 1

    def connect() -> socket.socket | None:
        try:
            return socket.create_connection((HOST, port), timeout=5)
        except OSError:
            return None

    opened = threading.Event()

    def idle() -> None:
        socks: list[socket.socket] = []
        for _ in range(n_idle):  # all at once first
            s = connect()
            if s is not None:
                socks.append(s)
                bump("idle_opened")
        opened.set()
        while not stop.is_set():
            while len(socks) < n_idle and not stop.is_set():
                s = connect()
                if s is None:
                    break
                socks.append(s)
                bump("idle_opened")
                time.sleep(0.005)  # a steady stream of new connections, not one burst
            readable, _, _ = select.select(socks, [], [], 0.05) if socks else ([], [], [])
            for s in readable:  # the only thing the server can say to an idle client is goodbye
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    bump("idle_closed")
                    socks.remove(s)
                    s.close()
        for s in socks:
            s.close()

    def drip() -> None:
        while not stop.is_set():
            s = connect()
            if s is None:
                time.sleep(0.05)
                continue
            sent = 0
            try:
                while sent < len(REQUEST) and not stop.is_set():
                    s.send(REQUEST[sent : sent + 1])
                    sent += 1
                    time.sleep(0.02)
                    # the server hung up: an EOF or a reset is readable
                    if select.select([s], [], [], 0)[0] and not s.recv(4096):
                        raise ConnectionResetError("closed by the server")
            except OSError:
                bump("drips_cut")
            else:
                if sent == len(REQUEST):
                    bump("drips_completed")
            finally:
                s.close()

    threads = [threading.Thread(target=idle)] + [threading.Thread(target=drip) for _ in range(n_drips)]
    for t in threads:
        t.start()
    opened.wait()
    print("started", flush=True)
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
