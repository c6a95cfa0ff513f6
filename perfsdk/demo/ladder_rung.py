"""Running one rung of the ladder: the same measurements on every rung, each into a typed record of the
:class:`~perfsdk.demo.ladder_rows.RungRow` it returns (see :mod:`perfsdk.demo.ladder` for what they are)::

    row = run_rung(name, model, settings, hw, cal_bw, out, compile_int8=False, calibrate=True,
                   profile_steps=4, say=print)
    row.standalone_b1.step_ms_p50, row.load.mbu, row.profile.kind
    compare(row, prev, out)     # perfsdk bench compare and regress check against the rung before

1. the engine's decode step in a loop at batch 1, timed by a Monitor of its own (:func:`standalone`);
2. the served load over HTTP in its own thread, with perfsdk's profiler window armed once the load runs at
   about full batch (:func:`arm_profile`), and the window's verdict on the captured decode steps
   (:func:`profile_of`);
3. three requests one after the other; 4. the standalone loop at the load's mean batch and context.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from perfsdk.demo.ladder_rows import (
    DecodeSteps,
    EngineInfo,
    FindingShare,
    Health,
    LoadRun,
    Profile,
    RegressCheck,
    RungRow,
    ServedB1,
    Settings,
    SpecInfo,
    Standalone,
)

__all__ = ["arm_profile", "calibrated", "compare", "profile_of", "run_rung", "standalone"]


def run_rung(
    name: str,
    model: Any,
    s: Settings,
    hw: Any,
    cal_bw: float | None,
    out: Path,
    *,
    compile_int8: bool,
    calibrate: bool,
    profile_steps: int,
    say: Callable[[str], None],
) -> RungRow:
    """Build the rung's engine and server, measure it, shut it down; the row of what was measured."""
    from perfsdk.demo.rungs import RUNGS
    from perfsdk.demo.stack import start_demo

    rung = RUNGS[name]
    change = rung.change
    if name != "eager" and not s.device.startswith("cuda"):
        change += " (on a CPU: no CUDA graphs; the same static step runs uncaptured)"
    row = RungRow(rung=name, change=change, why=rung.why)
    say(f"perfsdk ladder: {name}: building the engine ({rung.change})")
    stack = start_demo(
        size=s.size,
        device=s.device,
        model=model,
        engine=name,
        seed=s.seed,
        max_batch_slots=s.max_batch_slots,
        max_seq=s.max_seq,
        calibrate=calibrate,
        profile_dir=str(out / "traces"),
        compile_int8=compile_int8,
        int8_kernel=s.int8_kernel or "auto",
        attention=s.attention or "auto",
    )
    try:
        eng, mon, spec = stack.engine, stack.monitor, stack.model_spec
        row.engine = EngineInfo.of(eng, stack.build_seconds)
        row.spec = SpecInfo(
            params=spec.params,
            weight_bytes=spec.weight_bytes,
            dtype=spec.dtype,
            kv_bytes_per_token=spec.kv_bytes_per_token,
            step_weight_bytes=spec.step_weight_bytes,
            embedding_row_bytes=spec.embedding_row_bytes,
        )
        say(f"perfsdk ladder: {name}: standalone loop, batch 1 at context {s.context}")
        row.standalone_b1 = standalone(eng, spec, hw, batch=1, context=s.context, steps=s.steps)
        row.standalone_b1.mbu_calibrated = calibrated(row.standalone_b1.mbu, hw, cal_bw)

        # the load, with perfsdk's profiler window armed on the serving engine once it is at full batch
        n_before = len(eng.stats.batch_sizes)
        ctx_before = eng.stats.decode_context_tokens
        say(f"perfsdk ladder: {name}: load, {s.num_prompts} requests at concurrency {s.concurrency}")
        bench_path = str(out / f"bench-{name}.json")
        done: list[Any] = []  # the load thread's one result: the bench result, or what it raised

        def load_thread() -> None:
            try:
                done.append(
                    _bench(
                        stack.server.base_url,
                        stack.model_name,
                        prompts=s.num_prompts,
                        concurrency=s.concurrency,
                        input_len=s.input_len,
                        output_len=s.output_len,
                        seed=s.seed,
                        save=bench_path,
                    )
                )
            except BaseException as e:
                done.append(e)

        t = threading.Thread(target=load_thread, name="perfsdk-ladder-load", daemon=True)
        t.start()
        handle = arm_profile(mon, eng, n_before, s.concurrency, t, out, profile_steps)
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
        row.load = LoadRun(
            bench=bench_path,
            completed=summ.get("completed"),
            failed=summ.get("failed"),
            output_tokens_per_s=summ.get("output_throughput"),
            ttft_ms_p50=(summ.get("ttft_ms") or {}).get("median"),
            ttft_ms_p99=(summ.get("ttft_ms") or {}).get("p99"),
            tpot_ms_p50=(summ.get("tpot_ms") or {}).get("median"),
            itl_ms_p99=(summ.get("itl_ms") or {}).get("p99"),
            decode_steps=len(sizes),
            batch_mean=mean_batch,
            context_mean=mean_ctx,
            step_ms_p50=dec.get("step_ms_p50"),
            step_ms_mean=dec.get("step_ms_mean"),
            mbu=dec.get("mbu_p50"),
            prefill_mfu=(stats.get("prefill") or {}).get("mfu_p50"),
        )
        row.load.mbu_calibrated = calibrated(row.load.mbu, hw, cal_bw)
        row.profile = profile_of(capture)

        say(f"perfsdk ladder: {name}: one request at a time")
        b1 = _bench(
            stack.server.base_url,
            stack.model_name,
            prompts=3,
            concurrency=1,
            input_len="64",
            output_len=s.output_len,
            seed=s.seed + 1,
            save=None,
        )
        tpot = (b1.summary.get("tpot_ms") or {}).get("median")
        row.served_b1 = ServedB1(
            tpot_ms_p50=tpot, tokens_per_s=1000.0 / tpot if tpot else None, completed=b1.summary.get("completed")
        )

        if sizes:
            batch = max(1, min(round(mean_batch), s.max_batch_slots))
            solo = standalone(eng, spec, hw, batch=batch, context=max(2, round(mean_ctx)), steps=s.steps)
            solo.mbu_calibrated = calibrated(solo.mbu, hw, cal_bw)
            row.standalone_load = solo
            served = row.load.step_ms_p50
            row.served_over_standalone = served / solo.step_ms_p50 if served and solo.step_ms_p50 else None
        mon.flush(timeout=10)
        health = mon.stats()
        row.monitor = Health(
            internal_errors=health.get("internal_errors"), dropped_records=health.get("dropped_records")
        )
        row.engine.failed_requests = eng.stats.failed
    finally:
        stack.close()
    return row


def standalone(engine: Any, spec: Any, hw: Any, *, batch: int, context: int, steps: int) -> Standalone:
    """The engine's decode step in a loop, timed by a Monitor of its own (perfsdk's step time and MBU)."""
    import perfsdk

    mon = perfsdk.Monitor(model=spec, hardware=hw, service="perfsdk-ladder", prometheus=False, otel=False)
    try:
        engine.time_decode(batch, context, min(8, steps))  # warm: first shapes, lazy captures
        wall = engine.time_decode(batch, context, steps, phase=mon.decode)
        mon.flush(timeout=30)
        st = mon.stats().get("decode") or {}
    finally:
        mon.close()
    return Standalone(
        batch=batch,
        context=context,
        steps=steps,
        wall_ms=wall * 1e3,
        tokens_per_s=batch / wall if wall > 0 else None,
        step_ms_p50=st.get("step_ms_p50"),
        step_ms_mean=st.get("step_ms_mean"),
        mbu=st.get("mbu_p50"),
    )


def calibrated(mbu: float | None, hw: Any, cal_bw: float | None) -> float | None:
    """MBU against the calibrated copy bandwidth too (the Monitor's is against its hardware spec)."""
    bw = getattr(hw, "memory_bandwidth", None)
    return mbu * bw / cal_bw if mbu is not None and bw and cal_bw else None


def _bench(
    base_url: str,
    model_name: str,
    *,
    prompts: int,
    concurrency: int,
    input_len: str,
    output_len: str,
    seed: int,
    save: str | None,
) -> Any:
    from perfsdk.bench import BenchConfig
    from perfsdk.demo.stack import run_load

    config = BenchConfig(
        base_url=base_url,
        model=model_name,
        endpoint="completions",
        num_prompts=prompts,
        request_rate=math.inf,
        max_concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
        ignore_eos=True,
        seed=seed,
        timeout_s=600.0,
        progress=False,
        save_result=save,
    )
    return run_load(config)


def arm_profile(
    mon: Any, eng: Any, n_before: int, concurrency: int, load: threading.Thread, out: Path, steps: int
) -> Any:
    """Arm perfsdk's profiler window once the load runs at about full batch; None if it never does.

    Under a closed-loop load the batch changes whenever a request ends and the next one joins (every few
    steps at 16 in flight) and the steady gate restarts at each change, so the window asks for 4 steps of
    one batch size and captures anyway (marked not steady) 3 s after arming.
    """
    mon.enable_profiler(
        directory=str(out / "traces"),
        steps=steps,
        warmup=1,
        steady_window=4,
        steady_cv=0.3,
        warmup_steps=1,
        steady_timeout_s=3.0,
    )
    target = max(1, (3 * concurrency) // 4)
    while load.is_alive():
        sizes = eng.stats.batch_sizes
        if len(sizes) - n_before >= 8 and sizes[-1] >= target:
            return mon.profile(steps=steps, reason="ladder")
        time.sleep(0.005)
    return None


def _decode_steps(diag: Mapping[str, Any]) -> DecodeSteps | None:
    """The profiled decode steps alone (the window also records the prefills that fall inside it)."""
    steps = [st for st in diag.get("steps") or [] if st.get("name") == "perfsdk.decode" and st.get("gpu_window_us")]
    if not steps:
        return None
    busy = sum(st["gpu_busy_us"] for st in steps)
    shares: dict[str, float] = {}
    for st in steps:  # category shares weighted by each step's busy time
        for c, v in (st.get("category_shares") or {}).items():
            shares[c] = shares.get(c, 0.0) + v * st["gpu_busy_us"] / busy if busy else 0.0
    return DecodeSteps(
        steps=len(steps),
        gpu_window_us=statistics.fmean(st["gpu_window_us"] for st in steps),
        gpu_busy_us=busy / len(steps),
        kernels=statistics.fmean(st["kernels"] for st in steps),
        graph_launches=statistics.fmean(st.get("graph_launches", 0) for st in steps),
        category_shares={c: round(v, 4) for c, v in shares.items()},
    )


def profile_of(capture: Any) -> Profile:
    """What the table and the log need of one capture: the window's verdict on its decode steps."""
    if capture is None:
        return Profile(missing="the load ended before the window captured")
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
    return Profile(
        captured=capture.error is None,
        error=capture.error,
        steady=capture.steady,
        trace=capture.trace,
        verdict=capture.verdict,
        kind=top.get("kind") if top else None,
        share=top.get("share") if top else None,
        suggestion=top.get("suggestion") if top else None,
        findings=[FindingShare(f.get("kind"), f.get("share")) for f in findings],
        gpu_busy=diag.get("gpu_busy_fraction"),
        step_us=summary.get("step_time_us_mean"),
        kernels_per_step=summary.get("kernels_per_step"),
        kernel_median_us=summary.get("kernel_median_us"),
        graph_launches_per_step=summary.get("graph_launches_per_step"),
        host_syncs_per_step=summary.get("host_syncs_per_step"),
        category_shares=summary.get("category_shares"),
        decode=_decode_steps(diag),
        kernel_utilisation=kc.get("utilisation"),
        kernel_bound=kc.get("bound"),
        ncu=kc.get("ncu"),
        inflation=observed[0]["inflation"] if observed else None,
        unprofiled_step_us=observed[0]["unprofiled_step_us"] if observed else None,
        report=report,
    )


def compare(row: RungRow, prev: RungRow, out: Path) -> None:
    """``perfsdk bench compare`` and ``perfsdk regress check`` of this rung's load against the previous one's."""
    from perfsdk.bench import BenchResult
    from perfsdk.bench.compare import compare_results, config_diff, format_comparison
    from perfsdk.regress import check

    a_path, b_path = (prev.load or LoadRun()).bench, (row.load or LoadRun()).bench
    if not a_path or not b_path:
        return
    try:
        a, b = BenchResult.load(a_path), BenchResult.load(b_path)
        rows = compare_results(a, b)
        row.compare = format_comparison(rows, config_diff(a, b), names=(prev.rung, row.rung))
    except Exception as e:  # a comparison that cannot be made is a note, not a lost ladder
        row.compare = f"(compare failed: {type(e).__name__}: {e})"
        return
    try:
        report = check(a, b)
        row.regress = RegressCheck(
            passed=report.passed, regressions=[g.row.metric for g in report.regressions], markdown=report.markdown()
        )
    except Exception as e:  # e.g. a gated value the load did not produce: the gate says so, the table stays
        row.regress = RegressCheck(passed=False, regressions=[], markdown=f"(regress check: cannot compare: {e})\n")
