"""OpenTelemetry metrics: the same latencies and steps as the Prometheus sink, as OTel histograms.

Why a second metrics sink: OpenTelemetry's SDK offers **exponential (base-2) histograms**, whose buckets
follow the data at a fixed relative error, where Prometheus' classic histograms need bounds chosen in
advance (``perfsdk/buckets.py``). Point an OTel SDK at perfsdk and choose the aggregation there::

    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import Histogram, MeterProvider
    from opentelemetry.sdk.metrics.view import ExponentialBucketHistogramAggregation, View

    metrics.set_meter_provider(MeterProvider(
        metric_readers=[reader],      # an OTLP exporter's reader, say
        views=[View(instrument_type=Histogram, aggregation=ExponentialBucketHistogramAggregation())],
    ))
    mon = perfsdk.Monitor(...)        # or Monitor(meter_provider=provider)

(``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION=base2_exponential_bucket_histogram`` does the same
for an OTLP exporter.) Without a view the histograms use perfsdk's explicit bounds, given to the SDK as the
instruments' advisory boundaries.

Instruments, named after the GenAI semantic conventions where one exists (attribute ``gen_ai.request.model``;
step instruments add ``perfsdk.phase``; ``perfsdk.rank`` where the Monitor has a rank label):

=======================================  ====  ===========================================================
``gen_ai.server.time_to_first_token``    s     arrival to first token
``gen_ai.server.time_per_output_token``  s     per request: (e2e − ttft) / (tokens − 1)
``gen_ai.server.request.duration``       s     arrival to finish
``perfsdk.inter_token_latency``          s     every gap between two emissions
``perfsdk.request.queue``                s     arrival to scheduled
``perfsdk.step.duration``                s     device time of each timed step
``perfsdk.step.bandwidth_utilization``   1     MBU of decode and mixed steps
``perfsdk.step.flops_utilization``       1     MFU of prefill and mixed steps
=======================================  ====  ===========================================================

Steps reach this sink one value each (the step core hands the collector every timed step's time and
utilisation while this sink listens, up to :data:`perfsdk.records.VALUE_FEED` per export interval; beyond
that they are counted in ``stats()["dropped_step_values"]``). Like spans: the global meter provider unless
one is passed, and with no SDK configured (the API's proxy or no-op provider) nothing is built or recorded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from perfsdk.buckets import DURATION, ITL, QUEUE, STEP, TPOT, TTFT, UTIL
from perfsdk.records import PHASES
from perfsdk.sinks import yield_gil

if TYPE_CHECKING:
    from perfsdk.sinks import ExportBatch, RequestResult
    from perfsdk.stepcore import StepTotals

__all__ = ["OtelMetricsSink", "make_otel_metrics_sink"]

_NO_SDK = ("_ProxyMeterProvider", "ProxyMeterProvider", "NoOpMeterProvider")

# (attribute, name, unit, description, explicit bounds)
_INSTRUMENTS = (
    ("ttft", "gen_ai.server.time_to_first_token", "s", "Time to generate the first token of a request.", TTFT),
    ("tpot", "gen_ai.server.time_per_output_token", "s", "Time per output token after the first.", TPOT),
    ("duration", "gen_ai.server.request.duration", "s", "End-to-end request duration.", DURATION),
    ("itl", "perfsdk.inter_token_latency", "s", "Every gap between consecutive token emissions.", ITL),
    ("queue", "perfsdk.request.queue", "s", "Arrival to leaving the waiting queue.", QUEUE),
    ("step", "perfsdk.step.duration", "s", "Device time of one prefill, decode or mixed step.", STEP),
    ("mbu", "perfsdk.step.bandwidth_utilization", "1", "Model bandwidth utilisation of a step.", UTIL),
    ("mfu", "perfsdk.step.flops_utilization", "1", "Model FLOPs utilisation of a step.", UTIL),
)


def make_otel_metrics_sink(
    meter_provider: Any = None, model: str = "unknown", extra: dict[str, str] | None = None
) -> OtelMetricsSink | None:
    """An :class:`OtelMetricsSink`, or ``None`` when the OpenTelemetry API is not installed."""
    try:
        from opentelemetry import metrics
    except ImportError:
        return None
    return OtelMetricsSink(metrics, meter_provider, model, extra or {})


class OtelMetricsSink:
    """The :class:`~perfsdk.sinks.Sink` for OpenTelemetry metrics (see the module docstring)."""

    def __init__(self, metrics_api: Any, meter_provider: Any, model: str, extra: dict[str, str]) -> None:
        from perfsdk._version import __version__

        self._api = metrics_api
        self._provider = meter_provider
        self._version = __version__
        self._attrs = {"gen_ai.request.model": model, **extra}
        self._phase_attrs = [{**self._attrs, "perfsdk.phase": p} for p in PHASES]
        self._instruments: dict[str, Any] | None = None

    @property
    def wants_step_values(self) -> bool:
        """True once a real meter provider is configured: the step core then hands over each step's values."""
        return self._ready() is not None

    def _ready(self) -> dict[str, Any] | None:
        """The instruments, or ``None`` while no SDK meter provider is configured (checked again next time)."""
        if self._instruments is not None:
            return self._instruments
        provider = self._provider or self._api.get_meter_provider()
        if type(provider).__name__ in _NO_SDK:
            return None
        meter = provider.get_meter("perfsdk", self._version)
        self._instruments = {
            key: meter.create_histogram(name, unit=unit, description=doc, explicit_bucket_boundaries_advisory=bounds)
            for key, name, unit, doc, bounds in _INSTRUMENTS
        }
        return self._instruments

    # ---- the Sink interface (collector thread) ------------------------------------------------------
    def record(self, batch: ExportBatch) -> None:
        """One export: each timed step's values, the latencies, the finished requests (GIL let go between)."""
        ins = self._ready()
        if ins is None:
            return
        if batch.steps is not None and batch.steps.value_feed:
            self._steps(ins, batch.steps)
        if batch.ttft_s or batch.itl_s:
            yield_gil()
            self._latencies(ins, batch.ttft_s, batch.itl_s)
        for i, r in enumerate(batch.requests):
            if i & 7 == 0:
                yield_gil()
            self._request(ins, r)

    def _steps(self, ins: dict[str, Any], totals: StepTotals) -> None:
        step, mbu_h, mfu_h = ins["step"], ins["mbu"], ins["mfu"]
        attrs = self._phase_attrs
        for phase, seconds, mbu, mfu in totals.value_feed:
            a = attrs[phase]
            step.record(seconds, a)
            if mbu is not None:
                mbu_h.record(mbu, a)
            if mfu is not None:
                mfu_h.record(mfu, a)

    def _latencies(self, ins: dict[str, Any], ttft_s: Sequence[float], itl_s: Sequence[float]) -> None:
        for v in ttft_s:
            ins["ttft"].record(v, self._attrs)
        for v in itl_s:
            ins["itl"].record(v, self._attrs)

    def _request(self, ins: dict[str, Any], result: RequestResult) -> None:
        a = self._attrs
        if result.queue_s is not None:
            ins["queue"].record(result.queue_s, a)
        for v in result.itl_s:
            ins["itl"].record(v, a)
        if result.tpot_s is not None:
            ins["tpot"].record(result.tpot_s, a)
        if result.e2e_s is not None:  # None: the clock went backwards (counted by the collector), not observed
            ins["duration"].record(result.e2e_s, a)

    def flush(self, timeout: float | None) -> bool:
        return True  # recorded into the SDK at once; its readers export on their own schedule

    def close(self, timeout: float | None) -> None:
        return None
