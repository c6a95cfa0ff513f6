"""perfsdk's cost in the loops real servers run, before and after a change, with public API only.

Run it once per perfsdk build on the same GPU, in one device call, and compare the JSON files::

    PYTHONPATH=before/ python benchmarks/core_overhead.py --label before --out before.json
    PYTHONPATH=.       python benchmarks/core_overhead.py --label after  --out after.json
    PYTHONPATH=.       python benchmarks/core_overhead.py --label after_python --hot-path python --out py.json

It uses only what every perfsdk version has (``Monitor``, ``decode``, ``flush``, ``stats``), so the same
script measures an older checkout, and reads each perfsdk thread's CPU time from the kernel
(``/proc/self/task/<tid>/schedstat``, nanoseconds on the CPU), by thread name:

* ``perfsdk-collector`` and ``perfsdk-spans`` run Python: every nanosecond they spend on a CPU they
  hold the GIL (they release it only to sleep or wait), so their CPU time per step is an upper bound
  of **the collector's GIL time per step**;
* ``perfsdk-steps`` is the C step core's native thread, which never takes the GIL (off-GIL CPU).

Parts (a Llama-shaped 1.1B bf16 model, context 1,024; every Monitor has Prometheus on its own registry,
the OpenTelemetry SDK with a BatchSpanProcessor, step spans at 1 %, NVTX "auto"):

1. **Call cost**: ``with mon.decode(...)`` enter + exit, median of interleaved batches, GPU idle.
2. **Loops**, bare and instrumented interleaved A/B/B/A, median of ``--reps`` runs each: CUDA-graph
   replays back to back (``graph``); the same with the sampled ids read back every step
   (``graph_synced``: ``g.replay(); ids.cpu()``, the host on the critical path, as every streaming server);
   the read-back loop with each step's B tokens recorded (``graph_synced_tokens``: one ``step.tokens(reqs)``
   per step where perfsdk has it, else ``req.tokens(1)`` per request; ``token_call`` says which); eager
   (``model.decode`` per step). Reported: end-to-end step time and overhead, the serving thread's
   own CPU time per step (bare and instrumented: resolves a fraction of a microsecond, so it settles the
   eager loop where wall-clock noise would not), perfsdk's threads' CPU per step, steps recorded vs run.
   Instrumented non-synced loops run under ``torch.cuda.set_sync_debug_mode("error")``: any host sync
   on the serving thread would raise.
3. **Overload**: a 1,000-record queue flooded from the serving thread (200,000 steps): every step is
   processed or dropped-and-counted, and the worst single ``with mon.decode()`` (wall, p99.9, how many
   over 20 µs).
4. **Fresh threads**: a new thread whose first CUDA call is a perfsdk step (prefill then decode), and
   four threads stepping at once on their own streams: every step recorded, no internal error.
5. **MBU agreement** under CUDA graphs (batch 1 and 8): perfsdk's MBU against bytes counted from the
   model's tensors over separately timed bare replays.
6. **Graph-capture safety**: 10 captures (each with ``mon.decode`` inside, which must do nothing) while
   another thread's steps keep perfsdk's threads querying events.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from llama_decode import SHAPES, Model, capture_decode_graph, capture_with_step, decode_loop
from measure import decode_call_ns, median_ns, timer_floor_ns

import perfsdk
from perfsdk.model import ModelSpec

# kernel thread names are cut at 15 characters ("perfsdk-collector" reads "perfsdk-collect")
GIL_THREADS = ("perfsdk-collect", "perfsdk-spans")
NATIVE_THREADS = ("perfsdk-steps",)


def thread_cpu_ns() -> dict[str, int]:
    """CPU nanoseconds used so far by each perfsdk thread of this process, summed by name."""
    out: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if name.startswith("perfsdk"):
            name = next((n for n in (*GIL_THREADS, *NATIVE_THREADS) if name.startswith(n)), name)
            out[name] = out.get(name, 0) + ns
    return out


def name_python_threads() -> None:
    """Give perfsdk's Python threads their kernel name (comm), so /proc shows them by name."""
    for t in threading.enumerate():
        if t.name.startswith("perfsdk") and t.native_id is not None:
            try:
                Path(f"/proc/self/task/{t.native_id}/comm").write_text(t.name[:15])
            except OSError:
                pass  # best effort: an unnamed thread is reported under "other"


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "perfsdk": perfsdk.__version__,
        "perfsdk_path": os.path.dirname(perfsdk.__file__),
        "host": platform.node(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "perf_counter_ns_cost": median_ns(time.perf_counter_ns, 20000),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit"
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.strip()
            env["nvidia_smi"] = dict(zip(q.split(","), [s.strip() for s in out.split(",")], strict=False))
        except Exception as e:
            env["nvidia_smi_error"] = repr(e)
    return env


def make_monitor(spec: ModelSpec, hw: Any, **kw: Any) -> perfsdk.Monitor:
    """Every sink on: Prometheus (own registry), OpenTelemetry SDK + BatchSpanProcessor, NVTX auto."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    kw.setdefault("nvtx", "auto")
    mon = perfsdk.Monitor(
        model=spec,
        hardware=hw,
        registry=CollectorRegistry(),
        tracer_provider=provider,
        step_span_rate=0.01,
        model_name="bench-1b",
        **kw,
    )
    name_python_threads()
    return mon


def hot_path_of(mon: perfsdk.Monitor) -> str:
    return str(getattr(mon, "hot_path", "python"))


# ---------------------------------------------------------------------------------------------- parts
def call_costs(spec: ModelSpec, hw: Any, hot_path: str | None) -> dict[str, Any]:
    kw = {"hot_path": hot_path} if hot_path else {}
    mon = make_monitor(spec, hw, **kw)
    rounds, per_round = 10, 2000
    samples: list[float] = []
    for _ in range(rounds):
        for _ in range(per_round // 100):
            t0 = time.perf_counter_ns()
            for _ in range(100):
                with mon.decode(batch=8, context_tokens=8192):
                    pass
            samples.append((time.perf_counter_ns() - t0) / 100)
            time.sleep(0)
    req = mon.request(prompt_tokens=16)
    tokens_ns = median_ns(lambda: req.tokens(1), 20000)
    req.finish()
    torch.cuda.synchronize()
    mon.flush(60)
    out = {
        "decode_enter_exit_ns": statistics.median(samples),
        "request_tokens_1_ns": tokens_ns,
        "hot_path": hot_path_of(mon),
        "internal_errors": mon.stats()["internal_errors"],
    }
    mon.close()
    return out


def run_loop(
    mon: perfsdk.Monitor | None,
    step: Callable[[], object],
    steps: int,
    batch: int,
    ctx: int,
    time_calls: bool = False,
    reqs: list[Any] | None = None,
) -> dict[str, float]:
    """One run of *steps* steps (bare when *mon* is None). *time_calls*: also time perfsdk's own calls on the
    serving thread (clock reads around enter and exit; a separate run, so the others carry no timer).
    *reqs*: each instrumented step also records one token for each of these requests, the way this perfsdk
    can: one ``step.tokens(reqs)`` inside the step where it has it, else ``req.tokens(1)`` per request after
    it (what a streaming loop did before issue 23)."""
    torch.cuda.synchronize()
    if mon is not None:
        mon.flush(60)
    name_python_threads()
    c0 = thread_cpu_ns()
    s0 = time.thread_time_ns()
    t0 = time.perf_counter_ns()
    calls_ns = 0
    if mon is None:
        for _ in range(steps):
            step()
    elif time_calls:
        calls_ns = decode_call_ns(mon, step, steps, batch, batch * ctx)
    elif reqs is not None and token_call(mon) == "step.tokens":
        for _ in range(steps):
            with mon.decode(batch=batch, context_tokens=batch * ctx) as s:
                step()
                s.tokens(reqs)
    elif reqs is not None:
        for _ in range(steps):
            with mon.decode(batch=batch, context_tokens=batch * ctx):
                step()
            for r in reqs:
                r.tokens(1)
    else:
        for _ in range(steps):
            with mon.decode(batch=batch, context_tokens=batch * ctx):
                step()
    torch.cuda.synchronize()
    total = time.perf_counter_ns() - t0
    serving = time.thread_time_ns() - s0
    if mon is not None:
        mon.flush(60)
    c1 = thread_cpu_ns()
    gil = sum(c1.get(n, 0) - c0.get(n, 0) for n in GIL_THREADS)
    native = sum(c1.get(n, 0) - c0.get(n, 0) for n in NATIVE_THREADS)
    other = sum(v - c0.get(n, 0) for n, v in c1.items() if n not in GIL_THREADS + NATIVE_THREADS)
    return {
        "step_us": total / steps / 1e3,
        "serving_cpu_us": serving / steps / 1e3,
        "perfsdk_calls_us": calls_ns / steps / 1e3,
        "gil_threads_cpu_us": gil / steps / 1e3,
        "native_threads_cpu_us": native / steps / 1e3,
        "other_perfsdk_cpu_us": other / steps / 1e3,
    }


def token_call(mon: perfsdk.Monitor) -> str:
    """How this perfsdk records a step's tokens: ``step.tokens`` (one call per step) or ``req.tokens``."""
    return "step.tokens" if hasattr(mon.decode(batch=1), "tokens") else "req.tokens"


def loops(
    model: Model, spec: ModelSpec, hw: Any, ctx: int, reps: int, hot_path: str | None, which: list[str]
) -> list[dict[str, Any]]:
    results = []
    kw = {"hot_path": hot_path} if hot_path else {}
    for batch in (1, 8):
        tokens = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        pos = torch.tensor([ctx - 1], device="cuda")
        g, g_out = capture_decode_graph(model, tokens, pos, with_output=True)
        for loop in which:
            # graph_synced_tokens: the read-back loop, each instrumented step also recording its B tokens
            with_tokens = loop == "graph_synced_tokens"
            step, steps = decode_loop(loop.removesuffix("_tokens"), model, tokens, pos, g, g_out, batch)
            for _ in range(10):
                step()
            mon = make_monitor(spec, hw, **kw)
            reqs = [mon.request(prompt_tokens=16) for _ in range(batch)] if with_tokens else None
            run_loop(None, step, max(steps // 10, 5), batch, ctx)
            run_loop(mon, step, max(steps // 10, 5), batch, ctx, reqs=reqs)
            before = mon.stats()["decode"]["steps"]
            bare: list[dict[str, float]] = []
            inst: list[dict[str, float]] = []
            for rep in range(reps):
                for instrumented in (False, True) if rep % 2 == 0 else (True, False):
                    if not instrumented:
                        bare.append(run_loop(None, step, steps, batch, ctx))
                        continue
                    checked = not loop.startswith("graph_synced")  # those loops sync on purpose
                    if checked:
                        torch.cuda.set_sync_debug_mode("error")
                    try:
                        inst.append(run_loop(mon, step, steps, batch, ctx, reqs=reqs))
                    finally:
                        if checked:
                            torch.cuda.set_sync_debug_mode(0)
            timed = run_loop(mon, step, steps, batch, ctx, time_calls=True)
            timer = timer_floor_ns() / 1e3  # the four clock reads of a timed step, not perfsdk's
            mon.flush(120)
            st = mon.stats()

            def med(rs: list[dict[str, float]], k: str) -> float:
                return statistics.median(r[k] for r in rs)

            paired = [i["step_us"] / b["step_us"] - 1 for b, i in zip(bare, inst, strict=True)]
            b_us, i_us = med(bare, "step_us"), med(inst, "step_us")
            r = {
                "batch": batch,
                "ctx": ctx,
                "loop": loop,
                "token_call": token_call(mon) if with_tokens else None,
                "hot_path": hot_path_of(mon),
                "steps_per_run": steps,
                "runs": reps,
                "bare_step_us": b_us,
                "instrumented_step_us": i_us,
                "end_to_end_overhead_pct": (i_us - b_us) / b_us * 100,
                "paired_overhead_pct_median": statistics.median(paired) * 100,
                "paired_overhead_pct_all": [p * 100 for p in paired],
                "serving_cpu_us_bare": med(bare, "serving_cpu_us"),
                "serving_cpu_us_instrumented": med(inst, "serving_cpu_us"),
                "serving_cpu_added_us": med(inst, "serving_cpu_us") - med(bare, "serving_cpu_us"),
                "serving_cpu_added_pct_of_step": (med(inst, "serving_cpu_us") - med(bare, "serving_cpu_us"))
                / b_us
                * 100,
                "perfsdk_calls_us_per_step": timed["perfsdk_calls_us"] - timer,
                "perfsdk_calls_pct_of_step": (timed["perfsdk_calls_us"] - timer) / b_us * 100,
                "gil_threads_cpu_us_per_step": med(inst, "gil_threads_cpu_us"),
                "native_threads_cpu_us_per_step": med(inst, "native_threads_cpu_us"),
                "other_perfsdk_cpu_us_per_step": med(inst, "other_perfsdk_cpu_us"),
                "steps_run": (reps + 1) * steps,
                "steps_recorded": st["decode"]["steps"] - before,
                "mbu_mean": st["decode"]["mbu_mean"],
                "step_ms_p50": st["decode"]["step_ms_p50"],
                "dropped": st["dropped_records"],
                "internal_errors": st["internal_errors"],
                "zero_syncs_under_sync_debug_error": True if not loop.startswith("graph_synced") else None,
            }
            results.append(r)
            print(
                f"  b{batch} {loop:13s} {r['hot_path']:6s} bare {b_us:8.1f} us  instr {i_us:8.1f} us "
                f"({r['end_to_end_overhead_pct']:+.2f}%, paired {r['paired_overhead_pct_median']:+.2f}%)  "
                f"calls {r['perfsdk_calls_us_per_step']:.2f} us  serving +{r['serving_cpu_added_us']:.2f} us  "
                f"GIL threads {r['gil_threads_cpu_us_per_step']:.2f} us  native "
                f"{r['native_threads_cpu_us_per_step']:.2f} us  recorded {r['steps_recorded']}/{r['steps_run']}  "
                f"errors {r['internal_errors']}",
                flush=True,
            )
            mon.close()
    return results


def _push_latencies(n: int, push: Callable[[], Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """*n* timed calls of *push*; also when Python's garbage collector ran (it runs on whichever thread
    allocates, so a collection inside a timed call is the interpreter's, not the call's own)."""
    import gc

    pc = time.perf_counter_ns
    collections: list[tuple[int, int]] = []
    started = [0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = pc()
        else:
            collections.append((started[0], pc()))

    gc.callbacks.append(on_gc)
    lat = [0] * n
    starts = [0] * n
    try:
        for i in range(n):
            a = pc()
            push()
            lat[i] = pc() - a
            starts[i] = a
    finally:
        gc.callbacks.remove(on_gc)
    return list(zip(starts, lat, strict=True)), collections


def _tail(samples: list[tuple[int, int]], collections: list[tuple[int, int]]) -> dict[str, Any]:
    lat = sorted(x for _, x in samples)
    n = len(lat)
    slow = [(a, x) for a, x in samples if x > 20_000]
    in_gc = sum(1 for a, x in slow if any(g0 < a + x and g1 > a for g0, g1 in collections))
    worst_a, worst = max(samples, key=lambda s: s[1])
    return {
        "worst_push_us": worst / 1e3,
        "p999_push_us": lat[int(n * 0.999)] / 1e3,
        "p50_push_us": lat[n // 2] / 1e3,
        "pushes_over_20us": len(slow),
        "pushes_over_20us_during_gc": in_gc,
        "worst_push_during_gc": any(g0 < worst_a + worst and g1 > worst_a for g0, g1 in collections),
        "gc_collections": len(collections),
    }


def overload(spec: ModelSpec, hw: Any, hot_path: str | None, timing: str) -> dict[str, Any]:
    """200,000 steps as fast as the thread can push them into a 1,000-record queue: every one processed or
    dropped-and-counted, and the serving thread's push latency. ``bare`` is the same timed loop around an
    empty ``with`` in the same process just before: the host's own tail (interrupts, the VM, the
    interpreter), which no library can go under."""
    import contextlib

    from prometheus_client import CollectorRegistry

    kw = {"hot_path": hot_path} if hot_path else {}
    n = 200_000
    null = contextlib.nullcontext()

    def bare_push() -> None:
        with null:
            pass

    bare = _tail(*_push_latencies(n, bare_push))
    if timing == "cuda":
        bare_event = _tail(*_push_latencies(n, _raw_event_push()))
    mon = perfsdk.Monitor(
        model=spec,
        hardware=hw,
        registry=CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing=timing,
        queue_size=1000,
        **kw,
    )

    def push() -> None:
        with mon.decode(batch=8, context_tokens=8192):
            pass

    samples, collections = _push_latencies(n, push)
    torch.cuda.synchronize()
    mon.flush(300)
    st = mon.stats()
    out = {
        "timing": timing,
        "pushed": n,
        "queue_size": 1000,
        "dropped": st["dropped_records"],
        "processed": st["decode"]["steps"],
        "dropped_plus_processed": st["dropped_records"] + st["decode"]["steps"],
        "untimed_pool_empty": st.get("untimed_steps_event_pool_empty"),
        **_tail(samples, collections),
        "bare_loop": bare,
        "hot_path": hot_path_of(mon),
    }
    if timing == "cuda":
        out["bare_event_record_loop"] = bare_event
    mon.close()
    return out


def _raw_event_push() -> Callable[[], None]:
    """A push that is one driver-API ``cuEventRecord`` of a blocking-sync timing event (perfsdk's kind until its
    events became default-flag ones) on the current stream, through ctypes with the GIL kept, and nothing else:
    the driver's own tail."""
    import ctypes

    cuda = ctypes.PyDLL("libcuda.so.1")
    create, record = cuda.cuEventCreate, cuda.cuEventRecord
    create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    events = []
    for _ in range(1024):
        ev = ctypes.c_void_p()
        assert create(ctypes.byref(ev), 1) == 0
        events.append(ev)
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    i = [0]

    def push() -> None:
        record(events[i[0] & 1023], stream)
        i[0] += 1

    return push


def fresh_threads(model: Model, spec: ModelSpec, hw: Any, ctx: int, hot_path: str | None) -> dict[str, Any]:
    kw = {"hot_path": hot_path} if hot_path else {}
    out: dict[str, Any] = {}
    mon = make_monitor(spec, hw, **kw)
    prompt = torch.zeros(1, 64, dtype=torch.long, device="cuda")
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")

    def engine() -> None:  # its first CUDA call is perfsdk's prefill step
        with mon.prefill(tokens=64, batch=1):
            model.prefill(prompt)
        for _ in range(5):
            with mon.decode(batch=1, context_tokens=ctx):
                model.decode(tokens, pos)

    t = threading.Thread(target=engine)
    t.start()
    t.join()
    mon.flush(60)
    st = mon.stats()
    out["engine_thread"] = {
        "prefill_steps": st["prefill"]["steps"],
        "decode_steps": st["decode"]["steps"],
        "prefill_timed": st["prefill"]["step_ms_p50"] is not None,
        "internal_errors": st["internal_errors"],
        "expected": {"prefill": 1, "decode": 5},
    }
    mon.close()
    # four threads at once, each on its own stream, each a fresh thread
    mon = make_monitor(spec, hw, **kw)
    graphs = []
    for _ in range(4):
        tk = torch.zeros(1, 1, dtype=torch.long, device="cuda")
        graphs.append(capture_decode_graph(model, tk, pos))
    torch.cuda.synchronize()
    per = 300

    def server(g: Any) -> None:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(per):
                with mon.decode(batch=1, context_tokens=ctx):
                    g.replay()
        s.synchronize()

    ts = [threading.Thread(target=server, args=(g,)) for g in graphs]
    for x in ts:
        x.start()
    for x in ts:
        x.join()
    mon.flush(60)
    st = mon.stats()
    out["four_threads"] = {
        "steps_run": 4 * per,
        "steps_recorded": st["decode"]["steps"],
        "timed": st["decode"]["step_ms_p50"] is not None,
        "internal_errors": st["internal_errors"],
        "dropped": st["dropped_records"],
    }
    mon.close()
    print("== fresh threads:", json.dumps(out), flush=True)
    return out


def mbu_agreement(model: Model, spec: ModelSpec, hw: Any, ctx: int, hot_path: str | None) -> dict[str, Any]:
    kw = {"hot_path": hot_path} if hot_path else {}
    out: dict[str, Any] = {}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # the untied input embedding is read one row per sequence, not whole (perfsdk.budget's convention)
    table = model.emb.weight
    row_bytes = table.shape[1] * table.element_size()
    weight_bytes -= table.numel() * table.element_size()
    for batch in (1, 8):
        tokens = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        pos = torch.tensor([ctx - 1], device="cuda")
        g = capture_decode_graph(model, tokens, pos)
        kv_bytes = sum(kc[:batch].numel() * kc.element_size() * 2 for kc in model.kc)
        indep_bytes = weight_bytes + batch * row_bytes + kv_bytes
        bare_ms: list[float] = []
        same_ms: list[float] = []
        e0, e1, e2, e3 = (torch.cuda.Event(enable_timing=True) for _ in range(4))
        # 3 warm rounds on a monitor of their own (clocks up; its steps stay out of the compared ones), then
        # 30 interleaved rounds with the order alternating, so that a drift in clocks cancels
        warm = make_monitor(spec, hw, **kw)
        mon = warm
        before = 0
        for r in range(33):
            if r == 3:
                warm.close()
                mon = make_monitor(spec, hw, **kw)
                bare_ms.clear()
            for instrumented in (False, True) if r % 2 == 0 else (True, False):
                if instrumented:
                    # the same 20 steps timed by this benchmark's own pair of events too: perfsdk's accounting
                    # against an independent clock over the very steps it timed
                    e2.record()
                    for _ in range(20):
                        with mon.decode(batch=batch, context_tokens=batch * ctx):
                            g.replay()
                    e3.record()
                    e3.synchronize()
                    if r >= 3:
                        same_ms.append(e2.elapsed_time(e3) / 20)
                    mon.flush(60)
                    continue
                # 20 back-to-back bare replays between one pair of events (as a server runs them: no sync
                # between steps), so the per-step time is not padded by a restart after each synchronize
                e0.record()
                for _ in range(20):
                    g.replay()
                e1.record()
                e1.synchronize()
                bare_ms.append(e0.elapsed_time(e1) / 20)
        assert mon.stats()["decode"]["steps"] - before == 600
        st = mon.stats()["decode"]
        indep = statistics.fmean(indep_bytes / (ms / 1e3 * hw.memory_bandwidth) for ms in bare_ms)
        same = indep_bytes / (statistics.fmean(same_ms) / 1e3 * hw.memory_bandwidth)
        out[f"decode_cuda_graph_batch{batch}"] = {
            "perfsdk_mbu_mean": st["mbu_mean"],
            "independent_mbu_mean": indep,
            # the instrumented steps' bytes over their time on the benchmark's clock: is perfsdk's MBU right?
            "independent_mbu_same_steps": same,
            "relative_difference_same_steps": (st["mbu_mean"] - same) / same,
            # against bare replays: also counts what the timing event itself costs the GPU per step
            "relative_difference": (st["mbu_mean"] - indep) / indep,
            "perfsdk_step_ms_mean": st["step_ms_mean"],
            "independent_step_ms_mean": statistics.fmean(bare_ms),
            "perfsdk_step_ms_p50": st["step_ms_p50"],
            "independent_step_ms_median": statistics.median(bare_ms),
            "relative_difference_of_medians": (indep_bytes / (st["step_ms_p50"] / 1e3 * hw.memory_bandwidth) - indep)
            / indep,
            "independent_step_bytes": indep_bytes,
        }
        mon.close()
    print(
        "== MBU agreement (same steps, against bare):",
        json.dumps({k: [v["relative_difference_same_steps"], v["relative_difference"]] for k, v in out.items()}),
        flush=True,
    )
    return out


def capture_safety(model: Model, spec: ModelSpec, hw: Any, ctx: int, hot_path: str | None) -> dict[str, Any]:
    kw = {"hot_path": hot_path} if hot_path else {}
    tokens = torch.zeros(1, 1, dtype=torch.long, device="cuda")
    pos = torch.tensor([ctx - 1], device="cuda")
    mon = make_monitor(spec, hw, **kw)
    stop = threading.Event()
    side = torch.cuda.Stream()

    def background() -> None:
        with torch.cuda.stream(side):
            while not stop.is_set():
                with mon.decode(batch=1, context_tokens=ctx):
                    time.sleep(0.0002)

    t = threading.Thread(target=background, daemon=True)
    t.start()
    time.sleep(0.2)
    ok, errors = 0, []
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
    out = {
        "captures": 10,
        "succeeded": ok,
        "errors": errors,
        "background_steps": st["decode"]["steps"],
        "internal_errors": st["internal_errors"],
    }
    mon.close()
    print("== capture safety:", json.dumps(out), flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--hot-path", default=None, help="Monitor(hot_path=...) where this perfsdk has it")
    ap.add_argument("--loops", default="graph,graph_synced,graph_synced_tokens,eager")
    ap.add_argument("--parts", default="calls,loops,overload,threads,agreement,capture")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    torch.manual_seed(0)
    shape = SHAPES["1b"]
    model = Model(shape, max_batch=8, ctx=args.ctx, dtype=torch.bfloat16, device="cuda")
    spec = ModelSpec.from_module(
        model, layers=shape.layers, heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim, name="bench-1b"
    )
    hw = perfsdk.hardware.detect()
    res: dict[str, Any] = {"label": args.label, "environment": environment(), "model": spec.to_dict()}
    print(f"== {args.label}: perfsdk at {res['environment']['perfsdk_path']}", flush=True)

    def save() -> None:
        Path(args.out).write_text(json.dumps(res, indent=2, default=str))

    steps: list[tuple[str, Callable[[], Any]]] = [
        ("call_costs", lambda: call_costs(spec, hw, args.hot_path)),
        ("fresh_threads", lambda: fresh_threads(model, spec, hw, args.ctx, args.hot_path)),
        ("loops", lambda: loops(model, spec, hw, args.ctx, args.reps, args.hot_path, args.loops.split(","))),
        ("overload", lambda: [overload(spec, hw, args.hot_path, t) for t in ("host", "cuda")]),
        ("mbu_agreement", lambda: mbu_agreement(model, spec, hw, args.ctx, args.hot_path)),
        ("capture_safety", lambda: capture_safety(model, spec, hw, args.ctx, args.hot_path)),
    ]
    names = {
        "calls": "call_costs",
        "threads": "fresh_threads",
        "loops": "loops",
        "overload": "overload",
        "agreement": "mbu_agreement",
        "capture": "capture_safety",
    }
    wanted = {names[p] for p in parts}
    for name, fn in steps:
        if name not in wanted:
            continue
        try:
            res[name] = fn()
        except Exception as e:  # one part failing must not lose the others
            import traceback

            res[name] = {"error": repr(e), "traceback": traceback.format_exc()}
            print(f"== {name} FAILED: {e!r}", flush=True)
        if name in ("call_costs", "overload"):
            print(f"== {name}:", json.dumps(res[name]), flush=True)
        save()
    save()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
