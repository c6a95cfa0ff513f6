"""The collector thread: every export interval, hand what was recorded to the sinks.

Steps are counted by the step core (:mod:`perfsdk.stepcore`; in C, on a native thread that never takes
the GIL); this thread only visits it every ``export_interval`` (default 1 s) — one short turn at the
GIL for every few hundred steps — and:

* takes the step totals (:meth:`~perfsdk.stepcore.PyStepCore.take`), and hands every decode step's time
  to the profiler window while one listens;
* drains the request queue (:class:`~perfsdk.records.RequestQueue`) in order: a first token is a TTFT; a
  :class:`~perfsdk.records.Tokens` event (one per step, for every request it emitted a token for) updates
  each of those requests here, off the serving thread, its first token a TTFT; a finished request becomes a
  :class:`~perfsdk.sinks.RequestResult` (queue time, inter-token gaps, TPOT, duration, its bounded
  finish-reason label, and its span); values an engine measured itself go the same way;
* takes perfsdk's own losses (records dropped, internal errors, spans dropped by a cap: the core's
  sample of step spans beyond :data:`~perfsdk.records.SAMPLES` per take, the span thread's full queue)
  as deltas, and logs each new failure site of the core once;
* puts all of it in one frozen :class:`~perfsdk.sinks.ExportBatch` and hands that to every sink, one
  :meth:`~perfsdk.sinks.Sink.record` call each (none when the batch is empty);
* never observes a negative duration: a request whose finish reads before its last token or its arrival
  (a clock that went backwards) has no duration or TPOT observed, and an engine's TTFT beyond its own
  end-to-end time no TPOT; each is counted in ``perfsdk_internal_errors_total`` and logged once;
* logs, once per phase and quantity, a step whose MBU or MFU exceeded 1 — impossible, so the peak in use
  (named with its source, ``peaks``) or the step's sizes or time are wrong. The sinks count such steps
  from the totals (the utilisation histograms' ``+Inf`` bucket: :data:`~perfsdk.buckets.UTIL` ends at 1);
  :func:`summary` marks the figure suspect (``mbu_suspect``, ``mfu_suspect``);
* on a flush marker (:meth:`perfsdk.Monitor.flush`), first waits for the core to count every step
  pushed before it (the GPU is read as needed), then exports, then waits for the sinks. A scrape of
  perfsdk's ``/metrics`` (or :meth:`perfsdk.Monitor.metrics_text`) *drains* the same way, without waiting
  for the sinks: it sees every step and request that finished before it began.

When nothing happens it sleeps longer (up to :data:`IDLE_MAX`); flush and close wake it at once. A
failing sink is counted in ``perfsdk_internal_errors_total`` (exported with the next batch) and the others
still get the batch.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from perfsdk._guard import ErrorGuard
from perfsdk.errors import ConfigError
from perfsdk.records import (
    PHASES,
    Finished,
    FirstToken,
    Flush,
    MeasuredLatencies,
    MeasuredRequest,
    NullRequest,
    RecentSteps,
    Request,
    RequestQueue,
    Tokens,
    finish_reason_label,
)
from perfsdk.sinks import ExportBatch, RequestResult, Sink
from perfsdk.stepcore import StepCore, StepTotals

__all__ = ["Collector", "summary"]

log = logging.getLogger("perfsdk")

IDLE_MAX = 1.0  # longest sleep of an idle collector (s); export_interval is the usual one
REQUEST_CLOCK = (
    "a request finished before its last token or its arrival (the clock went backwards): its duration "
    "and TPOT are not observed"
)
MEASURED_CLOCK = (
    "record_finished: the first token came after the end (ttft_s, or queue_s + prefill_s, beyond "
    "e2e_s): no TPOT is observed"
)
_yield = time.sleep  # time.sleep(0) lets go of the GIL and takes it back: a waiting thread gets a turn


class RecorderView(Protocol):
    """What the collector reads of the Monitor's hot path (:class:`perfsdk.recorder.Recorder` is one)."""

    @property
    def window(self) -> Any: ...  # the profiler window, or None

    @property
    def event_pool_empty(self) -> int: ...  # steps counted but not timed: every event was in flight


class Collector(threading.Thread):
    """Reads the step core and the request queue, feeds the sinks (see the module docstring)."""

    def __init__(
        self,
        core: StepCore,
        requests: RequestQueue,
        sinks: Sequence[Sink],
        errors: ErrorGuard,
        *,
        model: str,
        operation: str,
        epoch_offset_ns: int,
        export_interval: float,
        recorder: RecorderView,
        peaks: dict[str, str] | None = None,
        spans_dropped: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        super().__init__(name="perfsdk-collector", daemon=True)
        self.core = core
        self.requests = requests
        self.sinks = list(sinks)
        self.errors = errors
        self.model = model
        self.operation = operation
        self._offset = epoch_offset_ns
        self._interval = export_interval
        self.recorder = recorder  # the hot path's owner: the profiler window, the steps the event pool could not time
        self._spans_dropped = spans_dropped  # reason -> spans dropped so far (None: no span sink)
        self._exported_spans: dict[str, int] = {}
        self.peaks = peaks or {}  # "mbu"/"mfu" -> the peak in use and its source, for the impossible-value log
        self._suspect_logged: set[tuple[int, str]] = set()
        self.notices: list[str] = []  # warnings to log at the first export of a step or a request
        # a plain lock as the wake-up: acquired by this thread, released by wake(); waiting on it with a
        # timeout is one C call (threading.Event builds a Condition and a lock per wait)
        self._wake = threading.Lock()
        self._wake.acquire()
        self._stop_flag = False
        self._exported_dropped = 0
        self._exported_errors = 0
        self.processed = 0  # request events read
        self.values_dropped = 0  # timed steps beyond the core's value feed (an OpenTelemetry metrics sink's)
        self.rounds = 0

    # ---- thread control -------------------------------------------------------------------------
    def forked(self) -> Collector:
        """A collector for a forked child, where this one's thread does not exist (a thread cannot be started
        twice): the same parts, nothing of this one's progress (the child's losses start at 0 too)."""
        new = Collector(
            self.core,
            self.requests,
            self.sinks,
            self.errors,
            model=self.model,
            operation=self.operation,
            epoch_offset_ns=self._offset,
            export_interval=self._interval,
            recorder=self.recorder,
            peaks=self.peaks,
            spans_dropped=self._spans_dropped,
        )
        return new

    def wake(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:
            pass  # a wake-up is pending already

    def stop(self, timeout: float | None) -> None:
        self._stop_flag = True
        self.wake()
        if self.ident is not None:  # started (a Monitor whose constructor failed may not have)
            self.join(timeout)

    def run(self) -> None:
        idle = self._interval
        while True:
            try:
                busy = self.export()
                if self._stop_flag:
                    return
                woken = self._wake.acquire(timeout=idle)
                # nothing arrived: sleep longer next time (every wake-up is a turn at the GIL)
                idle = self._interval if busy or woken else min(idle * 2, max(self._interval, IDLE_MAX))
            except Exception as e:  # keep collecting whatever happens, without spinning on a lasting fault
                self.errors.record(e, "collector")
                time.sleep(self._interval)

    # ---- one round --------------------------------------------------------------------------------
    def export(self) -> bool:
        """One round: steps, requests, health. True when anything was exported.

        The round lets go of the GIL between its parts (``time.sleep(0)``), so that a serving thread waiting
        for it waits for one part, not for the whole round or a switch interval (5 ms).
        """
        markers = list(self.requests.markers)
        if markers:
            # a flush is waiting: count every step first, so that its steps go out in this round's one export
            self.core.sync(markers[0].timeout)
        steps = self._take_steps()
        _yield(0)
        ttft: list[float] = []
        itl: list[float] = []
        results: list[RequestResult] = []
        flushes: list[Flush] = []
        q = self.requests
        work = 0  # events read, and requests a Tokens event updated, since the GIL was last let go of
        for _ in range(len(q)):  # what is queued now; later events wait for the next round
            ev = q.pop()
            if ev is None:
                break
            work += 1
            if work >= 32:
                work = 0
                _yield(0)
            self.processed += 1
            try:
                if isinstance(ev, Tokens):
                    self._tokens(ev, ttft)
                    work += len(ev.requests) // 4
                elif isinstance(ev, FirstToken):
                    req = ev.request
                    if req.first_token_ns is not None:
                        ttft.append((req.first_token_ns - req.arrival_ns) / 1e9)
                elif isinstance(ev, Finished):
                    results.append(self._finished(ev.request))
                elif isinstance(ev, MeasuredLatencies):
                    ttft.extend(ev.ttft_s)
                    itl.extend(ev.itl_s)
                elif isinstance(ev, MeasuredRequest):
                    results.append(self._measured(ev))
                elif isinstance(ev, Flush):
                    flushes.append(ev)
            except Exception as e:
                self.errors.record(e, f"collector {type(ev).__name__}")
        busy = steps is not None or bool(ttft or itl or results)
        self._record(self._batch(steps, ttft, itl, results))
        for f in flushes:
            self._flush(f)
        self.rounds += 1
        return busy

    def _take_steps(self) -> StepTotals | None:
        """The core's totals since the last take (None: no step), after feeding the profiler window."""
        # an OpenTelemetry metrics sink wants each step's values once a meter provider is set (checked each round)
        self.core.feed_values = any(s.wants_step_values for s in self.sinks)
        totals: StepTotals = self.core.take()
        self.values_dropped += totals.value_feed_dropped
        for site, message in self.core.take_errors():
            self.errors.log_once(site, message)
        if totals.empty():
            return None
        for code, t in enumerate(totals.phases):
            for kind, counts in (("mbu", t.mbu_counts), ("mfu", t.mfu_counts)):
                if counts and counts[-1] and (code, kind) not in self._suspect_logged:
                    self._log_suspect(code, kind, counts[-1])
        w = self.recorder.window  # fed every decode step while set
        if w is not None and totals.window_feed:
            try:
                for e in totals.window_feed:
                    w.observe_step("decode", e.seconds, e.batch, e.mbu)
            except Exception as e:
                self.errors.record(e, "profiler window feed")
        return totals

    def _log_suspect(self, code: int, kind: str, n: int) -> None:
        """A utilisation above 1 is impossible: say so once per phase and quantity, naming the peak in use."""
        self._suspect_logged.add((code, kind))
        recent = self.core.recent(code)
        values = recent.mbu if kind == "mbu" else recent.mfu
        worst = max(values, default=float("nan"))
        what = "bandwidth" if kind == "mbu" else "dense FLOP/s"
        log.warning(
            "perfsdk: %d %s step(s) had %s %s 100%% (up to %.1f%%), which is impossible: the peak %s in use, %s, "
            "is wrong for this device, or the step's sizes or time are. Counted in "
            'perfsdk_suspect_utilization_total{reason="%s_above_peak"}; stats() and reports mark it suspect; '
            "logged once.",
            n,
            PHASES[code],
            kind.upper(),
            "above",
            worst * 100,
            what,
            self.peaks.get(kind, "(unknown)"),
            kind,
        )

    def _flush(self, marker: Flush) -> None:
        """Everything pushed before the marker: counted by the core, exported, out of the sinks (a drain,
        ``marker.sinks`` False: exported, and what is counted even if the core is still behind)."""
        ok = False
        try:
            synced = self.core.sync(marker.timeout)
            if synced or not marker.sinks:
                self._record(self._batch(self._take_steps()))
            if synced and marker.sinks:
                flushed = [s.flush(marker.timeout) for s in self.sinks]  # every sink, even after one fails
                ok = all(flushed)
            else:
                ok = synced
        except Exception as e:
            self.errors.record(e, "collector flush")
        finally:
            marker.result.append(ok)
            marker.done.set()  # flush() returns even if this failed (the failure is counted)

    def _batch(
        self,
        steps: StepTotals | None,
        ttft: Sequence[float] = (),
        itl: Sequence[float] = (),
        results: Sequence[RequestResult] = (),
    ) -> ExportBatch:
        """One export: what was taken, with perfsdk's own losses since the last export (taken now, as deltas)."""
        d = max(self.core.dropped + self.requests.dropped - self._exported_dropped, 0)
        e = max(self.errors.count + self.core.errors - self._exported_errors, 0)
        self._exported_dropped += d
        self._exported_errors += e
        spans: list[tuple[str, int]] = []
        if self._spans_dropped is not None:
            for reason, total in self._spans_dropped().items():
                n = total - self._exported_spans.get(reason, 0)
                if n > 0:
                    self._exported_spans[reason] = total
                    spans.append((reason, n))
        return ExportBatch(steps, tuple(ttft), tuple(itl), tuple(results), d, e, tuple(spans))

    def _record(self, batch: ExportBatch) -> None:
        """Hand *batch* to every sink (none if it is empty); one failing is counted and the others still get it.

        The GIL is let go of before each sink; a sink lets go of it between its own parts (:mod:`perfsdk.sinks`).
        """
        if batch.empty():
            return
        for s in self.sinks:
            _yield(0)
            try:
                s.record(batch)
            except Exception as e:
                self.errors.record(e, f"{type(s).__name__}.record")
        # notices are said when they matter: at the first export of a step or a request, whether a round or a
        # flush took it (an idle copy of a Monitor, a fork's, stays quiet)
        if self.notices and (batch.steps is not None or batch.ttft_s or batch.itl_s or batch.requests):
            for notice in self.notices:
                log.warning("%s", notice)
            self.notices.clear()

    # ---- requests ----------------------------------------------------------------------------------
    def _tokens(self, ev: Tokens, ttft: list[float]) -> None:
        """One emission of *ev.n* tokens at *ev.t_ns* for each of *ev.requests* (``step.tokens``, ``mon.tokens``):
        each request's record updated as :meth:`~perfsdk.records.Request.tokens` at that time would have, its
        first token a TTFT. A request whose finish came first (its Finished event read already, or a finish
        stamped before *t_ns*) is closed: its late token is not its. Anything else odd is counted, never raised.

        The update is :meth:`Request.tokens`'s, written out rather than called: this loop runs once per request
        per step, and a call per request measured 6-30 % slower on this project's CPU."""
        t, n = ev.t_ns, ev.n
        q = self.requests
        for r in ev.requests:
            if (type(r) is not Request and not isinstance(r, Request)) or r._q is not q:
                if not isinstance(r, NullRequest):  # a disabled Monitor's request: nothing to record
                    self.errors.record(ConfigError(f"expected this Monitor's requests, got {r!r}"), "step.tokens")
                continue
            if r._exported:
                continue
            f = r.finish_ns
            if f is not None and f < t:
                continue
            times = r.token_ns
            if t < (times[-1] if times else r.arrival_ns):  # each token at or after the one before, and arrival
                self.errors.record(
                    ConfigError(f"t_ns {t} is before the request's arrival or its previous token"), "step.tokens"
                )
                continue
            r.output_tokens += n
            times.append(t)
            if r.first_token_ns is None:
                r.first_token_ns = t
                ttft.append((t - r.arrival_ns) / 1e9)

    def _finished(self, req: Request) -> RequestResult:
        req._exported = True  # a Tokens event read after this one is not the request's any more
        end = req.finish_ns if req.finish_ns is not None else req.arrival_ns
        span = (end - req.arrival_ns) / 1e9
        first = req.first_token_ns
        ttft = (first - req.arrival_ns) / 1e9 if first is not None else None
        queue = (req.scheduled_ns - req.arrival_ns) / 1e9 if req.scheduled_ns is not None else None
        times = req.token_ns  # each at or after the one before and the arrival (Request.tokens refuses others)
        gaps = [(times[i] - times[i - 1]) / 1e9 for i in range(1, len(times))]
        tpot = (span - ttft) / (req.output_tokens - 1) if ttft is not None and req.output_tokens > 1 else None
        e2e: float | None = span
        if end < (times[-1] if times else req.arrival_ns):
            # the clock went backwards before finish(): the duration and TPOT would be negative or short
            e2e = tpot = None
            self.errors.count_problem("request clock", REQUEST_CLOCK)
        off = self._offset
        raw = req.finish_reason or "stop"
        return RequestResult(
            operation=req.operation,
            model=self.model,
            parent=req._otel_parent,
            start_ns=req.arrival_ns + off,
            scheduled_ns=req.scheduled_ns + off if req.scheduled_ns is not None else None,
            first_token_ns=first + off if first is not None else None,
            end_ns=end + off,
            input_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens,
            finish_reason=finish_reason_label(raw, req.error),
            error=req.error,
            request_id=req.request_id,
            e2e_s=e2e,
            ttft_s=ttft,
            queue_s=queue,
            tpot_s=tpot,
            itl_s=gaps,
            raw_finish_reason=raw,
        )

    def _measured(self, m: MeasuredRequest) -> RequestResult:
        """A request an engine timed itself (Monitor.record_finished)."""
        ttft, tpot = m.ttft_s, m.tpot_s
        if ttft is None and m.queue_s is not None and m.prefill_s is not None:
            ttft = m.queue_s + m.prefill_s
        if tpot is None and ttft is not None and m.output_tokens > 1:
            tpot = (m.e2e_s - ttft) / (m.output_tokens - 1)
            if tpot < 0:  # the engine's first token after its own end: one of its clocks went backwards
                self.errors.count_problem("record_finished clock", MEASURED_CLOCK)
        if tpot is not None and (tpot < 0 or m.output_tokens <= 1):
            tpot = None
        off = self._offset
        end = m.end_ns
        start = end - round(m.e2e_s * 1e9)
        return RequestResult(
            operation=self.operation,
            model=self.model,
            parent=None,
            start_ns=start + off,
            scheduled_ns=start + round(m.queue_s * 1e9) + off if m.queue_s is not None else None,
            first_token_ns=start + round(ttft * 1e9) + off if ttft is not None else None,
            end_ns=end + off,
            input_tokens=m.prompt_tokens,
            output_tokens=m.output_tokens,
            finish_reason=finish_reason_label(m.finish_reason, m.error),
            error=m.error,
            request_id=m.request_id,
            e2e_s=m.e2e_s,
            ttft_s=ttft,
            queue_s=m.queue_s,
            tpot_s=tpot,
            itl_s=(),
            raw_finish_reason=m.finish_reason,
        )

    # ---- stats ---------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for code, phase in enumerate(PHASES):
            out[phase] = summary(self.core.recent(code))
        out["dropped_records"] = self.core.dropped + self.requests.dropped
        out["untimed_steps_event_pool_empty"] = self.recorder.event_pool_empty
        out["internal_errors"] = self.errors.count + self.core.errors
        out["processed_records"] = self.core.done + self.processed
        out["dropped_step_values"] = self.values_dropped
        return out


def summary(recent: RecentSteps) -> dict[str, Any]:
    """One phase's rolling statistics (its last :data:`~perfsdk.records.RECENT` steps).

    ``mbu_suspect`` / ``mfu_suspect`` (present only then) say why a utilisation figure cannot be trusted: some
    of these steps had an MBU or MFU above 1, which no step can reach — the peak or the measurement is wrong.
    """

    steps, errors, secs, mbu, mfu = recent.steps, recent.errors, recent.seconds, recent.mbu, recent.mfu

    def pct(xs: Sequence[float], q: float) -> float | None:
        if not xs:
            return None
        s = sorted(xs)
        return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

    out: dict[str, Any] = {
        "steps": steps,
        "errors": errors,
        "step_ms_mean": statistics.fmean(secs) * 1e3 if secs else None,
        "step_ms_p50": (pct(secs, 0.5) or 0) * 1e3 if secs else None,
        "step_ms_p99": (pct(secs, 0.99) or 0) * 1e3 if secs else None,
        "mbu_mean": statistics.fmean(mbu) if mbu else None,
        "mbu_p50": pct(mbu, 0.5),
        "mfu_mean": statistics.fmean(mfu) if mfu else None,
        "mfu_p50": pct(mfu, 0.5),
    }
    for name, xs in (("mbu", mbu), ("mfu", mfu)):
        if xs and max(xs) > 1:
            out[f"{name}_suspect"] = (
                f"{sum(1 for v in xs if v > 1)} of the last {len(xs)} steps had {name.upper()} "
                f"above 100% (up to {max(xs):.1%}), which is impossible: the peak in use or "
                "the steps' sizes or times are wrong"
            )
    return out
