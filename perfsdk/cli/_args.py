"""Argument types for every number on the ``perfsdk`` command line: one rule, one message shape.

Each flag that takes a number names its type here, with the range it makes sense in::

    p.add_argument("--duration", type=finite_float(0, DAY_S, open_low=True, what="a number of seconds"))
    p.add_argument("--request-rate", type=finite_float(0, 1e6, open_low=True, allow_inf=True))
    p.add_argument("--port", type=PORT)
    p.add_argument("--num-prompts", type=int_range(1, 10**9))

The text rule is :mod:`perfsdk.config`'s (the one the ``PERFSDK_*`` variables follow): ASCII whitespace
around a value is ignored; integers are ASCII digits; numbers are decimal or exponent notation, never
``nan``, ``inf`` only where a flag allows it, and within the flag's range — an upper bound keeps an absurd
magnitude from overflowing a later computation or printing a 300-digit figure. A bad value is an argparse
error: ``perfsdk <command>: error: argument --duration: must be a number of seconds within (0, 86400],
got 'nan'`` and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from perfsdk.config import parse_float, parse_int

__all__ = ["DAY_S", "PORT", "SEED", "finite_float", "int_range", "positive_int"]

DAY_S = 86_400.0


def finite_float(
    low: float, high: float, *, open_low: bool = False, allow_inf: bool = False, what: str = "a number"
) -> Callable[[str], float]:
    """An argparse ``type``: a finite float within [*low*, *high*] (``(low, high]`` with *open_low*);
    ``inf`` too with *allow_inf*."""

    def number(text: str) -> float:
        try:
            return parse_float(text, low, high, open_low=open_low, allow_inf=allow_inf, what=what)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    number.__name__ = "number"  # what argparse would name in its own messages
    return number


def int_range(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer within [*low*, *high*]."""

    def integer(text: str) -> int:
        try:
            return parse_int(text, low, high)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    integer.__name__ = "integer"
    return integer


def positive_int(high: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer within [1, *high*]."""
    return int_range(1, high)


PORT = int_range(0, 65535)
SEED = int_range(0, 2**63 - 1)
