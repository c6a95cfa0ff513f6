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

The parts: ``overhead_common.py`` (the environment, a Monitor with every sink on), ``overhead_calls.py``
(1 and 4), ``overhead_loops.py`` (2), ``overhead_gpu.py`` (3, 5, capture safety, the profiler window);
each returns its part of the JSON this script writes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from llama_decode import SHAPES, Model
from measure import median_ns
from overhead_calls import collector_throughput, host_costs
from overhead_common import environment
from overhead_gpu import capture_control, capture_safety, mbu_agreement, profiler_window, sync_census
from overhead_loops import overhead_configs, synced_breakdown

import perfsdk
from perfsdk.model import ModelSpec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default="overhead.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument(
        "--only",
        choices=["synced-breakdown", "call-costs", "capture-safety"],
        default=None,
        help="run one experiment instead of the whole benchmark",
    )
    ap.add_argument(
        "--no-capture-control",
        dest="capture_control",
        action="store_false",
        help="skip the control run (a thread breaking a CUDA-graph capture on purpose)",
    )
    args = ap.parse_args()
    device = args.device
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    shape = SHAPES["1b" if device == "cuda" else "cpu"]
    model = Model(shape, max_batch=8, ctx=args.ctx, dtype=dtype, device=device)
    spec = ModelSpec.from_module(
        model,
        layers=shape.layers,
        heads=shape.heads,
        kv_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        name="bench-1b" if device == "cuda" else "bench-cpu",
    )
    if device == "cuda":
        hw = perfsdk.hardware.detect()
    else:
        hw = perfsdk.hardware.calibrate(device="cpu", quick=True).as_spec()
    if args.only is not None:
        only: dict[str, Any] = {
            "environment": environment(device),
            "host_cost_ns": {"perf_counter_ns": median_ns(time.perf_counter_ns, 20000)},
        }
        if args.only == "synced-breakdown":
            only["synced_breakdown"] = synced_breakdown(model, spec, hw, args.ctx, args.reps)
        elif args.only == "capture-safety":
            only["capture_safety"] = capture_safety(model, spec, hw, args.ctx)
        else:
            only["host_cost_ns"] = host_costs(spec, hw, device)
            print(
                "== host cost per call (ns):",
                json.dumps({k: round(v) for k, v in only["host_cost_ns"].items()}),
                flush=True,
            )
        Path(args.out).write_text(json.dumps(only, indent=2, default=str))
        print(f"wrote {args.out}")
        return 0
    result: dict[str, Any] = {
        "environment": environment(device),
        "device": device,
        "model": {**spec.to_dict(), "shape": vars(shape)},
        "hardware": hw.as_dict(),
    }
    print(
        f"== {result['environment'].get('gpu', 'cpu')}, torch {torch.__version__}, model "
        f"{spec.total_params / 1e9:.2f} B params {spec.weight_bytes / 1e9:.2f} GB",
        flush=True,
    )
    result["host_cost_ns"] = host_costs(spec, hw, device)
    print(
        "== host cost per call (ns):", json.dumps({k: round(v) for k, v in result["host_cost_ns"].items()}), flush=True
    )
    print("== decode loops", flush=True)
    result["decode_loops"] = overhead_configs(model, spec, hw, device, args.ctx, [1, 8], args.reps)
    if device == "cuda":
        result["sync_census"] = sync_census(model, spec, hw, device, args.ctx)
        print("== sync census:", json.dumps(result["sync_census"]["sync_calls_by_thread"]), flush=True)
        result["agreement"] = mbu_agreement(model, spec, hw, device, args.ctx)
        print(
            "== agreement:",
            json.dumps(
                {k: v.get("relative_difference") for k, v in result["agreement"].items() if isinstance(v, dict)}
            ),
            flush=True,
        )
        out_dir = os.path.dirname(os.path.abspath(args.out))
        for name, fn in (
            ("capture_safety", lambda: capture_safety(model, spec, hw, args.ctx)),
            ("profiler_window", lambda: profiler_window(model, spec, hw, args.ctx, os.path.join(out_dir, "traces"))),
        ):
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
    result["collector"] = collector_throughput(spec, hw)
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
