"""Where results go: a small interface, one implementation per backend.

The collector (:mod:`perfsdk.collector`) turns records into results and hands them to every sink; a
sink owns its backend's details and knows nothing of the others (the shape of vLLM's
``StatLoggerBase``: typed results in, a loop over loggers outside)::

    class Sink(Protocol):
        def steps(self, totals: StepTotals) -> None          # per-phase step totals since the last call
        def latencies(self, ttft_s, itl_s) -> None           # first-token times and inter-token gaps
        def request(self, result: RequestResult) -> None     # one finished request
        def health(self, dropped: int, errors: int) -> None  # perfsdk's own losses since the last call
        def dropped_spans(self, reason: str, n: int) -> None  # spans dropped by a cap since the last call
        def flush(self, timeout: float | None) -> bool       # everything handed over is out
        def close(self, timeout: float | None) -> None

:class:`~perfsdk.sinks.prometheus.PrometheusSink` adds totals to histograms and counters;
:class:`~perfsdk.sinks.otel.OtelSink` builds spans on a thread of its own, so a slow exporter never
holds metrics back. ``tests/test_collector.py`` drives the collector with a list-backed sink.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perfsdk.stepcore import PhaseTotals, StepSample, StepTotals

__all__ = ["PhaseTotals", "RequestResult", "Sink", "StepSample", "StepTotals"]


@dataclass(frozen=True)
class RequestResult:
    """One finished request, on the Unix-epoch clock (ns) and in seconds.

    ``itl_s`` are the gaps between consecutive token emissions (empty for a request an engine timed).
    ``finish_reason`` is the bounded label (:data:`perfsdk.records.FINISH_REASONS`: ``error`` whenever *error*
    is set, ``other`` for a reason outside the set); ``raw_finish_reason`` what the server or engine said.
    """

    operation: str
    model: str
    parent: Any  # the OpenTelemetry context at arrival, or None
    start_ns: int
    scheduled_ns: int | None
    first_token_ns: int | None
    end_ns: int
    input_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None
    request_id: str | None
    e2e_s: float | None  # None: not observed (the clock went backwards before finish)
    ttft_s: float | None
    queue_s: float | None
    tpot_s: float | None
    itl_s: Sequence[float]
    raw_finish_reason: str | None = None


class Sink(Protocol):
    """What the collector calls; each call runs on the collector thread, guarded (a failure is counted)."""

    def steps(self, totals: StepTotals) -> None: ...

    def latencies(self, ttft_s: Sequence[float], itl_s: Sequence[float]) -> None: ...

    def request(self, result: RequestResult) -> None: ...

    def health(self, dropped: int, errors: int) -> None: ...

    def dropped_spans(self, reason: str, n: int) -> None: ...

    def flush(self, timeout: float | None) -> bool: ...

    def close(self, timeout: float | None) -> None: ...
