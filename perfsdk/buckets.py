"""Histogram bucket boundaries, shared by the step core (which counts into them) and the sinks.

The step core aggregates step times, MBU and MFU into these buckets off the serving thread's GIL;
the Prometheus sink hands the counts to its histograms (``docs/metrics.md`` lists them).

Why these bounds: a bucket can only say "somewhere between its bounds", so every server-side quantile is
as coarse as the bucket it lands in. On an H200 a CUDA-graph decode step is 0.5–2 ms (vLLM's was 2.09 ms,
the demo's 1.32 ms) and so is the time per output token; the OpenTelemetry GenAI semantic conventions'
TPOT bounds start at 10 ms, so every such TPOT landed in the first bucket and every quantile read 10 ms.
Each histogram here is therefore a **superset of the semconv bounds** where one exists (so a query written
for them — ``le="0.1"`` — still finds its bucket), with bounds added where GPUs live (from 0.25 ms up,
each at most a third above the last) and past the semconv's last bound (TTFT beyond 10 s under overload,
long generations). ``tests/test_buckets.py`` checks both properties.
"""

from __future__ import annotations

__all__ = [
    "BUCKETS",
    "DURATION",
    "ITL",
    "QUEUE",
    "SEMCONV_DURATION",
    "SEMCONV_TPOT",
    "SEMCONV_TTFT",
    "STEP",
    "TPOT",
    "TTFT",
    "UTIL",
]

# OpenTelemetry GenAI semantic conventions, explicit bucket boundaries (seconds): each histogram below keeps these
SEMCONV_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SEMCONV_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
SEMCONV_DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)

# A GPU step or token: 0.25 ms to 10 ms, each bound at most a third above the last; coarser after.
_FINE = (
    0.00025,
    0.0003,
    0.0004,
    0.0005,
    0.0006,
    0.00075,
    0.001,
    0.00125,
    0.0015,
    0.00175,
    0.002,
    0.0025,
    0.003,
    0.0035,
    0.004,
    0.005,
    0.006,
    0.0075,
)


def _union(*bounds: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(sorted(set().union(*bounds)))


TTFT = _union(
    SEMCONV_TTFT, (0.0025, 0.0075, 0.015, 0.03, 0.05, 0.15, 0.2, 0.3, 0.4, 1.5, 2.0, 15.0, 20.0, 30.0, 60.0, 120.0)
)
TPOT = _union(SEMCONV_TPOT, _FINE, (0.015, 0.02, 0.03, 0.04, 5.0, 10.0))
DURATION = _union(SEMCONV_DURATION, (0.005, 163.84, 327.68, 655.36))
# perfsdk's own
ITL = TPOT  # one gap between two emissions: the same scale as TPOT
STEP = _union(_FINE, (0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 10.0))
QUEUE = _union((0.0001, 0.00025, 0.0005), TTFT)
# utilisation 0–1 in steps of 0.05; a value above 1 means the peak is wrong and lands in +Inf
UTIL = tuple(round(0.05 * i, 2) for i in range(1, 21))

BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": TTFT,
    "tpot": TPOT,
    "duration": DURATION,
    "itl": ITL,
    "step": STEP,
    "queue": QUEUE,
    "util": UTIL,
}


def bucket_index(bounds: tuple[float, ...], value: float) -> int:
    """The index of the first bound >= *value* (``len(bounds)``: the +Inf bucket), as Prometheus counts."""
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds)
