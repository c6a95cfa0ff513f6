"""``perfsdk sglang`` against SGLang's own forward-pass-metrics publisher (sglang 0.5.23, its own venv:
scripts/test_engine.sh sglang).

No GPU here, so no scheduler runs; the messages are SGLang's ``ForwardPassMetrics`` structs, encoded
and sent by SGLang's ``_FpmPublisherThread`` on the per-rank endpoints its scheduler binds, exactly as
a server started with ``--enable-forward-pass-metrics --forward-pass-metrics-ipc-name BASE`` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

fpm = pytest.importorskip("sglang.srt.observability.forward_pass_metrics",
                          reason="the SGLang suite runs in its own venv: bash scripts/test_engine.sh sglang")

from perfsdk import budget  # noqa: E402
from perfsdk.engines.sglang import FPM_VERSION, FpmSubscriber  # noqa: E402
from perfsdk.hardware import HardwareSpec  # noqa: E402
from perfsdk.model import ModelSpec  # noqa: E402
from perfsdk.testing import monitor_harness  # noqa: E402

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 1e15})


def test_perfsdk_reads_the_schema_version_sglang_writes() -> None:
    assert fpm.FPM_VERSION == FPM_VERSION


def scheduled(**kw: int) -> Any:
    return fpm.ScheduledRequestMetrics(**kw)


def publish_until_heard(pubs: list[Any], sub: FpmSubscriber) -> None:
    """ZMQ drops what a PUB sends before a SUB has joined: idle heartbeats until every rank is heard."""
    deadline = time.monotonic() + 20
    while len(sub._last_seq) < len(pubs) and time.monotonic() < deadline:
        for rank, pub in enumerate(pubs):
            pub.publish(fpm.ForwardPassMetrics(worker_id="w", dp_rank=rank))
        time.sleep(0.02)
    assert len(sub._last_seq) == len(pubs), "the subscriber never heard every rank"


def test_sglangs_publisher_to_perfsdk_steps(tmp_path: Any) -> None:
    base = f"ipc://{tmp_path}/fpm"
    with monitor_harness(model=MODEL, hardware=HW) as h:
        sub = FpmSubscriber(h.monitor, base, dp_size=2)
        pubs = [fpm._FpmPublisherThread(f"{base}.{r}", worker_id="w", dp_rank=r) for r in range(2)]
        try:
            publish_until_heard(pubs, sub)
            pubs[0].publish(fpm.ForwardPassMetrics(
                worker_id="w", dp_rank=0, wall_time=0.02,
                scheduled_requests=scheduled(num_decode_requests=8, sum_decode_kv_tokens=8000)))
            pubs[0].publish(fpm.ForwardPassMetrics(
                worker_id="w", dp_rank=0, wall_time=0.03,
                scheduled_requests=scheduled(num_prefill_requests=1, sum_prefill_tokens=256, num_decode_requests=7,
                                             sum_decode_kv_tokens=7000)))
            pubs[1].publish(fpm.ForwardPassMetrics(
                worker_id="w", dp_rank=1, wall_time=0.05,
                scheduled_requests=scheduled(num_prefill_requests=2, sum_prefill_tokens=1000)))
            deadline = time.monotonic() + 20
            while sub.steps < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            for p in pubs:
                p.shutdown()
            sub.close()
        assert h.monitor.flush(5)
        st = h.monitor.stats()
        assert (st["decode"]["steps"], st["mixed"]["steps"], st["prefill"]["steps"]) == (1, 1, 1)
        assert sub.lost == 0
        assert h.sum("perfsdk_step_bandwidth_utilization", phase="decode") == pytest.approx(
            budget.decode_step_bytes(MODEL, 8000) / (0.02 * 4.8e12))
        assert h.sum("perfsdk_step_flops_utilization", phase="mixed") == pytest.approx(
            budget.mixed_step_flops(MODEL, [256], 7, 7000) / (0.03 * 1e15))
        assert h.sum("perfsdk_step_flops_utilization", phase="prefill") == pytest.approx(
            budget.prefill_flops(MODEL, [500, 500]) / (0.05 * 1e15))
        assert st["internal_errors"] == 0


def test_perfsdk_sglang_serves_the_steps_on_metrics(tmp_path: Any) -> None:
    """The command a user runs beside ``sglang serve``, scraped over HTTP."""
    base = f"ipc://{tmp_path}/fpm"
    proc = subprocess.Popen(
        [sys.executable, "-m", "perfsdk.cli", "sglang", "--fpm", base, "--model", "llama-3-8b", "--hardware",
         "h100-sxm", "--port", "0", "--duration", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PERFSDK_OTEL": "0"})
    pub = fpm._FpmPublisherThread(f"{base}.0", worker_id="w", dp_rank=0)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/metrics)", line)
        assert url, line
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            pub.publish(fpm.ForwardPassMetrics(worker_id="w", dp_rank=0, wall_time=0.02,
                                               scheduled_requests=scheduled(num_decode_requests=8,
                                                                            sum_decode_kv_tokens=8000)))
            time.sleep(0.2)
            body = urllib.request.urlopen(url.group(1), timeout=5).read().decode()
            m = re.search(r'perfsdk_step_seconds_count\{[^}]*phase="decode"[^}]*\} (\S+)', body)
            if m and float(m.group(1)) >= 1:
                break
        else:
            pytest.fail(f"no decode step on /metrics:\n{body[-2000:]}")
        assert re.search(r'perfsdk_step_bandwidth_utilization_count\{[^}]*phase="decode"', body)
        assert 'model="llama-3-8b"' in body
    finally:
        pub.shutdown()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "steps from" in out
