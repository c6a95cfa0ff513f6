"""The cost of one decorated call, three implementations side by side in one run, on the CPU.

    python benchmarks/decorator_cost.py [--out benchmarks/results/cpu_decorator_cost.json] [--rounds 9]

* ``shipped``: :func:`perfsdk.decorators.decorate` (``functools.wraps`` closures);
* ``previous``: :func:`previous_decorate`, a verbatim copy of the implementation before
  (``perfsdk/hotpath.py`` at commit 625e1a1);
* ``wrapt``: the same forms through ``wrapt.decorator`` (``benchmarks/decorators_wrapt.py``).

One Monitor per implementation and hot path (C and Python), alike but for the decorator: the variant is
put in place of ``perfsdk.recorder.decorate`` while its Monitor is built. Host timing, no sinks but
Prometheus on its own registry: the difference is the decorator's, not the device's. For each form (sizes
as values, size callables, bare, a method, a coroutine driven by hand) the median ns per call over
interleaved rounds, and each implementation's ratio to ``previous``; ``with`` (the same step in a ``with``
block inside an undecorated function) is the reference, the same in all three.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import decorators_wrapt
from prometheus_client import CollectorRegistry

import perfsdk
import perfsdk.recorder
from perfsdk.hotpath import NoStep
from perfsdk.monitor import load_native
from perfsdk.records import NO_TOKENS, UNSIZED
from perfsdk.sizes import check_sizes

F = TypeVar("F", bound=Callable[..., Any])


def previous_decorate(
    new_step: Callable[..., Any],
    unsized: Callable[[str], Any],
    compiling: Callable[[], bool],
    errors: Any,
    step: Any,
    fn: F,
) -> F:
    """The decorator before wrapt (commit 625e1a1), unchanged: the reference this benchmark compares with."""
    if isinstance(fn, (staticmethod, classmethod)):
        return cast(F, type(fn)(previous_decorate(new_step, unsized, compiling, errors, step, fn.__func__)))
    phase = step.phase
    batch, tokens, context_tokens, seq_lens = step.sizes
    dynamic = any(callable(v) for v in (batch, tokens, context_tokens, seq_lens))
    no_sizes = context_tokens == UNSIZED

    def fresh(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if compiling():
            return NoStep(phase)
        if no_sizes:
            return unsized(phase)
        if not dynamic:
            return new_step(phase, batch, tokens, context_tokens, seq_lens)
        try:
            vals = [v(*args, **kwargs) if callable(v) else v for v in (batch, tokens, context_tokens, seq_lens)]
            b, t, c, s, _ = check_sizes(phase, *vals)
        except Exception as e:
            errors.record(e, f"@{phase} size callable")
            return NoStep(phase)
        return new_step(phase, b, None if t == NO_TOKENS else t, c, s)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            with fresh(args, kwargs):
                return await fn(*args, **kwargs)

        return cast(F, awrapper)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with fresh(args, kwargs):
            return fn(*args, **kwargs)

    return cast(F, wrapper)


IMPLEMENTATIONS: dict[str, Callable[..., Any]] = {
    "shipped": perfsdk.recorder.decorate,
    "previous": previous_decorate,
    "wrapt": decorators_wrapt.decorate,
}


def monitor(hot_path: str, impl: str) -> perfsdk.Monitor:
    shipped = perfsdk.recorder.decorate
    perfsdk.recorder.decorate = IMPLEMENTATIONS[impl]
    try:
        return perfsdk.Monitor(
            model="llama-3-8b",
            hardware="h100-sxm",
            registry=CollectorRegistry(),
            otel=False,
            nvtx=False,
            timing="host",
            hot_path=hot_path,
            queue_size=1 << 16,
        )
    finally:
        perfsdk.recorder.decorate = shipped


def forms(mon: perfsdk.Monitor) -> dict[str, Callable[[], Any]]:
    """One zero-argument callable per form, each making one decorated call."""

    def with_block(ids: list[int]) -> int:
        with mon.decode(batch=8, context_tokens=8192):
            return len(ids)

    @mon.decode(batch=8, context_tokens=8192)
    def sized(ids: list[int]) -> int:
        return len(ids)

    @mon.decode(batch=len, context_tokens=lambda ids: 1024 * len(ids))
    def size_callables(ids: list[int]) -> int:
        return len(ids)

    @mon.decode
    def bare(ids: list[int]) -> int:
        return len(ids)

    class Engine:
        @mon.decode(batch=8, context_tokens=8192)
        def step(self, ids: list[int]) -> int:
            return len(ids)

    @mon.decode(batch=8, context_tokens=8192)
    async def coroutine(ids: list[int]) -> int:
        return len(ids)

    def drive(ids: list[int]) -> Any:
        try:
            coroutine(ids).send(None)
        except StopIteration as e:
            return e.value
        raise AssertionError("the coroutine did not return")

    ids = [1] * 8
    engine = Engine()
    return {
        "with": lambda: with_block(ids),
        "sized": lambda: sized(ids),
        "size_callables": lambda: size_callables(ids),
        "bare": lambda: bare(ids),
        "method": lambda: engine.step(ids),
        "coroutine": lambda: drive(ids),
    }


def run(rounds: int, calls: int) -> dict[str, Any]:
    hot_paths = ["c", "python"] if load_native() is not None else ["python"]
    mons = {(hp, impl): monitor(hp, impl) for hp in hot_paths for impl in IMPLEMENTATIONS}
    fns = {key: forms(mon) for key, mon in mons.items()}
    batches: dict[tuple[str, str, str], list[float]] = {}
    for _ in range(rounds):  # interleaved: drift and the host's other tenants hit every variant alike
        for (hp, impl), table in fns.items():
            for name, fn in table.items():
                t0 = time.perf_counter_ns()
                for _ in range(calls):
                    fn()
                batches.setdefault((hp, impl, name), []).append((time.perf_counter_ns() - t0) / calls)
        for mon in mons.values():
            mon.flush(30)
    out: dict[str, Any] = {}
    for hp in hot_paths:
        rows: dict[str, Any] = {}
        for name in fns[(hp, "previous")]:
            ns = {impl: statistics.median(batches[(hp, impl, name)]) for impl in IMPLEMENTATIONS}
            rows[name] = {f"{impl}_ns": round(v, 1) for impl, v in ns.items()}
            rows[name].update(
                {f"{impl}_vs_previous": round(ns[impl] / ns["previous"], 3) for impl in ("shipped", "wrapt")}
            )
        out[f"{hp}_hot_path"] = rows
    for mon in mons.values():
        assert mon.stats()["internal_errors"] == 0
        mon.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="write the JSON here")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=20_000, help="calls per round and variant")
    a = ap.parse_args()
    import wrapt

    result = {
        "environment": {
            "python": platform.python_version(),
            "wrapt": wrapt.__version__,
            "perfsdk": perfsdk.__version__,
            "cores": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "method": f"median ns per decorated call over {a.rounds} interleaved rounds of {a.calls} calls; "
        "previous: the implementation before (625e1a1)",
        "ns_per_call": run(a.rounds, a.calls),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
