"""``perfsdk demo --ladder``: climb the demo engine's optimisation ladder, and let perfsdk explain each rung.

The seeds' loop, in one command: measure one clean number, compare it with the floor, locate the gap,
change one thing, measure again, write it down::

    perfsdk demo --ladder                                   # CPU: eager, graph (no capture), int8
    perfsdk demo --ladder --device cuda --model-size 8b     # eager -> graph -> compile -> int8
    perfsdk demo --ladder --rungs eager,graph --out my-ladder

    from perfsdk.demo.ladder import LadderConfig, run_ladder, format_table
    result = run_ladder(LadderConfig(device="cpu", size="tiny"))
    print(format_table(result))

Every rung (:mod:`perfsdk.demo.rungs`, one change each) runs the same measurements on the same model:

1. **standalone, batch 1**: the engine's own decode step in a loop at context ``context`` (1024 on
   CUDA), timed on the device by a :class:`perfsdk.Monitor` of its own: step time, tokens/s, and
   perfsdk's MBU against the datasheet and against this machine's calibrated copy bandwidth;
2. **served load**: the instrumented HTTP server under ``num_prompts`` streaming requests at
   ``concurrency`` in flight (:mod:`perfsdk.bench`, in its own process); once the load runs at about full
   batch, perfsdk's profiler window (``Monitor.profile``) captures a few steady steps and
   :func:`perfsdk.profiling.analyze.analyze_trace` (``perfsdk analyze``) gives the verdict on the captured
   *decode* steps, against the unprofiled step time (the profiler slows what it measures) and, for the
   kernels, against the peak bandwidth: launch-, sync-, copy-bound, slow kernels (with the Nsight Compute
   command for them) or healthy memory-bound;
3. **served batch 1**: three requests one after the other: the tokens/s one user sees;
4. **standalone at the load's shape** (its mean batch and context): the in-server step over the bare
   loop's, which says what serving costs on top of the kernels;
5. ``perfsdk bench compare`` and ``perfsdk regress check`` of the load against the rung before.

Then the loop's log: for each rung the hypothesis the previous verdict suggests, the change, a predicted
step time, the result, and whether the prediction held. The table's "next" column is the change the
finding asks for (:func:`short_advice`), whatever the rung is called; a utilisation above 100 % (which no
step can reach) is shown as ``suspect``, not as a result. Written under ``out_dir``: ``ladder.json``
(everything), ``ladder.md`` (the table and the log), ``ladder.png`` (step time and MBU per rung, where
matplotlib is installed), ``bench-<rung>.json`` (each load, for ``perfsdk bench compare``) and
``traces/`` (each profiler window's trace and diagnosis).

On a CPU, ``graph`` runs the same static step without CUDA graphs and ``compile`` is skipped (the
table says why); the bf16 rungs share one model, and ``int8`` quantises it in place, so it runs last.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["LadderConfig", "format_markdown", "format_table", "run_ladder", "short_advice"]

log = logging.getLogger(__name__)

# per device kind: slots, concurrency, prompts, output tokens, standalone steps, batch-1 context, max_seq
_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {"slots": 4, "concurrency": 4, "prompts": 8, "output": "48", "steps": 16, "context": 256, "max_seq": 512},
    "cuda": {"slots": 32, "concurrency": 16, "prompts": 64, "output": "128", "steps": 64, "context": 1024,
             "max_seq": 1024},
}
# a prediction "held" when the measured step is within this fraction of it
_HELD = 0.15


@dataclass(frozen=True)
class LadderConfig:
    """What ``perfsdk demo --ladder`` runs; ``None`` fields take the device's defaults (see ``_DEFAULTS``)."""

    device: str = "auto"
    size: str | None = None
    rungs: tuple[str, ...] | None = None
    out_dir: str = "perfsdk-ladder"
    max_batch_slots: int | None = None
    max_seq: int | None = None
    context: int | None = None
    steps: int | None = None
    num_prompts: int | None = None
    concurrency: int | None = None
    input_len: str = "uniform:32-128"
    output_len: str | None = None
    seed: int = 0
    calibrate: bool = True
    int8_kernel: str = "auto"
    attention: str = "auto"
    profile_steps: int = 4
    progress: Callable[[str], None] | None = field(default=None, repr=False, compare=False)


def _say(cfg: LadderConfig, msg: str) -> None:
    if cfg.progress is not None:
        cfg.progress(msg)


def _plan(names: Sequence[str] | None, device: str) -> list[tuple[str, str | None]]:
    """(rung, skip reason) in ladder order; rungs asked for by name run even where skipped by default."""
    from perfsdk.demo.rungs import RUNG_NAMES, skip_reason

    if names is None:
        return [(n, skip_reason(n, device)) for n in RUNG_NAMES]
    unknown = [n for n in names if n not in RUNG_NAMES]
    if unknown:
        raise ConfigError(f"--rungs: unknown rung {unknown[0]!r}; the rungs are {', '.join(RUNG_NAMES)}")
    wanted = set(names)
    return [(n, None) for n in RUNG_NAMES if n in wanted]  # int8 quantises the shared model: it goes last


def run_ladder(cfg: LadderConfig) -> dict[str, Any]:
    """Run every rung of the ladder (see the module docstring); returns what ``ladder.json`` holds."""
    from perfsdk.demo.model import ModelArgs, default_size
    from perfsdk.demo.stack import build_model, resolve_device

    dev = resolve_device(cfg.device)
    kind = "cuda" if dev.startswith("cuda") else "cpu"
    d = _DEFAULTS[kind]
    size = cfg.size or default_size(dev)
    ModelArgs.from_name(size)  # a bad size fails before anything is built
    plan = _plan(cfg.rungs, dev)
    slots = cfg.max_batch_slots or d["slots"]
    concurrency = cfg.concurrency or min(d["concurrency"], slots)
    max_seq = cfg.max_seq or d["max_seq"]
    context = min(cfg.context or d["context"], max_seq)
    steps = cfg.steps or d["steps"]
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "device": dev, "size": size, "max_batch_slots": slots, "max_seq": max_seq, "context": context,
        "steps": steps, "num_prompts": cfg.num_prompts or d["prompts"], "concurrency": concurrency,
        "input_len": cfg.input_len, "output_len": cfg.output_len or d["output"], "seed": cfg.seed,
        "int8_kernel": cfg.int8_kernel, "attention": cfg.attention,
    }
    _say(cfg, f"perfsdk ladder: {size} on {dev}: rungs {', '.join(n for n, r in plan if r is None)}")
    hw, hw_note, cal_bw = _peaks(dev, cfg.calibrate)
    t0 = time.perf_counter()
    model = build_model(size=size, device=dev, max_batch_slots=slots, max_seq=max_seq, seed=cfg.seed)
    build_model_s = time.perf_counter() - t0
    compile_int8 = any(n == "compile" and r is None for n, r in plan)
    rows: list[dict[str, Any]] = []
    prev: dict[str, Any] | None = None
    for name, reason in plan:
        if reason is not None:
            _say(cfg, f"perfsdk ladder: {name}: skipped ({reason})")
            rows.append({"rung": name, "skipped": reason})
            continue
        try:
            row = _run_rung(cfg, name, model, settings, hw, cal_bw, out, compile_int8=compile_int8)
        except Exception as e:  # one broken rung is a row that says why, not a lost ladder
            log.exception("perfsdk ladder: rung %s failed", name)
            rows.append({"rung": name, "skipped": f"failed: {type(e).__name__}: {e}",
                         "error": traceback.format_exc()})
            if name == "compile":
                compile_int8 = False  # int8 then builds on the last rung that ran
            continue
        _explain(row, prev)
        if prev is not None:
            _compare(row, prev, out)
        rows.append(row)
        prev = row
        _say(cfg, f"perfsdk ladder: {name}: {_one_line(row)}")
    result = {
        "settings": settings,
        "model": {"size": size, "params": model.args.num_params(), "build_s": round(build_model_s, 2)},
        "hardware": {"note": hw_note, "datasheet_bandwidth": getattr(hw, "memory_bandwidth", None)
                     if hw_note.startswith("datasheet") else None, "calibrated_bandwidth": cal_bw},
        "environment": _environment(dev),
        "rungs": rows,
    }
    _write(result, out)
    return result


def _peaks(device: str, calibrate: bool) -> tuple[Any, str, float | None]:
    """The Monitor's hardware (datasheet on CUDA, calibrated on a CPU) and the calibrated copy bandwidth."""
    from perfsdk import hardware
    from perfsdk.demo.stack import _hardware

    hw, note = _hardware(device, calibrate)
    cal_bw: float | None = None
    if calibrate:
        try:
            cal = hardware.calibrate(device="cuda" if device.startswith("cuda") else "cpu", quick=True)
            cal_bw = cal.copy_bandwidth if cal.usable else None  # a noisy measurement is not a ceiling
        except Exception as e:  # no calibration: the "calibrated" column stays empty
            log.warning("perfsdk ladder: calibration failed: %s", e)
    return hw, note, cal_bw


def _standalone(engine: Any, spec: Any, hw: Any, *, batch: int, context: int, steps: int) -> dict[str, Any]:
    """The engine's decode step in a loop, timed by a Monitor of its own (perfsdk's step time and MBU)."""
    import perfsdk

    mon = perfsdk.Monitor(model=spec, hardware=hw, service="perfsdk-ladder", prometheus=False, otel=False)
    try:
        engine.time_decode(batch, context, min(8, steps))  # warm: first shapes, lazy captures
        wall = engine.time_decode(batch, context, steps, phase=mon.decode)
        mon.flush(timeout=30)
        st = (mon.stats().get("decode") or {})
    finally:
        mon.close()
    step_ms = st.get("step_ms_p50")
    return {
        "batch": batch, "context": context, "steps": steps,
        "wall_ms": wall * 1e3,
        "tokens_per_s": batch / wall if wall > 0 else None,
        "step_ms_p50": step_ms,
        "step_ms_mean": st.get("step_ms_mean"),
        "mbu": st.get("mbu_p50"),
    }


def _bench(base_url: str, model_name: str, *, prompts: int, concurrency: int, input_len: str, output_len: str,
           seed: int, save: str | None) -> Any:
    from perfsdk.bench import BenchConfig
    from perfsdk.demo.stack import run_load

    config = BenchConfig(
        base_url=base_url, model=model_name, endpoint="completions", num_prompts=prompts,
        request_rate=math.inf, max_concurrency=concurrency, input_len=input_len, output_len=output_len,
        ignore_eos=True, seed=seed, timeout_s=600.0, progress=False, save_result=save,
    )
    return run_load(config)


def _run_rung(cfg: LadderConfig, name: str, model: Any, s: Mapping[str, Any], hw: Any, cal_bw: float | None,
              out: Path, *, compile_int8: bool) -> dict[str, Any]:
    from perfsdk.demo.rungs import RUNGS
    from perfsdk.demo.stack import start_demo

    rung = RUNGS[name]
    change = rung.change
    if name != "eager" and not s["device"].startswith("cuda"):
        change += " (on a CPU: no CUDA graphs; the same static step runs uncaptured)"
    row: dict[str, Any] = {"rung": name, "change": change, "why": rung.why, "skipped": None}
    _say(cfg, f"perfsdk ladder: {name}: building the engine ({rung.change})")
    stack = start_demo(
        size=s["size"], device=s["device"], model=model, engine=name, seed=s["seed"],
        max_batch_slots=s["max_batch_slots"], max_seq=s["max_seq"], calibrate=cfg.calibrate,
        profile_dir=str(out / "traces"), compile_int8=compile_int8, int8_kernel=cfg.int8_kernel,
        attention=cfg.attention,
    )
    try:
        eng, mon, spec = stack.engine, stack.monitor, stack.model_spec
        row["engine"] = {
            "class": type(eng).__name__, "name": eng.name, "build_s": round(stack.build_seconds, 2),
            "cuda_graphs": getattr(eng, "cuda_graphs", False), "compiled": getattr(eng, "compiled", False),
            "graphs": len(getattr(eng, "_graphs", {})), "capture_s": round(getattr(eng, "capture_seconds", 0.0), 2),
            "compile_s": round(getattr(eng, "compile_seconds", 0.0), 2),
            "int8_kernel": getattr(eng, "int8_kernel", None) if getattr(eng, "quantized", False) else None,
            "attention": getattr(eng, "attention", None),
            "attention_rejected": getattr(eng, "attention_rejected", None),
        }
        row["spec"] = {"params": spec.params, "weight_bytes": spec.weight_bytes, "dtype": spec.dtype,
                       "kv_bytes_per_token": spec.kv_bytes_per_token, "step_weight_bytes": spec.step_weight_bytes,
                       "embedding_row_bytes": spec.embedding_row_bytes}
        _say(cfg, f"perfsdk ladder: {name}: standalone loop, batch 1 at context {s['context']}")
        row["standalone_b1"] = _standalone(eng, spec, hw, batch=1, context=s["context"], steps=s["steps"])
        _add_mbu(row["standalone_b1"], hw, cal_bw)

        # the load, with perfsdk's profiler window armed on the serving engine once it is at full batch
        n_before = len(eng.stats.batch_sizes)
        ctx_before = eng.stats.decode_context_tokens
        _say(cfg, f"perfsdk ladder: {name}: load, {s['num_prompts']} requests at concurrency {s['concurrency']}")
        bench_path = str(out / f"bench-{name}.json")
        done: list[Any] = []

        def load_thread() -> None:
            try:
                done.append(_bench(stack.server.base_url, stack.model_name, prompts=s["num_prompts"],
                                   concurrency=s["concurrency"], input_len=s["input_len"],
                                   output_len=s["output_len"], seed=s["seed"], save=bench_path))
            except BaseException as e:
                done.append(e)

        t = threading.Thread(target=load_thread, name="perfsdk-ladder-load", daemon=True)
        t.start()
        handle = _arm_profile(cfg, mon, eng, n_before, s["concurrency"], t, out)
        t.join()
        if isinstance(done[0], BaseException):
            raise done[0]
        load = done[0]
        eng.wait_idle(timeout=30)
        capture = handle.wait(timeout=60) if handle is not None else None
        if handle is not None and capture is None:  # still armed: the load ended before the window captured
            mon.enable_profiler().cancel("the load ended before the window captured")
        mon.flush(timeout=30)
        stats = mon.stats()
        sizes = eng.stats.batch_sizes[n_before:]
        ctx_sum = eng.stats.decode_context_tokens - ctx_before
        mean_batch = statistics.fmean(sizes) if sizes else 0.0
        mean_ctx = ctx_sum / sum(sizes) if sizes else 0.0
        dec = stats.get("decode") or {}
        summ = load.summary
        row["load"] = {
            "bench": bench_path,
            "completed": summ.get("completed"), "failed": summ.get("failed"),
            "output_tokens_per_s": summ.get("output_throughput"),
            "ttft_ms_p50": (summ.get("ttft_ms") or {}).get("median"),
            "ttft_ms_p99": (summ.get("ttft_ms") or {}).get("p99"),
            "tpot_ms_p50": (summ.get("tpot_ms") or {}).get("median"),
            "itl_ms_p99": (summ.get("itl_ms") or {}).get("p99"),
            "decode_steps": len(sizes), "batch_mean": mean_batch, "context_mean": mean_ctx,
            "step_ms_p50": dec.get("step_ms_p50"), "step_ms_mean": dec.get("step_ms_mean"),
            "mbu": dec.get("mbu_p50"),
            "prefill_mfu": (stats.get("prefill") or {}).get("mfu_p50"),
        }
        _add_mbu(row["load"], hw, cal_bw)
        row["profile"] = _profile(capture)

        _say(cfg, f"perfsdk ladder: {name}: one request at a time")
        b1 = _bench(stack.server.base_url, stack.model_name, prompts=3, concurrency=1, input_len="64",
                    output_len=s["output_len"], seed=s["seed"] + 1, save=None)
        tpot = (b1.summary.get("tpot_ms") or {}).get("median")
        row["served_b1"] = {"tpot_ms_p50": tpot, "tokens_per_s": 1000.0 / tpot if tpot else None,
                            "completed": b1.summary.get("completed")}

        if sizes:
            batch = max(1, min(round(mean_batch), s["max_batch_slots"]))
            row["standalone_load"] = _standalone(eng, spec, hw, batch=batch, context=max(2, round(mean_ctx)),
                                                 steps=s["steps"])
            _add_mbu(row["standalone_load"], hw, cal_bw)
            solo = row["standalone_load"]["step_ms_p50"]
            served = row["load"]["step_ms_p50"]
            row["served_over_standalone"] = served / solo if served and solo else None
        mon.flush(timeout=10)
        health = mon.stats()
        row["monitor"] = {"internal_errors": health.get("internal_errors"),
                          "dropped_records": health.get("dropped_records")}
        row["engine"]["failed_requests"] = eng.stats.failed
    finally:
        stack.close()
    return row


def _arm_profile(cfg: LadderConfig, mon: Any, eng: Any, n_before: int, concurrency: int, load: threading.Thread,
                 out: Path) -> Any:
    """Arm perfsdk's profiler window once the load runs at about full batch; None if it never does.

    Under a closed-loop load the batch changes whenever a request ends and the next one joins (every few
    steps at 16 in flight) and the steady gate restarts at each change, so the window asks for 4 steps of
    one batch size and captures anyway (marked not steady) 3 s after arming.
    """
    mon.enable_profiler(directory=str(out / "traces"), steps=cfg.profile_steps, warmup=1, steady_window=4,
                        steady_cv=0.3, warmup_steps=1, steady_timeout_s=3.0)
    target = max(1, (3 * concurrency) // 4)
    while load.is_alive():
        sizes = eng.stats.batch_sizes
        if len(sizes) - n_before >= 8 and sizes[-1] >= target:
            return mon.profile(steps=cfg.profile_steps, reason="ladder")
        time.sleep(0.005)
    return None


def _add_mbu(d: dict[str, Any], hw: Any, cal_bw: float | None) -> None:
    """MBU against the calibrated copy bandwidth too (the Monitor's is against its hardware spec)."""
    mbu = d.get("mbu")
    bw = getattr(hw, "memory_bandwidth", None)
    d["mbu_calibrated"] = mbu * bw / cal_bw if mbu is not None and bw and cal_bw else None


def _decode_steps(diag: Mapping[str, Any]) -> dict[str, Any] | None:
    """The profiled decode steps alone (the window also records the prefills that fall inside it)."""
    steps = [st for st in diag.get("steps") or [] if st.get("name") == "perfsdk.decode" and st.get("gpu_window_us")]
    if not steps:
        return None
    busy = sum(st["gpu_busy_us"] for st in steps)
    shares: dict[str, float] = {}
    for st in steps:  # category shares weighted by each step's busy time
        for c, v in (st.get("category_shares") or {}).items():
            shares[c] = shares.get(c, 0.0) + v * st["gpu_busy_us"] / busy if busy else 0.0
    return {
        "steps": len(steps),
        "gpu_window_us": statistics.fmean(st["gpu_window_us"] for st in steps),
        "gpu_busy_us": busy / len(steps),
        "kernels": statistics.fmean(st["kernels"] for st in steps),
        "graph_launches": statistics.fmean(st.get("graph_launches", 0) for st in steps),
        "category_shares": {c: round(v, 4) for c, v in shares.items()},
    }


def _profile(capture: Any) -> dict[str, Any]:
    """What the table and the log need of one capture: the window's verdict on its decode steps."""
    if capture is None:
        return {"captured": False, "verdict": None, "kind": None,
                "reason": "the load ended before the window captured"}
    diag = capture.diagnosis or {}
    findings = diag.get("findings") or []
    top = findings[0] if findings else None
    # the window's own report: its decode steps, against the unprofiled step and the peak bandwidth
    report = diag.get("report")
    if report is None and capture.trace:
        try:  # an older window: the report `perfsdk analyze TRACE` prints
            from perfsdk.profiling.analyze import analyze_trace

            report = analyze_trace(capture.trace).format_report()
        except Exception as e:
            report = f"(perfsdk analyze failed: {type(e).__name__}: {e})"
    summary = diag.get("summary") or {}
    kc = diag.get("kernel_check") or {}
    observed = [o for o in (diag.get("observer") or {}).values() if o.get("inflation") is not None]
    return {
        "captured": capture.error is None,
        "error": capture.error,
        "steady": capture.steady,
        "trace": capture.trace,
        "verdict": capture.verdict,
        "kind": top.get("kind") if top else None,
        "share": top.get("share") if top else None,
        "suggestion": top.get("suggestion") if top else None,
        "findings": [{"kind": f.get("kind"), "share": f.get("share")} for f in findings],
        "gpu_busy": diag.get("gpu_busy_fraction"),
        "step_us": summary.get("step_time_us_mean"),
        "kernels_per_step": summary.get("kernels_per_step"),
        "kernel_median_us": summary.get("kernel_median_us"),
        "graph_launches_per_step": summary.get("graph_launches_per_step"),
        "host_syncs_per_step": summary.get("host_syncs_per_step"),
        "category_shares": summary.get("category_shares"),
        "decode": _decode_steps(diag),
        "kernel_utilisation": kc.get("utilisation"),
        "kernel_bound": kc.get("bound"),
        "ncu": kc.get("ncu"),
        "inflation": observed[0]["inflation"] if observed else None,
        "unprofiled_step_us": observed[0]["unprofiled_step_us"] if observed else None,
        "report": report,
    }


def short_advice(row: Mapping[str, Any]) -> str:
    """The next change in a few words, from the rung's finding and its evidence — never from the rung's name
    (the log carries perfsdk's full text)."""
    p = row.get("profile") or {}
    kind = p.get("kind")
    graphs = (p.get("graph_launches_per_step") or 0) >= 1  # the captured decode steps replay a CUDA graph
    int8 = (row.get("spec") or {}).get("dtype") == "int8"
    if kind == "launch_bound":
        return "overlap host work, batch more" if graphs else "CUDA graphs"
    if kind == "sync_bound":
        return "no host reads in the step"
    if kind == "copy_bound":
        return "pinned, non-blocking copies"
    if kind == "communication_bound":
        return "overlap communication"
    if kind == "slow_kernels":
        util = p.get("kernel_utilisation")
        of = f" ({util * 100:.0f}% of peak)" if isinstance(util, (int, float)) else ""
        return f"faster kernels{of}: ncu"
    if kind == "utilisation_suspect":
        return "check the peak and bytes"
    if kind == "busy_unchecked":
        return "give model and GPU"
    if kind == "memory_bound":
        return "fewer bytes: int4 / fp8 KV, batch more" if int8 else "fewer bytes: int8 weights"
    if kind == "compute_bound":
        return "lower precision, fewer FLOPs"
    if p.get("captured") and p.get("gpu_busy") is None:
        return "profile on a GPU"
    return "-"


# ---- the loop's log: hypothesis -> change -> result ---------------------------------------------------


def _explain(row: dict[str, Any], prev: Mapping[str, Any] | None) -> None:
    """Fill ``hypothesis``, ``predicted_step_ms`` and ``result`` from the previous rung's measurements."""
    name = row["rung"]
    load = row.get("load") or {}
    step = load.get("step_ms_p50")
    predicted: float | None = None
    if prev is None:
        hyp = ("Starting point: measure the engine as it is, under the same load every rung gets, and ask "
               "perfsdk where the time goes.")
    else:
        pp = prev.get("profile") or {}
        pl = prev.get("load") or {}
        pstep = pl.get("step_ms_p50")
        kind = pp.get("kind")
        dec = pp.get("decode") or {}
        kernel_ms = dec.get("gpu_busy_us", 0.0) / 1000
        cats = dec.get("category_shares") or {}
        # the step the kernels' busy time is a share of: the unprofiled one where the window knew it
        unprofiled = pp.get("unprofiled_step_us")
        step_us = unprofiled or dec.get("gpu_window_us")
        of_step = (f"the unprofiled {unprofiled / 1000:.2f} ms step ({dec['gpu_window_us'] / 1000:.2f} ms profiled)"
                   if unprofiled and dec else
                   f"its {dec.get('gpu_window_us', 0.0) / 1000:.2f} ms (profiler time included)")
        if name == "graph" and pstep and dec:
            # in a graph the kernels still run one after the other, with ~1 µs between dependent ones
            predicted = kernel_ms + dec["kernels"] * 0.001
            hyp = (f"{prev['rung']} was {kind or 'not diagnosed'}: a profiled decode step kept the GPU busy "
                   f"{kernel_ms:.2f} ms of {of_step}, "
                   f"over {dec['kernels']:.0f} kernels. If the rest is launch gaps, one graph launch per step "
                   f"leaves the kernels and about 1 µs between each two: step ≈ {kernel_ms:.2f} + "
                   f"{dec['kernels']:.0f} × 0.001 = {predicted:.2f} ms.")
        elif name == "compile" and pstep and cats:
            small = sum(cats.get(c, 0.0) for c in ("elementwise", "normalization", "other"))
            busy = min(kernel_ms / (step_us / 1000), 1.0) if step_us else 1.0
            predicted = pstep * (1 - busy * small)
            hyp = (f"{prev['rung']} was {kind or 'not diagnosed'}; {small:.0%} of its decode steps' GPU time is "
                   f"elementwise, normalization and other small kernels (GPU busy {busy:.0%}). If fusion made "
                   f"them free: step ≈ {pstep:.2f} × (1 − {busy:.2f} × {small:.2f}) = {predicted:.2f} ms.")
        elif name == "int8" and pstep and prev.get("spec") and row.get("spec"):
            # decode step bytes = weights (an untied input table: a row per sequence) + KV bytes per token × the
            # batch's context (budget.decode_step_bytes)
            batch = load.get("batch_mean") or 1
            ctx = (load.get("context_mean") or 0) * batch

            def step_bytes(spec: dict[str, Any]) -> float:
                weights = spec.get("step_weight_bytes", spec["weight_bytes"])
                return float(weights + spec.get("embedding_row_bytes", 0.0) * batch + spec["kv_bytes_per_token"] * ctx)

            old, new = step_bytes(prev["spec"]), step_bytes(row["spec"])
            predicted = pstep * new / old
            hyp = (f"{prev['rung']} was {kind or 'not diagnosed'}. A memory-bound step is bytes over bandwidth: "
                   f"{new / 1e9:.2f} GB instead of {old / 1e9:.2f} GB per step at the same bandwidth gives "
                   f"step ≈ {pstep:.2f} × {new / old:.2f} = {predicted:.2f} ms.")
        else:
            why = _rung_why().get(name, "")
            hyp = f"{why} (no prediction: the rung before gave no GPU profile to scale)."
    row["hypothesis"] = hyp
    row["predicted_step_ms"] = predicted
    if step is None:
        row["result"] = "no decode steps measured"
        row["prediction_held"] = None
        return
    p = row.get("profile") or {}
    verdict = p.get("kind") or "no finding"
    share = p.get("share")
    res = f"served decode step {step:.2f} ms (p50, batch {load.get('batch_mean', 0):.1f}); verdict {verdict}"
    if share is not None:
        res += f" ({share:.0%} of step time)"
    if predicted:
        err = step / predicted - 1
        held = abs(err) <= _HELD
        row["prediction_held"] = held
        res += (f"; predicted {predicted:.2f} ms: {'held' if held else 'missed'} "
                f"({err:+.0%}{', slower' if err > 0 else ', faster' if err < 0 else ''})")
    else:
        row["prediction_held"] = None
    row["result"] = res


def _rung_why() -> dict[str, str]:
    from perfsdk.demo.rungs import RUNGS

    return {n: r.why[:1].upper() + r.why[1:] for n, r in RUNGS.items()}


def _compare(row: dict[str, Any], prev: Mapping[str, Any], out: Path) -> None:
    """``perfsdk bench compare`` and ``perfsdk regress check`` of this rung's load against the previous one's."""
    from perfsdk.bench import BenchResult
    from perfsdk.bench.compare import compare_results, config_diff, format_comparison
    from perfsdk.regress import check

    a_path, b_path = (prev.get("load") or {}).get("bench"), (row.get("load") or {}).get("bench")
    if not a_path or not b_path:
        return
    try:
        a, b = BenchResult.load(a_path), BenchResult.load(b_path)
        rows = compare_results(a, b)
        row["compare"] = format_comparison(rows, config_diff(a, b), names=(prev["rung"], row["rung"]))
    except Exception as e:  # a comparison that cannot be made is a note, not a lost ladder
        row["compare"] = f"(compare failed: {type(e).__name__}: {e})"
        return
    try:
        report = check(a, b)
        row["regress"] = {"passed": report.passed, "regressions": [g.row.metric for g in report.regressions],
                          "markdown": report.markdown()}
    except Exception as e:  # e.g. a gated value the load did not produce: the gate says so, the table stays
        row["regress"] = {"passed": False, "regressions": [], "markdown": f"(regress check: cannot compare: {e})\n"}


# ---- output ---------------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x)


def _util(x: Any) -> str:
    """A utilisation (MBU, MFU): above 1 no step can be, so it is shown as suspect, not as a result."""
    if x is None:
        return "-"
    return f"suspect ({x * 100:.0f}%)" if x > 1 else f"{x * 100:.1f}%"


def _suspects(result: Mapping[str, Any]) -> list[str]:
    """'rung: column' for every utilisation above 100 % in the table."""
    out = []
    for r in result["rungs"]:
        if r.get("skipped"):
            continue
        for label, d, key in (("MBU b1", r.get("standalone_b1"), "mbu"), ("MBU b1 cal", r.get("standalone_b1"),
                              "mbu_calibrated"), ("MBU load", r.get("load"), "mbu")):
            v = (d or {}).get(key)
            if isinstance(v, (int, float)) and v > 1:
                out.append(f"{r['rung']} {label}")
    return out


_SUSPECT_NOTE = ("suspect: a utilisation above 100 %, which no step can reach: the peak in use (datasheet or "
                 "calibrated bandwidth) or the measurement is wrong")


def _verdict(row: Mapping[str, Any]) -> str:
    p = row.get("profile") or {}
    if not p.get("captured"):
        return "not captured"
    kind = p.get("kind")
    if kind is None:
        return "no finding" + (" (CPU trace)" if p.get("gpu_busy") is None else "")
    return f"{kind} {p['share'] * 100:.0f}%" if p.get("share") is not None else str(kind)


_COLUMNS = ("rung", "step ms b1", "tok/s b1", "tok/s served b1", "tok/s load", "MBU b1", "MBU b1 cal",
            "MBU load", "srv/solo", "verdict", "next")


def _cells(row: Mapping[str, Any]) -> list[str]:
    if row.get("skipped"):
        return [row["rung"], *["-"] * 9, "skipped"]
    sb, ld, sv = row.get("standalone_b1") or {}, row.get("load") or {}, row.get("served_b1") or {}
    return [
        row["rung"], _f(sb.get("step_ms_p50")), _f(sb.get("tokens_per_s"), "{:.1f}"),
        _f(sv.get("tokens_per_s"), "{:.1f}"), _f(ld.get("output_tokens_per_s"), "{:.0f}"), _util(sb.get("mbu")),
        _util(sb.get("mbu_calibrated")), _util(ld.get("mbu")), _f(row.get("served_over_standalone"), "{:.2f}x"),
        _verdict(row), short_advice(row),
    ]


def format_table(result: Mapping[str, Any]) -> str:
    """The seeds' table, as text."""
    s = result["settings"]
    m = result["model"]
    lines = [
        f"perfsdk demo --ladder: demo-{s['size']} ({m['params'] / 1e9:.2f}B params) on {s['device']}; "
        f"{result['hardware']['note']}",
        f"  batch 1: standalone loop at context {s['context']}; load: {s['num_prompts']} requests at concurrency "
        f"{s['concurrency']}, prompt {s['input_len']}, output {s['output_len']} tokens",
    ]
    table = [list(_COLUMNS), *[_cells(r) for r in result["rungs"]]]
    widths = [max(len(r[i]) for r in table) + 2 for i in range(len(_COLUMNS))]
    for cells in table:
        lines.append("  " + "".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    for row in result["rungs"]:
        if row.get("skipped"):
            lines.append(f"  {row['rung']}: skipped: {row['skipped']}")
    lines.append("  step ms b1 and MBU b1: perfsdk's device step time and MBU of the standalone loop (MBU against the "
                 "datasheet, 'cal' against this machine's measured copy bandwidth); MBU load: the served steps'; "
                 "srv/solo: the served decode step over the standalone loop at the load's mean batch and context; "
                 "verdict and next: perfsdk's finding on the profiled decode steps, against the unprofiled step")
    suspects = _suspects(result)
    if suspects:
        lines.append(f"  {_SUSPECT_NOTE} ({', '.join(suspects)})")
    errors = [r["rung"] for r in result["rungs"] if (r.get("monitor") or {}).get("internal_errors")]
    if errors:
        lines.append(f"  note: perfsdk internal errors in {', '.join(errors)} (see ladder.json)")
    return "\n".join(lines)


def format_markdown(result: Mapping[str, Any]) -> str:
    """``ladder.md``: the table, then the loop's log, rung by rung."""
    s, env = result["settings"], result.get("environment") or {}
    lines = [f"# perfsdk ladder: demo-{s['size']} on {env.get('gpu') or s['device']}", ""]
    lines.append(f"{result['hardware']['note']}; torch {env.get('torch')}; perfsdk {env.get('perfsdk')}; "
                 f"{env.get('date_utc')}.")
    lines.append(f"Batch 1: the engine's own step in a loop at context {s['context']}. Load: {s['num_prompts']} "
                 f"streaming requests at concurrency {s['concurrency']}, prompt {s['input_len']} tokens, "
                 f"output {s['output_len']} tokens, over HTTP.")
    lines += ["", "| " + " | ".join(_COLUMNS) + " |", "|" + " --- |" * len(_COLUMNS)]
    for row in result["rungs"]:
        lines.append("| " + " | ".join(_cells(row)) + " |")
    suspects = _suspects(result)
    if suspects:
        lines += ["", f"{_SUSPECT_NOTE[:1].upper()}{_SUSPECT_NOTE[1:]}: {', '.join(suspects)}."]
    lines += ["", "## The loop: hypothesis → change → result", ""]
    n = 0
    for row in result["rungs"]:
        if row.get("skipped"):
            lines += [f"### {row['rung']}: skipped", "", row["skipped"], ""]
            continue
        n += 1
        eng = row.get("engine") or {}
        lines += [f"### {n}. {row['rung']}", ""]
        lines.append(f"- **Hypothesis.** {row.get('hypothesis')}")
        lines.append(f"- **Change.** {row['change']} (built in {eng.get('build_s')} s: {eng.get('graphs', 0)} "
                     f"CUDA graphs, capture {eng.get('capture_s')} s, compile {eng.get('compile_s')} s).")
        lines.append(f"- **Result.** {row.get('result')}.")
        sb, sl = row.get("standalone_b1") or {}, row.get("standalone_load") or {}
        lines.append(f"- **Batch 1** (standalone, context {sb.get('context')}): {_f(sb.get('step_ms_p50'))} ms "
                     f"per step on the device, {_f(sb.get('tokens_per_s'), '{:.1f}')} tokens/s, MBU "
                     f"{_util(sb.get('mbu'))} ({_util(sb.get('mbu_calibrated'))} of the calibrated copy bandwidth).")
        if sl:
            lines.append(f"- **Served vs standalone** at batch {sl.get('batch')}, context {sl.get('context')}: "
                         f"{_f((row.get('load') or {}).get('step_ms_p50'))} ms served, {_f(sl.get('step_ms_p50'))} "
                         f"ms standalone ({_f(row.get('served_over_standalone'), '{:.2f}x')}).")
        p = row.get("profile") or {}
        if p.get("verdict"):
            lines.append(f"- **perfsdk's verdict.** `{p['verdict']}`")
        if p.get("suggestion"):
            lines.append(f"- **Next, says perfsdk.** {p['suggestion']}")
        mon = row.get("monitor") or {}
        lines.append(f"- perfsdk internal errors: {mon.get('internal_errors')}; dropped records: "
                     f"{mon.get('dropped_records')}.")
        if p.get("report"):  # the window's diagnosis (its decode steps, against the unprofiled step and the peak)
            name = Path(p.get("trace") or "").name
            lines += ["", "```text", f"$ perfsdk analyze {name}  # as the window diagnosed it", p["report"], "```"]
        if row.get("compare"):
            lines += ["", "```text", f"$ perfsdk bench compare bench-{_prev_name(result, row)}.json "
                      f"bench-{row['rung']}.json", row["compare"], "```"]
        reg = row.get("regress")
        if reg:
            lines += ["", reg["markdown"]]
        lines.append("")
    return "\n".join(lines)


def _prev_name(result: Mapping[str, Any], row: Mapping[str, Any]) -> str:
    ran: list[str] = [str(r["rung"]) for r in result["rungs"] if not r.get("skipped")]
    i = ran.index(str(row["rung"]))
    return ran[i - 1] if i > 0 else ran[i]


def _plot(result: Mapping[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["rungs"] if not r.get("skipped")]
    names = [r["rung"] for r in rows]
    b1 = [(r.get("standalone_b1") or {}).get("step_ms_p50") or 0.0 for r in rows]
    served = [(r.get("load") or {}).get("step_ms_p50") or 0.0 for r in rows]
    mbu_b1 = [100 * ((r.get("standalone_b1") or {}).get("mbu") or 0.0) for r in rows]
    mbu_ld = [100 * ((r.get("load") or {}).get("mbu") or 0.0) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = list(range(len(names)))
    ax1.bar([i - 0.2 for i in x], b1, width=0.4, label="batch 1 (standalone)")
    ax1.bar([i + 0.2 for i in x], served, width=0.4, label="served load")
    ax1.set_xticks(x, names)
    ax1.set_ylabel("decode step, ms (device time)")
    ax1.set_title("step time per rung")
    ax1.legend()
    ax2.plot(x, mbu_b1, marker="o", label="batch 1 (standalone)")
    ax2.plot(x, mbu_ld, marker="s", label="served load")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("MBU, % of datasheet bandwidth")
    ax2.set_ylim(0, 100)
    ax2.set_title("MBU per rung")
    ax2.legend()
    s = result["settings"]
    fig.suptitle(f"perfsdk ladder: demo-{s['size']} on {(result.get('environment') or {}).get('gpu') or s['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _write(result: dict[str, Any], out: Path) -> None:
    result["files"] = {"json": str(out / "ladder.json"), "markdown": str(out / "ladder.md")}
    if _plot(result, out / "ladder.png"):
        result["files"]["plot"] = str(out / "ladder.png")
    (out / "ladder.md").write_text(format_markdown(result) + "\n")
    (out / "ladder.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


def _environment(device: str) -> dict[str, Any]:
    import platform

    import torch

    import perfsdk
    from perfsdk import hardware

    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "perfsdk": perfsdk.__version__,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu_count": __import__("os").cpu_count(),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    try:
        env["device_info"] = hardware.device_info()
    except Exception as e:
        env["device_info_error"] = str(e)
    return env


def _one_line(row: Mapping[str, Any]) -> str:
    sb, ld = row.get("standalone_b1") or {}, row.get("load") or {}
    return (f"batch-1 step {_f(sb.get('step_ms_p50'))} ms (MBU {_util(sb.get('mbu'))}), load "
            f"{_f(ld.get('output_tokens_per_s'), '{:.0f}')} tokens/s, verdict {_verdict(row)}")
