"""Capture the four real GPU traces that ``tests/test_analyze_gpu_fixtures.py`` checks.

Run on a CUDA machine (an H200 for the committed fixtures)::

    OUT=/tmp/traces python benchmarks/gpu_traces.py           # writes $OUT/h200_*.pt.trace.json.gz
    cp /tmp/traces/h200_*.pt.trace.json.gz tests/data/
    python benchmarks/gpu_traces.py --device cpu --out /tmp/x  # the same loops on CPU (checks the script)

A small Llama-shaped model (a few layers, hidden 2048, bf16, random weights) decodes one token per
step at batch 1 against a fixed-length KV cache, so every loop is shape-static and can be captured
in a CUDA graph. Four loops, each profiled with ``schedule(wait=2, warmup=2, active=4)`` and
``record_function("perfsdk.decode")`` around each step:

* ``eager``       — the plain eager loop: many small kernels, the host cannot launch them fast enough;
* ``cuda_graph``  — the same step captured once with ``torch.cuda.CUDAGraph`` and replayed;
* ``item_sync``   — eager, plus ``next_token.item()`` each step (a device-to-host copy and a stream sync);
* ``pageable_copy`` — eager, plus a copy of a 16 MB pageable host tensor to the device each step.

Then it runs :func:`perfsdk.profiling.analyze.analyze_trace` on each trace and writes
``$OUT/gpu_traces_summary.json`` (GPU, driver, torch version, each trace's diagnosis and whether it
matches what the fixture test expects). Only torch and perfsdk.profiling are needed; < 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# runnable from a checkout without installing perfsdk
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfsdk.profiling.analyze import analyze_trace

# what each fixture must be diagnosed as (tests/test_analyze_gpu_fixtures.py holds the same table)
EXPECTED: dict[str, str] = {
    "eager": "launch_bound in findings",
    "cuda_graph": "no launch_bound; GPU busy",
    "item_sync": "sync_bound in findings",
    "pageable_copy": "copy_bound in findings",
}
PAGEABLE_COPY_BYTES = 16 * 1024 * 1024


def build_model(
    torch: Any,
    device: str,
    *,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    ctx: int,
    dtype: Any,
) -> dict[str, Any]:
    """Random Llama-shaped weights and a KV cache; a dict keeps the script free of nn.Module state."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*shape: int) -> Any:
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).to(device=device, dtype=dtype)

    head_dim = hidden // heads
    m: dict[str, Any] = {
        "embed": w(vocab, hidden),
        "lm_head": w(vocab, hidden),
        "norm": torch.ones(hidden, device=device, dtype=dtype),
        "layers": [],
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "ctx": ctx,
    }
    for _ in range(layers):
        m["layers"].append(
            {
                "attn_norm": torch.ones(hidden, device=device, dtype=dtype),
                "wqkv": w((heads + 2 * kv_heads) * head_dim, hidden),
                "wo": w(hidden, heads * head_dim),
                "mlp_norm": torch.ones(hidden, device=device, dtype=dtype),
                "w_gate_up": w(2 * ffn, hidden),
                "w_down": w(hidden, ffn),
                "k_cache": torch.randn(1, kv_heads, ctx, head_dim, generator=g).to(device=device, dtype=dtype),
                "v_cache": torch.randn(1, kv_heads, ctx, head_dim, generator=g).to(device=device, dtype=dtype),
            }
        )
    half = head_dim // 2
    freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
    m["cos"] = torch.cos(freqs * (ctx - 1)).to(device=device, dtype=dtype)
    m["sin"] = torch.sin(freqs * (ctx - 1)).to(device=device, dtype=dtype)
    return m


def decode_step(torch: Any, m: dict[str, Any], token: Any) -> Any:
    """One batch-1 decode step; writes the argmax token back into *token* (stays on device)."""
    f = torch.nn.functional
    h, kvh, hd = m["heads"], m["kv_heads"], m["head_dim"]
    x = f.embedding(token, m["embed"])  # [1, 1, hidden]
    for layer in m["layers"]:
        y = f.rms_norm(x, (x.shape[-1],), layer["attn_norm"])
        q, k, v = f.linear(y, layer["wqkv"]).split([h * hd, kvh * hd, kvh * hd], dim=-1)
        q = q.view(1, 1, h, hd).transpose(1, 2)
        k = k.view(1, 1, kvh, hd).transpose(1, 2)
        v = v.view(1, 1, kvh, hd).transpose(1, 2)
        q1, q2 = q.chunk(2, dim=-1)  # rotary embedding at the last position
        q = torch.cat([q1 * m["cos"] - q2 * m["sin"], q2 * m["cos"] + q1 * m["sin"]], dim=-1)
        # write this token's K/V into the last slot of a fixed-length cache: shape-static
        layer["k_cache"][:, :, -1:].copy_(k)
        layer["v_cache"][:, :, -1:].copy_(v)
        a = f.scaled_dot_product_attention(q, layer["k_cache"], layer["v_cache"], enable_gqa=True)
        x = x + f.linear(a.transpose(1, 2).reshape(1, 1, h * hd), layer["wo"])
        y = f.rms_norm(x, (x.shape[-1],), layer["mlp_norm"])
        gate, up = f.linear(y, layer["w_gate_up"]).chunk(2, dim=-1)
        x = x + f.linear(f.silu(gate) * up, layer["w_down"])
    x = f.rms_norm(x, (x.shape[-1],), m["norm"])
    logits = f.linear(x, m["lm_head"])
    token.copy_(logits.argmax(dim=-1))
    return token


def capture(torch: Any, name: str, step: Callable[[], None], out_dir: Path, device: str) -> Path:
    """Profile *step* under schedule(wait=2, warmup=2, active=4); return the .json.gz written."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    prefix = "h200" if device == "cuda" else "cpu"
    path = out_dir / f"{prefix}_{name}.pt.trace.json.gz"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    written: list[Path] = []

    def on_ready(prof: Any) -> None:
        prof.export_chrome_trace(str(path))  # a ".gz" suffix makes torch gzip it
        written.append(path)

    # few active steps, no stacks/shapes/memory: keeps each file well under 1 MB gzipped
    with profile(
        activities=activities,
        schedule=schedule(wait=2, warmup=2, active=4, repeat=1),
        on_trace_ready=on_ready,
        record_shapes=False,
        with_stack=False,
        profile_memory=False,
    ) as prof:
        for _ in range(2 + 2 + 4 + 1):
            with record_function("perfsdk.decode"):
                step()
            prof.step()
    if device == "cuda":
        torch.cuda.synchronize()
    if not written:
        raise RuntimeError(f"{name}: the profiler wrote no trace")
    return path


def check(name: str, d: dict[str, Any]) -> bool:
    kinds = [f["kind"] for f in d["findings"]]
    busy = d["gpu_busy_fraction"]
    if name == "eager":
        return "launch_bound" in kinds
    if name == "cuda_graph":
        return "launch_bound" not in kinds and busy is not None and busy >= 0.8
    if name == "item_sync":
        return "sync_bound" in kinds
    if name == "pageable_copy":
        return "copy_bound" in kinds
    return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder (default: $OUT or .)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ctx", type=int, default=512)
    args = ap.parse_args(argv)

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu to check the script", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    heads = max(args.hidden // 128, 1)
    m = build_model(
        torch,
        dev,
        layers=args.layers,
        hidden=args.hidden,
        heads=heads,
        kv_heads=max(heads // 4, 1),
        ffn=int(args.hidden * 2.75) // 64 * 64,
        vocab=32000,
        ctx=args.ctx,
        dtype=dtype,
    )
    token = torch.zeros(1, 1, dtype=torch.long, device=dev)

    with torch.inference_mode():
        for _ in range(5):  # warm up cuBLAS handles, SDPA backend choice, allocator
            decode_step(torch, m, token)
        if dev == "cuda":
            torch.cuda.synchronize()

        host_buf = torch.randn(PAGEABLE_COPY_BYTES // 4)  # pageable: not pinned on purpose
        dev_buf = torch.empty_like(host_buf, device=dev)
        sink: list[int] = []

        # plain functions: never let a tensor reach a truth test, which would be a hidden sync
        def eager() -> None:
            decode_step(torch, m, token)

        def item_sync() -> None:
            sink.append(int(decode_step(torch, m, token).item()))  # D2H copy + stream sync

        def pageable_copy() -> None:
            dev_buf.copy_(host_buf)  # H2D from pageable memory: staged, slow
            decode_step(torch, m, token)

        loops: dict[str, Callable[[], None]] = {"eager": eager, "item_sync": item_sync, "pageable_copy": pageable_copy}
        if dev == "cuda":
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # capture needs a side stream and a warmed-up step
                for _ in range(3):
                    decode_step(torch, m, token)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                decode_step(torch, m, token)
            torch.cuda.synchronize()
            loops["cuda_graph"] = graph.replay

        order = ["eager", "cuda_graph", "item_sync", "pageable_copy"]
        summary: dict[str, Any] = {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "device": dev,
            "gpu": torch.cuda.get_device_name() if dev == "cuda" else platform.processor() or "cpu",
            "cuda": torch.version.cuda,
            "model": {"layers": args.layers, "hidden": args.hidden, "ctx": args.ctx, "dtype": str(dtype)},
            "traces": {},
        }
        if dev == "cuda":
            try:
                import subprocess

                summary["driver"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.mem", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                ).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                summary["driver"] = None
        all_ok = True
        for name in order:
            if name not in loops:
                summary["traces"][name] = {"skipped": "CUDA graphs need a CUDA device"}
                continue
            path = capture(torch, name, loops[name], out_dir, dev)
            diag = analyze_trace(path).to_dict()
            ok = check(name, diag) if dev == "cuda" else None
            all_ok = all_ok and ok is not False
            summary["traces"][name] = {
                "file": path.name,
                "bytes": path.stat().st_size,
                "expected": EXPECTED[name],
                "matches": ok,
                "gpu_busy_fraction": diag["gpu_busy_fraction"],
                "findings": diag["findings"],
                "summary": diag["summary"],
            }
            print(
                f"{name:14s} {path.stat().st_size / 1e3:7.0f} kB  busy={diag['gpu_busy_fraction']}  "
                f"findings={[f['kind'] for f in diag['findings']]}  expected: {EXPECTED[name]}  ok={ok}"
            )
    summary["seconds"] = round(time.perf_counter() - t_start, 1)
    (out_dir / "gpu_traces_summary.json").write_text(json.dumps(summary, indent=2))
    print(f"wrote {out_dir / 'gpu_traces_summary.json'} in {summary['seconds']} s")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
