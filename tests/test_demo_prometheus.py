"""A real Prometheus server scrapes the demo, and PromQL over its TTFT histogram returns data."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import PROMETHEUS, query, running_prometheus

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed (apt install prometheus)"),
]


def _query(prom: str, promql: str) -> list[dict[str, Any]]:
    body = query(prom, promql)
    if body.get("status") != "success":  # e.g. a 503 while Prometheus starts: the wait loop asks again
        raise ValueError(f"Prometheus answered {body}")
    return list(body["data"]["result"])


def test_prometheus_scrapes_the_demo_and_promql_sees_ttft(tmp_path: Path) -> None:
    from perfsdk.demo.stack import start_demo

    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=512) as demo:
        base = demo.server.base_url
        for i in range(5):
            r = httpx.post(f"{base}/v1/completions", json={"prompt": f"req {i}", "max_tokens": 8, "ignore_eos": True})
            assert r.status_code == 200
        assert demo.monitor.flush(timeout=10.0)

        with running_prometheus(tmp_path, job="perfsdk-demo", target=f"127.0.0.1:{demo.server.port}") as server:
            prom, proc = server.url, server.proc
            result: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    result = _query(prom, "sum(gen_ai_server_time_to_first_token_seconds_count)")
                except (OSError, ValueError):  # not listening yet, or not ready (a 503 with a plain-text body)
                    result = []
                if result and float(result[0]["value"][1]) >= 5:
                    break
                time.sleep(0.5)
            assert proc.poll() is None, server.log.read_text()[-2000:]
            assert result, "Prometheus never stored a TTFT sample from the demo"
            assert float(result[0]["value"][1]) == 5

            up = _query(prom, 'up{job="perfsdk-demo"}')
            assert up and up[0]["value"][1] == "1"
            quantile = _query(
                prom,
                f"histogram_quantile(0.5, sum by (le) (gen_ai_server_time_to_first_token_seconds_bucket"
                f'{{model="{demo.model_name}"}}))',
            )
            assert quantile, "histogram_quantile over the TTFT buckets returned nothing"
            assert float(quantile[0]["value"][1]) > 0
