"""A calibration and the rules for using it: :class:`Calibration`, :class:`Spread` and the named thresholds.

A calibration is a set of measured ceilings (copy bandwidth, GEMM FLOP/s per dtype) together with how
much they moved while they were measured. Each figure is the median of several *rounds*; its
:class:`Spread` keeps every round's rate, the quartiles and the extremes::

    cal = hw.calibrate("cpu")
    cal.copy_bandwidth, cal.flops["fp32"]       # medians of the rounds
    cal.spread["fp32"].rel_iqr                  # (q3 - q1) / median: 0.04 is a quiet machine
    cal.usable, cal.problems                    # False, ("GEMM fp32: spread 61% ...",) on a busy one
    cal.as_spec()                               # a HardwareSpec; raises CalibrationError when not usable
    cal.fallback()                              # what perfsdk uses instead: (spec or None, description)

A calibration is **not usable** (never cached, never turned into a spec) when any figure:

* is not a positive finite rate (a timer that did not advance, a failed kernel);
* has a spread above :data:`MAX_SPREAD` (0.25): the middle half of its rounds spans more than a quarter
  of their median. The machine's speed changed while it was being measured (a neighbour process on the
  cores, a clock or power state), so the median describes no steady state. Timed by CUDA events after a
  warm-up, a GPU's rounds agree within a few percent; on a 2-core VM shared with other work, quick CPU
  calibrations measured 0.1-17 % while it was quiet and 29-98 % while tests ran beside them;
* is below :data:`DATASHEET_FLOOR` (a tenth) of the part's datasheet row, where the device has one: a
  healthy GPU copies at 80-90 % of its datasheet bandwidth and multiplies at 70-80 % of its dense peak,
  so a tenth means something other than the device's limit was measured (a busy or throttled GPU, a
  timing that caught only a launch), and the datasheet row is the better ceiling;
* is above :data:`DATASHEET_CEILING` (1.1 ×) the datasheet peak: nothing beats its datasheet; a tenth
  over allows for clocks above the sheet's and its rounding, more means a wrong timing, a buffer that fit
  in a cache (a small ``size_mb``), or a device that is not the part its name matched.

Where the figures come from, how they are cached and checked again later, and what perfsdk does instead
of an unusable calibration: :func:`perfsdk.hardware.calibrate` and :func:`perfsdk.hardware.calibrated_spec`.
This module is plain Python (no torch).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from perfsdk.errors import CalibrationError, UnknownHardwareError
from perfsdk.hardware.datasheets import HardwareSpec, match_device_name

__all__ = [
    "DATASHEET_CEILING",
    "DATASHEET_FLOOR",
    "MAX_SPREAD",
    "SCHEMA_VERSION",
    "Calibration",
    "Spread",
    "format_rate",
    "slug",
]

#: The cache file format. 2: spread, machine and schema recorded (1, unnumbered: medians only).
SCHEMA_VERSION = 2
#: The widest spread (interquartile range over the median of a figure's rounds) a usable figure may have.
MAX_SPREAD = 0.25
#: A figure below this fraction of the part's datasheet peak is implausible.
DATASHEET_FLOOR = 0.1
#: A figure above this multiple of the part's datasheet peak is implausible.
DATASHEET_CEILING = 1.1


def format_rate(value: float, unit: str) -> str:
    """``4.15e12, "B/s"`` -> ``"4.15 TB/s"`` (decimal prefixes, three significant digits)."""
    if not math.isfinite(value):
        return f"{value} {unit}"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def slug(text: str) -> str:
    """A device name as a file-name part: ``"AMD EPYC 7B13"`` -> ``"amd-epyc-7b13"``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def label(figure: str) -> str:
    """``"copy"`` -> ``"copy"``, ``"fp32"`` -> ``"GEMM fp32"``: how messages name a figure."""
    return figure if figure == "copy" else f"GEMM {figure}"


def unit(figure: str) -> str:
    return "B/s" if figure == "copy" else "FLOP/s"


def _quantile(ordered: Sequence[float], p: float) -> float:
    # linear interpolation between closest ranks (statistics.quantiles' "inclusive" method), written out
    # so that one infinite rate gives an infinite quartile instead of an error
    pos = p * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    if lo == hi or ordered[lo] == ordered[hi]:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclasses.dataclass(frozen=True)
class Spread:
    """How one figure varied over its rounds: every round's rate, the median, quartiles and extremes."""

    samples: tuple[float, ...]
    median: float
    low: float
    high: float
    q1: float
    q3: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        """The spread of *samples* (one rate per round; at least one)."""
        values = tuple(float(v) for v in samples)
        if not values:
            raise ValueError("a spread needs at least one sample")
        ordered = sorted(values)
        return cls(
            samples=values,
            median=statistics.median(ordered),
            low=ordered[0],
            high=ordered[-1],
            q1=_quantile(ordered, 0.25),
            q3=_quantile(ordered, 0.75),
        )

    @property
    def rounds(self) -> int:
        return len(self.samples)

    @property
    def rel_iqr(self) -> float:
        """The interquartile range over the median: the spread :data:`MAX_SPREAD` bounds (``inf`` if unknown)."""
        width = self.q3 - self.q1
        if not (math.isfinite(width) and math.isfinite(self.median)) or self.median <= 0:
            return math.inf
        return width / self.median

    def as_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "q1": self.q1,
            "q3": self.q3,
            "rel_iqr": self.rel_iqr,
            "rounds": self.rounds,
            "samples": list(self.samples),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spread:
        """Rebuilt from the recorded rounds (the stored median and quartiles are not trusted on their own)."""
        return cls.of(data["samples"])


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured ceilings of one device: copy bandwidth (bytes read + written per second) and GEMM FLOP/s.

    ``copy_bandwidth`` and ``flops`` are medians over ``spread[figure].rounds`` rounds (figures:
    ``"copy"`` and the dtype keys). ``machine`` records where and with what it was measured (host,
    memory, threads, torch/CUDA/driver versions); ``problems`` says why it must not be used (empty:
    usable); ``cache`` says where this object came from or went (``"read from …"``, ``"written to …"``,
    ``"not written: …"``), and is not part of its identity.
    """

    device: str
    copy_bandwidth: float
    flops: dict[str, float]
    measured_at: str
    torch_version: str = ""
    backend: str = ""
    quick: bool = False
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    spread: dict[str, Spread] = dataclasses.field(default_factory=dict)
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)
    problems: tuple[str, ...] = ()
    schema: int = SCHEMA_VERSION
    cache: str = dataclasses.field(default="", compare=False)

    @property
    def usable(self) -> bool:
        """Whether perfsdk may cache this and compute MBU/MFU against it."""
        return not self.problems

    @property
    def figures(self) -> dict[str, float]:
        """``{"copy": copy_bandwidth, **flops}``: every measured figure by its key."""
        return {"copy": self.copy_bandwidth, **self.flops}

    def datasheet(self) -> HardwareSpec | None:
        """The datasheet row of the device measured, where it is a GPU in the table; else ``None``."""
        if self.backend in ("", "cpu"):
            return None
        try:
            return match_device_name(self.device, self.machine.get("memory_bytes"))
        except UnknownHardwareError:
            return None

    def check(self, datasheet: HardwareSpec | None = None) -> tuple[str, ...]:
        """Why this calibration must not be used, each naming the figure and the bound it broke (empty: usable).

        *datasheet*: the part's row to check against (:meth:`datasheet`); ``None`` skips those bounds.
        """
        out: list[str] = []
        if not self.flops:
            out.append("no GEMM rate was measured")
        for key, value in self.figures.items():
            name, u = label(key), unit(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                out.append(f"{name}: {value!r} is not a positive finite rate (did the timer advance?)")
                continue
            s = self.spread.get(key)
            if s is None:
                out.append(f"{name}: no spread recorded")
            elif s.median != value:
                out.append(f"{name}: {format_rate(value, u)} is not the median of its rounds "
                           f"({format_rate(s.median, u)})")  # fmt: skip
            elif not s.rel_iqr <= MAX_SPREAD:  # `not <=`: a NaN spread fails too
                out.append(
                    f"{name}: spread {s.rel_iqr:.0%} (rounds {format_rate(s.low, u)} to {format_rate(s.high, u)}) "
                    f"is above MAX_SPREAD {MAX_SPREAD:.0%}: the machine's speed changed while it was measured"
                )
            if datasheet is None:
                continue
            peak = datasheet.memory_bandwidth if key == "copy" else datasheet.flops.get(key)
            if not peak:
                continue
            row = f"the datasheet {format_rate(peak, u)} of {datasheet.name}"
            if value < DATASHEET_FLOOR * peak:
                out.append(f"{name}: {format_rate(value, u)} is {value / peak:.1%} of {row}, below "
                           f"DATASHEET_FLOOR {DATASHEET_FLOOR:.0%}")  # fmt: skip
            elif value > DATASHEET_CEILING * peak:
                out.append(f"{name}: {format_rate(value, u)} is {value / peak:.0%} of {row}, above "
                           f"DATASHEET_CEILING {DATASHEET_CEILING:.0%}")  # fmt: skip
        return tuple(out)

    def fallback(self) -> tuple[HardwareSpec | None, str]:
        """What perfsdk uses when this calibration is not usable, and a description of it.

        A GPU in the datasheet table: its row (what ``detect()`` returns). A CPU or an unknown GPU:
        ``None``, so MBU and MFU are off.
        """
        row = self.datasheet()
        if row is not None:
            return row, f"the datasheet row {row.name} ({row.display_name})"
        if self.backend in ("", "cpu"):
            return None, "no hardware spec, so MBU/MFU are off"
        return None, f"no hardware spec ({self.device} is not in the datasheet table), so MBU/MFU are off"

    def as_spec(self, name: str | None = None) -> HardwareSpec:
        """This measurement as a :class:`HardwareSpec`, to compute MBU/MFU against achievable ceilings.

        Raises :class:`~perfsdk.errors.CalibrationError` when it is not usable (see :attr:`problems`).
        """
        if self.problems:
            _, instead = self.fallback()
            raise CalibrationError(
                f"calibration: the measurement of {self.device} is not usable ({'; '.join(self.problems)}); "
                f"use perfsdk.hardware.calibrated_spec(), which falls back to {instead}"
            )
        return HardwareSpec(
            name=name or f"{slug(self.device)}-calibrated",
            memory_bandwidth=self.copy_bandwidth,
            flops=self.flops,
            display_name=f"{self.device} (calibrated)",
            source=f"calibrated on {self.device} at {self.measured_at}",
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: every field (spreads as dicts, ``problems`` as a list) and ``usable``."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["flops"] = dict(self.flops)
        out["spread"] = {key: s.as_dict() for key, s in self.spread.items()}
        out["problems"] = list(self.problems)
        out["usable"] = self.usable
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """The inverse of :meth:`as_dict` (keys it does not know are ignored).

        Raises ``KeyError``/``TypeError``/``ValueError`` on a malformed record.
        """
        names = {f.name for f in dataclasses.fields(cls)} - {"cache"}
        kwargs = {key: value for key, value in data.items() if key in names}
        kwargs["spread"] = {key: Spread.from_dict(value) for key, value in (data.get("spread") or {}).items()}
        kwargs["problems"] = tuple(str(p) for p in data.get("problems") or ())
        if not all(isinstance(kwargs.get(key, {}), dict) for key in ("flops", "details", "machine")):
            raise TypeError("flops, details and machine must be objects")
        return cls(**kwargs)
