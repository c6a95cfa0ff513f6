"""What the engine suites' server scripts share (``vllm_tp_server.py``, ``sglang_server.py``).

In a script: ``serve_on_loopback(app)`` serves the engine's own ``/metrics`` app on a free loopback port.
In a test: ``running_script(script, tmp, env, startup_s)`` starts the script in a fresh process, waits for
the one JSON line it prints when ready, yields it, and closes the script's stdin (its signal to stop) after.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["running_script", "serve_on_loopback"]


def serve_on_loopback(app: Any) -> tuple[Any, threading.Thread, str]:
    """Serve an ASGI app with uvicorn on a free 127.0.0.1 port: (server, its thread, the /metrics URL)."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}/metrics"


@contextmanager
def running_script(script: Path, tmp: Path, env: Mapping[str, str], startup_s: float) -> Iterator[dict[str, Any]]:
    """Run ``python SCRIPT TMP`` until it prints its JSON line; yield that line; stop it after."""
    out = tmp / "stdout"
    with out.open("w") as stdout, (tmp / "stderr").open("w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp)],
            stdin=subprocess.PIPE,
            stdout=stdout,
            stderr=stderr,
            text=True,
            env=dict(env),
        )
    try:
        deadline = time.monotonic() + startup_s
        info = None
        while info is None and time.monotonic() < deadline and proc.poll() is None:
            info = next((json.loads(x) for x in out.read_text().splitlines() if x.startswith("{")), None)
            time.sleep(0.2)
        assert info is not None, f"{script.name} did not start:\n{(tmp / 'stderr').read_text()[-3000:]}"
        yield info
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
