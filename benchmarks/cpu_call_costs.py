"""The serving thread's cost of perfsdk's calls on the CPU, side by side, and before/after a change.

Measured in one run, per call (median of batches of 100 calls, the cases interleaved):

* ``decode_enter_exit``: ``with mon.decode(batch=8, context_tokens=8192): pass``;
* ``decorated_call``: a function decorated with ``@mon.decode(batch=8, context_tokens=8192)``, called;
* for a batch of B = 1, 8 and 64 requests, one decode step of B sequences:
  ``step_B`` (the step alone), ``step_req_tokens_B`` (the step, then ``req.tokens(1)`` for each request: what a
  streaming loop did before) and ``step_tokens_B`` (``step.tokens(requests)`` inside it: one call per step,
  where the perfsdk under test has it).

Also, per call, the CPU time the collector thread then spends reading what the call queued
(``collector_cpu_ns_per_call``: off the serving thread, but every nanosecond of it holds the GIL), from its
thread's CPU clock around a ``flush()`` after each batch (the flush's own round is in every case alike).

Ratios: within a tree, ``step_tokens_B / step_req_tokens_B`` and the tokens' own cost (the step's subtracted);
between trees (``--before``), each case's after/before, and ``step_tokens_B`` after over ``step_req_tokens_B``
before (what a loop that reads the sampled ids back every step pays per step, then and now).

Each tree runs in its own subprocess with ``PYTHONPATH`` set to it, rounds interleaved (A B, B A, ...), so a
before/after comparison shares the machine's state::

    python benchmarks/cpu_call_costs.py --before /work/wt-before --rounds 10 --out cpu_call_costs.json
    python benchmarks/cpu_call_costs.py --hot-path python          # the Python reference, this tree only

The older tree needs its extension built in place (``python setup.py build_ext --inplace``) to measure the C
hot path; each result says which hot path ran. A CPU figure, host timing, no sink: the serving thread's own
cost, not a GPU loop's end-to-end overhead (``benchmarks/core_overhead.py`` measures that on a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BATCHES = (1, 8, 64)


# ---- the worker: one tree, in its own process --------------------------------------------------------------
def _timed(fn: Callable[[], object], calls: int) -> list[float]:
    """ns per call of each batch of 100 calls."""
    out = []
    pc = time.perf_counter_ns
    for _ in range(max(calls // 100, 1)):
        t0 = pc()
        for _ in range(100):
            fn()
        out.append((pc() - t0) / 100)
    return out


def worker(hot_path: str, calls: int, passes: int) -> dict[str, Any]:
    import perfsdk

    mon = perfsdk.Monitor(
        model=None,
        hardware=None,
        prometheus=False,
        otel=False,
        nvtx=False,
        timing="host",
        hot_path=hot_path,
        queue_size=2**20,
        export_interval=60,
    )
    has_tokens = hasattr(mon.decode(batch=1), "tokens")
    [thread] = [t for t in threading.enumerate() if t.name == "perfsdk-collector"]
    assert thread.ident is not None
    collector = time.pthread_getcpuclockid(thread.ident)  # its CPU-time clock

    def enter_exit() -> None:
        with mon.decode(batch=8, context_tokens=8192):
            pass

    @mon.decode(batch=8, context_tokens=8192)
    def decorated() -> None:
        pass

    cases: dict[str, Callable[[], object]] = {"decode_enter_exit": enter_exit, "decorated_call": decorated}
    for b in BATCHES:
        reqs = [mon.request(prompt_tokens=16) for _ in range(b)]
        ctx = 1024 * b

        def step(b: int = b, ctx: int = ctx) -> None:
            with mon.decode(batch=b, context_tokens=ctx):
                pass

        def step_req_tokens(b: int = b, ctx: int = ctx, reqs: list[Any] = reqs) -> None:
            with mon.decode(batch=b, context_tokens=ctx):
                pass
            for r in reqs:
                r.tokens(1)

        cases[f"step_{b}"] = step
        cases[f"step_req_tokens_{b}"] = step_req_tokens
        if has_tokens:

            def step_tokens(b: int = b, ctx: int = ctx, reqs: list[Any] = reqs) -> None:
                with mon.decode(batch=b, context_tokens=ctx) as s:
                    s.tokens(reqs)

            cases[f"step_tokens_{b}"] = step_tokens
    batches: dict[str, list[float]] = {k: [] for k in cases}
    drains: dict[str, list[float]] = {k: [] for k in cases}
    names = list(cases)
    for fn in cases.values():  # warm: the event pool, the caches, the first token of every request
        _timed(fn, 1000)
    mon.flush(60)
    for p in range(passes):
        for name in names if p % 2 == 0 else reversed(names):
            per_call = _timed(cases[name], calls // passes)
            batches[name] += per_call
            c0 = time.clock_gettime_ns(collector)
            mon.flush(60)  # the collector reads what these calls queued: its CPU time, per call
            drains[name].append((time.clock_gettime_ns(collector) - c0) / (len(per_call) * 100))
    stats = mon.stats()
    mon.close()
    return {
        "hot_path": mon.hot_path,
        "perfsdk": getattr(perfsdk, "__version__", "?"),
        "perfsdk_path": str(Path(perfsdk.__file__).resolve().parent),
        "step_tokens": has_tokens,
        "ns": {k: statistics.median(v) for k, v in batches.items()},
        "drain_ns": {k: statistics.median(v) for k, v in drains.items()},
        "dropped_records": stats.get("dropped_records"),
        "internal_errors": stats.get("internal_errors"),
    }


# ---- the parent: trees in turn, rounds interleaved -------------------------------------------------------
def run_tree(tree: Path, hot_path: str, calls: int, passes: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PERFSDK_HOT_PATH", None)
    out = subprocess.run(
        [sys.executable, str(HERE), "--worker", "--hot-path", hot_path, "--calls", str(calls), "--passes", str(passes)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=str(tree),
    )
    if out.returncode != 0:
        raise SystemExit(f"the worker for {tree} failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["perfsdk_path"]) != (tree / "perfsdk").resolve():
        raise SystemExit(f"the worker for {tree} imported perfsdk from {result['perfsdk_path']}")
    return result


def commit(tree: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "?"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarise(trees: dict[str, Path], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {"trees": {}, "ratios": {}}
    medians: dict[str, dict[str, float]] = {}
    for label, results in runs.items():
        keys = results[0]["ns"].keys()
        ns = {k: statistics.median(r["ns"][k] for r in results) for k in keys}
        drain = {k: statistics.median(r["drain_ns"][k] for r in results) for k in keys}
        medians[label] = ns
        within: dict[str, Any] = {}
        for b in BATCHES:
            per_request, per_step, alone = ns.get(f"step_req_tokens_{b}"), ns.get(f"step_tokens_{b}"), ns[f"step_{b}"]
            within[f"step_tokens_{b}/step_req_tokens_{b}"] = ratio(per_step, per_request)
            within[f"tokens_part_{b}: per step/per request"] = ratio(
                None if per_step is None else per_step - alone, None if per_request is None else per_request - alone
            )
        out["trees"][label] = {
            "path": str(trees[label]),
            "commit": commit(trees[label]),
            "hot_path": results[0]["hot_path"],
            "perfsdk": results[0]["perfsdk"],
            "step_tokens": results[0]["step_tokens"],
            "ns_per_call": {k: round(v, 1) for k, v in ns.items()},
            "collector_cpu_ns_per_call": {k: round(v, 1) for k, v in drain.items()},
            "ns_per_call_each_round": {k: [round(r["ns"][k], 1) for r in results] for k in keys},
            "ratios": within,
            "dropped_records": [r["dropped_records"] for r in results],
            "internal_errors": [r["internal_errors"] for r in results],
        }
    if "before" in medians and "after" in medians:
        before, after = medians["before"], medians["after"]
        across = {f"{k} after/before": ratio(after[k], before[k]) for k in after if k in before}
        for b in BATCHES:  # what a read-back loop pays per step: before, a call per request; now, one per step
            across[f"step_tokens_{b} after / step_req_tokens_{b} before"] = ratio(
                after.get(f"step_tokens_{b}"), before.get(f"step_req_tokens_{b}")
            )
        out["ratios"]["after/before"] = across
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, help="an older perfsdk checkout to compare with (its root)")
    ap.add_argument("--after", type=Path, default=HERE.parents[1], help="the tree under test (default: this one)")
    ap.add_argument("--hot-path", choices=("auto", "c", "python"), default="auto")
    ap.add_argument("--rounds", type=int, default=6, help="subprocesses per tree, interleaved")
    ap.add_argument("--calls", type=int, default=20000, help="calls per case per round")
    ap.add_argument("--passes", type=int, default=4, help="interleaved passes over the cases within a round")
    ap.add_argument("--out", type=Path, help="write the JSON here too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.hot_path, args.calls, args.passes)))
        return 0
    trees = {"after": args.after.resolve()}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    order = list(trees)
    for i in range(args.rounds):
        for label in order if i % 2 == 0 else reversed(order):
            runs[label].append(run_tree(trees[label], args.hot_path, args.calls, args.passes))
            print(
                f"round {i + 1}/{args.rounds} {label}: decode_enter_exit "
                f"{runs[label][-1]['ns']['decode_enter_exit']:.0f} ns",
                file=sys.stderr,
            )
    result = {
        "benchmark": "cpu_call_costs",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "rounds": args.rounds,
        "calls": args.calls,
        **summarise(trees, runs),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
