"""Exceptions perfsdk raises to its callers.

Every error perfsdk raises on purpose derives from :class:`PerfsdkError`, so a
server can catch all of them in one place. Configuration mistakes are also
:class:`ValueError` (bad sizes, unknown names) so that ordinary ``except
ValueError`` code keeps working::

    try:
        spec = perfsdk.hardware.get("h100-sxn")
    except perfsdk.UnknownHardwareError as e:
        print(e)          # names the close matches and how to pass a spec

Errors raised *inside* the instrumentation at run time never reach serving
code: they are counted and logged once (see ``perfsdk._guard``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "CalibrationError",
    "ConfigError",
    "MissingDependencyError",
    "MonitorClosedError",
    "PerfsdkError",
    "UnknownHardwareError",
    "UnknownModelError",
    "UsageError",
    "suggest",
]


class PerfsdkError(Exception):
    """Base class of every error perfsdk raises on purpose."""


class ConfigError(PerfsdkError, ValueError):
    """A value given to perfsdk is out of range or inconsistent; the message names the field."""


class UsageError(PerfsdkError):
    """A ``perfsdk`` command line that cannot run as given (a command or subcommand missing); the message says
    what to give. ``perfsdk``'s ``main`` prints it and exits 2, as for every error here."""


class UnknownHardwareError(ConfigError):
    """A GPU name that is not in the datasheet table, or a device that cannot be mapped to one."""


class UnknownModelError(ConfigError):
    """A model name that is not in the table of known models."""


class CalibrationError(PerfsdkError):
    """A calibration too noisy or implausible to use was asked for as a spec; the message says why."""


class MonitorClosedError(PerfsdkError, RuntimeError):
    """A call that would start something (a metrics server, a profiler capture) on a closed Monitor."""


class MissingDependencyError(PerfsdkError, ImportError):
    """An optional package was asked for explicitly and is not installed (or too old)."""

    def __init__(self, package: str, feature: str, extra: str | None = None, minimum: str | None = None):
        hint = f'pip install "perfsdk[{extra}]"' if extra else f"pip install {package}"
        version = f" >= {minimum}" if minimum else ""
        super().__init__(f"{feature} needs the '{package}{version}' package, which is not installed: {hint}")
        self.package = package
        self.feature = feature


def suggest(name: str, choices: Iterable[str], n: int = 4) -> str:
    """Return ``" Did you mean: a, b?"`` for close matches of *name*, or ``""``."""
    close = difflib.get_close_matches(name.lower(), list(choices), n=n, cutoff=0.5)
    return f" Did you mean: {', '.join(close)}?" if close else ""
