"""How the benchmarks time host code: shared by overhead.py, core_overhead.py and event_costs.py.

Plain functions, no perfsdk import, so a benchmark that must also run against an older perfsdk checkout
(core_overhead.py) can use them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["decode_call_ns", "median_ns", "timer_floor_ns"]


def median_ns(fn: Callable[[], object], n: int) -> float:
    """Median cost of one call in ns, timing batches of 100 calls."""
    batches = []
    for _ in range(max(n // 100, 5)):
        t0 = time.perf_counter_ns()
        for _ in range(100):
            fn()
        batches.append((time.perf_counter_ns() - t0) / 100)
    return statistics.median(batches)


def timer_floor_ns(n: int = 20000) -> float:
    """What a timed step's own four clock reads cost (subtracted from a per-call figure)."""
    pc = time.perf_counter_ns
    t0 = pc()
    for _ in range(n):
        a = pc()
        b = pc()
        c = pc()
        d = pc()
        _ = (b - a) + (d - c)
    return (pc() - t0) / n


def decode_call_ns(mon: Any, step: Callable[[], object], steps: int, batch: int, context_tokens: int) -> int:
    """Run *steps* steps inside ``mon.decode(...)``; the ns spent in perfsdk's enter and exit, all steps together.

    Clock reads sit around the enter and the exit, not around *step*; ``timer_floor_ns`` is their own cost.
    """
    pc = time.perf_counter_ns
    calls_ns = 0
    for _ in range(steps):
        a = pc()
        s = mon.decode(batch=batch, context_tokens=context_tokens)
        s.__enter__()
        b = pc()
        step()
        c = pc()
        s.__exit__(None, None, None)
        calls_ns += (b - a) + (pc() - c)
    return calls_ns
