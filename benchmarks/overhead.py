"""perfsdk's cost on a real decode loop, and whether its MBU/MFU are right.

Run on a GPU (the H200 numbers in docs/benchmarks.md come from this script)::

    python benchmarks/overhead.py --out results.json            # CUDA: 1.1B Llama-shaped bf16
    python benchmarks/overhead.py --device cpu --out cpu.json   # CPU: a smaller model, host timers

What it measures, every comparison side by side in one process:

1. **Host cost per call** of each hot-path piece (clock read, CUDA event record,
   NVTX push/pop, queue append, a whole ``with mon.decode(...)`` enter+exit,
   ``req.tokens(1)``), median of many calls.
2. **Per-step overhead on a real decode loop** — a Llama-shaped model with random
   weights and a static KV cache (batch 1 and 8, context 1024), eager and replayed
   as a CUDA graph, bare and instrumented with every sink on (Prometheus, NVTX,
   OpenTelemetry SDK with a BatchSpanProcessor). Two views: the *CPU time the
   instrumentation adds* on the serving thread (timed around the enter/exit calls
   only), and the *end-to-end step time* of bare vs instrumented runs,
   interleaved A/B/A/B so drift hits both.
3. **Zero host syncs**: the instrumented loops run under
   ``torch.cuda.set_sync_debug_mode("error")`` (any synchronising call raises), and
   a torch.profiler pass counts synchronise calls per thread.
4. **Collector throughput** (records/s on one core, all sinks) and **drops under
   overload** (a tiny queue flooded from the serving thread: drops are counted and
   the serving thread never waits).
5. **MBU/MFU agreement**: perfsdk's per-step MBU (decode) and MFU (prefill) beside an
   independent computation — bytes counted from the module's actual tensors and the
   KV slices the step reads, FLOPs from ``torch.utils.flop_counter``, time from a
   separate pair of CUDA events.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from llama_decode import SHAPES, Model, capture_decode_graph, capture_with_step, decode_loop
from measure import decode_call_ns, median_ns, timer_floor_ns

import perfsdk
from perfsdk.model import ModelSpec
from perfsdk.monitor import load_native


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "perfsdk": perfsdk.__version__,
        "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "perfsdk_c_extension_built": load_native() is not None,
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
            out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20, check=False).stdout.strip()
            env["nvidia_smi"] = dict(zip(q.split(","), [s.strip() for s in out.split(",")], strict=False))
        except Exception as e:
            env["nvidia_smi_error"] = str(e)
    try:
        env["device_info"] = perfsdk.hardware.device_info()
    except Exception as e:
        env["device_info_error"] = str(e)
    return env


def make_monitor(spec: ModelSpec, hw: Any, exporter_holder: list[Any], nvtx: bool | str = True,
                 **kw: Any) -> perfsdk.Monitor:
    """A Monitor with every sink on: Prometheus (own registry), NVTX, OTel SDK + BatchSpanProcessor.

    *nvtx*: True forces the ranges on (the default here: "every sink on"); "auto" is the production
    default, which pushes them only when an NVTX tool (Nsight) is attached.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    exporter_holder.append((provider, exporter))
    return perfsdk.Monitor(model=spec, hardware=hw, registry=CollectorRegistry(), tracer_provider=provider,
                           nvtx=nvtx, step_span_rate=0.01, model_name="bench-1b", **kw)


def thread_cpu_ns(thread: threading.Thread | None) -> int:
    """CPU time another thread has used so far (Linux: its CPU-time clock), 0 where unavailable."""
    if thread is None or thread.ident is None:
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):
        return 0


# --------------------------------------------------------------------------- parts
def host_costs(spec: ModelSpec, hw: Any, device: str, holder: list[Any]) -> dict[str, float]:
    n = 20000
    out: dict[str, float] = {"perf_counter_ns": median_ns(time.perf_counter_ns, n)}
    if device == "cuda":
        from perfsdk.cuda_driver import driver_events
        from perfsdk.timing import TorchEvents, capture_check

        ev = torch.cuda.Event(enable_timing=True, blocking=True)
        out["cuda_event_record_public"] = median_ns(ev.record, n)
        tev = TorchEvents()
        t_stream, t_record_on = tev.make_stream(), tev.make_record_on()
        out["cuda_event_record_torch_cached_stream"] = median_ns(lambda: t_record_on(ev, t_stream()), n)
        out["cuda_event_query_torch"] = median_ns(ev.query, n)
        drv = driver_events()
        if drv is not None:
            dev_ev = drv.new()
            d_stream, d_record_on = drv.make_stream(), drv.make_record_on()
            out["cuda_event_record_driver"] = median_ns(lambda: d_record_on(dev_ev, d_stream()), n)
            raw = torch._C._cuda_getCurrentRawStream
            out["raw_stream_handle"] = median_ns(lambda: raw(0), n)
            out["cuda_event_query_driver"] = median_ns(lambda: drv.query(dev_ev), n)
            torch.cuda.synchronize()
            out["cuda_event_elapsed_driver"] = median_ns(lambda: drv.elapsed_s(dev_ev, dev_ev), n)
            drv.destroy(dev_ev)
            drv.close()
        out["torch_cuda_current_stream"] = median_ns(torch.cuda.current_stream, n)
        out["capture_check"] = median_ns(capture_check(True), n)
        out["torch_compiler_is_compiling"] = median_ns(torch.compiler.is_compiling, n)
        out["torch_cuda_is_current_stream_capturing"] = median_ns(torch.cuda.is_current_stream_capturing, n)

    def enter_exit(mon: perfsdk.Monitor) -> Callable[[], None]:
        def phase() -> None:
            with mon.decode(batch=8, context_tokens=8192):
                pass
        return phase

    # Monitor settings compared; "" is perfsdk's default (the C hot path where built, driver events,
    # chained boundaries, NVTX auto); "_python" the same algorithm in Python (the reference implementation)
    variants: list[tuple[str, dict[str, Any]]] = [
        ("", {"nvtx": "auto"}), ("_python", {"nvtx": "auto", "hot_path": "python"}),
        ("_nvtx_forced", {}), ("_nvtx_forced_python", {"hot_path": "python"})]
    if device == "cuda":
        variants += [("_no_chain", {"nvtx": "auto", "chain_gap_us": 0}),
                     ("_no_chain_python", {"nvtx": "auto", "chain_gap_us": 0, "hot_path": "python"}),
                     ("_torch_events", {"nvtx": "auto", "cuda_events": "torch"}),
                     ("_torch_events_python", {"nvtx": "auto", "cuda_events": "torch", "hot_path": "python"})]
    rounds, per_round = 10, 2000
    env_hot_path = "c" if load_native() is not None else "python"
    mons: dict[str, perfsdk.Monitor] = {}
    for suffix, kw in variants:
        mon = make_monitor(spec, hw, holder, **kw)
        mons["decode_phase_enter_exit" + suffix] = mon
        # the same with the step core held back: the serving thread's own cost, nothing else running;
        # enough events made up front, since nothing returns them meanwhile
        quiet = make_monitor(spec, hw, holder, event_pool_size=rounds * per_round + 100,
                             queue_size=rounds * per_round + 100, **kw)
        quiet._reserve_events(2 * (rounds * per_round + 100))
        if quiet.cuda_events == "torch" and quiet._pool is not None:  # torch creates an event at its first record
            for ev in list(quiet._pool._free):
                ev.record()
        quiet._core.pause(True)
        mons["decode_phase_enter_exit_collector_stopped" + suffix] = quiet
        if suffix == "_nvtx_forced":
            st = mon._hot_state
            out["nvtx_push_pop"] = median_ns(lambda st=st: (st.nvtx_push("decode", 8), st.nvtx_pop()), n)
        if not suffix:
            req = mon.request(prompt_tokens=16)
            out["request_tokens_1"] = median_ns(lambda req=req: req.tokens(1), n)
            req.finish()
    sync(device)
    # interleaved rounds, so that drift and the host's other tenants hit every variant alike
    batches: dict[str, list[float]] = {k: [] for k in mons}
    for _ in range(rounds):
        for key, mon in mons.items():
            fn = enter_exit(mon)
            for _ in range(per_round // 100):
                t0 = time.perf_counter_ns()
                for _ in range(100):
                    fn()
                batches[key].append((time.perf_counter_ns() - t0) / 100)
    for key, mon in mons.items():
        out[key] = statistics.median(batches[key])
        # torch.cuda.Event objects run the Python hot path (the C one calls driver events by address)
        expected = "python" if key.endswith("_python") or "torch_events" in key else env_hot_path
        assert mon.hot_path == expected, (key, mon.hot_path)
        sync(device)
        if "collector_stopped" in key:
            mon._core.pause(False)
        mon.close()
    from prometheus_client import CollectorRegistry, Histogram

    h = Histogram("x_seconds", "x", ["model"], registry=CollectorRegistry()).labels("m")
    out["prometheus_child_observe"] = median_ns(lambda: h.observe(0.001), n)
    return out


def step_loop(mon: perfsdk.Monitor | None, step: Callable[[], object], steps: int, batch: int, ctx: int,
              device: str) -> dict[str, float]:
    """Run *steps* steps; time the loop end to end and (instrumented) the hot-path CPU cost.

    Also the CPU time of the serving thread (``thread_time``) and of the collector thread over the run.
    """
    add_ns = 0
    collector = mon._collector if mon is not None else None  # the Python side; the C core is off the GIL
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
    return {"step_us": total / steps / 1e3, "hot_path_cpu_us": add_ns / steps / 1e3 if mon is not None else 0.0,
            "serving_thread_cpu_us": serving_cpu / steps / 1e3, "collector_cpu_us": collector_cpu / steps / 1e3}


def overhead_configs(model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int,
                     batches: list[int], reps: int, holder: list[Any]) -> list[dict[str, Any]]:
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
        modes += [("cuda_graph", auto, "graph"),
                  ("cuda_graph_python", py, "graph"),
                  ("cuda_graph_synced", auto, "graph_synced"),
                  ("cuda_graph_synced_python", py, "graph_synced"),
                  ("cuda_graph_synced_nvtx_forced", {}, "graph_synced"),
                  ("cuda_graph_synced_no_chain", {**auto, "chain_gap_us": 0}, "graph_synced"),
                  ("cuda_graph_timing_every_4", {**auto, "timing_every": 4}, "graph")]
    for batch in batches:
        tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        pos = torch.tensor([ctx - 1], device=device)
        g, g_out = capture_decode_graph(model, tokens, pos, with_output=True) if device == "cuda" else (None, None)
        for mode, kw, loop in modes:
            step, steps = decode_loop(loop, model, tokens, pos, g, g_out, batch, device)
            for _ in range(10):
                step()
            mon = make_monitor(spec, hw, holder, **kw)
            bare, inst = [], []
            # A/B interleaved so clock and thermal drift affect both the same way
            step_loop(None, step, max(steps // 10, 5), batch, ctx, device)  # warm both paths
            step_loop(mon, step, max(steps // 10, 5), batch, ctx, device)
            for rep in range(reps):
                # A B B A ...: alternate which goes first so warm-up and drift hit both equally
                for instrumented in ((False, True) if rep % 2 == 0 else (True, False)):
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
            results.append({
                "batch": batch, "ctx": ctx, "mode": mode, "monitor_settings": kw, "cuda_events": mon.cuda_events,
                "hot_path": mon.hot_path,
                "nvtx_backend": mon.nvtx_backend, "steps_per_run": steps, "runs": reps,
                "bare_step_us": bare_us, "instrumented_step_us": inst_us,
                "end_to_end_overhead_pct": (inst_us - bare_us) / bare_us * 100,
                "hot_path_cpu_us_per_step": hot_us,
                "hot_path_pct_of_step": hot_us / bare_us * 100,
                "serving_thread_cpu_us_per_step_bare": med(bare, "serving_thread_cpu_us"),
                "serving_thread_cpu_us_per_step_instrumented": med(inst, "serving_thread_cpu_us"),
                "collector_cpu_us_per_step": med(inst, "collector_cpu_us"),
                "loop": loop, "chain_gap_us": mon.config.chain_gap_us,
                # the loop would have raised otherwise; the synced loop syncs by design and is not checked
                "zero_syncs_under_sync_debug_error": True if loop != "graph_synced" else None,
                "perfsdk_decode_steps": st["steps"], "perfsdk_step_ms_p50": st["step_ms_p50"],
                "perfsdk_mbu_mean": st["mbu_mean"], "dropped": mon.stats()["dropped_records"],
                "untimed_pool_empty": mon.stats()["untimed_steps_event_pool_empty"],
                "internal_errors": mon.stats()["internal_errors"],
            })
            r = results[-1]
            print(f"  batch {batch} {mode:26s} bare {bare_us:8.1f} us  instr {inst_us:8.1f} us "
                  f"({r['end_to_end_overhead_pct']:+.2f}%)  hot path {hot_us:.2f} us/step  serving CPU "
                  f"{r['serving_thread_cpu_us_per_step_bare']:.1f} -> "
                  f"{r['serving_thread_cpu_us_per_step_instrumented']:.1f} us  collector "
                  f"{r['collector_cpu_us_per_step']:.1f} us  MBU {st['mbu_mean'] or 0:.3f}  "
                  f"errors {r['internal_errors']}", flush=True)
            mon.close()
    return results


def sync_census(model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int, holder: list[Any]) -> dict[str, Any]:
    """torch.profiler over instrumented CUDA-graph steps: synchronise calls by thread."""
    from torch.profiler import ProfilerActivity, profile

    tokens = torch.zeros(1, 1, dtype=torch.long, device=device)
    pos = torch.tensor([ctx - 1], device=device)
    g = capture_decode_graph(model, tokens, pos)
    mon = make_monitor(spec, hw, holder)
    main_tid = threading.get_native_id()
    assert mon._collector is not None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50):
            with mon.decode(batch=1, context_tokens=ctx):
                g.replay()
        mon.flush(60)
        torch.cuda.synchronize()  # the benchmark's own, after the loop
    collector_tid = mon._collector.native_id  # the C core's thread shows up as another tid
    path = "/tmp/sync_census.json"
    prof.export_chrome_trace(path)
    counts: dict[str, dict[str, int]] = {}
    for e in json.loads(Path(path).read_text()).get("traceEvents", []):
        name = str(e.get("name", ""))
        if e.get("ph") == "X" and ("ynchronize" in name or "cudaMemcpy" in name):
            tid = e.get("tid")
            who = ("serving_thread" if tid == main_tid else "collector_thread" if tid == collector_tid
                   else f"tid_{tid}")
            counts.setdefault(who, {}).setdefault(name, 0)
            counts[who][name] += 1
    mon.close()
    return {"steps": 50, "sync_calls_by_thread": counts,
            "note": "the serving thread's only synchronize is the benchmark's own torch.cuda.synchronize() "
                    "after the loop; cudaEventSynchronize on another thread is the collector waiting "
                    "(blocking-sync events, GIL released)"}


def synced_breakdown(model: Model, spec: ModelSpec, hw: Any, ctx: int, holder: list[Any],
                     reps: int) -> dict[str, Any]:
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
        "default": make_monitor(spec, hw, holder, nvtx="auto"),
        "no_sinks": perfsdk.Monitor(model=spec, hardware=hw, registry=CollectorRegistry(), prometheus=False,
                                    otel=False, nvtx="auto"),
        "collector_stopped": make_monitor(spec, hw, holder, nvtx="auto", event_pool_size=(reps + 1) * steps + 64,
                                          queue_size=(reps + 1) * steps + 64),
        "host_timing": make_monitor(spec, hw, holder, nvtx="auto", timing="host"),
        "timing_every_4": make_monitor(spec, hw, holder, nvtx="auto", timing_every=4),
    }
    stopped = variants["collector_stopped"]
    assert stopped is not None
    stopped._reserve_events(2 * ((reps + 1) * steps + 64))
    stopped._core.pause(True)
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
        out[name] = {"step_us": st, "end_to_end_overhead_pct": (st - bare) / bare * 100,
                     "added_us_per_step": st - bare,
                     "hot_path_cpu_us_per_step": statistics.median(r["hot_path_cpu_us"] for r in rs),
                     "collector_cpu_us_per_step": statistics.median(r["collector_cpu_us"] for r in rs)}
        print(f"  synced breakdown {name:18s} {st:8.1f} us ({out[name]['end_to_end_overhead_pct']:+.2f}%, "
              f"{st - bare:+.1f} us)  hot path {out[name]['hot_path_cpu_us_per_step']:.1f} us  collector "
              f"{out[name]['collector_cpu_us_per_step']:.1f} us", flush=True)
    stopped._core.pause(False)
    for mon in variants.values():
        if mon is not None:
            mon.close()
    return out


def capture_safety(model: Model, spec: ModelSpec, hw: Any, ctx: int, holder: list[Any]) -> dict[str, Any]:
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
    mon = make_monitor(spec, hw, holder)
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
        "captures": 10, "succeeded": ok, "errors": errors,
        "background_steps_processed": st["decode"]["steps"] - steps_before,
        "internal_errors": st["internal_errors"], "cuda_events": mon.cuda_events}
    mon.close()
    print("== capture safety (perfsdk):", json.dumps(out["with_perfsdk_collector"]), flush=True)
    # each hot path's capture check, alone: a step inside a capture records nothing, one outside is a step
    for hot_path in ("c", "python"):
        try:
            m = make_monitor(spec, hw, holder, nvtx="auto", hot_path=hot_path if hot_path == "python" else None)
            g = capture_with_step(model, tokens, pos, m, ctx)
            m.flush(60)
            inside = m.stats()["decode"]["steps"]
            with m.decode(batch=1, context_tokens=ctx):
                g.replay()
            m.flush(60)
            out[f"step_inside_capture_{hot_path}"] = {
                "hot_path": m.hot_path, "steps_recorded_inside_capture": inside,
                "steps_recorded_after": m.stats()["decode"]["steps"], "internal_errors": m.stats()["internal_errors"]}
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


def profiler_window(model: Model, spec: ModelSpec, hw: Any, ctx: int, holder: list[Any],
                    directory: str) -> dict[str, Any]:
    """The opt-in profiler window on real GPU loops: a CUDA-graph loop and an eager loop, torch mode."""
    out: dict[str, Any] = {}
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    g = capture_decode_graph(model, tokens, pos)
    loops: dict[str, Callable[[], object]] = {"cuda_graph": g.replay, "eager": lambda: model.decode(tokens, pos)}
    for name, step in loops.items():
        mon = make_monitor(spec, hw, holder)
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
        out[name] = {"steps_run": n, "verdict": res.verdict if res else None, "error": res.error if res else "timeout",
                     "trace": os.path.basename(res.trace) if res and res.trace else None,
                     "steady": res.steady if res else None,
                     "gpu_busy_fraction": d.get("gpu_busy_fraction"),
                     "findings": [f.get("kind") for f in d.get("findings", [])] if isinstance(d, dict) else None,
                     # the profiler's inflation and the shares' basis (issue 19): against the unprofiled step
                     "observer": d.get("observer"), "unprofiled_note": d.get("unprofiled_note"),
                     "kernel_utilisation": (d.get("kernel_check") or {}).get("utilisation")}
        print(f"== profiler window ({name}):", json.dumps(out[name]), flush=True)
        mon.close()
    return out


def collector_throughput(spec: ModelSpec, hw: Any, holder: list[Any]) -> dict[str, Any]:
    """Records/s one collector thread processes with every sink on (host-timed steps + requests)."""
    mon = make_monitor(spec, hw, holder)
    mon.flush()
    n = 50_000
    t0 = time.perf_counter()
    # pre-built records pushed straight to the core: measures the core and collector, not the producer
    from perfsdk.records import DECODE, HOST, StepRecord

    for i in range(n):
        mon._push_step(StepRecord(DECODE, HOST, i, i + 1_500_000, None, None, 8, -1, 8192, 0, 0, 0, None))
    ok = mon.flush(300)
    dt = time.perf_counter() - t0
    steps_per_s = n / dt
    reqs = []
    for _ in range(2000):
        r = mon.request(prompt_tokens=64)
        r.scheduled()
        for _ in range(32):
            r.tokens(1)
        reqs.append(r)
    t0 = time.perf_counter()
    for r in reqs:
        r.finish()
    mon.flush(300)
    req_dt = time.perf_counter() - t0
    mon.close()

    # overload: a 1,000-record queue flooded from this thread; every push must return at once
    small = perfsdk.Monitor(model=spec, hardware=hw, registry=__import__("prometheus_client").CollectorRegistry(),
                            otel=False, nvtx=False, timing="host", queue_size=1000)
    worst = 0
    pc = time.perf_counter_ns
    for _ in range(200_000):
        a = pc()
        with small.decode(batch=8, context_tokens=8192):
            pass
        worst = max(worst, pc() - a)
    small.flush(300)
    dropped = small.stats()["dropped_records"]
    processed = small.stats()["decode"]["steps"]
    small.close()
    return {"step_records_per_s": steps_per_s, "flush_ok": ok,
            "finished_requests_per_s_32_tokens_each": 2000 / req_dt,
            "overload": {"pushed": 200_000, "queue_size": 1000, "dropped": dropped, "processed": processed,
                         "dropped_plus_processed": dropped + processed,
                         "worst_push_us": worst / 1e3}}


def mbu_agreement(model: Model, spec: ModelSpec, hw: Any, device: str, ctx: int, holder: list[Any]) -> dict[str, Any]:
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
        mon = make_monitor(spec, hw, holder)
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
            "perfsdk_mbu_mean": st["mbu_mean"], "independent_mbu_mean": indep,
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
    mon = make_monitor(spec, hw, holder)
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
        "perfsdk_mfu_mean": st["mfu_mean"], "independent_mfu_mean": indep_mfu,
        "relative_difference": (st["mfu_mean"] - indep_mfu) / indep_mfu,
        "perfsdk_flops": perfsdk.budget.prefill_flops(spec, [n]),
        "flop_counter_flops": counted, "flop_counter_attention_noncausal": attn_full,
        "independent_flops_causal": indep_flops,
    }
    mon.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="overhead.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--only", choices=["synced-breakdown", "call-costs", "capture-safety"], default=None,
                    help="run one experiment instead of the whole benchmark")
    ap.add_argument("--no-capture-control", dest="capture_control", action="store_false",
                    help="skip the control run (a thread breaking a CUDA-graph capture on purpose)")
    args = ap.parse_args()
    device = args.device
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = SHAPES["1b" if device == "cuda" else "cpu"]
    model = Model(shape, max_batch=8, ctx=args.ctx, dtype=dtype, device=device)
    spec = ModelSpec.from_module(model, layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads,
                                 head_dim=shape.head_dim, name="bench-1b" if device == "cuda" else "bench-cpu")
    if device == "cuda":
        hw = perfsdk.hardware.detect()
    else:
        hw = perfsdk.hardware.calibrate(device="cpu", quick=True).as_spec()
    holder: list[Any] = []
    if args.only is not None:
        only: dict[str, Any] = {"environment": environment(device), "host_cost_ns": {
            "perf_counter_ns": median_ns(time.perf_counter_ns, 20000)}}
        if args.only == "synced-breakdown":
            only["synced_breakdown"] = synced_breakdown(model, spec, hw, args.ctx, holder, args.reps)
        elif args.only == "capture-safety":
            only["capture_safety"] = capture_safety(model, spec, hw, args.ctx, holder)
        else:
            only["host_cost_ns"] = host_costs(spec, hw, device, holder)
            print("== host cost per call (ns):", json.dumps({k: round(v) for k, v in only["host_cost_ns"].items()}),
                  flush=True)
        Path(args.out).write_text(json.dumps(only, indent=2, default=str))
        print(f"wrote {args.out}")
        return 0
    result: dict[str, Any] = {"environment": environment(device), "device": device,
                              "model": {**spec.to_dict(), "shape": vars(shape)}, "hardware": hw.as_dict()}
    print(f"== {result['environment'].get('gpu', 'cpu')}, torch {torch.__version__}, model "
          f"{spec.total_params / 1e9:.2f} B params {spec.weight_bytes / 1e9:.2f} GB", flush=True)
    result["host_cost_ns"] = host_costs(spec, hw, device, holder)
    print("== host cost per call (ns):", json.dumps({k: round(v) for k, v in result["host_cost_ns"].items()}),
          flush=True)
    print("== decode loops", flush=True)
    result["decode_loops"] = overhead_configs(model, spec, hw, device, args.ctx, [1, 8], args.reps, holder)
    if device == "cuda":
        result["sync_census"] = sync_census(model, spec, hw, device, args.ctx, holder)
        print("== sync census:", json.dumps(result["sync_census"]["sync_calls_by_thread"]), flush=True)
        result["agreement"] = mbu_agreement(model, spec, hw, device, args.ctx, holder)
        print("== agreement:", json.dumps({k: v.get("relative_difference") for k, v in result["agreement"].items()
                                           if isinstance(v, dict)}), flush=True)
        out_dir = os.path.dirname(os.path.abspath(args.out))
        for name, fn in (("capture_safety", lambda: capture_safety(model, spec, hw, args.ctx, holder)),
                         ("profiler_window", lambda: profiler_window(model, spec, hw, args.ctx, holder,
                                                                    os.path.join(out_dir, "traces")))):
            try:
                result[name] = fn()
            except Exception as e:
                result[name] = {"error": repr(e)}
                print(f"== {name} failed: {e!r}", flush=True)
        try:
            cal = perfsdk.hardware.calibrate(device="cuda", cache=False)
            result["calibration"] = cal.as_dict()
        except Exception as e:
            result["calibration_error"] = repr(e)
    gc.collect()
    result["collector"] = collector_throughput(spec, hw, holder)
    print("== collector:", json.dumps(result["collector"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    if device == "cuda" and args.capture_control:
        # last: it may leave the CUDA context unusable, which is the point it makes
        try:
            result["capture_safety"]["control_default_mode_poller"] = capture_control(model, args.ctx)
        except Exception as e:
            result["capture_safety"]["control_default_mode_poller"] = {"error": repr(e)}
        Path(args.out).write_text(json.dumps(result, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
