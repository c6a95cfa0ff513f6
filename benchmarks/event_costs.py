"""What one CUDA event record costs on this host, by event flags and GPU state.

    python benchmarks/event_costs.py --out event_costs.json

perfsdk records two events per timed step, so their host cost is most of its
hot path. This measures ``cuEventRecord`` (driver API through ctypes, GIL kept)
for events created with default flags, ``CU_EVENT_BLOCKING_SYNC`` and
``CU_EVENT_DISABLE_TIMING``; with the GPU idle and with it busy (a long kernel
queued, so the records wait in the stream but the launch queue has room); and
``cuEventQuery`` on a completed event. Median of batches of 100 calls, in ns.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

import torch
from measure import median_ns  # this directory is on sys.path when the script runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="event_costs.json")
    ap.add_argument("--n", type=int, default=20000)
    args = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the primary context is current on this thread now
    py = ctypes.PyDLL("libcuda.so.1")
    create, record, query, destroy = py.cuEventCreate, py.cuEventRecord, py.cuEventQuery, py.cuEventDestroy_v2
    create.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    record.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    query.argtypes = [ctypes.c_void_p]
    destroy.argtypes = [ctypes.c_void_p]
    raw = torch._C._cuda_getCurrentRawStream
    side = torch.cuda.Stream()
    out: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    costs: dict[str, float] = {}
    for name, flags in (("default", 0), ("blocking_sync", 1), ("disable_timing", 2), ("blocking_no_timing", 3)):
        ev = ctypes.c_void_p()
        assert create(ctypes.byref(ev), flags) == 0
        h = ev.value
        for stream_name, stream in (("default_stream", None), ("side_stream", side)):
            ctx = torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream())
            with ctx:
                torch.cuda.synchronize()
                costs[f"record_{name}_{stream_name}_gpu_idle"] = median_ns(lambda h=h: record(h, raw(0)), args.n)
                torch.cuda.synchronize()
                # GPU busy: ~100 ms of matmuls queued ahead on this stream, records queue behind them
                for _ in range(40):
                    a @ a
                busy = median_ns(lambda h=h: record(h, raw(0)), min(args.n, 5000))
                costs[f"record_{name}_{stream_name}_gpu_busy"] = busy
                torch.cuda.synchronize()
        costs[f"query_{name}_completed"] = median_ns(lambda h=h: query(h), args.n)
        destroy(h)
    te = torch.cuda.Event(enable_timing=True)
    tb = torch.cuda.Event(enable_timing=True, blocking=True)
    costs["torch_event_record_timing"] = median_ns(te.record, args.n)
    costs["torch_event_record_timing_blocking"] = median_ns(tb.record, args.n)
    costs["perf_counter_ns"] = median_ns(time.perf_counter_ns, args.n)
    # The first record of a never-recorded event against later ones, for events made by perfsdk's
    # DriverEvents.new() (created inside a pushed primary context) and by a bare cuEventCreate here.
    from perfsdk.cuda_driver import driver_events

    drv = driver_events()
    if drv is not None:
        for label, make in (("perfsdk_new", drv.new), ("bare_create", None)):
            evs = []
            for _ in range(5000):
                if make is not None:
                    evs.append(make())
                else:
                    ev = ctypes.c_void_p()
                    assert create(ctypes.byref(ev), 1) == 0
                    evs.append(ev.value)
            torch.cuda.synchronize()
            for nth in ("first", "second"):
                t0 = time.perf_counter_ns()
                for h in evs:
                    record(h, raw(0))
                costs[f"record_{nth}_time_{label}"] = (time.perf_counter_ns() - t0) / len(evs)
                torch.cuda.synchronize()
            for h in evs:
                destroy(h)
    out["ns"] = costs
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
