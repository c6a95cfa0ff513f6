"""The step core: resolve each step's events, price it, and count it into histograms — off the serving thread.

Two implementations of one algorithm, chosen once per Monitor: ``perfsdk._native.StepCore`` (C, on a
native thread that never takes the GIL) and :class:`PyStepCore` here (the reference, and the fallback
where the extension was not built). ``tests/test_stepcore.py`` feeds both the same steps and checks
every output is identical.

What the core does, per :class:`~perfsdk.records.StepRecord`, in order:

* a TIMED step waits until its end event has completed (it waits for the *newest* pending step, so
  one wake-up reads every step the host queued before it; the wait polls the event every poll interval,
  sleeping between, or is the driver's own for blocking-sync events), reads the device time between its
  events, and lets go of them (:class:`~perfsdk.timing.EventPool` references: an event goes back to the
  pool once no step and no thread holds it);
* prices it (:class:`~perfsdk.stepcost.StepCosts`: bytes, FLOPs, tokens), computes MBU and MFU;
* adds it to per-phase totals: counts per histogram bucket and sums for step time, MBU and MFU
  (:mod:`perfsdk.buckets`), bytes, FLOPs and tokens — counters only for timed steps' bytes and FLOPs,
  so bytes over step seconds stays exact in PromQL;
* keeps the last :data:`~perfsdk.records.RECENT` steps per phase for :meth:`perfsdk.Monitor.stats`, a
  deterministic sample of steps for spans (``step_span_rate``: at most :data:`~perfsdk.records.SAMPLES`
  between two takes, the rest counted in ``dropped_samples``), while a profiler window listens
  (``feed_window``) every decode step's time, batch and MBU (the window feed), and while an OpenTelemetry
  metrics sink listens (``feed_values``) every timed step's phase, time, MBU and MFU (the value feed: up to
  :data:`~perfsdk.records.VALUE_FEED` per take; beyond, counted).

What it hands back is named (:mod:`perfsdk.records`: :class:`~perfsdk.records.StepTotals`,
:class:`~perfsdk.records.RecentSteps` and the records inside them); the C core returns struct sequences with
the same fields, which :func:`native_core` turns into those types. The capacities are given to the C core
when it is built, so they are defined once, in :mod:`perfsdk.records`.

A duration that comes out negative — a host clock that went backwards (``t1 < t0``), a device time read
as negative — is never observed: the step counts as a step, untimed, and the fault is counted in
``errors`` (``perfsdk_internal_errors_total``) with its site, logged once by the collector.

After ``os.fork()`` the core's thread does not exist in the child: :meth:`PyStepCore.after_fork` (the C
core's ``after_fork``) makes the child's core new — its own locks, nothing of the parent's queued or
counted steps (the parent counts those) — and the Monitor starts it again.

The collector thread calls :meth:`~PyStepCore.take` every export interval and hands the totals to the sinks;
:meth:`~PyStepCore.sync` waits (GIL released) until every step pushed before the call is counted. Nothing
here raises into the serving thread: :meth:`~PyStepCore.push` is a bounded append that reports ``False``
when full.

It runs over 500 lines on purpose: it is the specification of ``perfsdk/csrc/stepcore.c``, read side by side
with it — the thread's loop, the waits, the counting and the take in one file, as there.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Protocol

from perfsdk.buckets import STEP, UTIL, bucket_index
from perfsdk.records import (
    DECODE,
    HOST,
    PHASES,
    PREFILL,
    RECENT,
    SAMPLES,
    TIMED,
    VALUE_FEED,
    WINDOW_FEED,
    PhaseTotals,
    RecentSteps,
    StepRecord,
    StepSample,
    StepTotals,
    ValueFeedEntry,
    WindowFeedEntry,
)
from perfsdk.stepcost import StepCosts, utilization

__all__ = [
    "IDLE_MAX",
    "RECENT",
    "SAMPLES",
    "VALUE_FEED",
    "WINDOW_FEED",
    "PhaseTotals",
    "PyStepCore",
    "RecentSteps",
    "StepCore",
    "StepSample",
    "StepTotals",
    "native_core",
]

IDLE_MAX = 0.1  # longest sleep of an idle core (s); poll_interval is the shortest (the C core is given it)
# what the collector logs (once) for a negative duration; the C core's text is the same
CLOCK_BACKWARDS = "a step's host clock went backwards (it ended before it began): its time is not observed"
ELAPSED_NEGATIVE = "a step's device time read negative: its time is not observed"


class StepCore(Protocol):
    """What a Monitor's parts use of a step core: :class:`PyStepCore`, or the C one :func:`native_core` builds."""

    implementation: str  # "c" or "python"
    feed_window: bool  # keep every timed decode step for a profiler window (the window feed)
    feed_values: bool  # keep every timed step's values for an OpenTelemetry metrics sink (the value feed)

    @property
    def pushed(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def dropped_samples(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    def push(self, rec: StepRecord) -> bool: ...
    def start(self) -> None: ...
    def stop(self, timeout: float | None = ...) -> bool: ...
    def pause(self, paused: bool) -> None: ...
    def sync(self, timeout: float | None) -> bool: ...
    def take(self) -> StepTotals: ...
    def recent(self, phase: int) -> RecentSteps: ...
    def take_errors(self) -> list[tuple[str, str]]: ...
    def after_fork(self, drop_events: bool) -> None: ...


class _Counts:
    """One phase's totals while they are being added to (frozen into a PhaseTotals by a take)."""

    __slots__ = (
        "bytes",
        "errors",
        "flops",
        "mbu_counts",
        "mbu_sum",
        "mfu_counts",
        "mfu_sum",
        "step_counts",
        "step_sum",
        "steps",
        "tokens",
    )

    def __init__(self) -> None:
        self.steps = 0
        self.errors = 0
        self.step_counts = [0] * (len(STEP) + 1)
        self.step_sum = 0.0
        self.mbu_counts = [0] * (len(UTIL) + 1)
        self.mbu_sum = 0.0
        self.mfu_counts = [0] * (len(UTIL) + 1)
        self.mfu_sum = 0.0
        self.bytes = 0.0
        self.flops = 0.0
        self.tokens = 0

    def frozen(self) -> PhaseTotals:
        return PhaseTotals(
            self.steps,
            self.errors,
            tuple(self.step_counts),
            self.step_sum,
            tuple(self.mbu_counts),
            self.mbu_sum,
            tuple(self.mfu_counts),
            self.mfu_sum,
            self.bytes,
            self.flops,
            self.tokens,
        )


class _Interval:
    """Everything counted since the previous take (see :class:`~perfsdk.records.StepTotals`)."""

    __slots__ = ("phases", "samples", "value_feed", "value_feed_dropped", "window_feed")

    def __init__(self) -> None:
        self.phases = (_Counts(), _Counts(), _Counts())
        self.samples: list[StepSample] = []
        self.window_feed: deque[WindowFeedEntry] = deque(maxlen=WINDOW_FEED)  # the latest steps matter
        self.value_feed: list[ValueFeedEntry] = []
        self.value_feed_dropped = 0

    def frozen(self) -> StepTotals:
        p, d, m = (c.frozen() for c in self.phases)
        return StepTotals(
            (p, d, m), tuple(self.samples), tuple(self.window_feed), tuple(self.value_feed), self.value_feed_dropped
        )


class _Recent:
    """The last RECENT steps of one phase (stats())."""

    __slots__ = ("errors", "mbu", "mfu", "seconds", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.errors = 0
        self.seconds: deque[float] = deque(maxlen=RECENT)
        self.mbu: deque[float] = deque(maxlen=RECENT)
        self.mfu: deque[float] = deque(maxlen=RECENT)


class PyStepCore:
    """The step core in Python (see the module docstring); same interface as ``perfsdk._native.StepCore``.

    *pool* and *api* are the event pool and event API of a Monitor that times with CUDA events (None:
    host timing). *capacity* bounds the records waiting to be read.
    """

    implementation = "python"

    def __init__(
        self, costs: StepCosts, pool: Any, api: Any, capacity: int, span_rate: float, poll_interval: float
    ) -> None:
        self._costs = costs
        self._pool = pool
        self._api = api
        self._poll_wait = bool(getattr(api, "poll_wait", False))  # query and sleep, not api.wait (see _wait)
        self.capacity = capacity
        self._span_rate = span_rate
        self._poll = poll_interval
        self._records: deque[StepRecord] = deque()
        self._pending: deque[StepRecord] = deque()
        self._lock = threading.Lock()  # guards the totals, the recent steps and the counters below
        self._done_cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._totals = _Interval()
        self._recent = [_Recent(), _Recent(), _Recent()]
        self._sampled = 0  # steps seen by the span sampler
        self.feed_window = False  # keep every timed decode step for a profiler window (the window feed)
        self.feed_values = False  # keep every timed step's values (an OpenTelemetry metrics sink listens)
        self.pushed = 0  # records accepted (serving threads, under the GIL)
        self.done = 0  # records fully counted (this core's thread)
        self.dropped = 0  # records refused because the queue was full (serving threads)
        self.errors = 0  # CUDA errors reading events, and negative durations refused
        self.dropped_samples = 0  # sampled steps beyond SAMPLES between two takes: spans never built
        self.error_sites: deque[tuple[str, str]] = deque()  # (site, message), for the collector to log
        self._paused = False
        self._stop = False
        self._thread: threading.Thread | None = None

    # ---- serving threads --------------------------------------------------------------------------
    def push(self, rec: StepRecord) -> bool:
        """Queue one step; ``False`` (counted in ``dropped``) when *capacity* are already waiting."""
        if len(self._records) >= self.capacity:
            self.dropped += 1
            return False
        self._records.append(rec)
        self.pushed += 1
        return True

    # ---- the core's thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="perfsdk-steps", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop the thread (after reading what is queued, if it can within *timeout*); True when it ended."""
        self._stop = True
        self._wake.set()
        t = self._thread
        if t is None:
            return True
        t.join(timeout)
        return not t.is_alive()

    def pause(self, paused: bool) -> None:
        """Stop reading records (tests: a core that has fallen behind), or carry on."""
        self._paused = paused
        self._wake.set()

    def _run(self) -> None:
        if self._api is not None:
            try:
                self._api.thread_setup()  # the events' context current; relaxed graph-capture mode
            except Exception as e:
                self._error("core CUDA setup", e)
        idle = self._poll
        while True:
            try:
                if not self._paused and self._records:
                    self._drain()
                    idle = self._poll
                elif not self._paused and self._pending:
                    self._resolve(block=True)
                else:
                    if self._stop and (self._paused or not (self._records or self._pending)):
                        return
                    self._wake.wait(idle)
                    self._wake.clear()
                    # nothing arrived while asleep: sleep longer next time (up to IDLE_MAX); every wake-up
                    # costs CPU. sync() and stop() wake the thread at once.
                    idle = min(idle * 2, max(self._poll, IDLE_MAX)) if not self._records else self._poll
            except Exception as e:  # keep going whatever happens, without spinning on a lasting fault
                self._error("core", e)
                time.sleep(self._poll)

    def _drain(self) -> None:
        records = self._records
        n = 0
        while records:
            n += 1
            if not n & 63:
                # Let a serving thread waiting for the GIL take it: without this, a busy core keeps it for a
                # whole switch interval (5 ms) and every serving thread of the process stalls. (The C core
                # never holds the GIL; this is the reference's price.)
                time.sleep(0)
            rec = records.popleft()
            if rec.timing == TIMED and rec.error is None:
                self._pending.append(rec)
                self._resolve(block=False)
            else:
                seconds = None
                if rec.timing == HOST:
                    if rec.t1 >= rec.t0:
                        seconds = (rec.t1 - rec.t0) / 1e9
                    else:
                        self._problem("core clock", CLOCK_BACKWARDS)
                self._count(rec, seconds)
                if rec.timing == TIMED:  # a user error inside a timed step: its events are not read
                    self._let_go(rec)
                self._finish_one()

    def _resolve(self, block: bool) -> None:
        """Read pending steps in order; when *block*, wait for the newest pending step first."""
        pending = self._pending
        api = self._api
        waited = None  # waited for once already: a query that still says "not ready" is not believed
        while pending:
            rec = pending[0]
            seconds: float | None
            try:
                if not api.query(rec.end):
                    if not block:
                        return
                    newest = pending[-1].end
                    if newest not in (rec.end, waited) and self._wait_newest(newest):
                        waited = newest
                        continue  # re-check the oldest
                    self._wait(rec.end)
                seconds = api.elapsed_s(rec.start, rec.end)
                if seconds < 0:
                    self._problem("core event", ELAPSED_NEGATIVE)
                    seconds = None
            except Exception as e:
                # a CUDA error (sticky after a fault, say): count it and keep the step as counted but untimed
                self._error("core event", e)
                seconds = None
            pending.popleft()
            self._let_go(rec)
            self._count(rec, seconds)
            self._finish_one()
            if self._records:
                return  # go back to reading new records
            time.sleep(0)  # as in _drain: never hold the GIL through a run of steps

    def _wait_newest(self, newest: Any) -> bool:
        """Wait for the newest pending step's end; False if it is done already or cannot be waited on.

        Steps on one stream complete in order, so one wake-up then reads every step the host had queued,
        not one per step. A failure here is left for that step's own turn to report.
        """
        try:
            if self._api.query(newest):
                return False
            self._wait(newest)
            return True
        except Exception:
            return False

    def _wait(self, ev: Any) -> None:
        """Block until *ev* completes: a query every poll interval where the events say ``poll_wait``
        (perfsdk's own: made without blocking sync, whose records cost the GPU less), else ``api.wait``."""
        api = self._api
        if self._poll_wait:
            while not api.query(ev):
                self._wake.wait(self._poll)  # sync() and stop() wake it
                self._wake.clear()
        else:
            api.wait(ev)

    def _let_go(self, rec: StepRecord) -> None:
        pool = self._pool
        if rec.start is not None:
            pool.unref(rec.start)
        if rec.end is not None:
            pool.unref(rec.end)

    def _finish_one(self) -> None:
        with self._lock:
            self.done += 1
            self._done_cond.notify_all()

    def _error(self, site: str, e: BaseException) -> None:
        self._problem(site, f"{type(e).__name__}: {e}")

    def _problem(self, site: str, message: str) -> None:
        with self._lock:
            self.errors += 1
            if len(self.error_sites) < 64:
                self.error_sites.append((site, message))

    # ---- counting (the C core does exactly this, in this order) -----------------------------------------
    def _count(self, rec: StepRecord, seconds: float | None) -> None:
        costs = self._costs
        p = rec.phase
        sampled = self._sample()
        with self._lock:
            tot = self._totals.phases[p]
            recent = self._recent[p]
            tot.steps += 1
            recent.steps += 1
            if rec.error is not None:
                tot.errors += 1
                recent.errors += 1
                if sampled:
                    self._add_sample(StepSample(p, rec.t0, rec.t1, None, rec.batch, 0, None, None, rec.error))
                return
            nbytes, flops, ntokens = costs.cost(
                p, rec.batch, rec.context_tokens, rec.lens_sum, rec.lens_sq, rec.lens_count
            )
            mbu = mfu = None
            if seconds is not None and seconds > 0:
                if nbytes is not None and costs.bandwidth > 0 and p != PREFILL:
                    mbu = utilization(nbytes, seconds, costs.bandwidth)
                if flops is not None and costs.peak_flops > 0 and p != DECODE:
                    mfu = utilization(flops, seconds, costs.peak_flops)
            if seconds is not None:
                tot.step_counts[bucket_index(STEP, seconds)] += 1
                tot.step_sum += seconds
                tot.bytes += nbytes if nbytes is not None else 0.0
                tot.flops += flops if flops is not None else 0.0
                recent.seconds.append(seconds)
            if mbu is not None:
                tot.mbu_counts[bucket_index(UTIL, mbu)] += 1
                tot.mbu_sum += mbu
                recent.mbu.append(mbu)
            if mfu is not None:
                tot.mfu_counts[bucket_index(UTIL, mfu)] += 1
                tot.mfu_sum += mfu
                recent.mfu.append(mfu)
            tot.tokens += ntokens
            if sampled:
                self._add_sample(StepSample(p, rec.t0, rec.t1, seconds, rec.batch, ntokens, mbu, mfu, None))
            if self.feed_window and p == DECODE and seconds is not None:
                self._totals.window_feed.append(WindowFeedEntry(seconds, rec.batch, mbu))  # the latest WINDOW_FEED
            if self.feed_values and seconds is not None:
                if len(self._totals.value_feed) < VALUE_FEED:
                    self._totals.value_feed.append(ValueFeedEntry(p, seconds, mbu, mfu))
                else:
                    self._totals.value_feed_dropped += 1

    def _sample(self) -> bool:
        """Deterministic sampling at step_span_rate: step n is sampled when floor(n x rate) moves."""
        rate = self._span_rate
        if rate <= 0:
            return False
        n = self._sampled = self._sampled + 1
        return math.floor(n * rate) > math.floor((n - 1) * rate)

    def _add_sample(self, s: StepSample) -> None:
        if len(self._totals.samples) < SAMPLES:
            self._totals.samples.append(s)
        else:
            self.dropped_samples += 1

    # ---- the collector's side ---------------------------------------------------------------------
    def take(self) -> StepTotals:
        """Everything counted since the previous take (and reset)."""
        with self._lock:
            out, self._totals = self._totals, _Interval()
        return out.frozen()

    def sync(self, timeout: float | None) -> bool:
        """Wait until every step pushed before this call is counted (reading the GPU as needed)."""
        target = self.pushed
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wake.set()
        with self._lock:
            while self.done < target:
                if self._thread is None or not self._thread.is_alive() or self._paused:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._done_cond.wait(0.05 if left is None else min(left, 0.05))
        return True

    def recent(self, phase: int) -> RecentSteps:
        """The last steps of *phase* (a phase code: PREFILL, DECODE or MIXED)."""
        with self._lock:
            r = self._recent[phase]
            return RecentSteps(r.steps, r.errors, tuple(r.seconds), tuple(r.mbu), tuple(r.mfu))

    def take_errors(self) -> list[tuple[str, str]]:
        with self._lock:
            out = list(self.error_sites)
            self.error_sites.clear()
        return out

    def after_fork(self, drop_events: bool) -> None:
        """In a forked child, before anything else uses the core: a new core in place (see the module
        docstring). *drop_events*: the parent timed with CUDA events, which this process cannot use — the
        pool and event API go (nothing destroyed: the handles are the parent's) and steps come host-timed."""
        self._lock = threading.Lock()  # the parent's core thread may have held it: it does not exist here
        self._done_cond = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._records = deque()
        self._pending = deque()
        self._totals = _Interval()
        self._recent = [_Recent(), _Recent(), _Recent()]
        self._sampled = 0
        self.pushed = self.done = self.dropped = self.errors = self.dropped_samples = 0
        self.error_sites = deque()
        self._stop = False
        self._thread = None
        if drop_events:
            self._pool = self._api = None
            self._poll_wait = False

    @property
    def waiting(self) -> int:
        """Records pushed and not yet counted."""
        return self.pushed - self.done

    def __repr__(self) -> str:
        return f"<PyStepCore {PHASES} pushed={self.pushed} done={self.done} dropped={self.dropped}>"


def native_core(
    costs: StepCosts,
    capacity: int,
    span_rate: float,
    poll_interval: float,
    events: Any,
    event_capacity: int,
    event_prefill: int,
    new_event: Any,
    destroy_event: Any,
) -> StepCore:
    """The C step core (``perfsdk._native.StepCore``), given the capacities of :mod:`perfsdk.records`, its
    ``take()`` and ``recent()`` giving the types of :mod:`perfsdk.records`, as :class:`PyStepCore`'s do.

    The C core returns struct sequences whose field names are those of the records' types, in the same order
    (``tests/test_stepcore.py`` checks each pair), so each converts by its fields' order. Raises ImportError
    where the extension was not built.
    """
    from perfsdk._native import StepCore

    class NativeStepCore(StepCore):
        implementation = "c"

        # the records' types, not the C struct sequences: the same fields (checked), one type for both cores
        def take(self) -> StepTotals:  # type: ignore[override]
            t = super().take()
            return StepTotals(
                (PhaseTotals._make(t.phases[0]), PhaseTotals._make(t.phases[1]), PhaseTotals._make(t.phases[2])),
                tuple(map(StepSample._make, t.samples)),
                tuple(map(WindowFeedEntry._make, t.window_feed)),
                tuple(map(ValueFeedEntry._make, t.value_feed)),
                t.value_feed_dropped,
            )

        def recent(self, phase: int) -> RecentSteps:  # type: ignore[override]
            return RecentSteps._make(super().recent(phase))

    return NativeStepCore(
        costs=costs,
        capacity=capacity,
        span_rate=span_rate,
        poll_interval=poll_interval,
        events=events,
        event_capacity=event_capacity,
        event_prefill=event_prefill,
        new_event=new_event,
        destroy_event=destroy_event,
        step_bounds=STEP,
        util_bounds=UTIL,
        recent=RECENT,
        samples=SAMPLES,
        window_feed=WINDOW_FEED,
        value_feed=VALUE_FEED,
        idle_max=IDLE_MAX,
    )
