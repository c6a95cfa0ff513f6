"""Build ``perfsdk-dashboard.json``, the Grafana dashboard for perfsdk's metrics.

    python integrations/grafana/build_dashboard.py          # rewrite the JSON next to this file
    python integrations/grafana/build_dashboard.py --check  # exit 1 if the JSON is out of date

The dashboard is built with Grafana's own typed builders (``grafana-foundation-sdk``, in perfsdk's
``dev`` extra, pinned to its builders for Grafana 10.1 — the oldest schema the dashboard imports into;
newer Grafana migrates it on import). The builders' types are Grafana's dashboard schema, so mypy
checks every panel, option and variable here against it. Every panel's PromQL lives in one readable
place, and ``tests/test_grafana.py`` runs each query against a real Prometheus scraping a real
Monitor (``tests/test_tensor_parallel.py`` the per-rank ones, against two real ranks).

Import the JSON in Grafana (Dashboards → New → Import) and pick a Prometheus data source. Queries use
only perfsdk's raw metrics (and ``up``), so the dashboard works without the recording rules in
``perfsdk-rules.yml``; the alerts need those rules (and the targets-up panel reads one of them when it is
there: ``perfsdk:target:serves_perfsdk``, which remembers a dead target for as long as it is down).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

HERE = Path(__file__).resolve().parent
OUT = HERE / "perfsdk-dashboard.json"

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
SEL = 'model=~"$model", instance=~"$instance"'  # every query is filtered by the two variables
RI = "$__rate_interval"


def _by(phase: str | None = None) -> str:
    extra = f', phase="{phase}"' if phase else ""
    return "{" + SEL + extra + "}"


def quantile(q: float, metric: str, by: str = "", phase: str | None = None) -> str:
    group = f"le{', ' + by if by else ''}"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{_by(phase)}[{RI}])))"


def mean(metric: str, phase: str, by: str = "job, instance, model") -> str:
    s = f"sum by ({by}) (rate({metric}_sum{_by(phase)}[{RI}]))"
    c = f"sum by ({by}) (rate({metric}_count{_by(phase)}[{RI}]))"
    return f"{s}\n/\n{c}"


# Time-weighted decode MBU from the counters: bytes the timed steps had to read / their device seconds /
# the process's peak bandwidth (joined on the scrape target, which exports both).
DECODE_MBU = (
    f"sum by (job, instance, model) (rate(perfsdk_step_bytes_total{_by('decode')}[{RI}]))\n"
    f"/\nsum by (job, instance, model) (rate(perfsdk_step_seconds_sum{_by('decode')}[{RI}]))\n"
    "/ on (job, instance) group_left\nmax by (job, instance) (perfsdk_hardware_peak_bandwidth_bytes)"
)
# The same per rank (tensor parallelism: each rank's shard of the bytes, its own GPU's peak).
RANK_DECODE_MBU = (
    f"sum by (job, instance, rank, model) (rate(perfsdk_step_bytes_total{_by('decode')}[{RI}]))\n"
    f"/\nsum by (job, instance, rank, model) (rate(perfsdk_step_seconds_sum{_by('decode')}[{RI}]))\n"
    "/ on (job, instance, rank) group_left\nmax by (job, instance, rank) (perfsdk_hardware_peak_bandwidth_bytes)"
)
# Every rank of a job and model together: all bytes over all GPU-seconds at each GPU's peak.
FLEET_DECODE_MBU = (
    f"sum by (job, model) (rate(perfsdk_step_bytes_total{_by('decode')}[{RI}]))\n"
    f"/\nsum by (job, model) (\n  rate(perfsdk_step_seconds_sum{_by('decode')}[{RI}])\n"
    "  * on (job, instance, rank) group_left\n"
    "  max by (job, instance, rank) (perfsdk_hardware_peak_bandwidth_bytes))"
)
# Scrape targets that serve perfsdk metrics, 1 up and 0 down: a rank that stopped shows as 0 (with one
# /metrics port per rank; a rank dead behind PROMETHEUS_MULTIPROC_DIR is not seen) for as long as it is
# down, from the rules' perfsdk:target:serves_perfsdk (which remembers a target while it is discovered, as
# PerfsdkRankDown does). Without the rules loaded, for an hour after its last perfsdk sample.
TARGETS_UP = (
    'max by (job, instance) (up{instance=~"$instance"})\n'
    "and on (job, instance) (\n  perfsdk:target:serves_perfsdk\n"
    "  or max by (job, instance) (present_over_time(perfsdk_dropped_records_total[1h]))\n)"
)
# Each rank's share of its step in collectives (last profile), beyond the rank that spends least there.
COLLECTIVE_WAIT = (
    f"perfsdk_profile_communication_fraction{{{SEL}}}\n- on (job, model) group_left\n"
    f"min by (job, model) (perfsdk_profile_communication_fraction{{{SEL}}})"
)

UTIL_THRESHOLDS = ((None, "red"), (0.3, "orange"), (0.5, "green"))


def _targets(targets: Sequence[tuple[str, str]]) -> list[prometheus.Dataquery]:
    return [
        prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(DS)
        for i, (expr, legend) in enumerate(targets)
    ]


def ts(
    title: str,
    targets: Sequence[tuple[str, str]],
    unit: str,
    description: str,
    *,
    w: int,
    h: int = 8,
    max_: float | None = None,
) -> timeseries.Panel:
    p = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .min(0)
        .line_width(1)
        .fill_opacity(10)
        .span(w)
        .height(h)
        .legend(
            cb.VizLegendOptions()
            .display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM)
            .show_legend(True)
        )
        .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.NONE))
        .targets(_targets(targets))  # type: ignore[arg-type]  # Builder is invariant; a Dataquery builder is one
    )
    return p.max(max_) if max_ is not None else p


def single(
    title: str,
    expr: str,
    unit: str,
    description: str,
    thresholds: Sequence[tuple[float | None, str]],
    *,
    w: int = 6,
    h: int = 6,
    legend: str = "{{model}} {{instance}}",
) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .span(w)
        .height(h)
        .thresholds(
            dashboard.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(value=v, color=c) for v, c in thresholds])
        )
        .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(cm.BigValueColorMode.BACKGROUND)
        .graph_mode(cm.BigValueGraphMode.AREA)
        .text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
        .targets(_targets([(expr, legend)]))  # type: ignore[arg-type]
    )


def alert_list(*, w: int, h: int = 8) -> dashboard.Panel:
    # the 10.1 builders have no typed alert-list panel: a plain panel of that type with its options
    return (
        dashboard.Panel()
        .type("alertlist")
        .title("perfsdk alerts")
        .datasource(DS)
        .span(w)
        .height(h)
        .description("Alerts from perfsdk-rules.yml (Prometheus data-source alerts).")
        .options(
            {
                "alertName": "Perfsdk",
                "dashboardAlerts": False,
                "maxItems": 20,
                "stateFilter": {"firing": True, "pending": True, "normal": False},
                "groupMode": "default",
                "sortOrder": 1,
                "viewMode": "list",
                "alertInstanceLabelFilter": "",
                "showInstances": True,
            }
        )
    )


def build() -> dm.Dashboard:
    util = UTIL_THRESHOLDS
    panels: list[tuple[str, list[Any]]] = [
        (
            "Against the hardware (MBU: bytes over bandwidth; MFU: FLOPs over dense peak)",
            [
                single(
                    "Decode MBU",
                    DECODE_MBU,
                    "percentunit",
                    "Bytes decode steps had to read (weights + KV cache) per second of device time, over the GPU's "
                    "peak bandwidth. The seeds' MBU, time-weighted, exact (from counters).",
                    util,
                ),
                single(
                    "Prefill MFU",
                    mean("perfsdk_step_flops_utilization", "prefill"),
                    "percentunit",
                    "Mean per-step MFU of prefill steps: FLOPs over device time over the dense peak of the compute "
                    "dtype.",
                    util,
                ),
                single(
                    "Decode step time p50",
                    quantile(0.5, "perfsdk_step_seconds", phase="decode"),
                    "s",
                    "Device time of one decode step (CUDA events), median.",
                    [(None, "blue")],
                ),
                single(
                    "Last profile: GPU busy",
                    f"max by (model, instance) (perfsdk_profile_gpu_busy_fraction{{{SEL}}})",
                    "percentunit",
                    "GPU busy fraction in the last profiler-window capture (POST /profile).",
                    util,
                ),
                ts(
                    "Decode MBU",
                    [
                        (DECODE_MBU, "{{model}} {{instance}} (time-weighted)"),
                        (
                            quantile(0.5, "perfsdk_step_bandwidth_utilization", "model", "decode"),
                            "{{model}} per-step p50",
                        ),
                        (
                            quantile(0.1, "perfsdk_step_bandwidth_utilization", "model", "decode"),
                            "{{model}} per-step p10",
                        ),
                    ],
                    "percentunit",
                    "Decode memory-bandwidth utilisation. A fall here with steady traffic is what the "
                    "PerfsdkDecodeMBUDropped alert fires on.",
                    w=12,
                    max_=1,
                ),
                ts(
                    "Prefill MFU",
                    [
                        (mean("perfsdk_step_flops_utilization", "prefill"), "{{model}} {{instance}}"),
                        (mean("perfsdk_step_flops_utilization", "mixed"), "{{model}} {{instance}} mixed steps"),
                    ],
                    "percentunit",
                    "Prefill (and chunked-prefill mixed-step) FLOPs utilisation.",
                    w=12,
                    max_=1,
                ),
                ts(
                    "Step time by phase",
                    [
                        (quantile(0.5, "perfsdk_step_seconds", "phase"), "p50 {{phase}}"),
                        (quantile(0.99, "perfsdk_step_seconds", "phase"), "p99 {{phase}}"),
                    ],
                    "s",
                    "Device time of one step, per phase.",
                    w=12,
                ),
                ts(
                    "Tokens per second by phase",
                    [(f"sum by (phase) (rate(perfsdk_step_tokens_total{{{SEL}}}[{RI}]))", "{{phase}}")],
                    "short",
                    "Prompt tokens (prefill) and sequences stepped (decode) per second.",
                    w=12,
                ),
            ],
        ),
        (
            "What users feel",
            [
                ts(
                    "Time to first token",
                    [
                        (quantile(0.5, "gen_ai_server_time_to_first_token_seconds"), "p50"),
                        (quantile(0.9, "gen_ai_server_time_to_first_token_seconds"), "p90"),
                        (quantile(0.99, "gen_ai_server_time_to_first_token_seconds"), "p99"),
                    ],
                    "s",
                    "Arrival to first token (buckets: the GenAI semconv bounds and finer ones, up to 120 s).",
                    w=8,
                ),
                ts(
                    "Time per output token",
                    [
                        (quantile(0.5, "gen_ai_server_time_per_output_token_seconds"), "TPOT p50"),
                        (quantile(0.99, "gen_ai_server_time_per_output_token_seconds"), "TPOT p99"),
                        (quantile(0.99, "perfsdk_inter_token_latency_seconds"), "inter-token p99"),
                    ],
                    "s",
                    "Per request: (end to end - TTFT) / (tokens - 1); and every gap between tokens.",
                    w=8,
                ),
                ts(
                    "Queue time",
                    [
                        (quantile(0.5, "perfsdk_request_queue_seconds"), "p50"),
                        (quantile(0.99, "perfsdk_request_queue_seconds"), "p99"),
                    ],
                    "s",
                    "Arrival to scheduled: waiting for a slot in the batch.",
                    w=8,
                ),
                ts(
                    "Requests per second",
                    [
                        (
                            f"sum by (model) (rate(gen_ai_server_request_duration_seconds_count{{{SEL}}}[{RI}]))",
                            "{{model}}",
                        )
                    ],
                    "reqps",
                    "Finished requests per second.",
                    w=8,
                ),
                ts(
                    "How requests ended",
                    [(f"sum by (finish_reason) (rate(perfsdk_requests_total{{{SEL}}}[{RI}]))", "{{finish_reason}}")],
                    "reqps",
                    "Finished requests per second by finish_reason: stop and length are normal ends; abort is "
                    "a client that went away (or an engine's abort), cancelled a cancelled task -- neither is a "
                    "server failure; error is one (PerfsdkRequestErrors fires on its share).",
                    w=8,
                ),
                ts(
                    "Request duration",
                    [
                        (quantile(0.5, "gen_ai_server_request_duration_seconds"), "p50"),
                        (quantile(0.99, "gen_ai_server_request_duration_seconds"), "p99"),
                    ],
                    "s",
                    "Arrival to finish.",
                    w=8,
                ),
            ],
        ),
        (
            "Ranks (tensor parallelism: one /metrics port per rank)",
            [
                ts(
                    "Decode MBU by rank",
                    [(RANK_DECODE_MBU, "rank {{rank}} {{instance}}"), (FLEET_DECODE_MBU, "{{model}} all ranks")],
                    "percentunit",
                    "Time-weighted decode MBU of each rank against its own GPU's peak (its shard of the "
                    "weights and KV cache), and of all ranks together (all bytes over all GPU-seconds).",
                    w=12,
                    max_=1,
                ),
                ts(
                    "Decode step time by rank",
                    [
                        (
                            mean("perfsdk_step_seconds", "decode", "job, instance, rank, model"),
                            "rank {{rank}} {{instance}}",
                        )
                    ],
                    "s",
                    "Mean decode step time per rank. The ranks of a tensor-parallel group meet at every "
                    "all-reduce, so their step times agree even when one of them is slow: the straggler shows in "
                    "'Time in collectives by rank', not here.",
                    w=12,
                ),
                ts(
                    "perfsdk targets up",
                    [(TARGETS_UP, "{{instance}}")],
                    "short",
                    "1: the target (one rank, with one /metrics port per rank) answers its scrapes; 0: it stopped "
                    "(PerfsdkRankDown), shown for as long as it is down with perfsdk-rules.yml loaded (for an hour "
                    "without). The other ranks of its tensor-parallel group then stall at their next "
                    "collective, so their step rates drop to 0 too.",
                    w=8,
                    max_=1,
                ),
                ts(
                    "Decode steps per second by rank",
                    [
                        (
                            f"sum by (job, instance, rank) (rate(perfsdk_step_seconds_count{_by('decode')}[{RI}]))",
                            "rank {{rank}} {{instance}}",
                        )
                    ],
                    "short",
                    "A rank whose rate falls to 0 while others step has stopped stepping.",
                    w=8,
                ),
                ts(
                    "Time in collectives by rank (last profile)",
                    [
                        (f"perfsdk_profile_communication_fraction{{{SEL}}}", "rank {{rank}} in collectives"),
                        (COLLECTIVE_WAIT, "rank {{rank}} waiting for the slowest"),
                    ],
                    "percentunit",
                    "From each rank's last profiler capture (mon.profile(steps=N, steady=False) at the "
                    "same step on every rank): the share of the step spent in collectives, and its excess over the "
                    "rank that spends least there -- the wait for the straggler (PerfsdkStraggler names it).",
                    w=8,
                    max_=1,
                ),
            ],
        ),
        (
            "perfsdk itself",
            [
                ts(
                    "Dropped records and internal errors",
                    [
                        (
                            f'sum by (instance) (rate(perfsdk_dropped_records_total{{instance=~"$instance"}}[{RI}]))',
                            "dropped/s {{instance}}",
                        ),
                        (
                            f'sum by (instance) (rate(perfsdk_internal_errors_total{{instance=~"$instance"}}[{RI}]))',
                            "errors/s {{instance}}",
                        ),
                    ],
                    "short",
                    "Both should be zero. Drops mean the collector fell behind (the server never waits); errors "
                    "were caught inside perfsdk and logged once.",
                    w=12,
                ),
                alert_list(w=12),
            ],
        ),
    ]

    def label_values(query: str, name: str) -> dashboard.QueryVariable:
        return (
            dashboard.QueryVariable(name)
            .label(name)
            .datasource(DS)
            .query({"query": query, "refId": name})
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .include_all(True)
            .multi(True)
            .all_value(".*")
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
        )

    board = (
        dashboard.Dashboard("perfsdk: LLM serving against the hardware")
        .uid("perfsdk-serving")
        .description(
            "TTFT, TPOT, queue time, step time, decode MBU and prefill MFU from perfsdk "
            "(integrations/grafana/README.md in the perfsdk repository)."
        )
        .tags(["perfsdk", "llm", "inference"])
        .editable()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .refresh("30s")
        .version(1)
        .time("now-3h", "now")
        .timezone("browser")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(label_values("label_values(perfsdk_step_seconds_count, model)", "model"))
        .with_variable(label_values('label_values(perfsdk_step_seconds_count{model=~"$model"}, instance)', "instance"))
    )
    next_id = 1
    for title, row in panels:
        board.with_row(dashboard.Row(title).id(next_id))
        next_id += 1
        for panel in row:
            board.with_panel(panel.id(next_id))
            next_id += 1
    return board.build()


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


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
