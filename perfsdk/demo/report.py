"""The demo's report: what the client saw beside what the server recorded, and the floors.

Server-side quantiles come from the Prometheus histograms in the monitor's registry, estimated the
way PromQL's ``histogram_quantile`` does (linear inside the bucket that holds the rank)::

    from perfsdk.demo.report import histogram_quantile, histogram_count

    p50 = histogram_quantile(registry, "gen_ai_server_time_to_first_token_seconds", 0.5)
    n = histogram_count(registry, "perfsdk_step_seconds", phase="decode")

:func:`build_report` gathers everything into a JSON-ready dict and :func:`format_report` prints it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["HEADINGS", "build_report", "format_report", "histogram_buckets", "histogram_count", "histogram_quantile"]

TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
E2E = "gen_ai_server_request_duration_seconds"
ITL = "perfsdk_inter_token_latency_seconds"
QUEUE = "perfsdk_request_queue_seconds"

#: Section titles of the text report, in order (the end-to-end test checks them).
HEADINGS: tuple[str, ...] = (
    "perfsdk demo",
    "Latency: client vs server",
    "Steps",
    "Floors for this model on this machine",
    "Where to look next",
)


def histogram_buckets(registry: Any, name: str, **labels: str) -> list[tuple[float, float]]:
    """Cumulative ``(le, count)`` pairs of histogram *name*, summed over series matching *labels*."""
    if registry is None:
        return []
    totals: dict[float, float] = {}
    for family in registry.collect():
        if family.name != name:
            continue
        for s in family.samples:
            if s.name != name + "_bucket" or any(s.labels.get(k) != v for k, v in labels.items()):
                continue
            le = float(s.labels["le"])
            totals[le] = totals.get(le, 0.0) + float(s.value)
    return sorted(totals.items())


def histogram_count(registry: Any, name: str, **labels: str) -> int:
    """Observations in histogram *name* (its ``+Inf`` bucket), 0 when absent."""
    buckets = histogram_buckets(registry, name, **labels)
    return int(buckets[-1][1]) if buckets else 0


def histogram_quantile(registry: Any, name: str, q: float, **labels: str) -> float | None:
    """PromQL's ``histogram_quantile(q, ...)`` over the current cumulative buckets; None when empty."""
    buckets = histogram_buckets(registry, name, **labels)
    return quantile_from_buckets(buckets, q)


def quantile_from_buckets(buckets: list[tuple[float, float]], q: float) -> float | None:
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):  # in the overflow bucket: the best bound is the last finite one
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def _client(summary: Mapping[str, Any], key: str) -> dict[str, float | None]:
    stats = summary.get(key) or {}
    return {"p50": stats.get("median", stats.get("p50")), "p99": stats.get("p99")}


def build_report(
    *, stack: Any, bench: Any | None, config: Mapping[str, Any], monitor_stats: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Everything the report prints, as plain data (``--json`` prints this)."""
    from perfsdk import budget

    registry = getattr(stack.monitor, "registry", None)
    summary: Mapping[str, Any] = bench.summary if bench is not None else {}
    latency: dict[str, Any] = {}
    for label, ckey, metric in (
        ("TTFT", "ttft_ms", TTFT),
        ("TPOT", "tpot_ms", TPOT),
        ("ITL", "itl_ms", ITL),
        ("E2E", "e2el_ms", E2E),
        ("Queue", None, QUEUE),
    ):
        latency[label] = {
            "client_ms": _client(summary, ckey) if ckey else {"p50": None, "p99": None},
            "server_ms": {
                "p50": _ms(histogram_quantile(registry, metric, 0.5)),
                "p99": _ms(histogram_quantile(registry, metric, 0.99)),
            },
            "server_count": histogram_count(registry, metric),
        }

    es = stack.engine.stats
    steps: dict[str, Any] = {}
    for phase in ("prefill", "decode"):
        ms = dict((monitor_stats or {}).get(phase) or {})
        n_engine = es.prefill_steps if phase == "prefill" else es.decode_steps
        host_s = es.prefill_seconds if phase == "prefill" else es.decode_seconds
        steps[phase] = {
            "steps": ms.get("steps", n_engine),
            "engine_steps": n_engine,
            "step_ms_p50": ms.get("step_ms_p50"),
            "step_ms_mean": ms.get("step_ms_mean", host_s / n_engine * 1000 if n_engine else None),
            "mbu_mean": ms.get("mbu_mean"),
            "mfu_mean": ms.get("mfu_mean"),
            # an MBU/MFU above 1 is impossible: such a figure is shown as suspect, never as a result
            "mbu_suspect": ms.get("mbu_suspect"),
            "mfu_suspect": ms.get("mfu_suspect"),
        }
    steps["decode"]["batch_mean"] = sum(es.batch_sizes) / len(es.batch_sizes) if es.batch_sizes else None
    steps["decode"]["batch_max"] = max(es.batch_sizes, default=None)

    spec, hw = stack.model_spec, stack.hardware
    floors: dict[str, Any] = {"hardware": stack.hardware_note}
    if spec is not None:
        floors["weight_bytes"] = spec.weight_bytes
        floors["step_weight_bytes"] = spec.step_weight_bytes  # an untied input table is read one row per sequence
        floors["embedding_bytes"] = spec.embedding_bytes
        floors["kv_bytes_per_token"] = spec.kv_bytes_per_token
        floors["params"] = spec.params
        floors["dtype"] = spec.dtype
    if spec is not None and hw is not None:
        ctx = es.decode_context_tokens / es.decode_steps if es.decode_steps else 0.0
        batch = round(sum(es.batch_sizes) / len(es.batch_sizes)) if es.batch_sizes else 1
        decode_floor = budget.decode_floor_s(spec, hw.memory_bandwidth, context_tokens=round(ctx), batch=max(batch, 1))
        prompt = es.prefill_tokens / es.submitted if es.submitted else 128
        try:
            peak = hw.peak_flops(spec.dtype)
        except ValueError:
            peak = None
        floors.update(
            bandwidth_bytes_per_s=hw.memory_bandwidth,
            peak_flops=peak,
            decode_context_tokens_mean=ctx,
            decode_step_floor_ms=decode_floor * 1000,
            decode_tokens_per_s_ceiling_batch1=1.0 / budget.decode_floor_s(spec, hw.memory_bandwidth),
            prefill_tokens_mean=prompt,
            prefill_floor_ms=(budget.prefill_floor_s(spec, peak, round(prompt)) * 1000 if peak else None),
        )
    base = stack.server.base_url
    return {
        "model": {
            "name": stack.model_name,
            "size": stack.size,
            "device": stack.device,
            "params": spec.params if spec is not None else None,
            "engine": getattr(stack, "rung", "eager"),
        },
        "load": {
            **dict(config),
            "completed": summary.get("completed"),
            "failed": summary.get("failed"),
            "failures": summary.get("failures"),
            "duration_s": summary.get("duration_s"),
            "output_throughput": summary.get("output_throughput"),
        },
        "counts": {
            "client_completed": summary.get("completed"),
            "client_output_tokens": summary.get("total_output_tokens"),
            "server_requests": latency["E2E"]["server_count"],
            "server_first_tokens": latency["TTFT"]["server_count"],
            "engine_tokens": es.tokens_generated,
            "engine_finished": es.finished,
            "engine_aborted": es.aborted,
        },
        "latency": latency,
        "steps": steps,
        "floors": floors,
        "monitor": {
            "available": stack.monitor is not None,
            "dropped_records": (monitor_stats or {}).get("dropped_records"),
            "internal_errors": (monitor_stats or {}).get("internal_errors"),
        },
        "notes": list(stack.notes),
        "next": {"metrics_url": f"{base}/metrics", "profile_url": f"{base}/debug/profile?steps=4&wait=60"},
    }


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return fmt.format(x)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _bytes(n: float) -> str:
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def format_report(r: Mapping[str, Any], *, serving: bool = False) -> str:
    """The human-readable report: one screen, sections in :data:`HEADINGS` order."""
    m, load, counts = r["model"], r["load"], r["counts"]
    lines: list[str] = []
    params = f"{m['params'] / 1e6:.1f}M params, " if m.get("params") else ""
    lines.append(
        f"perfsdk demo — {m['name']} ({params}{r['floors'].get('dtype', '?')}) on {m['device']}, "
        f"{m.get('engine', 'eager')} engine"
    )
    lines.append(
        f"  load: {load.get('num_prompts')} requests at {load.get('request_rate')} req/s, "
        f"prompt {load.get('input_len')} tokens, output {load.get('output_len')} tokens"
    )
    failed = load.get("failed") or 0
    lines.append(
        f"  {_f(load.get('completed'), '{}')} completed, {failed} failed"
        f" in {_f(load.get('duration_s'), '{:.1f}')} s"
        f" ({_f(load.get('output_throughput'), '{:.0f}')} output tokens/s)"
    )
    if failed:
        lines.append(f"  failures: {load.get('failures')}")
    if r.get("interrupted"):
        lines.append(f"  interrupted: {r['interrupted']}")
    lines.append("")
    lines.append("Latency: client vs server (ms)")
    lines.append(f"  {'':8}{'client p50':>12}{'client p99':>12}{'server p50':>12}{'server p99':>12}")
    for name, row in r["latency"].items():
        c, s = row["client_ms"], row["server_ms"]
        lines.append(f"  {name:8}{_f(c['p50']):>12}{_f(c['p99']):>12}{_f(s['p50']):>12}{_f(s['p99']):>12}")
    agree = counts["client_completed"] == counts["server_requests"]
    if not r["monitor"]["available"]:
        lines.append("  (no monitor: the server columns are empty)")
    lines.append(
        f"  requests: client {_f(counts['client_completed'], '{}')}, server {counts['server_requests']}"
        f" ({'agree' if agree else 'DISAGREE' if counts['client_completed'] is not None else 'no client numbers'});"
        f" output tokens: client "
        f"{_f(counts['client_output_tokens'], '{}')}, engine {counts['engine_tokens']}"
    )
    lines.append("  server quantiles are estimated from histogram buckets, as PromQL's histogram_quantile does;")
    lines.append("  client TTFT adds HTTP and the event loop's hand-off to what the server measured.")
    lines.append("")
    lines.append("Steps")
    lines.append(f"  {'phase':8}{'steps':>8}{'p50 ms':>10}{'mean ms':>10}{'MBU':>9}{'MFU':>9}")
    fl = r["floors"]
    peaks = {
        "mbu_suspect": f"{(fl.get('bandwidth_bytes_per_s') or 0) / 1e9:.4g} GB/s",
        "mfu_suspect": f"{(fl.get('peak_flops') or 0) / 1e12:.4g} TFLOP/s",
    }
    suspects: list[str] = []
    for phase, st in r["steps"].items():
        mbu = "suspect" if st.get("mbu_suspect") else _pct(st["mbu_mean"])
        mfu = "suspect" if st.get("mfu_suspect") else _pct(st["mfu_mean"])
        lines.append(
            f"  {phase:8}{_f(st['steps'], '{}'):>8}{_f(st['step_ms_p50']):>10}{_f(st['step_ms_mean']):>10}"
            f"{mbu:>9}{mfu:>9}"
        )
        suspects += [
            f"  warning: {phase}: {st[k]}. The peak in use: {peak} ({fl.get('hardware')})."
            for k, peak in peaks.items()
            if st.get(k)
        ]
    lines += suspects
    dec = r["steps"]["decode"]
    lines.append(f"  decode batch: mean {_f(dec.get('batch_mean'), '{:.1f}')}, max {_f(dec.get('batch_max'), '{}')}")
    lines.append("")
    lines.append("Floors for this model on this machine")
    lines.append(f"  hardware: {fl.get('hardware')}")
    if "weight_bytes" in fl:
        table = fl.get("embedding_bytes") or 0
        lines.append(
            f"  weights {_bytes(fl.get('step_weight_bytes', fl['weight_bytes']))} read per decode step"
            + (f" (+ one row per sequence of the {_bytes(table)} untied input embedding)" if table else "")
            + f"; KV cache {_bytes(fl['kv_bytes_per_token'])} per token"
        )
    if "decode_step_floor_ms" in fl:
        bw, peak = fl["bandwidth_bytes_per_s"], fl.get("peak_flops")
        lines.append(
            f"  decode step floor {fl['decode_step_floor_ms']:.3f} ms at {bw / 1e9:.1f} GB/s "
            f"(mean context {fl['decode_context_tokens_mean']:.0f} tokens); "
            f"batch-1 ceiling {fl['decode_tokens_per_s_ceiling_batch1']:.0f} tokens/s"
        )
        if peak:
            lines.append(
                f"  prefill floor {_f(fl.get('prefill_floor_ms'), '{:.3f}')} ms for "
                f"{fl['prefill_tokens_mean']:.0f} tokens at {peak / 1e12:.3g} TFLOP/s"
            )
        if dec.get("step_ms_mean") and fl["decode_step_floor_ms"]:
            ratio = dec["step_ms_mean"] / fl["decode_step_floor_ms"]
            if ratio >= 1:
                lines.append(f"  measured decode step is {ratio:.1f}x its floor")
            else:  # faster than the floor: impossible, so one of the two numbers is wrong
                lines.append(
                    f"  measured decode step is faster than its floor ({ratio:.2f}x), which is impossible:"
                    " the peak bandwidth or the measurement is wrong"
                )
    else:
        lines.append("  (no hardware spec: floors, MBU and MFU are off)")
    lines.append("")
    lines.append("Where to look next")
    nxt = r["next"]
    if serving:
        lines.append(f"  metrics:  curl {nxt['metrics_url']}")
        lines.append(f"  profiler: curl -X POST '{nxt['profile_url']}'")
        lines.append("            (steady steps under torch.profiler, then a diagnosis: launch-, sync-, copy-bound)")
    else:
        lines.append("  the server stopped with this report; keep it running with `perfsdk demo --serve --port 8000`")
        lines.append("  metrics:  curl http://127.0.0.1:8000/metrics  (point Prometheus at it)")
        lines.append("  profiler: curl -X POST 'http://127.0.0.1:8000/debug/profile?steps=4&wait=60'")
        lines.append("            (under load: a few steady steps under torch.profiler, then a diagnosis)")
        lines.append("  traces:   `perfsdk analyze TRACE` reads any torch.profiler trace (vLLM's and SGLang's too)")
    for note in r.get("notes") or []:
        lines.append(f"  note: {note}")
    mon = r["monitor"]
    if mon.get("dropped_records") or mon.get("internal_errors"):
        lines.append(
            f"  note: the monitor dropped {mon['dropped_records']} records, {mon['internal_errors']} internal errors"
        )
    return "\n".join(lines)
