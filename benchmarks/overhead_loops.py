"""Per-step overhead on real decode loops, bare against instrumented, interleaved
(``benchmarks/overhead.py``, part 2; ``--only synced-breakdown`` runs :func:`synced_breakdown` alone)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from llama_decode import Model, capture_decode_graph, decode_loop
from measure import decode_call_ns, timer_floor_ns
from overhead_common import make_monitor, sync, thread_cpu_ns

import perfsdk
from perfsdk.model import ModelSpec
from perfsdk.testing import probe


def step_loop(
    mon: perfsdk.Monitor | None, step: Callable[[], object], steps: int, batch: int, ctx: int, device: str
) -> dict[str, float]:
    """Run *steps* steps; time the loop end to end and (instrumented) the hot-path CPU cost.

    Also the CPU time of the serving thread (``thread_time``) and of the collector thread over the run.
    """
    add_ns = 0
    collector = probe(mon).collector_thread if mon is not None else None  # the Python side; the C core is off the GIL
    sync(device)
    if mon is not None:
        mon.flush(60)
    c0 = thread_cpu_ns(collector)
    s0 = time.thread_time_ns()
    t_start = time.perf_counter_ns()
    if mon is None:
        for _ in range(steps):
            step()
    else:
        add_ns = decode_call_ns(mon, step, steps, batch, batch * ctx)
    sync(device)
    total = time.perf_counter_ns() - t_start
    serving_cpu = time.thread_time_ns() - s0
    if mon is not None:
        mon.flush(60)
    collector_cpu = thread_cpu_ns(collector) - c0
    return {
        "step_us": total / steps / 1e3,
        "hot_path_cpu_us": add_ns / steps / 1e3 if mon is not None else 0.0,
        "serving_thread_cpu_us": serving_cpu / steps / 1e3,
        "collector_cpu_us": collector_cpu / steps / 1e3,
    }


def overhead_configs(
    model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int, batches: list[int], reps: int
) -> list[dict[str, Any]]:
    results = []
    floor_ns = timer_floor_ns()
    # (name, Monitor settings, loop). Every Monitor has Prometheus and the OpenTelemetry SDK on; NVTX is
    # "auto" (perfsdk's default: ranges only while Nsight is attached, so none here) unless forced.
    # Loops: "eager"; "graph": CUDA-graph replays back to back, the host running ahead until the launch
    # queue is full; "graph_synced": each step's token ids copied to the host before the next step, as a
    # server that samples or streams every step does (host and GPU alternate, host cost adds to the step).
    auto = {"nvtx": "auto"}
    modes: list[tuple[str, dict[str, Any], str]] = [("eager", auto, "eager")]
    if device == "cuda":
        py = {**auto, "hot_path": "python"}  # the same loops with the Python reference implementation
        modes += [
            ("cuda_graph", auto, "graph"),
            ("cuda_graph_python", py, "graph"),
            ("cuda_graph_synced", auto, "graph_synced"),
            ("cuda_graph_synced_python", py, "graph_synced"),
            ("cuda_graph_synced_nvtx_forced", {}, "graph_synced"),
            ("cuda_graph_synced_no_chain", {**auto, "chain_gap_us": 0}, "graph_synced"),
            ("cuda_graph_timing_every_4", {**auto, "timing_every": 4}, "graph"),
        ]
    for batch in batches:
        tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        pos = torch.tensor([ctx - 1], device=device)
        g, g_out = capture_decode_graph(model, tokens, pos, with_output=True) if device == "cuda" else (None, None)
        for mode, kw, loop in modes:
            step, steps = decode_loop(loop, model, tokens, pos, g, g_out, batch, device)
            for _ in range(10):
                step()
            mon = make_monitor(spec, hw, **kw)
            bare, inst = [], []
            # A/B interleaved so clock and thermal drift affect both the same way
            step_loop(None, step, max(steps // 10, 5), batch, ctx, device)  # warm both paths
            step_loop(mon, step, max(steps // 10, 5), batch, ctx, device)
            for rep in range(reps):
                # A B B A ...: alternate which goes first so warm-up and drift hit both equally
                for instrumented in (False, True) if rep % 2 == 0 else (True, False):
                    if not instrumented:
                        bare.append(step_loop(None, step, steps, batch, ctx, device))
                        continue
                    checked = device == "cuda" and loop != "graph_synced"  # that loop syncs on purpose
                    if checked:
                        torch.cuda.set_sync_debug_mode("error")
                    try:
                        inst.append(step_loop(mon, step, steps, batch, ctx, device))
                    finally:
                        if checked:
                            torch.cuda.set_sync_debug_mode(0)
            mon.flush(120)
            st = mon.stats()["decode"]

            def med(runs: list[dict[str, float]], key: str) -> float:
                return statistics.median(r[key] for r in runs)

            bare_us, inst_us = med(bare, "step_us"), med(inst, "step_us")
            hot_us = med(inst, "hot_path_cpu_us") - floor_ns / 1e3
            results.append(
                {
                    "batch": batch,
                    "ctx": ctx,
                    "mode": mode,
                    "monitor_settings": kw,
                    "cuda_events": mon.cuda_events,
                    "hot_path": mon.hot_path,
                    "nvtx_backend": mon.nvtx_backend,
                    "steps_per_run": steps,
                    "runs": reps,
                    "bare_step_us": bare_us,
                    "instrumented_step_us": inst_us,
                    "end_to_end_overhead_pct": (inst_us - bare_us) / bare_us * 100,
                    "hot_path_cpu_us_per_step": hot_us,
                    "hot_path_pct_of_step": hot_us / bare_us * 100,
                    "serving_thread_cpu_us_per_step_bare": med(bare, "serving_thread_cpu_us"),
                    "serving_thread_cpu_us_per_step_instrumented": med(inst, "serving_thread_cpu_us"),
                    "collector_cpu_us_per_step": med(inst, "collector_cpu_us"),
                    "loop": loop,
                    "chain_gap_us": mon.config.chain_gap_us,
                    # the loop would have raised otherwise; the synced loop syncs by design and is not checked
                    "zero_syncs_under_sync_debug_error": True if loop != "graph_synced" else None,
                    "perfsdk_decode_steps": st["steps"],
                    "perfsdk_step_ms_p50": st["step_ms_p50"],
                    "perfsdk_mbu_mean": st["mbu_mean"],
                    "dropped": mon.stats()["dropped_records"],
                    "untimed_pool_empty": mon.stats()["untimed_steps_event_pool_empty"],
                    "internal_errors": mon.stats()["internal_errors"],
                }
            )
            r = results[-1]
            print(
                f"  batch {batch} {mode:26s} bare {bare_us:8.1f} us  instr {inst_us:8.1f} us "
                f"({r['end_to_end_overhead_pct']:+.2f}%)  hot path {hot_us:.2f} us/step  serving CPU "
                f"{r['serving_thread_cpu_us_per_step_bare']:.1f} -> "
                f"{r['serving_thread_cpu_us_per_step_instrumented']:.1f} us  collector "
                f"{r['collector_cpu_us_per_step']:.1f} us  MBU {st['mbu_mean'] or 0:.3f}  "
                f"errors {r['internal_errors']}",
                flush=True,
            )
            mon.close()
    return results


def synced_breakdown(model: Model, spec: ModelSpec, hw: Any, ctx: int, reps: int) -> dict[str, Any]:
    """Where a synced CUDA-graph loop's overhead comes from: the calls, the sinks, or the collector thread.

    Batch 1, each step's ids read back (as in ``cuda_graph_synced``), bare and five instrumented
    variants interleaved: perfsdk's default; no Prometheus and no OpenTelemetry (the collector reads
    events but exports nothing); the collector stopped (the serving thread's calls alone, in the loop);
    timing off (``timing="host"``: no CUDA events at all); and the default with ``timing_every=4``.
    """
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    g, g_out = capture_decode_graph(model, tokens, pos, with_output=True)

    def step() -> None:
        g.replay()
        g_out.cpu()

    steps = 1000
    from prometheus_client import CollectorRegistry

    variants: dict[str, perfsdk.Monitor | None] = {
        "bare": None,
        "default": make_monitor(spec, hw, nvtx="auto"),
        "no_sinks": perfsdk.Monitor(
            model=spec, hardware=hw, registry=CollectorRegistry(), prometheus=False, otel=False, nvtx="auto"
        ),
        "collector_stopped": make_monitor(
            spec, hw, nvtx="auto", event_pool_size=(reps + 1) * steps + 64, queue_size=(reps + 1) * steps + 64
        ),
        "host_timing": make_monitor(spec, hw, nvtx="auto", timing="host"),
        "timing_every_4": make_monitor(spec, hw, nvtx="auto", timing_every=4),
    }
    stopped = variants["collector_stopped"]
    assert stopped is not None
    probe(stopped).events.reserve(2 * ((reps + 1) * steps + 64))
    paused = contextlib.ExitStack()
    paused.enter_context(probe(stopped).paused_core())
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for _ in range(10):
        step()
    for mon in variants.values():
        step_loop(mon, step, 100, 1, ctx, "cuda")  # warm
    for rep in range(reps):
        order = list(variants.items()) if rep % 2 == 0 else list(reversed(variants.items()))
        for name, mon in order:
            runs[name].append(step_loop(mon, step, steps, 1, ctx, "cuda"))
    bare = statistics.median(r["step_us"] for r in runs["bare"])
    out: dict[str, Any] = {"steps_per_run": steps, "runs": reps, "bare_step_us": bare}
    for name, rs in runs.items():
        if name == "bare":
            continue
        st = statistics.median(r["step_us"] for r in rs)
        out[name] = {
            "step_us": st,
            "end_to_end_overhead_pct": (st - bare) / bare * 100,
            "added_us_per_step": st - bare,
            "hot_path_cpu_us_per_step": statistics.median(r["hot_path_cpu_us"] for r in rs),
            "collector_cpu_us_per_step": statistics.median(r["collector_cpu_us"] for r in rs),
        }
        print(
            f"  synced breakdown {name:18s} {st:8.1f} us ({out[name]['end_to_end_overhead_pct']:+.2f}%, "
            f"{st - bare:+.1f} us)  hot path {out[name]['hot_path_cpu_us_per_step']:.1f} us  collector "
            f"{out[name]['collector_cpu_us_per_step']:.1f} us",
            flush=True,
        )
    paused.close()
    for mon in variants.values():
        if mon is not None:
            mon.close()
    return out
