"""The demo engine's optimisation ladder on a GPU: every rung, both model sizes, one JSON.

    python benchmarks/ladder.py --sizes 1b,8b --out results/        # an H200: about 6 minutes

For each size it runs :func:`perfsdk.demo.ladder.run_ladder` (eager -> graph -> compile -> int8, each
under the same HTTP load with perfsdk's profiler window and verdict) and, before that, checks the fused
Triton int8 kernel against a float32 reference and times it beside bf16 ``F.linear`` and the eager
dequantise-then-matmul on the 8B model's weight shapes. Writes ``<out>/h200_ladder.json`` (environment
with GPU, clocks, driver and torch version; the kernel check; each ladder's result) and each ladder's
``ladder_<size>.md`` and ``ladder_<size>.png``. docs/benchmarks.md summarises the committed run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# runnable from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import perfsdk
from perfsdk.demo.ladder import LadderConfig, format_table, run_ladder

# The seed's 7B figures (seeds/000_522167d9ced5af01.txt): tokens/s and MBU per step of its loop.
SEED = [("naive", 25.5, 0.17), ("tuned (CUDA graph, static cache)", 107.0, 0.72), ("int8", 157.4, 0.53)]
# The H200 reference for Llama-3-8B's shape, batch 1, context 1024, standalone loop (ms/step).
REFERENCE_8B_MS = {"eager": 9.5, "graph": 5.4, "compile": 4.8, "int8 (compile)": 4.85}
BF16_FLOOR_8B_MS = 3.37


def environment() -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "perfsdk": perfsdk.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
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
            env["nvidia_smi_error"] = str(e)
    return env


def _time_ms(fn: Any, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def int8_kernel_check() -> dict[str, Any]:
    """Correctness of the Triton W8A16 kernel against float32, and its speed on the 8B shapes."""
    from perfsdk.demo.int8_triton import chosen_configs, w8a16_mm
    from perfsdk.demo.quant import quantize_weight

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    checks = []
    for m, n, k in ((1, 4096, 4096), (5, 6144, 4096), (16, 28672, 4096), (32, 4096, 14336), (3, 1000, 512)):
        w = torch.randn(n, k, generator=gen, device=dev, dtype=torch.bfloat16) / k**0.5
        q, s = quantize_weight(w)
        x = torch.randn(m, k, generator=gen, device=dev, dtype=torch.bfloat16)
        ref = x.double() @ (q.double() * s.double()[:, None]).T
        out = w8a16_mm(x, q, s)
        rel = float((out.double() - ref).norm() / ref.norm())
        checks.append({"m": m, "n": n, "k": k, "rel_err": rel, "ok": rel < 1e-2 and bool(torch.isfinite(out).all())})
    shapes = {
        "wqkv": (6144, 4096),
        "wo": (4096, 4096),
        "w13": (28672, 4096),
        "w2": (4096, 14336),
        "output": (128256, 4096),
    }
    timing = []
    for name, (n, k) in shapes.items():
        w = torch.randn(n, k, generator=gen, device=dev, dtype=torch.bfloat16) / k**0.5
        q, s = quantize_weight(w)
        for m in (1, 16):
            x = torch.randn(m, k, generator=gen, device=dev, dtype=torch.bfloat16)
            t_bf16 = _time_ms(lambda x=x, w=w: torch.nn.functional.linear(x, w))
            t_tri = _time_ms(lambda x=x, q=q, s=s: w8a16_mm(x, q, s))
            t_deq = _time_ms(lambda x=x, q=q, s=s: torch.nn.functional.linear(x, q.to(x.dtype)) * s)
            timing.append(
                {
                    "weight": name,
                    "m": m,
                    "n": n,
                    "k": k,
                    "bf16_ms": t_bf16,
                    "bf16_tb_s": n * k * 2 / t_bf16 / 1e9,
                    "triton_int8_ms": t_tri,
                    "triton_int8_tb_s": n * k / t_tri / 1e9,
                    "eager_dequant_ms": t_deq,
                }
            )
        del w, q, s
    return {"correctness": checks, "timing": timing, "configs": chosen_configs()}


def _strip(result: dict[str, Any]) -> dict[str, Any]:
    """Paths under the temporary directory as bare names: the committed JSON should not name /tmp."""
    for row in result.get("rungs", []):
        load = row.get("load") or {}
        if load.get("bench"):
            load["bench"] = Path(load["bench"]).name
        prof = row.get("profile") or {}
        if prof.get("trace"):
            prof["trace"] = Path(prof["trace"]).name
            if prof.get("verdict"):
                prof["verdict"] = prof["verdict"].split("; trace: ")[0]
    result.pop("files", None)
    return result


def _graph_time_ms(fn: Any, calls: int = 20) -> float:
    """GPU time of one call of *fn*: *calls* calls captured in one CUDA graph, replayed (no launch gaps)."""
    from llama_decode import capture_graph  # beside this script

    def many() -> None:
        for _ in range(calls):
            fn()

    g, _ = capture_graph(many, warmups=1)
    return _time_ms(g.replay) / calls


def attention_kernel_check() -> dict[str, Any]:
    """The fused Triton decode attention against the torch one (gather, matmuls, softmax), on the 1b and 8b
    head shapes: agreement, and the GPU time of one call over a 32-slot, 1024-position cache (inside a CUDA
    graph, as the engine runs them)."""
    from perfsdk.demo.attention_triton import check, fused_decode_attention
    from perfsdk.demo.graph_engine import decode_attention

    out: dict[str, Any] = {"correctness": {}, "timing": []}
    for name, (heads, kv, d) in {"1b": (32, 4, 64), "8b": (32, 8, 128)}.items():
        out["correctness"][name] = check(decode_attention, heads, kv, d, torch.bfloat16, "cuda") or "ok"
        kc = torch.randn(33, kv, 1024, d, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        for b in (1, 8, 32):
            q = torch.randn(b, 1, heads, d, device="cuda", dtype=torch.bfloat16)
            slots = torch.randperm(32, device="cuda")[:b]
            mask = torch.ones(b, 1024, dtype=torch.bool, device="cuda")

            def torch_attn(q: Any = q, slots: Any = slots, mask: Any = mask, kc: Any = kc, vc: Any = vc) -> Any:
                return decode_attention(q, kc[slots], vc[slots], mask)

            def triton_attn(q: Any = q, slots: Any = slots, mask: Any = mask, kc: Any = kc, vc: Any = vc) -> Any:
                return fused_decode_attention(q, kc, vc, slots, mask)

            out["timing"].append(
                {
                    "shape": name,
                    "batch": b,
                    "length": 1024,
                    "torch_ms": _graph_time_ms(torch_attn),
                    "triton_ms": _graph_time_ms(triton_attn),
                }
            )
    return out


def standalone(sizes: list[str], rungs: list[str], steps: int, attentions: list[str]) -> dict[str, Any]:
    """Each rung's own decode step at batch 1, context 1024, without the server (``--standalone-only``), for
    each decode attention asked for."""
    from perfsdk.demo.ladder import _peaks, _standalone
    from perfsdk.demo.rungs import build_engine, prepare_model
    from perfsdk.demo.stack import build_model, demo_model_spec

    hw, _, cal_bw = _peaks("cuda", True)
    out: dict[str, Any] = {}
    for size in sizes:
        model = build_model(size=size, device="cuda", max_batch_slots=32, max_seq=1024)
        rows = []
        for rung, attention in [(r, a) for r in rungs for a in attentions]:
            t0 = time.perf_counter()
            prepare_model(model, rung)
            engine = build_engine(model, rung, compile_int8=True, attention=attention)
            spec = demo_model_spec(model, f"demo-{size}")
            row = _standalone(engine, spec, hw, batch=1, context=1024, steps=steps)
            row["mbu_calibrated"] = row["mbu"] * hw.memory_bandwidth / cal_bw if row.get("mbu") and cal_bw else None
            row.update(
                rung=rung,
                build_and_first_steps_s=round(time.perf_counter() - t0, 1),
                weight_bytes=spec.weight_bytes,
                int8_kernel=getattr(engine, "int8_kernel", None),
                attention=getattr(engine, "attention", None),
                attention_rejected=getattr(engine, "attention_rejected", None),
            )
            print(f"{size} {rung}: {row}", flush=True)
            rows.append(row)
            del engine
        out[size] = rows
        del model
    return out


def summary(results: dict[str, Any]) -> list[str]:
    lines = []
    for size, res in results["ladders"].items():
        if "error" in res:
            lines.append(f"{size}: FAILED: {res['error']}")
            continue
        lines.append(format_table(res))
        ran = [r for r in res["rungs"] if not r.get("skipped")]
        best = max(ran, key=lambda r: (r.get("standalone_b1") or {}).get("mbu") or 0, default=None)
        if best is not None:
            sb = best["standalone_b1"]
            target = 0.65 if size == "8b" else 0.30
            lines.append(
                f"  best batch-1 rung: {best['rung']} at {sb['step_ms_p50']:.3f} ms, MBU {sb['mbu']:.1%} "
                f"(target {target:.0%}: {'met' if sb['mbu'] >= target else 'NOT met'})"
            )
        for r in ran:
            ratio = r.get("served_over_standalone")
            errs = (r.get("monitor") or {}).get("internal_errors")
            lines.append(
                f"  {r['rung']}: served/standalone {ratio if ratio is None else f'{ratio:.2f}x'}, "
                f"internal errors {errs}, verdict {(r.get('profile') or {}).get('kind')}, "
                f"build {(r.get('engine') or {}).get('build_s')} s"
            )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1b,8b")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--output-len", default="128")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rungs", default=None)
    ap.add_argument("--no-kernel-check", action="store_true")
    ap.add_argument(
        "--attention",
        default="auto",
        help="the engines' decode attention: auto, triton or torch; --standalone-only takes a "
        "comma-separated list and runs each",
    )
    ap.add_argument(
        "--standalone-only",
        action="store_true",
        help="each rung's batch-1 step without the server (a quick check; needs --rungs)",
    )
    ap.add_argument("--name", default="h200_ladder", help="the JSON's file name, without .json")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "environment": environment(),
        "seed_figures": SEED,
        "reference_8b_ms": REFERENCE_8B_MS,
        "bf16_floor_8b_ms": BF16_FLOOR_8B_MS,
        "ladders": {},
    }
    print(json.dumps(results["environment"]), flush=True)
    if not args.no_kernel_check:
        try:
            results["int8_kernel"] = int8_kernel_check()
            print(json.dumps(results["int8_kernel"]["correctness"]), flush=True)
            for t in results["int8_kernel"]["timing"]:
                print(
                    f"  {t['weight']:>7} m={t['m']:<3} bf16 {t['bf16_ms']:.4f} ms ({t['bf16_tb_s']:.2f} TB/s)  "
                    f"triton int8 {t['triton_int8_ms']:.4f} ms ({t['triton_int8_tb_s']:.2f} TB/s)  "
                    f"eager dequant {t['eager_dequant_ms']:.4f} ms",
                    flush=True,
                )
        except Exception as e:
            import traceback

            traceback.print_exc()
            results["int8_kernel"] = {"error": f"{type(e).__name__}: {e}"}
        try:
            results["attention_kernel"] = attention_kernel_check()
            print(json.dumps(results["attention_kernel"]), flush=True)
        except Exception as e:
            import traceback

            traceback.print_exc()
            results["attention_kernel"] = {"error": f"{type(e).__name__}: {e}"}
    rungs = tuple(args.rungs.split(",")) if args.rungs else None
    if args.standalone_only:
        results["standalone"] = standalone(
            args.sizes.split(","), list(rungs or ()), args.steps, args.attention.split(",")
        )
        from perfsdk.demo.int8_triton import chosen_configs

        results["int8_kernel_configs_after"] = chosen_configs()
        results["elapsed_s"] = round(time.perf_counter() - t0, 1)
        (out / f"{args.name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        return 0
    for size in args.sizes.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"ladder-{size}-"))
        try:
            res = run_ladder(
                LadderConfig(
                    device="cuda",
                    size=size,
                    rungs=rungs,
                    out_dir=str(tmp),
                    num_prompts=args.prompts,
                    concurrency=args.concurrency,
                    output_len=args.output_len,
                    steps=args.steps,
                    attention=args.attention,
                    progress=lambda m: print(f"[{time.perf_counter() - t0:6.1f} s] {m}", file=sys.stderr, flush=True),
                )
            )
            res["dynamo_counters"] = {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if v}
            for ext in ("md", "png"):
                if (tmp / f"ladder.{ext}").exists():
                    shutil.copy(tmp / f"ladder.{ext}", out / f"ladder_{size}.{ext}")
            results["ladders"][size] = _strip(res)
        except Exception as e:
            import traceback

            traceback.print_exc()
            results["ladders"][size] = {"error": f"{type(e).__name__}: {e}"}
        finally:
            import gc

            gc.collect()
            torch.cuda.empty_cache()
        results["elapsed_s"] = round(time.perf_counter() - t0, 1)
        (out / f"{args.name}.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        print(f"{size} done at {results['elapsed_s']} s", file=sys.stderr, flush=True)
    print("\n".join(summary(results)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
