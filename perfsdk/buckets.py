"""Histogram bucket boundaries, shared by the step core (which counts into them) and the sinks.

The step core aggregates step times, MBU and MFU into these buckets off the serving thread's GIL;
the Prometheus sink hands the counts to its histograms (``docs/metrics.md`` lists them). The request
latencies follow the OpenTelemetry GenAI semantic conventions' explicit boundaries; perfsdk's own
(inter-token latency, step time) go finer, down to 0.5 ms: a CUDA-graph decode step on an H200 is
~1.5 ms, under the semconv TPOT's first bucket.
"""

from __future__ import annotations

__all__ = ["BUCKETS", "DURATION", "ITL", "QUEUE", "STEP", "TPOT", "TTFT", "UTIL"]

# OpenTelemetry GenAI semantic conventions, explicit bucket boundaries (seconds).
TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
DURATION = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
# perfsdk's own
ITL = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
       0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
STEP = (0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
        0.05, 0.075, 0.1, 0.2, 0.5, 1.0, 2.5)
QUEUE = (0.0005, *TTFT, 30.0, 60.0)
# utilisation 0–1 in steps of 0.05; a value above 1 means the peak is wrong and lands in +Inf
UTIL = tuple(round(0.05 * i, 2) for i in range(1, 21))

BUCKETS: dict[str, tuple[float, ...]] = {
    "ttft": TTFT, "tpot": TPOT, "duration": DURATION, "itl": ITL, "step": STEP, "queue": QUEUE, "util": UTIL,
}


def bucket_index(bounds: tuple[float, ...], value: float) -> int:
    """The index of the first bound >= *value* (``len(bounds)``: the +Inf bucket), as Prometheus counts."""
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds)
