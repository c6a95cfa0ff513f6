"""``perfsdk calibrate`` and ``perfsdk hardware``: measured ceilings and the datasheet table.

::

    perfsdk calibrate                      # the GPU if there is one, else the CPU; cached per device
    perfsdk calibrate --device cpu --json  # machine-readable: medians, spreads, every round, the machine
    perfsdk calibrate --no-cache --quick   # re-measure, smaller sizes, fewer rounds
    perfsdk calibrate --rounds 15          # more rounds per figure
    perfsdk hardware                       # every datasheet row: bandwidth and dense peaks
    perfsdk hardware "H100 SXM" --json     # one row

``calibrate`` prints each figure's median over its rounds and its spread (the interquartile range over
the median, and the slowest and fastest round). A calibration that is too noisy or implausible (see
:mod:`perfsdk.hardware.calibration`) is printed with its problems and what perfsdk uses instead, is not
cached, and the command exits 1; a usable one exits 0. On a GPU that is in the table each figure is
also shown as a fraction of the datasheet peak: a healthy H200 copies at ~85% of 4.8 TB/s and multiplies
bf16 at ~78% of 989 TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from perfsdk import hardware
from perfsdk.cli._args import finite_float, positive_int
from perfsdk.hardware.calibration import format_rate, label, unit
from perfsdk.hardware.calibration_cache import max_age_days

__all__ = ["format_calibration", "register", "run", "run_calibrate", "run_hardware"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate`` and ``hardware`` to the ``perfsdk`` command line."""
    cal = sub.add_parser(
        "calibrate",
        help="measure achievable copy bandwidth and GEMM FLOP/s on this machine, with their spread",
        description="Measure the achievable copy bandwidth (bytes read + written) and GEMM rate of a "
        "device, each the median of several rounds, with its spread. A usable result is cached per device "
        "under $PERFSDK_CACHE_DIR or ~/.cache/perfsdk for --max-age-days; a noisy or implausible one is "
        "neither cached nor used (exit code 1).",
    )
    cal.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto")
    cal.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cal.add_argument("--no-cache", action="store_true", help="re-measure, ignoring (and not writing) the cache")
    cal.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    cal.add_argument("--size-mb", type=positive_int(2**40), default=None, help="copy buffer size in MiB")
    cal.add_argument("--rounds", type=positive_int(10_000), default=None,
                     help="rounds per figure (default: 5 quick / 9 on a CPU, 10 / 20 on a GPU)")  # fmt: skip
    cal.add_argument(
        "--max-age-days",
        type=finite_float(0, 36500, what="a number of days"),
        default=None,
        help="use a cached calibration up to this age (default 7; $PERFSDK_CALIBRATION_MAX_AGE_DAYS)",
    )
    cal.set_defaults(func=run)

    hw = sub.add_parser("hardware", help="list the datasheet table (or one row)")
    hw.add_argument("name", nargs="?", help="a part, e.g. 'h100-sxm' or 'H200'")
    hw.add_argument("--json", action="store_true", help="print JSON instead of a table")
    hw.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``perfsdk calibrate`` or ``perfsdk hardware``, by the command given."""
    return run_calibrate(args) if args.command == "calibrate" else run_hardware(args)


def format_calibration(cal: hardware.Calibration) -> str:
    """The table ``perfsdk calibrate`` prints: medians, spreads, datasheet fractions, problems, the cache."""
    spec = cal.datasheet()
    threads = cal.details.get("threads")
    where = f"{cal.backend}, torch {cal.torch_version}" + (f", {threads} threads" if threads else "")
    host = cal.machine.get("hostname")
    rounds = sorted({s.rounds for s in cal.spread.values()})
    rows: list[tuple[str, str]] = [
        ("device", f"{cal.device} ({where}" + (f", host {host})" if host else ")")),
        ("measured", f"{cal.measured_at}" + (" (quick)" if cal.quick else "")
         + f": median of {'/'.join(map(str, rounds)) or '?'} rounds per figure"),
        ("", f"{'median':>13}  {'spread':>7}  rounds from slowest to fastest"),
    ]  # fmt: skip
    for key, value in cal.figures.items():
        u = unit(key)
        s = cal.spread.get(key)
        spread = f"{s.rel_iqr:7.1%}  {format_rate(s.low, u)} - {format_rate(s.high, u)}" if s else f"{'-':>7}"
        peak = (spec.memory_bandwidth if key == "copy" else spec.flops.get(key)) if spec else None
        versus = f"   {value / peak:.1%} of datasheet {format_rate(peak, u)}" if peak else ""
        # fp32 is measured with TF32 off, so it lines up with the non-tensor "fp32" peak
        rows.append(("copy (read+write)" if key == "copy" else label(key),
                     f"{format_rate(value, u):>13}  {spread}{versus}"))  # fmt: skip
    if cal.problems:
        for i, problem in enumerate(cal.problems):
            rows.append(("NOT USABLE" if i == 0 else "", problem))
        rows.append(("instead", f"perfsdk uses {cal.fallback()[1]}"))
    if cal.cache:
        rows.append(("cache", cal.cache))
    width = max(len(k) for k, _ in rows)
    lines = [f"{key:<{width}}  {value}" for key, value in rows]
    lines.append(f"spread: the interquartile range of the rounds over their median; a figure above "
                 f"{hardware.MAX_SPREAD:.0%} is not used")  # fmt: skip
    return "\n".join(lines)


def _finite(value: Any) -> Any:
    """*value* with every non-finite float replaced by None: JSON has no Infinity or NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def run_calibrate(args: argparse.Namespace) -> int:
    cal = hardware.calibrate(
        args.device, cache=not args.no_cache, size_mb=args.size_mb, quick=args.quick, rounds=args.rounds,
        max_age_days=args.max_age_days,
    )  # fmt: skip
    fallback, instead = cal.fallback()
    if args.json:
        spec = cal.datasheet()
        out: dict[str, Any] = cal.as_dict()
        out["datasheet"] = spec.as_dict() if spec is not None else None
        out["fallback"] = None if cal.usable else {
            "spec": fallback.as_dict() if fallback is not None else None, "description": instead}  # fmt: skip
        out["limits"] = {
            "max_spread": hardware.MAX_SPREAD,
            "datasheet_floor": hardware.DATASHEET_FLOOR,
            "datasheet_ceiling": hardware.DATASHEET_CEILING,
            "probe_margin": hardware.PROBE_MARGIN,
            "max_age_days": max_age_days(args.max_age_days),
        }
        print(json.dumps(_finite(out), indent=2, sort_keys=True))
    else:
        print(format_calibration(cal))
    if not cal.usable:
        print(f"perfsdk: this calibration is not usable, so it is neither cached nor used: {'; '.join(cal.problems)}. "
              f"perfsdk uses {instead}. Measure again on a quieter machine (or with --rounds), or pass the "
              f"ceilings yourself (perfsdk.HardwareSpec).", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def run_hardware(args: argparse.Namespace) -> int:
    # `is not None`: an empty name ("") is a mistake to report, not a request for the whole table
    specs = [hardware.get(args.name)] if args.name is not None else [hardware.get(n) for n in hardware.names()]
    if args.json:
        print(json.dumps([s.as_dict() for s in specs], indent=2))
        return 0
    dtypes = hardware.DTYPE_KEYS
    header = ["name", "TB/s", *(f"{d} TF" for d in dtypes)]
    lines = [header]
    for s in specs:
        peaks = [f"{s.flops[d] / 1e12:g}" if d in s.flops else "-" for d in dtypes]
        lines.append([s.name, f"{s.memory_bandwidth / 1e12:g}", *peaks])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    for row in lines:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print("\ndense peaks (sparsity figures halved); int8 in TOPS. Sources: perfsdk.hardware.get(name).source")
    return 0
