"""What a timing event between two CUDA-graph replays costs the GPU, without perfsdk.

    python benchmarks/graph_gaps.py --out results/graph_gaps.json

perfsdk times a step with CUDA events recorded between the step's graph launches (consecutive steps share
one: one event per step). In a loop that replays graphs back to back the host is far ahead, so whatever
the loop's time grows by is GPU time. This measures that floor with plain torch, on the benchmarks' 1.1B
Llama decode graph (context 1024, batch 1 and 8):

* ``bare``: replays back to back;
* ``timing``: a timing event recorded after every replay (what perfsdk's chained steps record);
* ``no_timing``: the same with ``enable_timing=False`` events;
* ``timing_every_2`` / ``timing_every_4``: a timing event after every 2nd / 4th replay;
* ``timing_blocking``: timing events made with ``blocking=True`` (``CU_EVENT_BLOCKING_SYNC``, perfsdk's);
* ``timing_blocking_waited`` / ``timing_polled``: the same / default events, with a thread that waits for
  the newest one (``cuEventSynchronize``: it sleeps in the driver on a blocking-sync event, spins on a
  default one), as perfsdk's step core does;
* ``perfsdk``: each replay inside ``with mon.decode(...)`` (perfsdk's defaults, Prometheus only);
* ``in_graph``: a second graph of the same step with a timing event captured inside it, at its end
  (an event-record node, ``torch.cuda.Event(external=True)``), replayed back to back.

Variants interleaved, several rounds, median of the per-step wall time of each round (the GPU is the
bottleneck, so wall time per step is GPU time per step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from llama_decode import SHAPES, Model, capture_decode_graph, capture_graph  # this directory is on sys.path


def run(step: Callable[[int], None], steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / steps / 1e3


KEEP: list[Any] = []


class Waiter:
    """A thread that waits for the newest recorded event, as perfsdk's step core does: cuEventSynchronize
    (through ctypes.CDLL, so without the GIL), which sleeps in the driver on a blocking-sync event and spins
    on a default one."""

    def __init__(self) -> None:
        import ctypes
        import threading

        self._sync = ctypes.CDLL("libcuda.so.1").cuEventSynchronize
        self._sync.argtypes = [ctypes.c_void_p]
        self._newest = 0
        self._stop = False
        self.waits = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Before the events go: a wait on a destroyed event is a crash."""
        self._stop = True
        self._thread.join()

    def put(self, handle: int) -> None:
        self._newest = handle  # no lock: the thread reads whichever is newest

    def _run(self) -> None:
        import time as _t

        last = 0
        while not self._stop:
            h = self._newest
            if h and h != last:
                self._sync(h)
                self.waits += 1
                last = h
            else:
                _t.sleep(0.0002)

    def __repr__(self) -> str:
        return f"Waiter(waits={self.waits})"


def make_variants(
    model: Model, g: Any, tokens: torch.Tensor, pos: torch.Tensor, res: dict[str, Any]
) -> dict[str, Callable[[int], None]]:
    timing = [torch.cuda.Event(enable_timing=True) for _ in range(64)]
    plain = [torch.cuda.Event(enable_timing=False) for _ in range(64)]

    def bare(i: int) -> None:
        g.replay()

    def every(n: int, events: list[Any]) -> Callable[[int], None]:
        def step(i: int) -> None:
            g.replay()
            if i % n == n - 1:
                events[i & 63].record()

        return step

    blocking = [torch.cuda.Event(enable_timing=True, blocking=True) for _ in range(64)]
    variants: dict[str, Callable[[int], None]] = {
        "bare": bare,
        "timing": every(1, timing),
        "no_timing": every(1, plain),
        "timing_every_2": every(2, timing),
        "timing_every_4": every(4, timing),
        "timing_blocking": every(1, blocking),
    }
    waiter = Waiter()
    res.setdefault("waiters", []).append(waiter)

    def waited(events: list[Any]) -> Callable[[int], None]:
        def step(i: int) -> None:
            g.replay()
            e = events[i & 63]
            e.record()
            waiter.put(e.cuda_event)

        return step

    variants["timing_blocking_waited"] = waited(blocking)
    variants["timing_polled"] = waited(timing)
    KEEP.extend([timing, plain, blocking])  # alive until the process ends (the waiter may still hold one)

    from prometheus_client import CollectorRegistry

    import perfsdk

    spec = perfsdk.ModelSpec.from_module(
        model,
        layers=SHAPES["1b"].layers,
        heads=SHAPES["1b"].heads,
        kv_heads=SHAPES["1b"].kv_heads,
        head_dim=SHAPES["1b"].head_dim,
    )
    mon = perfsdk.Monitor(model=spec, hardware="auto", registry=CollectorRegistry(), otel=False, nvtx=False)
    KEEP.append(mon)
    ctx = int(pos.item()) + 1

    def with_perfsdk(i: int) -> None:
        with mon.decode(batch=tokens.shape[0], context_tokens=tokens.shape[0] * ctx):
            g.replay()

    variants["perfsdk"] = with_perfsdk
    try:
        inside = torch.cuda.Event(enable_timing=True, external=True)  # type: ignore[call-arg]
        # the step, then the event recorded inside the capture (an event-record node at the graph's end)
        g2, _ = capture_graph(lambda: (model.decode(tokens, pos), inside.record()), warmups=1)

        def in_graph(i: int) -> None:
            g2.replay()

        variants["in_graph"] = in_graph
    except Exception as e:  # an older torch: no external events
        res.setdefault("errors", []).append(f"in_graph: {type(e).__name__}: {e}")
    return variants


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    shape = SHAPES["1b"]
    model = Model(shape, max_batch=8, ctx=1024, dtype=torch.bfloat16, device="cuda")
    from core_overhead import environment

    res: dict[str, Any] = {"environment": environment(), "batches": {}}
    for batch in (1, 8):
        tokens = torch.zeros(batch, 1, dtype=torch.long, device="cuda")
        pos = torch.tensor([1023], device="cuda")
        g = capture_decode_graph(model, tokens, pos)
        variants = make_variants(model, g, tokens, pos, res)
        for fn in variants.values():
            run(fn, 50)
        per: dict[str, list[float]] = {k: [] for k in variants}
        for r in range(args.rounds):
            order = list(variants) if r % 2 == 0 else list(reversed(variants))
            for k in order:
                per[k].append(run(variants[k], args.steps))
        bare = statistics.median(per["bare"])
        out = {}
        for k, xs in per.items():
            m = statistics.median(xs)
            paired = [x / b - 1 for x, b in zip(xs, per["bare"], strict=True)]
            out[k] = {
                "step_us": m,
                "added_us": m - bare,
                "added_pct": (m - bare) / bare * 100,
                "paired_pct_median": statistics.median(paired) * 100,
                "all_us": xs,
            }
            print(
                f"b{batch} {k:15s} {m:9.2f} us  {m - bare:+6.2f} us  ({(m - bare) / bare * 100:+.3f} %, paired "
                f"{statistics.median(paired) * 100:+.3f} %)",
                flush=True,
            )
        res["batches"][str(batch)] = out
        for w in res.get("waiters", []):
            if isinstance(w, Waiter):
                w.stop()
    res["waiters"] = [repr(w) for w in res.get("waiters", [])]
    Path(args.out).write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
