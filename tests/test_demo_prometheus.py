"""A real Prometheus server scrapes the demo, and PromQL over its TTFT histogram returns data."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed (apt install prometheus)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _query(prom: str, promql: str) -> list[dict[str, Any]]:
    url = f"{prom}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_prometheus_scrapes_the_demo_and_promql_sees_ttft(tmp_path: Path) -> None:
    from perfsdk.demo.stack import start_demo

    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=512) as demo:
        base = demo.server.base_url
        for i in range(5):
            r = httpx.post(f"{base}/v1/completions", json={"prompt": f"req {i}", "max_tokens": 8, "ignore_eos": True})
            assert r.status_code == 200
        assert demo.monitor.flush(timeout=10.0)

        web_port = _free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  evaluation_interval: 1s\n"
            "scrape_configs:\n"
            "  - job_name: perfsdk-demo\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{demo.server.port}']\n"
        )
        assert PROMETHEUS is not None
        check = subprocess.run(
            [shutil.which("promtool") or "promtool", "check", "config", str(config)],
            check=False,
            capture_output=True,
            text=True,
        )
        assert check.returncode == 0, check.stdout + check.stderr
        log = (tmp_path / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{web_port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        prom = f"http://127.0.0.1:{web_port}"
        try:
            result: list[dict[str, Any]] = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    result = _query(prom, "sum(gen_ai_server_time_to_first_token_seconds_count)")
                except OSError:  # not listening yet
                    result = []
                if result and float(result[0]["value"][1]) >= 5:
                    break
                time.sleep(0.5)
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
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
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
