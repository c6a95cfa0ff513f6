"""The steady-state gate: capture only once decode steps look like the traffic you care about.

A profile of warm-up or compilation steps (the first steps after start, or after a batch-shape
change that recompiles or re-captures a CUDA graph) diagnoses the wrong problem. The gate is fed
every resolved decode step on the collector thread and says when the last *window* steps, all of
one batch size, have a step-time coefficient of variation (stdev / mean) under *cv*::

    gate = SteadyGate(window=32, cv=0.05, skip=16)
    for seconds, batch in decode_steps:
        gate.observe(seconds, batch)
    gate.steady        # True once 32 same-batch steps after the 16 skipped ones vary < 5%
    gate.cv()          # the current coefficient of variation, None until the window is full

Past a deadline the profiler window captures anyway and marks the capture ``steady=False``;
that decision lives in :mod:`perfsdk.profiling.window`, which owns the clock.
"""

from __future__ import annotations

import math
from collections import deque

__all__ = ["SteadyGate", "coefficient_of_variation"]


def coefficient_of_variation(xs: deque[float] | list[float]) -> float | None:
    """Population stdev / mean of *xs*; None for fewer than two values or a non-positive mean."""
    n = len(xs)
    if n < 2:
        return None
    mean = math.fsum(xs) / n
    if mean <= 0:
        return None
    var = math.fsum((x - mean) ** 2 for x in xs) / n
    return math.sqrt(var) / mean


class SteadyGate:
    """Step-time CV over the last *window* decode steps of one batch size, after *skip* steps.

    ``skip`` steps are ignored after construction, after :meth:`reset` and after every change of
    batch size, because the first steps of a new shape pay for compilation and graph capture.
    Not thread-safe: the collector thread is its only writer.
    """

    __slots__ = ("_batch", "_skip_left", "_times", "cv_threshold", "skip", "window")

    def __init__(self, window: int, cv: float, skip: int) -> None:
        self.window = window
        self.cv_threshold = cv
        self.skip = skip
        self._times: deque[float] = deque(maxlen=window)
        self._batch: int | None = None
        self._skip_left = skip

    def reset(self) -> None:
        """Forget everything and skip the next *skip* steps again."""
        self._times.clear()
        self._batch = None
        self._skip_left = self.skip

    def observe(self, seconds: float, batch: int) -> None:
        if batch != self._batch:
            if self._batch is not None:  # a new shape: new kernels, maybe a recompile
                self._skip_left = self.skip
            self._batch = batch
            self._times.clear()
        if self._skip_left > 0:
            self._skip_left -= 1
            return
        self._times.append(seconds)

    @property
    def batch(self) -> int | None:
        return self._batch

    @property
    def full(self) -> bool:
        return len(self._times) == self.window

    def cv(self) -> float | None:
        """Coefficient of variation of the window; None until it is full."""
        return coefficient_of_variation(self._times) if self.full else None

    @property
    def steady(self) -> bool:
        c = self.cv()
        return c is not None and c < self.cv_threshold
