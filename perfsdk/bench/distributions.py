"""Token-length specifications for synthetic requests.

``--input-len`` and ``--output-len`` accept one of three forms::

    128               every request asks for exactly 128 tokens
    uniform:64-256    an integer drawn uniformly from 64..256 (both ends included)
    normal:128,32     a normal draw with mean 128 and std 32, rounded, clamped to >= 1

Use :meth:`LengthSpec.parse` on text and :meth:`LengthSpec.sample` (or
:meth:`LengthSpec.draw`, one length) with a seeded :class:`random.Random` so
that two runs with the same ``--seed`` send the same lengths; ``sample(rng, n)``
is ``n`` calls of ``draw(rng)``, and a fixed length draws nothing from *rng*::

    spec = LengthSpec.parse("uniform:64-256")
    lengths = spec.sample(random.Random(0), 100)

Bad text raises :class:`perfsdk.errors.ConfigError` naming the field; so do
non-finite numbers and lengths above :data:`MAX_LENGTH` (each prompt is built
in memory, as its request is sent).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Literal

from perfsdk.errors import ConfigError

__all__ = ["MAX_LENGTH", "LengthSpec"]

#: The longest request length accepted, in tokens: ten million, beyond the longest context any
#: served model takes; a larger value is a typo that would otherwise build gigabyte prompts.
MAX_LENGTH = 10_000_000

Kind = Literal["fixed", "uniform", "normal"]


@dataclass(frozen=True)
class LengthSpec:
    """A fixed length or a distribution of lengths, in tokens.

    ``fixed``: ``a`` is the length. ``uniform``: ``a``..``b`` inclusive.
    ``normal``: mean ``a``, standard deviation ``b``.
    """

    kind: Kind
    a: float
    b: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ConfigError(f"length: numbers must be finite, got {self.a!r} and {self.b!r}")
        if max(self.a, self.b) > MAX_LENGTH:
            raise ConfigError(f"length: at most {MAX_LENGTH:,} tokens, got {max(self.a, self.b):g}")
        if self.kind == "fixed":
            if self.a < 1 or self.a != int(self.a):
                raise ConfigError(f"length: a fixed length must be a positive integer, got {self.a:g}")
        elif self.kind == "uniform":
            if self.a < 1 or self.b < self.a or self.a != int(self.a) or self.b != int(self.b):
                raise ConfigError(f"length: uniform:a-b needs integers 1 <= a <= b, got uniform:{self.a:g}-{self.b:g}")
        elif self.kind == "normal":
            if self.a < 1 or self.b < 0:
                raise ConfigError(
                    f"length: normal:mean,std needs mean >= 1 and std >= 0, got normal:{self.a:g},{self.b:g}"
                )
        else:
            raise ConfigError(f"length: unknown distribution kind {self.kind!r}")

    @classmethod
    def fixed(cls, n: int) -> LengthSpec:
        return cls("fixed", float(n))

    @classmethod
    def parse(cls, text: str | int | LengthSpec, *, field: str = "length") -> LengthSpec:
        """Parse ``"128"``, ``"uniform:64-256"`` or ``"normal:128,32"``; *field* names the option."""
        if isinstance(text, LengthSpec):
            return text
        if isinstance(text, bool):  # bool is an int; True tokens is certainly a mistake
            raise ConfigError(f"{field}: expected a length, got {text!r}")
        if isinstance(text, int):
            if text > MAX_LENGTH:  # checked first: str() and float() of a huge int raise
                raise ConfigError(f"{field}: at most {MAX_LENGTH:,} tokens, got a larger integer")
            return cls._build("fixed", float(text), 0.0, field, str(text))
        raw = str(text).strip()
        kind, sep, rest = raw.partition(":")
        try:
            if not sep:
                return cls._build("fixed", float(int(raw)), 0.0, field, raw)
            kind = kind.strip().lower()
            if kind == "uniform":
                lo, dash, hi = rest.partition("-")
                if not dash:
                    raise ValueError("missing '-'")
                return cls._build("uniform", float(int(lo)), float(int(hi)), field, raw)
            if kind == "normal":
                mean, comma, std = rest.partition(",")
                if not comma:
                    raise ValueError("missing ','")
                return cls._build("normal", float(mean), float(std), field, raw)
        except (ValueError, OverflowError) as e:  # OverflowError: an integer beyond a float
            if isinstance(e, ConfigError):
                raise
            raise ConfigError(
                f"{field}: cannot parse {raw!r}; expected N, uniform:A-B or normal:MEAN,STD ({e})"
            ) from None
        raise ConfigError(
            f"{field}: unknown distribution {kind!r} in {raw!r}; expected N, uniform:A-B or normal:MEAN,STD"
        )

    @classmethod
    def _build(cls, kind: Kind, a: float, b: float, field: str, raw: str) -> LengthSpec:
        try:
            return cls(kind, a, b)
        except ConfigError as e:
            raise ConfigError(f"{field}: {raw!r} is invalid: {str(e).removeprefix('length: ')}") from None

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """Draw *n* lengths (each >= 1) from *rng*."""
        return [self.draw(rng) for _ in range(n)]

    def draw(self, rng: random.Random) -> int:
        """One length (>= 1) from *rng*; a fixed length uses no randomness."""
        if self.kind == "fixed":
            return int(self.a)
        if self.kind == "uniform":
            return rng.randint(int(self.a), int(self.b))
        return min(max(1, round(rng.gauss(self.a, self.b))), MAX_LENGTH)

    @property
    def mean(self) -> float:
        """Expected length (before clamping, for ``normal``)."""
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    def __str__(self) -> str:
        if self.kind == "fixed":
            return str(int(self.a))
        if self.kind == "uniform":
            return f"uniform:{int(self.a)}-{int(self.b)}"
        return f"normal:{self.a:g},{self.b:g}"
