"""One rank of a real 2-process tensor-parallel run on CPU (gloo), for tests/test_tensor_parallel.py.

::

    python tests/tp_worker.py --rank 0 --world 2 --init tcp://127.0.0.1:PORT --dir DIR --steps 30 ...

Each rank joins the process group with an explicit rank (no ``RANK``/``WORLD_SIZE`` in the environment,
so ``Monitor(rank="auto")`` must find its rank through the initialised process group), builds a
Monitor with its own registry and serves ``/metrics`` on a port of its own, which it writes to
``DIR/port<r>``. It waits for ``DIR/go`` (the test starts it once Prometheus has scraped every rank's
zeros), then runs ``--steps`` decode steps of a column/row-parallel MLP stack with a gloo all-reduce
after each row-parallel matmul; the ``--straggler`` rank sleeps ``--extra-ms`` inside every step before
its first all-reduce, so the others wait for it there. At ``--profile-at`` every rank asks for a profiler
window with ``steady=False``, so all ranks capture the same steps. Then it writes ``DIR/done<r>.json``
(its counts, its trace) and keeps serving until ``DIR/stop<r>`` appears.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from prometheus_client import CollectorRegistry

import perfsdk
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec

# a tiny Llama-shaped model; the Monitor costs steps against its per-rank share (ModelSpec.with_tp)
CONFIG = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "torch_dtype": "float32",
}
HW = HardwareSpec(name="tp-test-cpu", memory_bandwidth=20e9, flops={"float32": 100e9, "bf16": 100e9})
BATCH = 4
CONTEXT = 4 * 64  # summed context tokens of the batch


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {timeout:.0f} s")
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--init", required=True, help="tcp://host:port of the gloo rendezvous")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--straggler", type=int, default=-1)
    ap.add_argument("--extra-ms", type=float, default=50.0)
    ap.add_argument("--profile-at", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)  # two ranks on a 2-core CI machine
    dist.init_process_group("gloo", init_method=a.init, rank=a.rank, world_size=a.world)

    spec = ModelSpec.from_hf_config(CONFIG).with_tp(a.world)
    mon = perfsdk.Monitor(
        model=spec,
        hardware=HW,
        registry=CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing="host",
        model_name="tp-test",
    )  # rank="auto": from the process group
    srv = mon.serve_metrics(port=0)
    _write(a.dir / f"port{a.rank}", str(srv.port))
    window = mon.enable_profiler(directory=a.dir / "traces", min_free_mb=0, keep=100)

    # column-parallel (dim -> inter/world) then row-parallel (inter/world -> dim) + all-reduce, twice a layer
    g = torch.Generator().manual_seed(a.rank)
    dim, inter, layers = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["num_hidden_layers"]
    shard = inter // a.world
    weights = [
        (torch.randn(dim, shard, generator=g) * 0.02, torch.randn(shard, dim, generator=g) * 0.02)
        for _ in range(2 * layers)
    ]
    x0 = torch.randn(BATCH, dim, generator=torch.Generator().manual_seed(0))

    def step() -> torch.Tensor:
        x = x0
        for i, (w_col, w_row) in enumerate(weights):
            y = torch.relu(x @ w_col) @ w_row
            if i == 0 and a.rank == a.straggler:
                time.sleep(a.extra_ms / 1000)  # extra work on one rank: the others wait in the all-reduce
            dist.all_reduce(y)
            x = x + y
        return x

    _wait_for(a.dir / "go", 120)
    handle = None
    for i in range(a.steps):
        if i == a.profile_at:
            handle = mon.profile(steps=a.profile_steps, steady=False)  # same step on every rank
        with mon.decode(batch=BATCH, context_tokens=CONTEXT):
            step()
    result = handle.wait(120) if handle is not None else None
    mon.flush()
    stats = mon.stats()
    _write(
        a.dir / f"done{a.rank}.json",
        json.dumps(
            {
                "rank": a.rank,
                "port": srv.port,
                "decode_steps": stats["decode"]["steps"] if "decode" in stats else None,
                "trace": result.trace if result else None,
                "error": result.error if result else "no capture",
                "capture_steady": result.steady if result else None,
                "window": window.status()["state"],
            }
        ),
    )
    _wait_for(a.dir / f"stop{a.rank}", 300)
    mon.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
