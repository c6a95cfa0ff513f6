"""Where results go: a small interface, one implementation per backend.

The collector (:mod:`perfsdk.collector`) turns records into results, gathers one round's worth into a frozen
:class:`ExportBatch` and hands that same batch to every sink, one :meth:`Sink.record` call per sink per export.
A sink owns its backend's details and knows nothing of the others (the shape of vLLM's ``StatLoggerBase``: one
``record()`` over typed stats, a loop over loggers outside)::

    class Sink(Protocol):
        wants_step_values: bool                          # read-only: hand each timed step's values over
        def record(self, batch: ExportBatch) -> None     # one export: steps, latencies, requests, losses
        def flush(self, timeout: float | None) -> bool   # everything recorded so far is out
        def close(self, timeout: float | None) -> None

A minimal sink, printing each export's finished requests::

    class PrintSink:
        wants_step_values = False

        def record(self, batch: ExportBatch) -> None:
            for r in batch.requests:
                print(r.request_id, r.finish_reason, r.e2e_s)

        def flush(self, timeout: float | None) -> bool:
            return True

        def close(self, timeout: float | None) -> None:
            return None

Every call runs on the collector thread. A sink that raises is counted in ``perfsdk_internal_errors_total``
(reported with the next export) and loses the rest of that batch; the other sinks still get it. A sink whose
work grows with the batch lets go of the GIL between its parts with :func:`yield_gil` (the Prometheus and
OpenTelemetry metrics sinks do between steps, latencies and every 8 requests), so that a serving thread
waiting for the GIL waits for one part, not for the whole export.

:class:`~perfsdk.sinks.prometheus.PrometheusSink` adds totals to histograms and counters;
:class:`~perfsdk.sinks.otel.OtelSink` builds spans on a thread of its own, so a slow exporter never
holds metrics back; :class:`~perfsdk.sinks.otel_metrics.OtelMetricsSink` records OpenTelemetry histograms.
``tests/test_collector.py`` drives the collector with list-backed sinks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from perfsdk.stepcore import PhaseTotals, StepSample, StepTotals

__all__ = ["ExportBatch", "PhaseTotals", "RequestResult", "Sink", "StepSample", "StepTotals", "yield_gil"]


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


@dataclass(frozen=True, slots=True)
class ExportBatch:
    """What one export hands every sink: everything the collector took since the previous export.

    Built once per round and shared by all sinks, so a sink must not change what it holds.
    """

    # per-phase step totals, spans' step samples and each timed step's values (None: no step since the last export)
    steps: StepTotals | None = None
    # first-token times (s): requests' own (arrival to first token) and those an engine measured
    ttft_s: tuple[float, ...] = ()
    # inter-token gaps an engine measured (Monitor.record_latencies); a request's own gaps are in its result
    itl_s: tuple[float, ...] = ()
    requests: tuple[RequestResult, ...] = ()  # finished requests, in the order they finished
    dropped: int = 0  # records perfsdk dropped since the last export (a full ring or request queue)
    errors: int = 0  # perfsdk's internal errors since the last export (a failing sink's included)
    dropped_spans: tuple[tuple[str, int], ...] = ()  # (reason, spans dropped since the last export), each > 0

    def empty(self) -> bool:
        """Nothing to export: the collector calls no sink for it."""
        return (
            self.steps is None
            and not self.ttft_s
            and not self.itl_s
            and not self.requests
            and not self.dropped
            and not self.errors
            and not self.dropped_spans
        )


class Sink(Protocol):
    """What the collector calls; each call runs on the collector thread, guarded (a failure is counted)."""

    @property
    def wants_step_values(self) -> bool:
        """True: the step core should put every timed step's values in ``batch.steps.value_feed`` (costs a
        little per step, so only while a sink uses them; read once per export)."""
        ...

    def record(self, batch: ExportBatch) -> None:
        """Export *batch* (see :class:`ExportBatch`); called only for a batch that is not empty."""
        ...

    def flush(self, timeout: float | None) -> bool:
        """Everything recorded so far is out of the sink (False: not within *timeout*)."""
        ...

    def close(self, timeout: float | None) -> None: ...


def yield_gil() -> None:
    """Let go of the GIL and take it back (``time.sleep(0)``): a waiting thread gets a turn now, not after the
    rest of the export or a switch interval (5 ms)."""
    time.sleep(0)
