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

::

    offsets = arrival_offsets(100, rate=8.0, burstiness=1.0, seed=0)   # seconds from start
"""

from __future__ import annotations

import itertools
import math
import random

from perfsdk.errors import ConfigError

__all__ = ["arrival_offsets", "inter_arrival_gaps"]


def inter_arrival_gaps(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """*n* gaps in seconds; the first request goes out after the first gap (0 when ``rate`` is inf)."""
    if n < 0:
        raise ConfigError(f"num_prompts: must be >= 0, got {n}")
    if not rate > 0:
        raise ConfigError(f"request_rate: must be > 0 (or inf), got {rate}")
    if not burstiness > 0:
        raise ConfigError(f"burstiness: must be > 0, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    if math.isinf(burstiness):  # the limit of the gamma family: a perfectly regular clock
        return [1.0 / rate] * n
    # a dedicated stream so that changing the length distributions never moves the arrivals
    rng = random.Random(None if seed is None else f"perfsdk.bench.arrivals:{seed}")
    per_s = rate * burstiness
    if per_s == 0 or not math.isfinite(1.0 / per_s):  # underflow: no finite gap to draw
        raise ConfigError(f"request_rate: {rate!r} with burstiness {burstiness!r} gives no finite arrival gap")
    scale = 1.0 / per_s
    return [rng.gammavariate(burstiness, scale) for _ in range(n)]


def arrival_offsets(n: int, *, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """Send times in seconds from the start of the run, non-decreasing; the first is 0."""
    gaps = inter_arrival_gaps(n, rate=rate, burstiness=burstiness, seed=seed)
    if not gaps:
        return []
    # the first request goes out immediately; the process starts with it
    return [0.0, *itertools.accumulate(gaps[1:])]
