"""Build ``perfsdk-dashboard.json``, the Grafana dashboard for perfsdk's metrics.

    python integrations/grafana/build_dashboard.py          # rewrite the JSON next to this file
    python integrations/grafana/build_dashboard.py --check  # exit 1 if the JSON is out of date

The JSON is generated so that every panel's PromQL lives in one readable place, and so that a test
(``tests/test_grafana.py``) can run each query against a real Prometheus scraping a real Monitor.
Import the JSON in Grafana (Dashboards → New → Import) and pick a Prometheus data source. Queries use
only perfsdk's raw metrics, so the dashboard works without the recording rules in
``perfsdk-rules.yml``; the alerts need those rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "perfsdk-dashboard.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'model=~"$model", instance=~"$instance"'  # every query is filtered by the two variables
RI = "$__rate_interval"


def _by(phase: str | None = None) -> str:
    extra = f', phase="{phase}"' if phase else ""
    return "{" + SEL + extra + "}"


def quantile(q: float, metric: str, by: str = "", phase: str | None = None) -> str:
    group = f"le{', ' + by if by else ''}"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{_by(phase)}[{RI}])))"


def mean(metric: str, phase: str) -> str:
    s = f"sum by (job, instance, model) (rate({metric}_sum{_by(phase)}[{RI}]))"
    c = f"sum by (job, instance, model) (rate({metric}_count{_by(phase)}[{RI}]))"
    return f"{s}\n/\n{c}"


# Time-weighted decode MBU from the counters: bytes the timed steps had to read / their device seconds /
# the process's peak bandwidth (joined on the scrape target, which exports both).
DECODE_MBU = (
    f'sum by (job, instance, model) (rate(perfsdk_step_bytes_total{_by("decode")}[{RI}]))\n'
    f'/\nsum by (job, instance, model) (rate(perfsdk_step_seconds_sum{_by("decode")}[{RI}]))\n'
    "/ on (job, instance) group_left\nmax by (job, instance) (perfsdk_hardware_peak_bandwidth_bytes)"
)


class Layout:
    """Places panels left to right in rows of 24 grid columns."""

    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []})
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int = 8) -> None:
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.panels.append(panel)
        self.x += w
        self.row_h = max(self.row_h, h)

    def _newline(self) -> None:
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0

    def _id(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i


def timeseries(title: str, targets: list[tuple[str, str]], unit: str, description: str,
               max_: float | None = None) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "min": 0, "custom": {"lineWidth": 1, "fillOpacity": 10}}
    if max_ is not None:
        defaults["max"] = max_
    return {
        "type": "timeseries", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [{"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
                    for i, (expr, legend) in enumerate(targets)],
    }


def stat(title: str, expr: str, unit: str, description: str, thresholds: list[tuple[float | None, str]]
         ) -> dict[str, Any]:
    return {
        "type": "stat", "title": title, "description": description, "datasource": DS,
        "fieldConfig": {"defaults": {
            "unit": unit,
            "thresholds": {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in thresholds]},
        }, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "background", "graphMode": "area", "textMode": "value_and_name"},
        "targets": [{"datasource": DS, "expr": expr, "legendFormat": "{{model}} {{instance}}", "refId": "A"}],
    }


def build() -> dict[str, Any]:
    g = Layout()
    g.row("Against the hardware (MBU: bytes over bandwidth; MFU: FLOPs over dense peak)")
    util = [(None, "red"), (0.3, "orange"), (0.5, "green")]
    g.add(stat("Decode MBU", DECODE_MBU, "percentunit",
               "Bytes decode steps had to read (weights + KV cache) per second of device time, over the GPU's "
               "peak bandwidth. The seeds' MBU, time-weighted, exact (from counters).", util), w=6, h=6)
    g.add(stat("Prefill MFU", mean("perfsdk_step_flops_utilization", "prefill"), "percentunit",
               "Mean per-step MFU of prefill steps: FLOPs over device time over the dense peak of the compute "
               "dtype.", util), w=6, h=6)
    g.add(stat("Decode step time p50", quantile(0.5, "perfsdk_step_seconds", phase="decode"), "s",
               "Device time of one decode step (CUDA events), median.", [(None, "blue")]), w=6, h=6)
    g.add(stat("Last profile: GPU busy", f"max by (model, instance) (perfsdk_profile_gpu_busy_fraction{{{SEL}}})",
               "percentunit", "GPU busy fraction in the last profiler-window capture (POST /profile).",
               util), w=6, h=6)
    g.add(timeseries("Decode MBU", [(DECODE_MBU, "{{model}} {{instance}} (time-weighted)"),
                                    (quantile(0.5, "perfsdk_step_bandwidth_utilization", "model", "decode"),
                                     "{{model}} per-step p50"),
                                    (quantile(0.1, "perfsdk_step_bandwidth_utilization", "model", "decode"),
                                     "{{model}} per-step p10")],
                     "percentunit", "Decode memory-bandwidth utilisation. A fall here with steady traffic is "
                     "what the PerfsdkDecodeMBUDropped alert fires on.", 1), w=12)
    g.add(timeseries("Prefill MFU", [(mean("perfsdk_step_flops_utilization", "prefill"), "{{model}} {{instance}}"),
                                     (mean("perfsdk_step_flops_utilization", "mixed"),
                                      "{{model}} {{instance}} mixed steps")],
                     "percentunit", "Prefill (and chunked-prefill mixed-step) FLOPs utilisation.", 1), w=12)
    g.add(timeseries("Step time by phase", [(quantile(0.5, "perfsdk_step_seconds", "phase"), "p50 {{phase}}"),
                                            (quantile(0.99, "perfsdk_step_seconds", "phase"), "p99 {{phase}}")],
                     "s", "Device time of one step, per phase."), w=12)
    g.add(timeseries("Tokens per second by phase",
                     [(f"sum by (phase) (rate(perfsdk_step_tokens_total{{{SEL}}}[{RI}]))", "{{phase}}")],
                     "short", "Prompt tokens (prefill) and sequences stepped (decode) per second."), w=12)

    g.row("What users feel")
    g.add(timeseries("Time to first token", [
        (quantile(0.5, "gen_ai_server_time_to_first_token_seconds"), "p50"),
        (quantile(0.9, "gen_ai_server_time_to_first_token_seconds"), "p90"),
        (quantile(0.99, "gen_ai_server_time_to_first_token_seconds"), "p99")],
        "s", "Arrival to first token (GenAI semconv buckets)."), w=8)
    g.add(timeseries("Time per output token", [
        (quantile(0.5, "gen_ai_server_time_per_output_token_seconds"), "TPOT p50"),
        (quantile(0.99, "gen_ai_server_time_per_output_token_seconds"), "TPOT p99"),
        (quantile(0.99, "perfsdk_inter_token_latency_seconds"), "inter-token p99")],
        "s", "Per request: (end to end - TTFT) / (tokens - 1); and every gap between tokens."), w=8)
    g.add(timeseries("Queue time", [
        (quantile(0.5, "perfsdk_request_queue_seconds"), "p50"),
        (quantile(0.99, "perfsdk_request_queue_seconds"), "p99")],
        "s", "Arrival to scheduled: waiting for a slot in the batch."), w=8)
    g.add(timeseries("Requests per second", [
        (f"sum by (model) (rate(gen_ai_server_request_duration_seconds_count{{{SEL}}}[{RI}]))", "{{model}}")],
        "reqps", "Finished requests per second."), w=12)
    g.add(timeseries("Request duration", [
        (quantile(0.5, "gen_ai_server_request_duration_seconds"), "p50"),
        (quantile(0.99, "gen_ai_server_request_duration_seconds"), "p99")],
        "s", "Arrival to finish."), w=12)

    g.row("perfsdk itself")
    g.add(timeseries("Dropped records and internal errors", [
        (f"sum by (instance) (rate(perfsdk_dropped_records_total{{instance=~\"$instance\"}}[{RI}]))",
         "dropped/s {{instance}}"),
        (f"sum by (instance) (rate(perfsdk_internal_errors_total{{instance=~\"$instance\"}}[{RI}]))",
         "errors/s {{instance}}")],
        "short", "Both should be zero. Drops mean the collector fell behind (the server never waits); errors "
        "were caught inside perfsdk and logged once."), w=12)
    g.add({"type": "alertlist", "title": "perfsdk alerts", "datasource": DS,
           "description": "Alerts from perfsdk-rules.yml (Prometheus data-source alerts).",
           "options": {"alertName": "Perfsdk", "dashboardAlerts": False, "maxItems": 20,
                       "stateFilter": {"firing": True, "pending": True, "normal": False},
                       "groupMode": "default", "sortOrder": 1, "viewMode": "list",
                       "alertInstanceLabelFilter": "", "showInstances": True}}, w=12)

    variables = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "options": []},
        {"name": "model", "label": "model", "type": "query", "datasource": DS,
         "query": {"query": "label_values(perfsdk_step_seconds_count, model)", "refId": "model"},
         "definition": "label_values(perfsdk_step_seconds_count, model)", "refresh": 2, "includeAll": True,
         "multi": True, "allValue": ".*", "current": {}, "options": [], "sort": 1},
        {"name": "instance", "label": "instance", "type": "query", "datasource": DS,
         "query": {"query": 'label_values(perfsdk_step_seconds_count{model=~"$model"}, instance)', "refId": "instance"},
         "definition": 'label_values(perfsdk_step_seconds_count{model=~"$model"}, instance)', "refresh": 2,
         "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "options": [], "sort": 1},
    ]
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": "", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "title": "perfsdk: LLM serving against the hardware",
        "uid": "perfsdk-serving",
        "description": "TTFT, TPOT, queue time, step time, decode MBU and prefill MFU from perfsdk "
                       "(integrations/grafana/README.md in the perfsdk repository).",
        "tags": ["perfsdk", "llm", "inference"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "browser",
        "templating": {"list": variables},
        "annotations": {"list": []},
        "panels": g.panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs from the generator")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
