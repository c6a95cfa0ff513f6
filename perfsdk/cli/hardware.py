"""``perfsdk calibrate`` and ``perfsdk hardware``: measured ceilings and the datasheet table.

::

    perfsdk calibrate                      # the GPU if there is one, else the CPU; cached per device
    perfsdk calibrate --device cpu --json  # machine-readable
    perfsdk calibrate --no-cache --quick   # re-measure, smaller sizes
    perfsdk hardware                       # every datasheet row: bandwidth and dense peaks
    perfsdk hardware "H100 SXM" --json     # one row

On a GPU that is in the table, ``calibrate`` also prints each measurement as a fraction of the
datasheet peak: a healthy H200 copies at ~85% of 4.8 TB/s and multiplies bf16 at ~78% of 989 TFLOP/s.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from perfsdk import hardware
from perfsdk.cli._args import positive_int
from perfsdk.errors import UnknownHardwareError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``calibrate`` and ``hardware`` to the ``perfsdk`` command line."""
    cal = sub.add_parser(
        "calibrate",
        help="measure achievable copy bandwidth and GEMM FLOP/s on this machine",
        description="Measure the achievable copy bandwidth (bytes read + written) and GEMM rate of a "
        "device. Results are cached per device under $PERFSDK_CACHE_DIR or ~/.cache/perfsdk.",
    )
    cal.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: auto")
    cal.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cal.add_argument(
        "--no-cache", action="store_true", help="re-measure, ignoring (and not writing) the cache"
    )
    cal.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    cal.add_argument("--size-mb", type=positive_int(2**40), default=None, help="copy buffer size in MiB")
    cal.set_defaults(func=_run_calibrate)

    hw = sub.add_parser("hardware", help="list the datasheet table (or one row)")
    hw.add_argument("name", nargs="?", help="a part, e.g. 'h100-sxm' or 'H200'")
    hw.add_argument("--json", action="store_true", help="print JSON instead of a table")
    hw.set_defaults(func=_run_hardware)


def _rate(value: float, unit: str) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _datasheet_for(cal: hardware.Calibration) -> hardware.HardwareSpec | None:
    if cal.backend == "cpu":
        return None
    try:
        return hardware.match_device_name(cal.device, None)
    except UnknownHardwareError:
        return None


def _run_calibrate(args: argparse.Namespace) -> int:
    cal = hardware.calibrate(args.device, cache=not args.no_cache, size_mb=args.size_mb, quick=args.quick)
    spec = _datasheet_for(cal)
    if args.json:
        out: dict[str, Any] = cal.as_dict()
        out["datasheet"] = spec.as_dict() if spec is not None else None
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0

    def versus(measured: float, peak: float | None, unit: str) -> str:
        return f"   {measured / peak:6.1%} of datasheet {_rate(peak, unit)}" if peak else ""

    threads = cal.details.get("threads")
    where = f"{cal.backend}, torch {cal.torch_version}" + (f", {threads} threads" if threads else "")
    rows = [
        ("device", f"{cal.device} ({where})"),
        ("measured", f"{cal.measured_at}" + (" (quick)" if cal.quick else "")),
        ("copy (read+write)", f"{_rate(cal.copy_bandwidth, 'B/s'):>12}"
         + versus(cal.copy_bandwidth, spec.memory_bandwidth if spec else None, 'B/s')),
    ]  # fmt: skip
    for dtype, rate in cal.flops.items():
        # fp32 is measured with TF32 off, so it lines up with the non-tensor "fp32" peak
        peak = spec.flops.get(dtype) if spec else None
        rows.append((f"GEMM {dtype}", f"{_rate(rate, 'FLOP/s'):>12}" + versus(rate, peak, "FLOP/s")))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _run_hardware(args: argparse.Namespace) -> int:
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
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print("\ndense peaks (sparsity figures halved); int8 in TOPS. Sources: perfsdk.hardware.get(name).source")
    return 0
