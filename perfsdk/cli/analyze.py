"""``perfsdk analyze TRACE``: diagnose a torch.profiler chrome trace from the command line.

::

    perfsdk analyze decode.pt.trace.json.gz                 # short report, findings ranked
    perfsdk analyze decode.pt.trace.json.gz --json          # {"findings": [...], "gpu_busy_fraction", ...}
    perfsdk analyze decode.pt.trace.json.gz --plot step.png --step 2
    perfsdk analyze vllm.trace.json.gz --step-name 'execute_model.*'
    perfsdk analyze rank0.pt.trace.json.gz rank1.pt.trace.json.gz   # one trace per rank: the straggler,
                                                                    # who waits in collectives (profiling/ranks.py)
    perfsdk analyze huge.pt.trace.json.gz --max-size 8GiB    # read past the default limit of 2 GiB

    # are the kernels fast? the bytes a step must read over its kernels' time, against the peak
    perfsdk analyze decode.pt.trace.json.gz --model llama-3-8b --gpu h200-sxm --batch 1 --context 1024
    perfsdk analyze decode.pt.trace.json.gz --step-bytes 16.2e9 --bandwidth-tb-s 4.8
    perfsdk analyze prefill.pt.trace.json.gz --model llama-3-8b --gpu h200-sxm --prompt-tokens 2048 --phase prefill
    # against the step time measured without the profiler (it slows what it measures)
    perfsdk analyze decode.pt.trace.json.gz --unprofiled-ms 2.09

Without ``--model``/``--step-bytes`` and a GPU the kernels are not checked against the peak and the
report says so (``busy_unchecked``) instead of calling a busy GPU healthy; without ``--unprofiled-ms``
it says the shares are of the profiled step. ``--model``, ``--batch`` and ``--context`` price decode
steps (``--prompt-tokens`` prefill steps); ``--step-bytes`` / ``--step-flops`` give the figures of the
``--phase`` steps (default decode; it is also the phase of steps that are not perfsdk's ranges).

Exit status 0 when the trace was analysed (whatever it found, CPU-only traces included), 2 on a
trace that cannot be read or options that do not make sense: not JSON, not a trace, odd values (nesting
past the recursion limit, a number past Python's int conversion limit, bytes that are not UTF-8), or more than
``--max-size`` bytes of JSON once decompressed (the reader stops there: a compression bomb costs no more).
"""

from __future__ import annotations

import argparse
import json
import math
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfsdk.profiling.bandwidth import StepCost

from perfsdk.cli._args import finite_float, int_range

__all__ = ["register", "run", "run_analyze"]

# decimal units (kB, MB, GB, TB) and binary ones (KiB, MiB, GiB, TiB; K, M, G, T alone)
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
    "t": 2**40,
    "tib": 2**40,
}
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
    p = sub.add_parser(
        "analyze",
        help="diagnose a torch.profiler chrome trace (.json or .json.gz)",
        description="Per step: GPU busy fraction, idle split (waiting for launch / other), "
        "kernel categories, host syncs, pageable copies; ranked findings.",
    )
    p.add_argument(
        "trace",
        nargs="+",
        help="chrome trace written by torch.profiler (.json or .json.gz); several: one per rank of a "
        "tensor-parallel group, compared (the straggler, and who waits for it)",
    )
    p.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    p.add_argument("--plot", metavar="PATH", help="draw one step's GPU timeline with its idle gaps (PNG/SVG/PDF)")
    p.add_argument(
        "--step", type=int_range(0, 10**9), default=None, help="step index to plot (default: the median-length step)"
    )
    p.add_argument(
        "--step-name",
        default=None,
        metavar="REGEX",
        help="record_function names that mark steps (default: perfsdk.* ranges, then ProfilerStep#N)",
    )
    g = p.add_argument_group("kernels against the peak (what a step must move, and the GPU)")
    g.add_argument(
        "--model",
        help="a known model (see perfsdk floor), e.g. llama-3-8b: prices decode steps "
        "(and prefill steps with --prompt-tokens)",
    )
    g.add_argument("--gpu", help="the GPU's datasheet row, e.g. h200-sxm: the peaks")
    g.add_argument("--batch", type=int_range(1, 2**31), default=1, help="sequences per step (default 1)")
    g.add_argument(
        "--context",
        "--ctx",
        type=int_range(0, 2**40),
        default=0,
        dest="context",
        help="context length of each sequence in the decode steps (default 0: weights only)",
    )
    g.add_argument(
        "--prompt-tokens",
        type=int_range(1, 2**31),
        default=None,
        help="prompt length of each sequence in the prefill steps (without it they are not priced)",
    )
    g.add_argument(
        "--step-bytes",
        type=finite_float(0, 1e18, open_low=True, what="a number of bytes"),
        default=None,
        help="bytes each --phase step must read (instead of the model's)",
    )
    g.add_argument(
        "--step-flops",
        type=finite_float(0, 1e21, open_low=True, what="a number of FLOPs"),
        default=None,
        help="FLOPs each --phase step must do (instead of the model's)",
    )
    g.add_argument(
        "--bandwidth-tb-s",
        type=finite_float(0, 1e3, open_low=True, what="TB/s"),
        default=None,
        help="peak memory bandwidth, TB/s (overrides --gpu)",
    )
    g.add_argument(
        "--tflops",
        type=finite_float(0, 1e6, open_low=True, what="TFLOP/s"),
        default=None,
        help="dense peak TFLOP/s (overrides --gpu; default its figure for the model's dtype, or bf16)",
    )
    g.add_argument(
        "--phase",
        choices=("decode", "prefill", "mixed"),
        default="decode",
        help="phase of the steps --step-bytes/--step-flops/--unprofiled-ms describe, and of steps that "
        "are not perfsdk.<phase> ranges (default decode)",
    )
    g.add_argument(
        "--unprofiled-ms",
        type=finite_float(0, 1e7, open_low=True, what="milliseconds"),
        default=None,
        help="the --phase step time measured without the profiler: shares are then of it, and the "
        "profiler's inflation is reported",
    )
    p.add_argument(
        "--max-size",
        type=parse_size,
        default=None,
        metavar="SIZE",
        help="refuse a trace holding more JSON than this once decompressed, reading no further "
        "(default: 2GiB; e.g. 8GiB, 500MB)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # imported on use: `perfsdk --help` must not pay for the analyser
    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.trace_events import DEFAULT_MAX_BYTES

    if args.max_size is None:
        args.max_size = DEFAULT_MAX_BYTES
    traces = args.trace if isinstance(args.trace, list) else [args.trace]
    if len(traces) > 1:
        return _run_ranks(args, traces)
    cost, unprofiled = _cost_and_reference(args)
    diag = analyze_trace(
        traces[0],
        step_pattern=args.step_name,
        cost=cost,
        unprofiled=unprofiled,
        phase=args.phase,
        max_bytes=args.max_size,
    )
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


def _cost_and_reference(args: argparse.Namespace) -> tuple[dict[str, StepCost] | None, Any]:
    """The per-phase costs and the unprofiled reference the options describe (None where none were given)."""
    from perfsdk.profiling.bandwidth import StepCost
    from perfsdk.profiling.observer import Unprofiled

    # every figure was checked by its flag's type (perfsdk.cli._args): finite, in range, positive where it must be
    phase = args.phase
    step_bytes, step_flops = args.step_bytes, args.step_flops
    bw, tflops = args.bandwidth_tb_s, args.tflops
    unprofiled_ms = args.unprofiled_ms
    batch, context, prompt = args.batch, args.context, args.prompt_tokens
    unprofiled = (
        None if unprofiled_ms is None else {phase: Unprofiled(step_us=unprofiled_ms * 1000, source="--unprofiled-ms")}
    )
    if not any(x is not None for x in (args.model, args.gpu, step_bytes, step_flops, bw, tflops)):
        return None, unprofiled
    from perfsdk import hardware
    from perfsdk.model import ModelSpec

    model = ModelSpec.named(args.model) if args.model else None
    hw = hardware.get(args.gpu) if args.gpu else None

    def peaks(c: StepCost) -> StepCost:  # --bandwidth-tb-s / --tflops win over the GPU's datasheet row
        return StepCost(
            bytes=c.bytes,
            flops=c.flops,
            peak_bandwidth=bw * 1e12 if bw is not None else c.peak_bandwidth,
            peak_flops=tflops * 1e12 if tflops is not None else c.peak_flops,
            source=c.source + ("; peaks from --bandwidth-tb-s/--tflops" if bw or tflops else ""),
            missing="" if hw is None and (bw or tflops) else c.missing,
        )

    costs: dict[str, StepCost] = {}
    if model is not None:
        costs["decode"] = peaks(StepCost.decode(model, hw, batch=batch, context_tokens=context * batch))
        if prompt is not None:
            costs["prefill"] = peaks(StepCost.prefill(model, hw, [prompt] * batch))
    if step_bytes is not None or step_flops is not None:
        base = costs.get(phase) or peaks(
            StepCost(
                peak_bandwidth=hw.memory_bandwidth if hw is not None else None,
                peak_flops=_bf16(hw) if hw is not None else None,
            )
        )
        costs[phase] = StepCost(
            bytes=step_bytes if step_bytes is not None else base.bytes,
            flops=step_flops if step_flops is not None else base.flops,
            peak_bandwidth=base.peak_bandwidth,
            peak_flops=base.peak_flops,
            source="--step-bytes/--step-flops" + (f"; {hw.display_name}" if hw is not None else ""),
        )
    if not costs:  # peaks only: the steps' bytes are still unknown, and the report says so
        costs[phase] = StepCost(
            peak_bandwidth=bw * 1e12 if bw is not None else hw.memory_bandwidth if hw else None,
            missing="no bytes or FLOPs for the steps: give --model (with --batch/--context) or --step-bytes",
        )
    return costs, unprofiled


run_analyze = run  # its name before the CLI modules had one pattern (issue 23)


def _bf16(hw: Any) -> float | None:
    try:
        return float(hw.peak_flops("bf16"))
    except Exception:
        return None


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
