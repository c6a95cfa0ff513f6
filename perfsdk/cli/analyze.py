"""``perfsdk analyze TRACE``: diagnose a torch.profiler chrome trace from the command line.

::

    perfsdk analyze decode.pt.trace.json.gz                 # short report, findings ranked
    perfsdk analyze decode.pt.trace.json.gz --json          # {"findings": [...], "gpu_busy_fraction", ...}
    perfsdk analyze decode.pt.trace.json.gz --plot step.png --step 2
    perfsdk analyze vllm.trace.json.gz --step-name 'execute_model.*'
    perfsdk analyze rank0.pt.trace.json.gz rank1.pt.trace.json.gz   # one trace per rank: the straggler,
                                                                    # who waits in collectives (profiling/ranks.py)
    perfsdk analyze huge.pt.trace.json.gz --max-size 8GiB    # read past the default limit of 2 GiB

Exit status 0 when the trace was analysed (whatever it found, CPU-only traces included), 2 on a
trace that cannot be read: not JSON, not a trace, odd values (nesting past the recursion limit, a
number past Python's int conversion limit, bytes that are not UTF-8), or more than ``--max-size``
bytes of JSON once decompressed (the reader stops there: a compression bomb costs no more).
"""

from __future__ import annotations

import argparse
import json
import math
import re

__all__ = ["register", "run_analyze"]

# decimal units (kB, MB, GB, TB) and binary ones (KiB, MiB, GiB, TiB; K, M, G, T alone)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30, "t": 2**40, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """``"2GiB"``, ``"500MB"``, ``"1.5G"``, ``"1048576"`` -> a number of bytes, at least 1."""
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GiB, 500MB or 1048576 (bytes), got {text!r}")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or not 1 <= value <= 2**62:
        raise argparse.ArgumentTypeError(f"expected a size from 1 byte to 4 EiB, got {text!r}")
    return int(value)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("analyze", help="diagnose a torch.profiler chrome trace (.json or .json.gz)",
                       description="Per step: GPU busy fraction, idle split (waiting for launch / other), "
                                   "kernel categories, host syncs, pageable copies; ranked findings.")
    p.add_argument("trace", nargs="+",
                   help="chrome trace written by torch.profiler (.json or .json.gz); several: one per rank of a "
                        "tensor-parallel group, compared (the straggler, and who waits for it)")
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--plot", metavar="PATH",
                   help="draw one step's GPU timeline with its idle gaps (PNG/SVG/PDF)")
    p.add_argument("--step", type=int, default=None,
                   help="step index to plot (default: the median-length step)")
    p.add_argument("--step-name", default=None, metavar="REGEX",
                   help="record_function names that mark steps "
                        "(default: perfsdk.* ranges, then ProfilerStep#N)")
    p.add_argument("--max-size", type=parse_size, default=None, metavar="SIZE",
                   help="refuse a trace holding more JSON than this once decompressed, reading no further "
                        "(default: 2GiB; e.g. 8GiB, 500MB)")
    p.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    # imported on use: `perfsdk --help` must not pay for the analyser
    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.trace_events import DEFAULT_MAX_BYTES

    if args.max_size is None:
        args.max_size = DEFAULT_MAX_BYTES
    traces = args.trace if isinstance(args.trace, list) else [args.trace]
    if len(traces) > 1:
        return _run_ranks(args, traces)
    diag = analyze_trace(traces[0], step_pattern=args.step_name, max_bytes=args.max_size)
    plotted = None
    if args.plot and diag.has_gpu:
        from perfsdk.profiling.timeline_plot import plot_timeline

        plotted = plot_timeline(diag, args.plot, step=args.step)
    if args.json:
        out = diag.to_dict()
        out["plot"] = plotted
        print(json.dumps(out, indent=2))
    else:
        print(diag.format_report())
        if plotted:
            print(f"timeline: {plotted}")
        elif args.plot:
            print("timeline: not drawn, the trace has no GPU events")
    return 0


def _run_ranks(args: argparse.Namespace, traces: list[str]) -> int:
    from perfsdk.errors import ConfigError
    from perfsdk.profiling.ranks import analyze_ranks

    if args.plot:
        raise ConfigError("--plot: draws one trace's timeline; give a single trace with it")
    diagnoses, cmp = analyze_ranks(traces, step_pattern=args.step_name, max_bytes=args.max_size)
    if args.json:
        print(json.dumps({"traces": [d.to_dict() for d in diagnoses], "ranks": cmp.to_dict()}, indent=2))
    else:
        for d in diagnoses:
            print(d.format_report())
            print()
        print(cmp.format_report())
    return 0
