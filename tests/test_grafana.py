"""The Grafana dashboard and the Prometheus rules in integrations/grafana, checked with the real tools.

- ``promtool check rules`` and ``promtool test rules`` (the alerts fire on the histories they are for);
- the committed dashboard JSON is what ``build_dashboard.py`` generates, and is well formed;
- every panel query, and every recording rule, runs on a real Prometheus server that scrapes a real
  Monitor's ``/metrics`` while steps and requests go through it — and the core panels return data.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_server import PROMETHEUS, PROMTOOL, query, running_prometheus

import perfsdk
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec

GRAFANA = Path(__file__).resolve().parent.parent / "integrations" / "grafana"
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (apt install prometheus)")


def _dashboard() -> dict[str, Any]:
    return dict(json.loads((GRAFANA / "perfsdk-dashboard.json").read_text()))


def _targets(dash: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


@needs_promtool
def test_rules_pass_promtool_check_and_unit_tests() -> None:
    assert PROMTOOL is not None
    check = subprocess.run(
        [PROMTOOL, "check", "rules", "perfsdk-rules.yml"], cwd=GRAFANA, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run(
        [PROMTOOL, "test", "rules", "perfsdk-rules.test.yml"], cwd=GRAFANA, capture_output=True, text=True, check=False
    )
    assert unit.returncode == 0, unit.stdout + unit.stderr
    assert "SUCCESS" in unit.stdout


def test_every_alert_has_a_promtool_case_that_fires_it_and_one_that_does_not() -> None:
    # before: PerfsdkTTFTHigh and PerfsdkStraggler were only ever tested firing
    alerts = re.findall(r"^\s*- alert: (\w+)$", (GRAFANA / "perfsdk-rules.yml").read_text(), re.MULTILINE)
    cases = re.findall(
        r"^\s*alertname: (\w+)\n\s*exp_alerts:(.*)$", (GRAFANA / "perfsdk-rules.test.yml").read_text(), re.MULTILINE
    )
    assert len(alerts) >= 8 and cases
    fires = {name for name, exp in cases if exp.strip() != "[]"}
    quiet = {name for name, exp in cases if exp.strip() == "[]"}
    assert not set(alerts) - fires, f"never tested firing: {sorted(set(alerts) - fires)}"
    assert not set(alerts) - quiet, f"never tested quiet: {sorted(set(alerts) - quiet)}"


@needs_promtool
def test_the_targets_up_panel_shows_a_dead_target_for_as_long_as_it_is_down(tmp_path: Path) -> None:
    # before: present_over_time(...[1h]) dropped the dead target from the panel an hour after its last sample.
    # The panel's own query, evaluated by promtool with the rules loaded over a job whose only target dies
    # at 11m and stays down for three hours.
    assert PROMTOOL is not None
    (panel,) = [p for p in _dashboard()["panels"] if p.get("title") == "perfsdk targets up"]
    (expr,) = [t["expr"] for t in panel["targets"]]
    expr = expr.replace("$instance", ".*")
    target = '{job="solo",instance="gpu-7:9400"}'

    def at(minutes: int, value: int | None) -> dict[str, Any]:
        samples = [] if value is None else [{"labels": target, "value": value}]
        return {"expr": expr, "eval_time": f"{minutes}m", "exp_samples": samples}

    test = {  # JSON is YAML
        "rule_files": [str(GRAFANA / "perfsdk-rules.yml")],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": "up" + target, "values": "1x10 0x180"},
                    {"series": "perfsdk_dropped_records_total" + target, "values": "0x10"},
                    {"series": 'up{job="node",instance="gpu-7:9100"}', "values": "0x190"},  # not perfsdk's
                ],
                "promql_expr_test": [at(5, 1), at(20, 0), at(75, 0), at(180, 0)],
            }
        ],
    }
    path = tmp_path / "panel.test.yml"
    path.write_text(json.dumps(test))
    unit = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert unit.returncode == 0, unit.stdout + unit.stderr


@pytest.mark.skipif(sys.version_info < (3, 11), reason="grafana-foundation-sdk, which builds it, needs Python 3.11")
def test_the_committed_dashboard_is_what_the_generator_builds() -> None:
    run = subprocess.run(
        [sys.executable, str(GRAFANA / "build_dashboard.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr


def test_dashboard_is_well_formed() -> None:
    dash = _dashboard()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "model", "instance"}
    for p in dash["panels"]:
        pos = p["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, p["title"]
        if p["type"] not in ("row",):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    used = set()
    for _, expr in _targets(dash):
        used |= set(re.findall(r"\$(\w+)", expr))
    assert used <= variables | {"__rate_interval"}, used
    # the metric names queried are exactly ones perfsdk exports (or their histogram series)
    exported = {
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "gen_ai_server_request_duration_seconds",
        "perfsdk_inter_token_latency_seconds",
        "perfsdk_request_queue_seconds",
        "perfsdk_step_seconds",
        "perfsdk_step_bandwidth_utilization",
        "perfsdk_step_flops_utilization",
        "perfsdk_step_bytes_total",
        "perfsdk_step_flops_total",
        "perfsdk_step_tokens_total",
        "perfsdk_hardware_peak_bandwidth_bytes",
        "perfsdk_hardware_peak_flops",
        "perfsdk_dropped_records_total",
        "perfsdk_internal_errors_total",
        "perfsdk_profile_gpu_busy_fraction",
        "perfsdk_profile_communication_fraction",
        "perfsdk_requests_total",
    }
    for title, expr in _targets(dash):
        for name in re.findall(r"\b((?:gen_ai|perfsdk)_[a-z_]+)", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in exported or base in exported, (title, name)


# ---------------------------------------------------------------------------------------------- live
MODEL = ModelSpec.named("llama-3-8b")
# chosen so that a 2 ms decode step reads at ~50 % of the bandwidth and a 10 ms prefill computes at ~50 %
HW = HardwareSpec(
    name="grafana-test-gpu",
    memory_bandwidth=MODEL.weight_bytes / 0.002 / 0.5,
    flops={"bf16": 2 * MODEL.params * 256 / 0.010 / 0.5},
)


def _traffic(mon: perfsdk.Monitor, stop: threading.Event) -> None:
    """Requests through prefill and decode steps, until told to stop."""
    while not stop.is_set():
        req = mon.request(prompt_tokens=256)
        req.scheduled()
        with mon.prefill(tokens=256, batch=1):
            time.sleep(0.010)
        req.tokens(1)
        for _ in range(8):
            with mon.decode(batch=1, context_tokens=300):
                time.sleep(0.002)
            req.tokens(1)
        req.finish("length")


@pytest.fixture
def prometheus_on_a_monitor(tmp_path: Path) -> Iterator[tuple[str, perfsdk.Monitor]]:
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("the prometheus binary is not installed (apt install prometheus)")
    mon = perfsdk.Monitor(
        model=MODEL,
        hardware=HW,
        registry=CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing="host",
        model_name="grafana-test",
    )
    server = mon.serve_metrics(port=0)
    stop = threading.Event()
    worker = threading.Thread(target=_traffic, args=(mon, stop), daemon=True)
    worker.start()
    try:
        with running_prometheus(
            tmp_path, job="llm", target=f"127.0.0.1:{server.port}", rule_files=[GRAFANA / "perfsdk-rules.yml"]
        ) as prom:
            yield prom.url, mon
    finally:
        stop.set()
        worker.join(10)
        mon.close()


@pytest.mark.slow
def test_every_panel_query_and_recording_rule_runs_on_a_real_prometheus(
    prometheus_on_a_monitor: tuple[str, perfsdk.Monitor],
) -> None:
    prom, _ = prometheus_on_a_monitor
    # wait until the recording rules have been evaluated over a few scrapes (a 10 s rate then has points)
    start = time.monotonic()
    ready = False
    while time.monotonic() < start + 90:
        try:
            got = query(prom, "perfsdk:ttft_seconds:p99_5m")
        except OSError:  # not listening yet
            got = {}
        if got.get("data", {}).get("result") and time.monotonic() > start + 5:
            ready = True
            break
        time.sleep(0.5)
    assert ready, "Prometheus never evaluated the recording rules over the Monitor's metrics"

    def run(expr: str) -> list[dict[str, Any]]:
        promql = expr.replace("$__rate_interval", "10s").replace("$model", ".*").replace("$instance", ".*")
        body = query(prom, promql)
        assert body.get("status") == "success", (expr, body)
        return list(body["data"]["result"])

    results = {title + " | " + expr: run(expr) for title, expr in _targets(_dashboard())}
    # the panels that must show data for a server with traffic (the rest may be empty: no profile taken,
    # no drops, no errors)
    must = (
        "Decode MBU",
        "Prefill MFU",
        "Decode step time p50",
        "Step time by phase",
        "Tokens per second",
        "Time to first token",
        "Time per output token",
        "Queue time",
        "Requests per second",
        "Request duration",
        "How requests ended",
        "Decode MBU by rank",
        "Decode step time by rank",
        "perfsdk targets up",
        "Decode steps per second by rank",
    )
    for key, res in results.items():
        if key.startswith(must) and "mixed" not in key:
            assert res, f"no data for {key}"
    # the exact MBU panel agrees with the Monitor's own per-step MBU (2 ms steps at ~50 % by construction;
    # host sleeps overshoot, so a little under)
    mbu = float(run(_targets(_dashboard())[0][1])[0]["value"][1])
    assert 0.2 < mbu <= 0.5
    for rule in (
        "perfsdk:decode_mbu:mean5m",
        "perfsdk:prefill_mfu:mean5m",
        "perfsdk:decode_mbu:ratio_rate5m",
        "perfsdk:decode_mbu:fleet_ratio_rate5m",
        "perfsdk:decode_step_seconds:mean5m",
        "perfsdk:decode_steps:rate5m",
        "perfsdk:prefill_steps:rate5m",
        "perfsdk:ttft_seconds:p99_5m",
        "perfsdk:target:serves_perfsdk",
    ):
        res = run(rule)
        assert res and float(res[0]["value"][1]) > 0, rule
    # requests finish, none fails: the error share is there, and 0
    res = run("perfsdk:request_errors:ratio_rate5m")
    assert res and float(res[0]["value"][1]) == 0
    # the alert rules loaded and none fires on a healthy server
    rules = json.load(urllib.request.urlopen(f"{prom}/api/v1/rules", timeout=5))
    alerts = [r for g in rules["data"]["groups"] for r in g["rules"] if r["type"] == "alerting"]
    assert {a["name"] for a in alerts} == {
        "PerfsdkDecodeMBUDropped",
        "PerfsdkPrefillMFUDropped",
        "PerfsdkTTFTHigh",
        "PerfsdkImpossibleUtilization",
        "PerfsdkDroppingRecords",
        "PerfsdkInternalErrors",
        "PerfsdkRankDown",
        "PerfsdkStraggler",
        "PerfsdkRequestErrors",
    }
    # one process: no rank label, and no profile taken yet, so no communication share exported (a 0 there
    # would make this the rank that waits for nobody)
    assert run("perfsdk_profile_communication_fraction") == []
    assert all(a["health"] == "ok" for a in alerts), alerts
    assert not [a for a in alerts if a["state"] == "firing"]
