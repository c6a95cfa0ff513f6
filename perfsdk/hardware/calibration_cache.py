"""The calibration cache: one JSON file per device, used only while it still describes this machine.

Files live in ``$PERFSDK_CACHE_DIR`` (default ``~/.cache/perfsdk``) as ``calibration-<device>.json``.
Only usable calibrations are written (:func:`store`). :func:`load` returns one only when all of these
hold, and otherwise logs why and returns ``None`` (the caller measures again and replaces the file):

* it is in the current format (``schema`` :data:`~perfsdk.hardware.calibration.SCHEMA_VERSION`); a file
  from an older perfsdk, with no spread and no schema, is ignored and replaced (an info message);
* it was measured on this machine as it is now: the same device, host name, memory, CPU threads (on a
  CPU), torch, CUDA/HIP and driver versions; a full calibration serves a quick request, not the reverse;
* it is younger than the maximum age: :data:`DEFAULT_MAX_AGE_DAYS` (7 days), or
  ``$PERFSDK_CALIBRATION_MAX_AGE_DAYS``, or the caller's ``max_age_days``. Drivers, clocks, power
  limits, firmware and a shared host's neighbours change without changing any recorded version; a week
  keeps a daily benchmark's peaks fixed while bounding how long a wrong one can last;
* it still passes :meth:`Calibration.check <perfsdk.hardware.Calibration.check>` (a hand-edited or
  corrupted file does not).

A last check needs the device itself, so :func:`perfsdk.hardware.calibrate` does it: a short probe that
measures a rate clearly above a cached figure proves the file wrong.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.hardware.calibration import SCHEMA_VERSION, Calibration, slug

__all__ = [
    "DEFAULT_MAX_AGE_DAYS",
    "MACHINE_KEYS",
    "MAX_AGE_ENV",
    "cache_dir",
    "cache_path",
    "load",
    "max_age_days",
    "remove",
    "store",
]

log = logging.getLogger(__name__)

#: How long a cached calibration is used before it is measured again, in days.
DEFAULT_MAX_AGE_DAYS = 7.0
#: The environment variable that overrides :data:`DEFAULT_MAX_AGE_DAYS`.
MAX_AGE_ENV = "PERFSDK_CALIBRATION_MAX_AGE_DAYS"
#: ``Calibration.machine`` entries that must match the machine now for a cached file to be used.
MACHINE_KEYS = ("hostname", "memory_bytes", "threads", "cuda_version", "hip_version", "driver")

_FUTURE_SLACK = timedelta(days=1)  # clocks of hosts sharing a home directory disagree a little


def cache_dir() -> Path:
    """``$PERFSDK_CACHE_DIR``, else ``~/.cache/perfsdk`` (read by :func:`perfsdk.config.cache_dir`'s rule)."""
    from perfsdk.config import cache_dir as configured

    return configured()


def cache_path(device_name: str) -> Path:
    """Where the calibration of *device_name* is cached."""
    return cache_dir() / f"calibration-{slug(device_name)}.json"


def max_age_days(value: float | None = None) -> float:
    """*value*, else ``$PERFSDK_CALIBRATION_MAX_AGE_DAYS``, else 7; a positive finite number of days."""
    field = "max_age_days"
    if value is None:
        from perfsdk.config import env, parse_float  # the one rule for every PERFSDK_* variable

        text = env(MAX_AGE_ENV)
        if text is None:
            return DEFAULT_MAX_AGE_DAYS
        field = f"{MAX_AGE_ENV} (environment)"
        try:
            value = parse_float(text, 0, 36500, open_low=True, what="a number of days")
        except ValueError as e:
            raise ConfigError(f"{field}: {e}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field}: expected a positive finite number of days, got {value!r}")
    return float(value)


def _age(measured_at: str, now: datetime) -> timedelta:
    when = datetime.fromisoformat(measured_at)
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return now - when


def _mismatch(cal: Calibration, device: str, torch_version: str, machine: Mapping[str, Any], quick: bool) -> str:
    if cal.device != device:
        return f"it is for {cal.device!r}, not {device!r}"
    if cal.torch_version != torch_version:
        return f"it was measured with torch {cal.torch_version}, this is torch {torch_version}"
    for key in MACHINE_KEYS:
        if cal.machine.get(key) != machine.get(key):
            return f"its {key} is {cal.machine.get(key)!r}, this machine's is {machine.get(key)!r}"
    if cal.quick and not quick:
        return "it is a quick calibration and a full one was asked for"
    return ""


def load(
    path: Path,
    *,
    device: str,
    torch_version: str,
    machine: Mapping[str, Any],
    quick: bool,
    max_age_days: float,
    now: datetime | None = None,
) -> Calibration | None:
    """The calibration cached at *path* if it may be used on this machine now (see the module docstring)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.info("perfsdk: cannot read the calibration cache %s (%s); measuring again", path, e)
        return None

    def ignore(why: str, level: int = logging.INFO) -> None:
        log.log(level, "perfsdk: ignoring the calibration cache %s: %s; measuring again", path, why)

    try:
        data = json.loads(text)
    except ValueError as e:
        ignore(f"it is not JSON ({e})")
        return None
    if not isinstance(data, dict):
        ignore("it is not a JSON object")
        return None
    if data.get("schema") != SCHEMA_VERSION:
        found = "no schema" if "schema" not in data else f"schema {data.get('schema')!r}"
        ignore(f"it is from an older perfsdk ({found}, no spread recorded; this one writes schema {SCHEMA_VERSION})")
        return None
    try:
        cal = Calibration.from_dict(data)
        age = _age(cal.measured_at, now or datetime.now(timezone.utc))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        ignore(f"it is malformed ({type(e).__name__}: {e})", logging.WARNING)
        return None
    why = _mismatch(cal, device, torch_version, machine, quick)
    if why:
        ignore(why)
        return None
    if age < -_FUTURE_SLACK:
        ignore(f"it is dated {cal.measured_at}, in the future", logging.WARNING)
        return None
    if age > timedelta(days=max_age_days):
        ignore(f"it was measured {age.total_seconds() / 86400:.1f} days ago ({cal.measured_at}), longer than "
               f"the {max_age_days:g} days a calibration is kept (max_age_days, ${MAX_AGE_ENV})")  # fmt: skip
        return None
    problems = cal.problems or cal.check(cal.datasheet())
    if problems:
        ignore("; ".join(problems), logging.WARNING)
        return None
    return cal


def store(path: Path, cal: Calibration) -> None:
    """Write *cal* to *path* atomically; a failure is logged, never raised."""
    data = cal.as_dict()
    for key in ("cache", "usable"):  # where this copy came from, and derived: not part of the record
        data.pop(key, None)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    except OSError as e:
        log.warning("perfsdk: could not write the calibration cache %s: %s", path, e)


def remove(path: Path) -> None:
    """Delete a cache file that was found unusable and could not be replaced by a usable measurement."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.debug("perfsdk: could not remove the calibration cache %s: %s", path, e)
