"""When each request is sent: the arrival process.

The gaps between consecutive requests are drawn from a gamma distribution with
``shape = burstiness`` and ``scale = 1 / (rate * burstiness)``, the same
parameterisation as ``vllm bench serve``, so ``--request-rate`` and
``--burstiness`` mean the same thing in both tools:

- the mean gap is always ``1 / rate`` (requests per second);
- ``burstiness = 1`` is a Poisson process (exponential gaps, coefficient of
  variation 1);
- the coefficient of variation of the gaps is ``1 / sqrt(burstiness)``: values
  below 1 give bursts and lulls, values above 1 give near-regular arrivals;
- ``rate = inf`` sends every request at once (all gaps are 0).

Unlike vLLM we do not rescale the cumulative delays to make the total exactly
``n / rate``: the process stays a true renewal process, which is what the
statistical tests check, and the measured duration is reported anyway.

The gaps are drawn one at a time from a stream of their own, so
:func:`iter_arrival_offsets` yields the schedule lazily (a run of ``10**8``
requests never holds it) and :func:`arrival_offsets` is the same numbers as a
list::

    offsets = arrival_offsets(100, rate=8.0, burstiness=1.0, seed=0)   # seconds from start
    lazy = iter_arrival_offsets(10**8, rate=8.0, seed=0)                # the same first values
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from perfsdk.errors import ConfigError

__all__ = ["arrival_offsets", "inter_arrival_gaps", "iter_arrival_offsets", "iter_inter_arrival_gaps"]


def iter_inter_arrival_gaps(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> Iterator[float]:
    """*n* gaps in seconds, drawn as they are asked for; the arguments are checked at once."""
    if n < 0:
        raise ConfigError(f"num_prompts: must be >= 0, got {n}")
    if not rate > 0:
        raise ConfigError(f"request_rate: must be > 0 (or inf), got {rate}")
    if not burstiness > 0:
        raise ConfigError(f"burstiness: must be > 0, got {burstiness}")
    if math.isinf(rate):
        return _repeat(0.0, n)
    if math.isinf(burstiness):  # the limit of the gamma family: a perfectly regular clock
        return _repeat(1.0 / rate, n)
    per_s = rate * burstiness
    if per_s == 0 or not math.isfinite(1.0 / per_s):  # underflow: no finite gap to draw
        raise ConfigError(f"request_rate: {rate!r} with burstiness {burstiness!r} gives no finite arrival gap")
    # a dedicated stream so that changing the length distributions never moves the arrivals
    rng = random.Random(None if seed is None else f"perfsdk.bench.arrivals:{seed}")
    return _gamma(rng, burstiness, 1.0 / per_s, n)


def _repeat(gap: float, n: int) -> Iterator[float]:
    for _ in range(n):
        yield gap


def _gamma(rng: random.Random, shape: float, scale: float, n: int) -> Iterator[float]:
    for _ in range(n):
        yield rng.gammavariate(shape, scale)


def inter_arrival_gaps(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """*n* gaps in seconds; the first request goes out after the first gap (0 when ``rate`` is inf)."""
    return list(iter_inter_arrival_gaps(n, rate=rate, burstiness=burstiness, seed=seed))


def iter_arrival_offsets(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> Iterator[float]:
    """Send times in seconds from the start of the run, lazily: non-decreasing, the first is 0."""
    return _offsets(iter_inter_arrival_gaps(n, rate=rate, burstiness=burstiness, seed=seed))


def _offsets(gaps: Iterator[float]) -> Iterator[float]:
    # the first request goes out immediately (the process starts with it): its gap is drawn, not used
    t = 0.0
    for i, gap in enumerate(gaps):
        if i:
            t += gap
        yield t


def arrival_offsets(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """Send times in seconds from the start of the run, non-decreasing; the first is 0."""
    return list(iter_arrival_offsets(n, rate=rate, burstiness=burstiness, seed=seed))
