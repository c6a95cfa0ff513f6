"""``perfsdk analyze TRACE``: diagnose a torch.profiler chrome trace from the command line.

::

    perfsdk analyze decode.pt.trace.json.gz                 # short report, findings ranked
    perfsdk analyze decode.pt.trace.json.gz --json          # {"findings": [...], "gpu_busy_fraction", ...}
    perfsdk analyze decode.pt.trace.json.gz --plot step.png --step 2
    perfsdk analyze vllm.trace.json.gz --step-name 'execute_model.*'
    perfsdk analyze rank0.pt.trace.json.gz rank1.pt.trace.json.gz   # one trace per rank: the straggler,
                                                                    # who waits in collectives (profiling/ranks.py)

Exit status 0 when the trace was analysed (whatever it found, CPU-only traces included), 2 on a
trace that cannot be read.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register", "run_analyze"]


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
    p.set_defaults(func=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    # imported on use: `perfsdk --help` must not pay for the analyser
    from perfsdk.profiling.analyze import analyze_trace

    traces = args.trace if isinstance(args.trace, list) else [args.trace]
    if len(traces) > 1:
        return _run_ranks(args, traces)
    diag = analyze_trace(traces[0], step_pattern=args.step_name)
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
    diagnoses, cmp = analyze_ranks(traces, step_pattern=args.step_name)
    if args.json:
        print(json.dumps({"traces": [d.to_dict() for d in diagnoses], "ranks": cmp.to_dict()}, indent=2))
    else:
        for d in diagnoses:
            print(d.format_report())
            print()
        print(cmp.format_report())
    return 0
