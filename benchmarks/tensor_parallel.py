"""Tensor parallelism: per-rank MBU, the ranks' profiles at the same steps, and a straggler perfsdk names.

Run one process per GPU (the 2-GPU numbers in docs/benchmarks.md come from this)::

    torchrun --nproc-per-node 2 benchmarks/tensor_parallel.py --out benchmarks/results/h200x2_tensor_parallel.json
    torchrun --nproc-per-node 2 benchmarks/tensor_parallel.py --device cpu --out tp_cpu.json   # gloo, tiny shape

What each rank runs: its shard of a Llama-3-8B-shaped decoder (``--shape tiny`` on a CPU) split the
Megatron way — the QKV and gate/up projections column-parallel, the attention output and down
projections row-parallel with an all-reduce after each (two per layer), a vocab-parallel embedding
(one more all-reduce) and a column-parallel LM head whose local argmax ends the step on the device.
Random bf16 weights (float32 on a CPU), a static KV cache of ``--ctx`` tokens per sequence. NCCL on
GPUs (its settings as the environment has them), gloo on a CPU.

For each mode (eager; a CUDA graph of the whole step, collectives included, on GPUs) and batch
(1 and 8), every rank:

1. runs ``--steps`` decode steps inside ``with mon.decode(...)`` of a Monitor whose model is the
   per-GPU share (``ModelSpec.with_tp(world)``) and whose hardware is its own GPU's datasheet row
   (a quick calibration of copy bandwidth on a CPU): perfsdk's per-rank step time and MBU, beside an
   independent step time (wall clock over the run, synchronised at both ends) and an independent MBU
   (bytes counted from the shard's actual tensors and the KV slices read);
2. asks for a profiler window with ``mon.profile(steps=P, steady=False)`` at the same step on every
   rank, so every rank captures the same steps; rank 0 compares the ranks' traces
   (:mod:`perfsdk.profiling.ranks`): each step's share in collectives per rank, who waits for whom.

Then a **straggler run** per mode at batch 1: one rank (``--straggler-rank``, default the last) does
extra work in every step — repeated matmuls before its first all-reduce, sized to
``--straggler-fraction`` of a healthy step — and the comparison must name that rank and the others'
wait (``named_straggler`` in the JSON; the report's text is kept too).

Output (rank 0): a JSON file with each rank's GPU, clocks, driver, torch, CUDA and NCCL versions, and
per configuration each rank's numbers, the comparison and the trace paths.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from prometheus_client import CollectorRegistry
from torch import Tensor

import perfsdk
from perfsdk.budget import decode_step_bytes
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.ranks import compare_ranks


# --------------------------------------------------------------------------- the sharded model
@dataclass(frozen=True)
class Shape:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    inter: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def hf_config(self, dtype: str) -> dict[str, Any]:
        return {
            "model_type": "llama",
            "hidden_size": self.dim,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "vocab_size": self.vocab,
            "torch_dtype": dtype,
            "tie_word_embeddings": False,
        }


SHAPES = {
    "llama-3-8b": Shape(4096, 32, 32, 8, 14336, 128256),
    # small enough for two ranks on a 2-core CPU to step in tens of ms
    "tiny": Shape(256, 4, 8, 4, 704, 4096),
}


class TPDecoder:
    """One rank's shard of a Llama-shaped decoder under Megatron-style tensor parallelism."""

    def __init__(
        self, s: Shape, world: int, rank: int, max_batch: int, ctx: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        for name, n in (("heads", s.heads), ("intermediate size", s.inter), ("vocab", s.vocab)):
            if n % world:
                raise SystemExit(f"{world} ranks do not divide the {name} ({n})")
        self.s, self.world, self.rank, self.ctx = s, world, rank, ctx
        self.h = s.heads // world
        self.kv = max(s.kv_heads // world, 1)  # fewer KV heads than ranks: replicated
        self.inter = s.inter // world
        self.vocab = s.vocab // world
        hd = s.head_dim
        # made on the device: 8 GB of weights per rank drawn on a host would take minutes
        g = torch.Generator(device=device).manual_seed(1234 + rank)

        def w(*shape: int, scale: float = 0.02) -> Tensor:
            return torch.randn(*shape, generator=g, device=device, dtype=dtype).mul_(scale)

        self.emb = w(self.vocab, s.dim)  # vocab-parallel
        self.layers = [
            {
                "wqkv": w(s.dim, (self.h + 2 * self.kv) * hd),  # column-parallel
                "wo": w(self.h * hd, s.dim),  # row-parallel (+ all-reduce)
                "w13": w(s.dim, 2 * self.inter),  # column-parallel (gate and up)
                "w2": w(self.inter, s.dim),  # row-parallel (+ all-reduce)
                "n1": torch.ones(s.dim, device=device, dtype=dtype),
                "n2": torch.ones(s.dim, device=device, dtype=dtype),
            }
            for _ in range(s.layers)
        ]
        self.norm = torch.ones(s.dim, device=device, dtype=dtype)
        self.head = w(s.dim, self.vocab)  # column-parallel
        shape = (max_batch, self.kv, ctx, hd)
        self.kc = [w(*shape, scale=1.0) for _ in range(s.layers)]
        self.vc = [w(*shape, scale=1.0) for _ in range(s.layers)]
        self.pos = torch.tensor([ctx - 1], device=device)
        # the straggler's extra work: repeated (B, dim) x (dim, dim) matmuls into a fixed buffer
        self.extra_w = w(s.dim, s.dim)
        self.extra_buf = torch.zeros(max_batch, s.dim, device=device, dtype=dtype)
        self.extra_repeats = 0

    def extra_work(self, x: Tensor, repeats: int) -> None:
        out = self.extra_buf[: x.shape[0]]
        for _ in range(repeats):
            torch.matmul(x, self.extra_w, out=out)

    @torch.no_grad()
    def decode(self, tokens: Tensor) -> Tensor:
        """One decode step for ``tokens`` (B,): every collective included; ends with the local argmax."""
        s, hd, b = self.s, self.s.head_dim, tokens.shape[0]
        local = tokens - self.rank * self.vocab
        mine = (local >= 0) & (local < self.vocab)
        x = self.emb[local.clamp(0, self.vocab - 1)] * mine.unsqueeze(-1).to(self.emb.dtype)
        dist.all_reduce(x)  # the rank that holds the row contributes it, the others zeros
        for i, (lw, kc, vc) in enumerate(zip(self.layers, self.kc, self.vc, strict=True)):
            qkv = F.rms_norm(x, (s.dim,), lw["n1"]) @ lw["wqkv"]
            q, k, v = qkv.split([self.h * hd, self.kv * hd, self.kv * hd], dim=-1)
            kc[:b].index_copy_(2, self.pos, k.view(b, self.kv, 1, hd))
            vc[:b].index_copy_(2, self.pos, v.view(b, self.kv, 1, hd))
            o = F.scaled_dot_product_attention(q.view(b, self.h, 1, hd), kc[:b], vc[:b], enable_gqa=True)
            y = o.reshape(b, self.h * hd) @ lw["wo"]
            if i == 0 and self.extra_repeats:
                self.extra_work(x, self.extra_repeats)  # a straggler: late at the first all-reduce
            dist.all_reduce(y)
            x = x + y
            gate, up = (F.rms_norm(x, (s.dim,), lw["n2"]) @ lw["w13"]).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ lw["w2"]
            dist.all_reduce(y)
            x = x + y
        return (F.rms_norm(x, (s.dim,), self.norm) @ self.head).argmax(-1)  # stays on the device

    def bytes_read(self, batch: int) -> int:
        """What one decode step really reads on this rank: the shard's weights (of the embedding only the
        rows looked up) and the KV cache of every sequence over the whole static context."""
        weights = sum(t.numel() * t.element_size() for lw in self.layers for t in lw.values())
        weights += (self.norm.numel() + self.head.numel()) * self.head.element_size()
        emb_rows = batch * self.s.dim * self.emb.element_size()  # at most; rows of other shards are not read
        kv = 2 * self.s.layers * batch * self.kv * self.ctx * self.s.head_dim * self.kc[0].element_size()
        return weights + emb_rows + kv


# --------------------------------------------------------------------------- helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def capture_graph(model: TPDecoder, tokens: Tensor) -> Callable[[], object]:
    """A CUDA graph of one whole decode step, NCCL all-reduces included (warmed up on a side stream).

    Captured in thread-local error mode: NCCL's watchdog thread (and perfsdk's collector, which runs in
    relaxed mode anyway) query events from other threads, which a global-mode capture forbids.
    """
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model.decode(tokens)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        model.decode(tokens)
    return graph.replay


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "perfsdk": perfsdk.__version__,
        "host": platform.node(),
        "cores": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "backend": dist.get_backend(),
        "world_size": dist.get_world_size(),
        "rank": dist.get_rank(),
        "nccl_env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")},
    }
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        try:
            q = (
                "index,name,pci.bus_id,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
                "power.limit,temperature.gpu"
            )
            out = subprocess.run(
                ["nvidia-smi", f"--id={device.index}", f"--query-gpu={q}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.strip()
            env["nvidia_smi"] = dict(zip(q.split(","), [v.strip() for v in out.split(",")], strict=False))
            topo = subprocess.run(
                ["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
            env["nvidia_smi_topo"] = topo.strip().splitlines()[:6]
        except Exception as e:
            env["nvidia_smi_error"] = repr(e)
    try:
        env["device_info"] = perfsdk.hardware.device_info(device.index if device.type == "cuda" else None)
    except Exception as e:
        env["device_info_error"] = repr(e)
    return env


def comm_shares(diag: Any) -> list[float | None]:
    """Each captured step's share of its time in collectives (not overlapped), as the analyser measured it."""
    out: list[float | None] = []
    for s in diag.steps:
        total = s.gpu_window_us if diag.has_gpu else s.host_dur_us
        comm = s.exposed_comm_us if diag.has_gpu else s.host_comm_us
        out.append(round(comm / total, 4) if total > 0 else None)
    return out


# --------------------------------------------------------------------------- one configuration
def run_config(
    model: TPDecoder,
    spec: ModelSpec,
    hw: HardwareSpec,
    device: torch.device,
    *,
    mode: str,
    batch: int,
    steps: int,
    warmup: int,
    profile_steps: int,
    trace_dir: Path,
    straggler: int | None = None,
    straggler_fraction: float = 0.3,
) -> dict[str, Any]:
    """Every rank runs exactly the same number of steps here: each step holds collectives."""
    rank = dist.get_rank()
    tokens = torch.arange(batch, device=device) * 997 % model.s.vocab
    model.extra_repeats = 0

    def eager() -> object:
        return model.decode(tokens)

    step: Callable[[], object] = eager
    if mode == "graph":
        step = capture_graph(model, tokens)
    for _ in range(warmup):
        step()
    sync(device)
    if straggler is not None:
        # size the extra work from this rank's own healthy step, then rebuild the graph with it inside
        t0 = time.perf_counter()
        for _ in range(warmup):
            step()
        sync(device)
        healthy_s = (time.perf_counter() - t0) / warmup
        x = torch.zeros(batch, model.s.dim, device=device, dtype=model.emb.dtype)
        t0 = time.perf_counter()
        model.extra_work(x, 20)
        sync(device)
        one = (time.perf_counter() - t0) / 20
        model.extra_repeats = math.ceil(straggler_fraction * healthy_s / one) if rank == straggler else 0
        if mode == "graph":
            step = capture_graph(model, tokens)
        for _ in range(warmup):
            step()
        sync(device)
    name = f"tp{dist.get_world_size()}-{mode}-b{batch}" + ("-straggler" if straggler is not None else "")
    mon = perfsdk.Monitor(
        model=spec, hardware=hw, registry=CollectorRegistry(), otel=False, nvtx="auto", model_name=name
    )
    mon.enable_profiler(directory=str(trace_dir / name), min_free_mb=0, keep=10, warmup=1)
    ctx_tokens = batch * model.ctx
    dist.barrier()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        with mon.decode(batch=batch, context_tokens=ctx_tokens):
            step()
    sync(device)
    wall_s = (time.perf_counter() - t0) / steps
    mon.flush(60)
    stats = mon.stats().get("decode", {})
    # the profiler window: triggered at the same step on every rank, so each captures the same steps: the
    # profiler starts at the next step (its warm-up step), records profile_steps, stops; one spare step
    handle = mon.profile(steps=profile_steps, steady=False, reason="benchmark")
    n = 1 + profile_steps + 1  # the same on every rank: a rank that stopped early would hang the others
    for _ in range(n):
        with mon.decode(batch=batch, context_tokens=ctx_tokens):
            step()
    sync(device)
    result = handle.wait(300)
    mon.close()
    trace = result.trace if result is not None else None
    actual = model.bytes_read(batch)
    peak = hw.memory_bandwidth
    per_step = decode_step_bytes(spec, ctx_tokens, batch)
    perfsdk_ms = stats.get("step_ms_mean")
    mine = {
        "rank": rank,
        "steps": steps,
        "extra_repeats": model.extra_repeats,
        "step_ms_perfsdk_mean": stats.get("step_ms_mean"),
        "step_ms_perfsdk_p50": stats.get("step_ms_p50"),
        "step_ms_wall_mean": wall_s * 1e3,
        # the mean of per-step MBU (what perfsdk's stats() and histogram report) ...
        "mbu_perfsdk_mean": stats.get("mbu_mean"),
        # ... and bytes over mean step time (what the counters and the dashboard's MBU give): on a noisy host
        # the mean of ratios runs above the ratio of means
        "mbu_perfsdk_time_weighted": per_step / (perfsdk_ms / 1e3) / peak if perfsdk_ms else None,
        "mbu_independent": actual / wall_s / peak,
        "bytes_per_step_perfsdk": per_step,
        "bytes_per_step_actual": actual,
        "profile": {
            "trace": trace,
            "error": result.error if result is not None else "timeout",
            "steps_run": n,
            "steady_gate_at_trigger": result.steady if result is not None else None,
        },
    }
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    out: dict[str, Any] = {
        "name": name,
        "mode": mode,
        "batch": batch,
        "context_per_sequence": model.ctx,
        "straggler_rank": straggler,
        "ranks": everyone,
    }
    if rank == 0:
        traces = [r["profile"]["trace"] for r in everyone]
        if all(traces):
            diags = [analyze_trace(t) for t in traces]
            cmp = compare_ranks(diags)
            out["comparison"] = cmp.to_dict()
            out["comparison_report"] = cmp.format_report()
            out["comm_share_per_step"] = {str(r["rank"]): comm_shares(d) for r, d in zip(everyone, diags, strict=True)}
            out["named_straggler"] = cmp.straggler
        _print_config(out)
    return out


def _print_config(c: dict[str, Any]) -> None:
    print(f"== {c['name']}: ctx {c['context_per_sequence']}/sequence", flush=True)
    for r in c["ranks"]:
        mbu = r["mbu_perfsdk_mean"]
        print(
            f"   rank {r['rank']}: perfsdk {r['step_ms_perfsdk_mean'] or float('nan'):.3f} ms/step, "
            f"wall {r['step_ms_wall_mean']:.3f} ms/step, MBU perfsdk "
            f"{'-' if mbu is None else f'{mbu:.1%}'} (time-weighted {r['mbu_perfsdk_time_weighted'] or 0:.1%}) "
            f"independent {r['mbu_independent']:.1%}"
            + (f", extra matmuls {r['extra_repeats']}" if r["extra_repeats"] else ""),
            flush=True,
        )
    if "comparison_report" in c:
        print("   " + c["comparison_report"].replace("\n", "\n   "), flush=True)
    if c["straggler_rank"] is not None:
        print(
            f"   straggler given extra work: rank {c['straggler_rank']}; named by perfsdk: {c.get('named_straggler')}",
            flush=True,
        )


# --------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--shape", choices=sorted(SHAPES), default=None, help="model shape (default: llama-3-8b on GPUs, tiny on a CPU)"
    )
    ap.add_argument("--out", default="tensor_parallel.json")
    ap.add_argument("--traces", default=None, help="trace directory (default: <out>.traces/ beside --out)")
    ap.add_argument("--ctx", type=int, default=None, help="context tokens per sequence (default 1024; 64 on a CPU)")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--modes", default=None, help="eager,graph (default; graph needs CUDA)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per configuration (default 200; 20 on a CPU)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--profile-steps", type=int, default=4)
    ap.add_argument("--straggler-rank", type=int, default=None, help="default: the last rank")
    ap.add_argument(
        "--straggler-fraction",
        type=float,
        default=0.3,
        help="extra work on the straggler, as a fraction of a healthy step",
    )
    ap.add_argument("--no-straggler", dest="straggler", action="store_false")
    ap.add_argument(
        "--timeout-s",
        type=float,
        default=300.0,
        help="collective timeout: a rank stuck in a collective fails after this instead of hanging",
    )
    a = ap.parse_args()
    cpu = a.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu for the gloo run)")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cpu:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
        dist.init_process_group("gloo", timeout=timedelta(seconds=a.timeout_s))
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=a.timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()
    shape = SHAPES[a.shape or ("tiny" if cpu else "llama-3-8b")]
    ctx = a.ctx or (64 if cpu else 1024)
    steps, warmup = a.steps or (20 if cpu else 200), a.warmup or (3 if cpu else 20)
    modes = (a.modes or ("eager" if cpu else "eager,graph")).split(",")
    if cpu and "graph" in modes:
        raise SystemExit("--modes graph: CUDA graphs need a GPU")
    batches = [int(b) for b in a.batches.split(",")]
    dtype = torch.float32 if cpu else torch.bfloat16
    dtype_name = "float32" if cpu else "bfloat16"
    spec = ModelSpec.from_hf_config(shape.hf_config(dtype_name)).with_tp(world)  # the per-GPU share
    if cpu:  # no datasheet for a CPU: rank 0 measures copy bandwidth once and tells the others
        box: list[Any] = [
            perfsdk.hardware.calibrate(device="cpu", quick=True).as_spec().as_dict() if rank == 0 else None
        ]
        dist.broadcast_object_list(box, src=0)
        hw = HardwareSpec(**box[0])
    else:
        hw = perfsdk.hardware.detect(local_rank)
    model = TPDecoder(shape, world, rank, max(batches), ctx, dtype, device)
    out_path = Path(a.out)
    trace_dir = Path(a.traces) if a.traces else out_path.with_name(out_path.name + ".traces")
    envs: list[Any] = [None] * world
    dist.all_gather_object(envs, environment(device))
    if rank == 0:
        print(
            f"== {world} ranks, {envs[0].get('gpu', 'cpu')}, torch {torch.__version__}, "
            f"{dist.get_backend()} {envs[0].get('nccl', '')}; per rank {spec.weight_bytes / 1e9:.2f} GB of weights "
            f"(ModelSpec.with_tp({world})), peak {hw.memory_bandwidth / 1e12:.2f} TB/s ({hw.name})",
            flush=True,
        )
    configs = [
        run_config(
            model,
            spec,
            hw,
            device,
            mode=m,
            batch=b,
            steps=steps,
            warmup=warmup,
            profile_steps=a.profile_steps,
            trace_dir=trace_dir,
        )
        for m in modes
        for b in batches
    ]
    straggler_rank = (world - 1 if a.straggler_rank is None else a.straggler_rank) if a.straggler else None
    stragglers = (
        [
            run_config(
                model,
                spec,
                hw,
                device,
                mode=m,
                batch=1,
                steps=steps,
                warmup=warmup,
                profile_steps=a.profile_steps,
                trace_dir=trace_dir,
                straggler=straggler_rank,
                straggler_fraction=a.straggler_fraction,
            )
            for m in modes
        ]
        if straggler_rank is not None and world > 1
        else []
    )
    if rank == 0:
        result = {
            "environment": envs,
            "device": a.device,
            "world_size": world,
            "model": {"shape": asdict(shape), "per_rank_spec": spec.to_dict(), "dtype": dtype_name},
            "hardware": hw.as_dict(),
            "settings": dict(vars(a)),
            "configs": configs,
            "straggler_runs": stragglers,
        }
        out_path.write_text(json.dumps(result, indent=2, default=str))
        print(f"wrote {out_path}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
