"""The kernel check: the bytes (FLOPs) a step must move over the time its kernels ran, against the peak.

:func:`check_kernels` gives a :class:`KernelCheck` (per-step means over the steps checked: kernel time,
floor, bound, utilisation) with the :class:`KernelRow` of the kernels that hold the time and the Nsight
Compute command for them (:func:`ncu_command`). The thresholds are here, their reasons in
:mod:`perfsdk.profiling.bandwidth`'s docstring (which re-exports everything below)::

    check = check_kernels(steps, phases, {"decode": cost}, window_us)
    check.utilisation, check.bound, check.top[0].name, check.ncu
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfsdk.profiling.kernel_shapes import KernelTally
from perfsdk.profiling.step_cost import StepCost
from perfsdk.profiling.steps import StepStats

__all__ = [
    "HEALTHY_BANDWIDTH_FRACTION",
    "HEALTHY_BUSY_FRACTION",
    "HEALTHY_FLOPS_FRACTION",
    "NCU_LAUNCHES",
    "SLOW_KERNELS_MIN_SHARE",
    "SUSPECT_UTILISATION",
    "TOP_KERNELS",
    "KernelCheck",
    "KernelRow",
    "check_kernels",
    "ncu_base_name",
    "ncu_command",
    "short_name",
    "top_kernels",
]

# Share of step time the GPU spends running kernels (busy, less copies and exposed collectives)
# from which a step can be called healthy: the remaining idle is launch latency and step boundaries
# that no host-side change removes.
HEALTHY_BUSY_FRACTION = 0.80
HEALTHY_BANDWIDTH_FRACTION = 0.60  # why: the module docstring
HEALTHY_FLOPS_FRACTION = 0.50
SLOW_KERNELS_MIN_SHARE = 0.10
SUSPECT_UTILISATION = 1.0
TOP_KERNELS = 5  # kernels named in a finding: the seeds' "zoom in where the time is", not a full table
NCU_LAUNCHES = 5  # ncu -c: each profiled launch is replayed dozens of times; five is minutes, not hours


@dataclass(frozen=True)
class KernelRow:
    """One kernel name over the steps checked: its time per step, share of the step, achieved rates."""

    name: str
    us_per_step: float
    calls_per_step: float
    share: float
    bandwidth: float | None = None  # bytes/s over the launches with recorded shapes
    flop_rate: float | None = None
    bandwidth_fraction: float | None = None  # of the peak
    flops_fraction: float | None = None

    @property
    def suspect(self) -> bool:
        return any(f is not None and f > SUSPECT_UTILISATION for f in (self.bandwidth_fraction, self.flops_fraction))

    def describe(self, basis: str) -> str:
        rate = ""
        if self.bandwidth is not None and self.flop_rate is not None:
            parts = [f"{self.bandwidth / 1e12:.2f} TB/s"]
            if self.bandwidth_fraction is not None:
                parts[0] += f" = {self.bandwidth_fraction:.0%} of peak"
            parts.append(f"{self.flop_rate / 1e12:.1f} TFLOP/s")
            if self.flops_fraction is not None:
                parts[1] += f" = {self.flops_fraction:.0%} of peak"
            rate = "; " + ", ".join(parts)
            if self.suspect:
                rate += " (above the peak: suspect shapes or peak)"
        return (
            f"{short_name(self.name)} {self.share:.0%} of {basis} ({self.us_per_step:.1f} µs per step, "
            f"×{self.calls_per_step:g}{rate})"
        )

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "name": self.name,
            "ncu_name": ncu_base_name(self.name),
            "us_per_step": r(self.us_per_step, 2),
            "calls_per_step": r(self.calls_per_step, 2),
            "share": r(self.share),
            "bandwidth": self.bandwidth,
            "flop_rate": self.flop_rate,
            "bandwidth_fraction": r(self.bandwidth_fraction),
            "flops_fraction": r(self.flops_fraction),
            "suspect": self.suspect,
        }


@dataclass(frozen=True)
class KernelCheck:
    """The bytes/FLOPs check over the steps diagnosed (per-step means); see the module docstring.

    ``utilisation`` is ``floor / kernel time``; None when the check could not be made (``missing``
    says why). ``suspect`` when it is above 1: impossible, so a figure is wrong.
    """

    steps: int
    kernel_us: float
    bytes: float | None = None
    flops: float | None = None
    floor_us: float | None = None
    bound: str | None = None
    utilisation: float | None = None
    peak_bandwidth: float | None = None
    peak_flops: float | None = None
    source: str = ""
    missing: str | None = None
    top: list[KernelRow] = field(default_factory=list)
    ncu: str | None = None

    @property
    def checked(self) -> bool:
        return self.utilisation is not None

    @property
    def suspect(self) -> bool:
        return self.utilisation is not None and self.utilisation > SUSPECT_UTILISATION

    @property
    def healthy_fraction(self) -> float | None:
        if self.bound is None:
            return None
        return HEALTHY_BANDWIDTH_FRACTION if self.bound == "memory" else HEALTHY_FLOPS_FRACTION

    @property
    def achieved_bandwidth(self) -> float | None:
        return self.bytes / (self.kernel_us * 1e-6) if self.bytes is not None and self.kernel_us > 0 else None

    @property
    def achieved_flops(self) -> float | None:
        return self.flops / (self.kernel_us * 1e-6) if self.flops is not None and self.kernel_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "steps": self.steps,
            "kernel_us": round(self.kernel_us, 2),
            "bytes": self.bytes,
            "flops": self.flops,
            "floor_us": r(self.floor_us, 2),
            "bound": self.bound,
            "utilisation": r(self.utilisation),
            "suspect": self.suspect,
            "healthy_fraction": self.healthy_fraction,
            "achieved_bandwidth": self.achieved_bandwidth,
            "achieved_flops": self.achieved_flops,
            "peak_bandwidth": self.peak_bandwidth,
            "peak_flops": self.peak_flops,
            "source": self.source,
            "missing": self.missing,
            "top_kernels": [k.to_dict() for k in self.top],
            "ncu": self.ncu,
        }


def _kernel_us(s: StepStats) -> float:
    """A step's time in kernels: GPU busy less copies and exposed collectives (they have their own findings)."""
    return float(max(s.gpu_busy_us - s.copy_us - s.exposed_comm_us, 0.0))


def check_kernels(
    steps: Sequence[StepStats], phases: Sequence[str], costs: Mapping[str, StepCost], window_us: float
) -> KernelCheck:
    """The check over *steps* (``StepStats`` with a GPU window; *phases* theirs), priced by *costs* per phase.

    *window_us* is the steps' total window the kernel shares are of (the unprofiled one when corrected).
    """
    n = len(steps)
    kernel_total = sum(_kernel_us(s) for s in steps)
    rows = top_kernels(steps, window_us, costs.get(phases[0]) if phases else None)
    ncu = ncu_command([r.name for r in rows]) if rows else None
    base = KernelCheck(steps=n, kernel_us=kernel_total / n if n else 0.0, top=rows, ncu=ncu)
    if not n:
        return base
    mem_total = comp_total = floor_total = 0.0
    bytes_total = flops_total = 0.0
    have_bytes = have_flops = True
    sources: list[str] = []
    peak_bw = peak_fl = None
    for ph in phases:
        c = costs.get(ph)
        if c is None:
            return _missing(base, f"no bytes or FLOPs for the {ph} steps")
        if not c.checkable:
            return _missing(base, c.why_unchecked())
        mem, comp = c.floors_us()
        mem_total += mem or 0.0
        comp_total += comp or 0.0
        floor_total += max(mem or 0.0, comp or 0.0)
        have_bytes = have_bytes and c.bytes is not None
        have_flops = have_flops and c.flops is not None
        bytes_total += c.bytes or 0.0
        flops_total += c.flops or 0.0
        peak_bw = c.peak_bandwidth if peak_bw is None else peak_bw
        peak_fl = c.peak_flops if peak_fl is None else peak_fl
        if c.source and c.source not in sources:
            sources.append(c.source)
    if kernel_total <= 0:
        return _missing(base, "no kernel time in these steps")
    return KernelCheck(
        steps=n,
        kernel_us=kernel_total / n,
        bytes=bytes_total / n if have_bytes else None,
        flops=flops_total / n if have_flops else None,
        floor_us=floor_total / n,
        bound="memory" if mem_total >= comp_total else "compute",
        utilisation=floor_total / kernel_total,
        peak_bandwidth=peak_bw,
        peak_flops=peak_fl,
        source="; ".join(sources),
        top=rows,
        ncu=ncu,
    )


def _missing(base: KernelCheck, why: str) -> KernelCheck:
    return KernelCheck(steps=base.steps, kernel_us=base.kernel_us, missing=why, top=base.top, ncu=base.ncu)


def top_kernels(
    steps: Sequence[StepStats], window_us: float, cost: StepCost | None, n: int = TOP_KERNELS
) -> list[KernelRow]:
    """The *n* kernel names that hold the most time over *steps*, with their share of the step and rates."""
    agg: dict[str, KernelTally] = {}
    for s in steps:
        for name, t in s.kernel_tally.items():
            a = agg.get(name)
            if a is None:
                a = agg[name] = KernelTally()
            a.us += t.us
            a.calls += t.calls
            a.shaped_us += t.shaped_us
            a.bytes += t.bytes
            a.flops += t.flops
    count = len(steps) or 1
    rows = []
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1].us)[:n]:
        bw = fl = None
        if a.shaped_us > 0:
            bw, fl = a.bytes / (a.shaped_us * 1e-6), a.flops / (a.shaped_us * 1e-6)
        peak_bw = cost.peak_bandwidth if cost is not None else None
        peak_fl = cost.peak_flops if cost is not None else None
        rows.append(
            KernelRow(
                name=name,
                us_per_step=a.us / count,
                calls_per_step=a.calls / count,
                share=a.us / window_us if window_us > 0 else 0.0,
                bandwidth=bw,
                flop_rate=fl,
                bandwidth_fraction=bw / peak_bw if bw is not None and peak_bw else None,
                flops_fraction=fl / peak_fl if fl is not None and peak_fl else None,
            )
        )
    return rows


# ---- Nsight Compute -----------------------------------------------------------------------------------

_ANON = re.compile(r"\(anonymous namespace\)::")


def ncu_base_name(name: str) -> str:
    """The kernel's function name as Nsight Compute matches it by default (``--kernel-name-base function``):
    no return type, namespace, template arguments or parameters."""
    s = _ANON.sub("", name).strip()
    if s.startswith("void "):
        s = s[5:]
    cut = min((i for i in (s.find("<"), s.find("(")) if i >= 0), default=len(s))
    s = s[:cut].split("::")[-1].strip()
    return s or name


def ncu_command(names: Sequence[str], launches: int = NCU_LAUNCHES) -> str:
    """``ncu --set full -k regex:'a|b' -c 5 -o perfsdk-kernels <command>`` for the kernels *names*."""
    bases: list[str] = []
    for n in names:
        b = re.escape(ncu_base_name(n))
        if b not in bases:
            bases.append(b)
    return (
        f"ncu --set full -k regex:'{'|'.join(bases)}' -c {launches} -o perfsdk-kernels "
        "<the command that starts your server>"
    )


def short_name(name: str, limit: int = 72) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."
