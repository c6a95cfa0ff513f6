"""A real Prometheus server for the tests: configured, checked with promtool, started and stopped.

::

    with running_prometheus(tmp_path, job="llm", target=f"127.0.0.1:{port}", rule_files=[rules]) as prom:
        query(prom.url, "up")["data"]["result"]
    # several targets of one job (one per rank): targets=[f"127.0.0.1:{p0}", f"127.0.0.1:{p1}"]
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROMETHEUS", "PROMTOOL", "RunningPrometheus", "free_port", "free_ports", "query", "running_prometheus"]

PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> int:
    """A port P with P .. P+n-1 all free just now (for processes that serve on consecutive ports)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports on 127.0.0.1")


def query(url: str, promql: str) -> dict[str, Any]:
    """The API's answer to an instant query (a bad query answers 400 with the parser's message; a server not
    ready yet, a 503 in plain text, comes back as an error answer too)."""
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(full, timeout=5) as resp:
            return dict(json.load(resp))
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            return dict(json.loads(body))
        except ValueError:  # not ready yet: a 503 with a plain-text body
            return {"status": "error", "errorType": f"http {e.code}", "error": body.strip()}


@dataclass
class RunningPrometheus:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


@contextmanager
def running_prometheus(
    tmp_path: Path, *, job: str, target: str | None = None, targets: Sequence[str] = (), rule_files: Sequence[Path] = ()
) -> Iterator[RunningPrometheus]:
    """Prometheus scraping *target* (or each of *targets*) every second, rules evaluated every second."""
    assert PROMETHEUS is not None and PROMTOOL is not None
    listed = [*([target] if target else []), *targets]
    assert listed, "no target to scrape"
    for rules in rule_files:
        shutil.copy(rules, tmp_path / rules.name)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        + (f"rule_files: [{', '.join(r.name for r in rule_files)}]\n" if rule_files else "")
        + f"scrape_configs:\n  - job_name: {job}\n"
        f"    static_configs:\n      - targets: [{', '.join(repr(t) for t in listed)}]\n"
    )
    check = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    web = free_port()
    log_path = tmp_path / "prometheus.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            yield RunningPrometheus(f"http://127.0.0.1:{web}", proc, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
