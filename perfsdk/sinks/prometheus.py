"""Prometheus metrics of one model, created once per registry and bound once.

The names, types, labels and buckets are the table in ``docs/metrics.md``;
they follow the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.server.time_to_first_token`` → ``gen_ai_server_time_to_first_token_seconds``)
and are prefixed ``perfsdk_`` otherwise — never ``vllm:`` or ``sglang:``, which
those engines unregister at start-up.

Creating metrics is idempotent per registry: two Monitors on one registry share
one set of collectors (a second ``Histogram(...)`` with the same name would
raise "Duplicated timeseries"). Label children are bound when a sink is built.

Each export arrives as one :class:`~perfsdk.sinks.ExportBatch`
(:meth:`PrometheusSink.record`). Its steps are totals
(:class:`~perfsdk.stepcore.StepTotals`): the step core has already counted each
step into the same buckets off the GIL, and the sink adds the counts to each
histogram child's per-bucket values and sum — what ``observe`` would have added
one step at a time, in one call per bucket. prometheus_client has no public call
for that (``observe`` adds one value to one bucket), so this uses its histogram
internals (``_upper_bounds``, ``_buckets``, ``_sum``), checked when the sink is
built; they write through prometheus_client's own value class, so they work the
same with the multi-process value files.

Why not its public route for precomputed values, a custom collector
(``registry.register(c)``, ``c.collect()`` yielding ``HistogramMetricFamily``;
checked against prometheus_client 0.26): with ``PROMETHEUS_MULTIPROC_DIR`` set,
``/metrics`` is served by a ``MultiProcessCollector`` — in vLLM's API server or
SGLang's ``/metrics`` app, another process than the one whose core counted the
steps — and it reads only the per-process files that prometheus_client's value
class writes when a metric's value changes. A custom collector is asked for its
values only by a registry in its own process, so the step histograms would vanish
from those scrapes. Keeping the internals for the directory and a custom collector
without it would be two code paths for one histogram, and would change the
single-process exposition (a ``HistogramMetricFamily`` has no ``_created``
sample). So the one route stays, behind :func:`_checked`.

With ``PROMETHEUS_MULTIPROC_DIR`` set, prometheus_client writes values to
per-process files; every gauge here declares ``mostrecent`` (the hardware peaks and
the last capture's busy and communication fractions are facts, not sums), and :func:`multiprocess_registry`
reads all processes back for ``/metrics``.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from perfsdk.buckets import BUCKETS, DURATION, ITL, QUEUE, STEP, TPOT, TTFT, UTIL
from perfsdk.config import multiproc_dir
from perfsdk.errors import ConfigError
from perfsdk.records import FINISH_REASONS, PHASES
from perfsdk.sinks import yield_gil

if TYPE_CHECKING:
    from perfsdk.sinks import ExportBatch, RequestResult
    from perfsdk.stepcore import StepTotals

__all__ = [
    "BUCKETS",
    "PHASES",
    "MetricSet",
    "PrometheusSink",
    "exposition",
    "metric_set",
    "multiprocess_registry",
    "update_lock",
]

TTFT_BUCKETS, TPOT_BUCKETS, DURATION_BUCKETS, ITL_BUCKETS = TTFT, TPOT, DURATION, ITL
STEP_BUCKETS, QUEUE_BUCKETS, UTIL_BUCKETS = STEP, QUEUE, UTIL


@dataclass(frozen=True)
class MetricSet:
    """The collectors of one registry (shared by every Monitor that writes to it)."""

    ttft: Histogram
    tpot: Histogram
    duration: Histogram
    itl: Histogram
    queue: Histogram
    requests: Counter
    step: Histogram
    mbu: Histogram
    mfu: Histogram
    step_bytes: Counter
    step_flops: Counter
    step_tokens: Counter
    peak_bandwidth: Gauge
    peak_flops: Gauge
    dropped: Counter
    dropped_spans: Counter
    internal_errors: Counter
    suspect: Counter
    profile_busy: Gauge
    profile_comm: Gauge
    extra_labels: tuple[str, ...]


_sets: weakref.WeakKeyDictionary[CollectorRegistry, dict[tuple[str, ...], MetricSet]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_update_locks: weakref.WeakKeyDictionary[CollectorRegistry, threading.Lock] = weakref.WeakKeyDictionary()


def update_lock(registry: CollectorRegistry) -> threading.Lock:
    """The lock perfsdk holds while it adds one export's step totals to *registry*'s metrics.

    Step time, bytes, FLOPs and tokens of one export are added together; a scrape that takes this lock
    around collecting (perfsdk's metrics server does) sees all of one export or none of it, so ratios such
    as bytes / step seconds (the exact MBU panel) never mix two exports.
    """
    with _lock:
        lk = _update_locks.get(registry)
        if lk is None:
            lk = _update_locks[registry] = threading.Lock()
        return lk


def metric_set(registry: CollectorRegistry | None = None, extra_labels: tuple[str, ...] = ()) -> MetricSet:
    """The metric set of *registry* (default: the global one), created on first use."""
    reg = REGISTRY if registry is None else registry
    with _lock:
        per_reg = _sets.setdefault(reg, {})
        if extra_labels not in per_reg:
            if per_reg:
                other = next(iter(per_reg))
                raise ValueError(
                    f"registry already holds perfsdk metrics with labels {other!r}; a Monitor with labels "
                    f"{extra_labels!r} needs its own registry"
                )
            per_reg[extra_labels] = _create(reg, extra_labels)
        return per_reg[extra_labels]


def _create(reg: CollectorRegistry, extra: tuple[str, ...]) -> MetricSet:
    m = ("model", *extra)
    mp = ("model", "phase", *extra)

    def hist(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...], unit: str = "") -> Histogram:
        return Histogram(name, doc, labels, registry=reg, buckets=buckets, unit=unit)

    return MetricSet(
        ttft=hist(
            "gen_ai_server_time_to_first_token",
            "Time to generate the first token of a request (arrival to first token, as the user feels it).",
            m,
            TTFT_BUCKETS,
            "seconds",
        ),
        tpot=hist(
            "gen_ai_server_time_per_output_token",
            "Time per output token after the first, per request: (e2e - ttft) / (output tokens - 1).",
            m,
            TPOT_BUCKETS,
            "seconds",
        ),
        duration=hist(
            "gen_ai_server_request_duration",
            "End-to-end request duration (arrival to finish).",
            m,
            DURATION_BUCKETS,
            "seconds",
        ),
        itl=hist(
            "perfsdk_inter_token_latency",
            "Every gap between consecutive token emissions of a request.",
            m,
            ITL_BUCKETS,
            "seconds",
        ),
        queue=hist(
            "perfsdk_request_queue", "Arrival to leaving the waiting queue (scheduled).", m, QUEUE_BUCKETS, "seconds"
        ),
        requests=Counter(
            "perfsdk_requests",
            "Finished requests by how they ended (finish_reason: stop, length, "
            "tool_calls, content_filter, abort = the client went away, cancelled, error, other).",
            ("model", "finish_reason", *extra),
            registry=reg,
        ),
        step=hist(
            "perfsdk_step",
            "Device time of one prefill, decode or mixed step (CUDA events; host clock when there is no GPU).",
            mp,
            STEP_BUCKETS,
            "seconds",
        ),
        mbu=hist(
            "perfsdk_step_bandwidth_utilization",
            "Model bandwidth utilisation of a step: bytes it must read / (device time x peak bandwidth).",
            mp,
            UTIL_BUCKETS,
        ),
        mfu=hist(
            "perfsdk_step_flops_utilization",
            "Model FLOPs utilisation of a step: FLOPs it must do / (device time x dense peak FLOP/s).",
            mp,
            UTIL_BUCKETS,
        ),
        step_bytes=Counter(
            "perfsdk_step_bytes",
            "Bytes steps had to read (weights + KV), for utilisation over any window in PromQL.",
            mp,
            registry=reg,
        ),
        step_flops=Counter("perfsdk_step_flops", "FLOPs steps had to do.", mp, registry=reg),
        step_tokens=Counter(
            "perfsdk_step_tokens",
            "Tokens processed by steps (prompt tokens for prefill, one per sequence for decode).",
            mp,
            registry=reg,
        ),
        peak_bandwidth=Gauge(
            "perfsdk_hardware_peak_bandwidth_bytes",
            "Peak memory bandwidth MBU divides by (bytes per second).",
            ("device", *extra),
            registry=reg,
            multiprocess_mode="mostrecent",
        ),
        peak_flops=Gauge(
            "perfsdk_hardware_peak_flops",
            "Dense peak FLOP/s MFU divides by.",
            ("device", "dtype", *extra),
            registry=reg,
            multiprocess_mode="mostrecent",
        ),
        dropped=Counter(
            "perfsdk_dropped_records",
            "Records perfsdk dropped because its collector fell behind (the server never blocks).",
            extra,
            registry=reg,
        ),
        dropped_spans=Counter(
            "perfsdk_dropped_spans",
            "Spans perfsdk dropped: step spans sampled beyond 4,096 per "
            "export interval (reason=sample_cap), or spans that found the span thread's queue "
            "full (reason=queue_full, a slow span exporter).",
            (*extra, "reason"),
            registry=reg,
        ),
        internal_errors=Counter(
            "perfsdk_internal_errors",
            "Exceptions inside perfsdk, caught and counted (they never reach the server).",
            extra,
            registry=reg,
        ),
        suspect=Counter(
            "perfsdk_suspect_utilization",
            "Steps whose MBU or MFU came out above 1, which is "
            "impossible: the peak in use or the step's sizes or time are wrong (logged once).",
            (*mp, "reason"),
            registry=reg,
        ),
        profile_busy=Gauge(
            "perfsdk_profile_gpu_busy_fraction",
            "GPU busy fraction of the last profiler window's trace.",
            m,
            registry=reg,
            multiprocess_mode="mostrecent",
        ),
        profile_comm=Gauge(
            "perfsdk_profile_communication_fraction",
            "Share of step time in collectives not "
            "overlapped by compute in the last profiler window's trace (waits for other ranks "
            "included).",
            m,
            registry=reg,
            multiprocess_mode="mostrecent",
        ),
        extra_labels=extra,
    )


class PrometheusSink:
    """The :class:`~perfsdk.sinks.Sink` for Prometheus: label children of one (model, extra labels), bound once."""

    def __init__(
        self,
        metrics: MetricSet,
        model: str,
        extra_values: tuple[str, ...] = (),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.metrics = metrics
        self._update = update_lock(REGISTRY if registry is None else registry)
        mv = (model, *extra_values)
        self.ttft = metrics.ttft.labels(*mv)
        self.tpot = metrics.tpot.labels(*mv)
        self.duration = metrics.duration.labels(*mv)
        self.itl = metrics.itl.labels(*mv)
        self.queue = metrics.queue.labels(*mv)
        # every reason's child now: a series at 0 from the start, so rates and ratios by reason exist before the
        # first request of each kind (an error-ratio alert reads 0, not "no data")
        self.requests = {r: metrics.requests.labels(model, r, *extra_values) for r in FINISH_REASONS}
        self._mv = mv  # the profile gauges' children are bound at the first capture (set_profile)
        self.step: list[Any] = []
        self.mbu: list[Any] = []
        self.mfu: list[Any] = []
        self.step_bytes: list[Any] = []
        self.step_flops: list[Any] = []
        self.step_tokens: list[Any] = []
        self.suspect_mbu: list[Any] = []
        self.suspect_mfu: list[Any] = []
        for phase in PHASES:  # indexed by perfsdk.records' phase codes
            pv = (model, phase, *extra_values)
            self.step.append(_checked(metrics.step.labels(*pv), STEP))
            self.mbu.append(_checked(metrics.mbu.labels(*pv), UTIL))
            self.mfu.append(_checked(metrics.mfu.labels(*pv), UTIL))
            self.step_bytes.append(metrics.step_bytes.labels(*pv))
            self.step_flops.append(metrics.step_flops.labels(*pv))
            self.step_tokens.append(metrics.step_tokens.labels(*pv))
            self.suspect_mbu.append(metrics.suspect.labels(*pv, "mbu_above_peak"))
            self.suspect_mfu.append(metrics.suspect.labels(*pv, "mfu_above_peak"))
        self.dropped = metrics.dropped.labels(*extra_values) if extra_values else metrics.dropped
        self.internal_errors = (
            metrics.internal_errors.labels(*extra_values) if extra_values else metrics.internal_errors
        )
        self._extra_values = extra_values

    def set_profile(self, busy: float | None, comm: float | None) -> None:
        """Export the last profiler capture's GPU busy and communication fractions.

        Their series appear at the first capture, not before: a 0 exported before any capture would read
        as an idle GPU, or as the one rank of a group that waits for nobody (the straggler alert's test).
        """
        with self._update:
            if busy is not None:
                self.metrics.profile_busy.labels(*self._mv).set(busy)
            if comm is not None:
                self.metrics.profile_comm.labels(*self._mv).set(comm)

    def set_hardware(self, device: str, bandwidth: float, flops: dict[str, float]) -> None:
        with self._update:
            self.metrics.peak_bandwidth.labels(device, *self._extra_values).set(bandwidth)
            for dtype, value in flops.items():
                self.metrics.peak_flops.labels(device, dtype, *self._extra_values).set(value)

    # ---- the Sink interface ------------------------------------------------------------------------
    wants_step_values = False  # the core's bucket counts are enough

    def record(self, batch: ExportBatch) -> None:
        """One export, each part under the registry's update lock, letting go of the GIL between parts."""
        if batch.steps is not None:
            self._steps(batch.steps)
        if batch.ttft_s or batch.itl_s:
            yield_gil()
            self._latencies(batch.ttft_s, batch.itl_s)
        for i, r in enumerate(batch.requests):
            if i & 7 == 0:
                yield_gil()
            self._request(r)
        if batch.dropped or batch.errors or batch.dropped_spans:
            self._health(batch)

    def _steps(self, totals: StepTotals) -> None:
        with self._update:  # one export at a time, as a scrape through update_lock() sees it
            for code, t in enumerate(totals.phases):
                if not t.steps:
                    continue
                _add(self.step[code], t.step_counts, t.step_sum)
                _add(self.mbu[code], t.mbu_counts, t.mbu_sum)
                _add(self.mfu[code], t.mfu_counts, t.mfu_sum)
                if t.bytes:
                    self.step_bytes[code].inc(t.bytes)
                if t.flops:
                    self.step_flops[code].inc(t.flops)
                if t.tokens:
                    self.step_tokens[code].inc(t.tokens)
                # UTIL ends at 1.0: the +Inf bucket holds exactly the impossible values
                if t.mbu_counts[-1]:
                    self.suspect_mbu[code].inc(t.mbu_counts[-1])
                if t.mfu_counts[-1]:
                    self.suspect_mfu[code].inc(t.mfu_counts[-1])

    # Every write holds the registry's update lock (as _steps() does): a fork waits for it (perfsdk.monitor's
    # fork hooks), so no perfsdk thread holds a prometheus_client lock when the child is made.
    def _latencies(self, ttft_s: Sequence[float], itl_s: Sequence[float]) -> None:
        with self._update:
            for v in ttft_s:
                self.ttft.observe(v)
            for v in itl_s:
                self.itl.observe(v)

    def _request(self, result: RequestResult) -> None:
        with self._update:
            if result.queue_s is not None:
                self.queue.observe(result.queue_s)
            itl = self.itl
            for v in result.itl_s:
                itl.observe(v)
            if result.tpot_s is not None:
                self.tpot.observe(result.tpot_s)
            if result.e2e_s is not None:
                self.duration.observe(result.e2e_s)
            self.requests.get(result.finish_reason, self.requests["other"]).inc()

    def _health(self, batch: ExportBatch) -> None:
        with self._update:
            if batch.dropped > 0:
                self.dropped.inc(batch.dropped)
            if batch.errors > 0:
                self.internal_errors.inc(batch.errors)
            for reason, n in batch.dropped_spans:
                self.metrics.dropped_spans.labels(*self._extra_values, reason).inc(n)

    def flush(self, timeout: float | None) -> bool:
        return True

    def close(self, timeout: float | None) -> None:
        return None


def _checked(child: Any, bounds: tuple[float, ...]) -> Any:
    """*child*, after checking it exposes the per-bucket values the sink adds totals to."""
    upper = getattr(child, "_upper_bounds", None)
    if upper is None or not hasattr(child, "_buckets") or not hasattr(child, "_sum"):
        import prometheus_client

        raise ConfigError(
            f"prometheus_client {getattr(prometheus_client, '__version__', '?')}: its Histogram "
            "has no _upper_bounds/_buckets/_sum, which perfsdk adds step totals to; "
            "use prometheus-client >= 0.17"
        )
    if list(upper) != [*bounds, math.inf]:
        raise ConfigError(f"histogram {child!r} has buckets {upper}, expected {[*bounds, math.inf]}")
    return child


def _add(child: Any, counts: Sequence[int], total: float) -> None:
    """Add per-bucket *counts* and their sum to a histogram child (what that many observe() calls add)."""
    n = 0
    buckets = child._buckets
    for i, c in enumerate(counts):
        if c:
            buckets[i].inc(c)
            n += c
    if n:
        child._sum.inc(total)


def exposition(registry: CollectorRegistry | None) -> tuple[bytes, str]:
    """``(body, content type)``: *registry* (every process's values when ``PROMETHEUS_MULTIPROC_DIR`` is set;
    default: the global one) in the Prometheus text format, rendered under :func:`update_lock` so one export's
    step totals are all in or all out."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    reg = multiprocess_registry() or registry or REGISTRY
    with update_lock(registry or REGISTRY):
        return generate_latest(reg), CONTENT_TYPE_LATEST


def multiprocess_registry() -> CollectorRegistry | None:
    """A registry that aggregates every process's values when ``PROMETHEUS_MULTIPROC_DIR`` is set (checked by
    :func:`perfsdk.config.multiproc_dir`: a :class:`~perfsdk.errors.ConfigError` naming it if unusable)."""
    path = multiproc_dir()
    if path is None:
        return None
    from prometheus_client import multiprocess

    reg = CollectorRegistry()
    multiprocess.MultiProcessCollector(reg, path=path)  # type: ignore[no-untyped-call]
    return reg
