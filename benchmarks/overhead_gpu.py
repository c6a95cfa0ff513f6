"""The GPU-only parts of ``benchmarks/overhead.py``: zero host syncs (part 3), graph capture beside a busy
collector (``--only capture-safety``), the profiler window on real loops, and MBU/MFU against an independent
count (part 5)."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from llama_decode import Model, capture_decode_graph, capture_with_step
from overhead_common import make_monitor

import perfsdk
from perfsdk.model import ModelSpec
from perfsdk.testing import probe


def sync_census(model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int) -> dict[str, Any]:
    """torch.profiler over instrumented CUDA-graph steps: synchronise calls by thread."""
    from torch.profiler import ProfilerActivity, profile

    tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.tensor([ctx - 1], device=device)
    g = capture_decode_graph(model, tokens, pos)
    mon = make_monitor(spec, hw)
    main_tid = threading.get_native_id()
    collector = probe(mon).collector_thread
    assert collector is not None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            with mon.decode(batch=1, context_tokens=ctx):
                g.replay()
        mon.flush(60)
        torch.cuda.synchronize()  # the benchmark's own, after the loop
    collector_tid = collector.native_id  # the C core's thread shows up as another tid
    path = "/tmp/sync_census.json"
    prof.export_chrome_trace(path)
    counts: dict[str, dict[str, int]] = {}
    for e in json.loads(Path(path).read_text()).get("traceEvents", []):
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and ("ynchronize" in name or "cudaMemcpy" in name):
            tid = e.get("tid")
            who = "serving_thread" if tid == main_tid else "collector_thread" if tid == collector_tid else f"tid_{tid}"
            counts.setdefault(who, {}).setdefault(name, 0)
            counts[who][name] += 1
    mon.close()
    return {
        "steps": 50,
        "sync_calls_by_thread": counts,
        "note": "the serving thread's only synchronize is the benchmark's own torch.cuda.synchronize() "
        "after the loop; cudaEventSynchronize on another thread is the collector waiting "
        "(blocking-sync events, GIL released)",
    }


def capture_safety(model: Model, spec: ModelSpec, hw: Any, ctx: int) -> dict[str, Any]:
    """CUDA-graph capture while perfsdk's collector is busy on another thread.

    In CUDA's default (global) capture mode, an event query or synchronise from *any* thread during a
    capture invalidates it. A second thread keeps stepping (events on its own stream) so that the
    collector queries and waits on events throughout; the main thread captures graphs with
    ``with mon.decode()`` inside the capture (which must be a no-op). The collector runs in relaxed
    mode, so every capture must succeed. Control: a plain thread querying an event in a loop, in the
    default mode, during the same kind of capture.
    """
    out: dict[str, Any] = {}
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    mon = make_monitor(spec, hw)
    stop = threading.Event()
    side = torch.cuda.Stream()

    def background() -> None:
        with torch.cuda.stream(side):
            while not stop.is_set():
                with mon.decode(batch=1, context_tokens=ctx):
                    time.sleep(0.0002)  # no device work: the events alone keep the collector querying

    t = threading.Thread(target=background, daemon=True)
    t.start()
    ok, errors = 0, []
    steps_before = mon.stats()["decode"]["steps"]
    for _ in range(10):
        try:
            g = capture_with_step(model, tokens, pos, mon, ctx)  # mon.decode inside: must do nothing
            g.replay()
            torch.cuda.synchronize()
            ok += 1
        except Exception as e:
            errors.append(repr(e)[:300])
    stop.set()
    t.join()
    mon.flush(60)
    st = mon.stats()
    out["with_perfsdk_collector"] = {
        "captures": 10,
        "succeeded": ok,
        "errors": errors,
        "background_steps_processed": st["decode"]["steps"] - steps_before,
        "internal_errors": st["internal_errors"],
        "cuda_events": mon.cuda_events,
    }
    mon.close()
    print("== capture safety (perfsdk):", json.dumps(out["with_perfsdk_collector"]), flush=True)
    # each hot path's capture check, alone: a step inside a capture records nothing, one outside is a step
    for hot_path in ("c", "python"):
        try:
            m = make_monitor(spec, hw, nvtx="auto", hot_path=hot_path if hot_path == "python" else None)
            g = capture_with_step(model, tokens, pos, m, ctx)
            m.flush(60)
            inside = m.stats()["decode"]["steps"]
            with m.decode(batch=1, context_tokens=ctx):
                g.replay()
            m.flush(60)
            out[f"step_inside_capture_{hot_path}"] = {
                "hot_path": m.hot_path,
                "steps_recorded_inside_capture": inside,
                "steps_recorded_after": m.stats()["decode"]["steps"],
                "internal_errors": m.stats()["internal_errors"],
            }
            m.close()
        except Exception as e:
            out[f"step_inside_capture_{hot_path}"] = {"error": repr(e)[:300]}
        print(f"== step inside capture ({hot_path}):", json.dumps(out[f"step_inside_capture_{hot_path}"]), flush=True)
    return out


def capture_control(model: Model, ctx: int) -> dict[str, Any]:
    """The control for :func:`capture_safety`: a thread in the default capture mode querying an event."""
    import ctypes

    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    stop = threading.Event()
    queries = [0]

    def poller() -> None:
        lib = ctypes.CDLL("libcuda.so.1")
        handle = ctypes.c_void_p(ev.cuda_event)
        while not stop.is_set():
            lib.cuEventQuery(handle)
            queries[0] += 1

    t = threading.Thread(target=poller, daemon=True)
    t.start()
    ok, errors = 0, []
    for _ in range(5):
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                model.decode(tokens, pos)
            ok += 1
        except Exception as e:
            errors.append(repr(e)[:300])
    stop.set()
    t.join()
    try:
        torch.cuda.synchronize()
        healthy = True
    except Exception as e:
        healthy = False
        errors.append("after: " + repr(e)[:300])
    out = {"captures": 5, "succeeded": ok, "errors": errors, "queries": queries[0], "context_healthy": healthy}
    print("== capture control (default mode poller):", json.dumps(out), flush=True)
    return out


def profiler_window(model: Model, spec: ModelSpec, hw: Any, ctx: int, directory: str) -> dict[str, Any]:
    """The opt-in profiler window on real GPU loops: a CUDA-graph loop and an eager loop, torch mode."""
    out: dict[str, Any] = {}
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    g = capture_decode_graph(model, tokens, pos)
    loops: dict[str, Callable[[], object]] = {"cuda_graph": g.replay, "eager": lambda: model.decode(tokens, pos)}
    for name, step in loops.items():
        mon = make_monitor(spec, hw)
        mon.enable_profiler(directory=directory, steps=4, warmup_steps=16, steady_cv=0.2)
        handle = mon.profile(reason="benchmark")
        t0 = time.perf_counter()
        n = 0
        while not handle.done and time.perf_counter() - t0 < 60:
            with mon.decode(batch=1, context_tokens=ctx):
                step()
            n += 1
        res = handle.wait(120)
        d = (res.diagnosis or {}) if res is not None else {}
        out[name] = {
            "steps_run": n,
            "verdict": res.verdict if res else None,
            "error": res.error if res else "timeout",
            "trace": os.path.basename(res.trace) if res and res.trace else None,
            "steady": res.steady if res else None,
            "gpu_busy_fraction": d.get("gpu_busy_fraction"),
            "findings": [f.get("kind") for f in d.get("findings", [])] if isinstance(d, dict) else None,
            # the profiler's inflation and the shares' basis (issue 19): against the unprofiled step
            "observer": d.get("observer"),
            "unprofiled_note": d.get("unprofiled_note"),
            "kernel_utilisation": (d.get("kernel_check") or {}).get("utilisation"),
        }
        print(f"== profiler window ({name}):", json.dumps(out[name]), flush=True)
        mon.close()
    return out


def mbu_agreement(model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int) -> dict[str, Any]:
    """perfsdk's MBU/MFU vs bytes counted from tensors, FLOPs from FlopCounterMode, separate events."""
    from torch.utils.flop_counter import FlopCounterMode

    out: dict[str, Any] = {"peak_bandwidth": hw.memory_bandwidth, "peak_flops_bf16": hw.peak_flops("bf16")}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # the untied input embedding is read one row per sequence, not whole (perfsdk.budget's convention)
    table = model.emb.weight
    row_bytes = table.shape[1] * table.element_size()
    weight_bytes -= table.numel() * table.element_size()
    for batch in (1, 8):
        tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        pos = torch.tensor([ctx - 1], device=device)
        kv_bytes = sum(kc[:batch].numel() * kc.element_size() * 2 for kc in model.kc)  # K and V, whole context
        indep_bytes = weight_bytes + batch * row_bytes + kv_bytes
        mon = make_monitor(spec, hw)
        for _ in range(5):
            model.decode(tokens, pos)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ours_ms = []
        for _ in range(30):
            e0.record()
            with mon.decode(batch=batch, context_tokens=batch * ctx):
                model.decode(tokens, pos)
            e1.record()
            e1.synchronize()
            ours_ms.append(e0.elapsed_time(e1))
        mon.flush(60)
        st = mon.stats()["decode"]
        indep = statistics.fmean(indep_bytes / (ms / 1e3 * hw.memory_bandwidth) for ms in ours_ms)
        out[f"decode_batch{batch}"] = {
            "perfsdk_mbu_mean": st["mbu_mean"],
            "independent_mbu_mean": indep,
            "relative_difference": (st["mbu_mean"] - indep) / indep,
            "perfsdk_step_bytes": perfsdk.budget.decode_step_bytes(spec, batch * ctx, batch),
            "independent_step_bytes": indep_bytes,
        }
        mon.close()
    # the same under a CUDA graph, where device time is not padded by launch gaps: core_overhead.py's check
    # (bare replays timed by their own events, interleaved with perfsdk-instrumented replays)
    from core_overhead import mbu_agreement as graph_mbu_agreement

    for key, res in graph_mbu_agreement(model, spec, hw, ctx, None).items():
        batch = 8 if key.endswith("8") else 1
        out[key] = {**res, "perfsdk_step_bytes": perfsdk.budget.decode_step_bytes(spec, batch * ctx, batch)}
    # prefill MFU, 1 × 1024 tokens
    n = ctx
    prompt = torch.zeros(1, n, dtype=torch.long, device=device)
    with FlopCounterMode(display=False) as fc:
        model.prefill(prompt)
    counted = fc.get_total_flops()
    by_op = {str(k): v for k, v in fc.get_flop_counts().get("Global", {}).items()}
    attn_full = sum(v for k, v in by_op.items() if "attention" in k)
    # FlopCounterMode counts SDPA as non-causal (4·n²·hd per head); perfsdk counts the causal half
    indep_flops = counted - attn_full / 2
    mon = make_monitor(spec, hw)
    for _ in range(3):
        model.prefill(prompt)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        e0.record()
        with mon.prefill(tokens=n, batch=1, seq_lens=[n]):
            model.prefill(prompt)
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    mon.flush(60)
    st = mon.stats()["prefill"]
    peak = hw.peak_flops("bf16")
    indep_mfu = statistics.fmean(indep_flops / (ms / 1e3 * peak) for ms in times)
    out["prefill_1x1024"] = {
        "perfsdk_mfu_mean": st["mfu_mean"],
        "independent_mfu_mean": indep_mfu,
        "relative_difference": (st["mfu_mean"] - indep_mfu) / indep_mfu,
        "perfsdk_flops": perfsdk.budget.prefill_flops(spec, [n]),
        "flop_counter_flops": counted,
        "flop_counter_attention_noncausal": attn_full,
        "independent_flops_causal": indep_flops,
    }
    mon.close()
    return out
