"""The collector thread: everything that is not recording happens here.

It drains the Monitor's bounded queue in order, and for each record:

* a **step** — waits until its end CUDA event has completed (a query, then a
  blocking-sync wait that sleeps in the driver with the GIL released: no
  spinning core, and never on the serving thread; it waits for the *newest*
  pending step, so that one wake-up resolves every step queued before it), reads the
  device time, returns the events to the pool, computes the step's bytes and
  FLOPs (:mod:`perfsdk.budget`), MBU and MFU, and observes the Prometheus
  histograms and counters; feeds the profiler window's steady-state gate;
* a **first token** — observes TTFT at once (dashboards need not wait for the
  request to end);
* a **finished request** — queue time, every inter-token gap, TPOT, duration,
  and the request's OpenTelemetry span tree, with explicit timestamps;
* a **flush marker** — resolves every pending step, then wakes the caller.

When the queue is empty it sleeps ``poll_interval`` seconds, doubling the sleep
(up to 0.1 s) while nothing arrives, so an idle server's collector wakes ten
times a second rather than two hundred. Any exception is
counted in ``perfsdk_internal_errors_total`` and the thread keeps going.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from perfsdk import budget

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor, Request

__all__ = ["Collector"]

_WINDOW = 4096  # steps kept per phase for stats()
_IDLE_MAX = 0.1  # longest sleep of an idle collector (s); poll_interval is the shortest


class _PhaseStats:
    __slots__ = ("errors", "mbu", "mfu", "seconds", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.errors = 0
        self.seconds: deque[float] = deque(maxlen=_WINDOW)
        self.mbu: deque[float] = deque(maxlen=_WINDOW)
        self.mfu: deque[float] = deque(maxlen=_WINDOW)

    def summary(self) -> dict[str, Any]:
        def pct(xs: list[float], q: float) -> float | None:
            if not xs:
                return None
            s = sorted(xs)
            return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]

        secs, mbu, mfu = _snapshot(self.seconds), _snapshot(self.mbu), _snapshot(self.mfu)
        return {
            "steps": self.steps,
            "errors": self.errors,
            "step_ms_mean": statistics.fmean(secs) * 1e3 if secs else None,
            "step_ms_p50": (pct(secs, 0.5) or 0) * 1e3 if secs else None,
            "step_ms_p99": (pct(secs, 0.99) or 0) * 1e3 if secs else None,
            "mbu_mean": statistics.fmean(mbu) if mbu else None,
            "mbu_p50": pct(mbu, 0.5),
            "mfu_mean": statistics.fmean(mfu) if mfu else None,
            "mfu_p50": pct(mfu, 0.5),
        }


class Collector(threading.Thread):
    def __init__(self, mon: Monitor, poll_interval: float) -> None:
        super().__init__(name="perfsdk-collector", daemon=True)
        self._mon = mon
        self._queue = mon._queue
        self._poll = poll_interval
        self._stop_flag = False
        self._wake = threading.Event()
        self._pending: deque[tuple[Any, ...]] = deque()  # steps whose end event has not completed
        self._stats = {p: _PhaseStats() for p in ("prefill", "decode", "mixed")}
        self._exported_dropped = 0
        self._exported_errors = 0
        self.processed = 0
        self.resolved = 0  # records fully read (a CUDA step once its events are): orphans wait on this
        self.dropped_device_timing = 0
        m, h = mon.model, mon.hardware
        self._model = m
        self._bandwidth = h.memory_bandwidth if h is not None else None
        self._peak_flops: float | None = None
        if h is not None:
            try:
                self._peak_flops = h.peak_flops(mon.compute_dtype)
            except Exception:
                self._peak_flops = None
        self._kv = m is not None and m.has_attention_shape
        # decode cost coefficients, so a step costs two multiply-adds here (same formulas as perfsdk.budget;
        # tests check the two agree)
        self._wbytes = m.weight_bytes if m is not None else 0.0
        self._kv_per_token = m.kv_bytes_per_token if self._kv and m is not None else 0.0
        self._two_params = 2.0 * m.params if m is not None else 0.0
        self._attn_per_ctx = (
            4.0 * m.layers * (m.heads // m.tp) * m.head_dim  # type: ignore[operator]
            if self._kv and m is not None else 0.0
        )
        # counters are summed locally and added to Prometheus once per batch of records
        self._acc: dict[str, list[float]] = {p: [0.0, 0.0, 0.0] for p in ("prefill", "decode", "mixed")}

    # ---- thread control -------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float | None) -> None:
        self._stop_flag = True
        self._wake.set()
        self.join(timeout)

    def run(self) -> None:
        pool = self._mon._pool
        if pool is not None:
            try:
                pool.api.thread_setup()  # the events' context current; relaxed graph-capture mode
            except Exception as e:
                self._mon._errors.record(e, "collector CUDA setup")
        q = self._queue
        idle = self._poll
        while True:
            try:
                if q:
                    self._drain()
                elif self._pending:
                    self._resolve_pending(block=True)
                else:
                    self._release_orphans()
                    self._export_counters()
                    self._export_health()
                    if self._stop_flag:
                        return
                    self._wake.wait(idle)
                    self._wake.clear()
                    # Nothing arrived while asleep: sleep longer next time (up to _IDLE_MAX), since every
                    # wake-up costs CPU and a turn at the GIL; the first record resets it. flush() and
                    # close() wake the thread at once whatever the interval.
                    idle = min(idle * 2, max(self._poll, _IDLE_MAX)) if not q else self._poll
            except Exception as e:  # keep collecting whatever happens, without spinning on a lasting fault
                self._mon._errors.record(e, "collector")
                time.sleep(self._poll)

    def _drain(self) -> None:
        q = self._queue
        mon = self._mon
        n = 0
        while q:
            n += 1
            if not n & 63:
                # Let a waiting serving thread take the GIL: without this, a busy collector keeps it for a
                # whole switch interval (5 ms) and the serving thread stalls on its next bytecode.
                time.sleep(0)
            rec = q.popleft()
            tag = rec[0]
            try:
                if tag == "s":
                    ev = rec[4]
                    if ev:
                        self._pending.append(rec)
                        self._resolve_pending(block=False)
                    elif ev is None:
                        self._step(rec, (rec[3] - rec[2]) / 1e9)
                    else:  # False: a CUDA step not sampled for timing (Monitor(timing_every=N))
                        self._step(rec, None)
                elif tag == "f":
                    self._first_token(rec[1])
                elif tag == "r":
                    self._finish(rec[1])
                elif tag == "o":
                    self._measured(rec)
                elif tag == "x":
                    try:
                        self._resolve_pending(block=True, all_=True)
                        self._export_counters()
                        self._export_health()
                    finally:
                        rec[1].set()  # flush() returns even if resolving failed (the failure is counted)
            except Exception as e:
                mon._errors.record(e, f"collector record {tag!r}")
            self.processed += 1
            if not (tag == "s" and rec[4]):
                self.resolved += 1  # a timed CUDA step counts once its events are read

    def _resolve_pending(self, block: bool, all_: bool = False) -> None:
        pending = self._pending
        pool = self._mon._pool
        if pool is None:
            return
        api = pool.api
        while pending:
            rec = pending[0]
            start, end, drops = rec[4]
            seconds: float | None
            try:
                if not api.query(end):
                    if not block:
                        return
                    newest = pending[-1][4][1]
                    if newest is not end and self._wait_newest(api, newest):
                        continue  # re-check the oldest
                    api.wait(end)  # blocking-sync event: sleeps in the driver, GIL released
                seconds = api.elapsed_s(start, end)
                pool.release(start)
            except Exception as e:
                # a CUDA error (sticky after a fault, say): this start is unusable; drop it rather than
                # retrying it forever, and keep the step as counted but untimed. (The end event stays the
                # serving thread's until a later step lets go of it.)
                self._mon._errors.record(e, "collector event")
                seconds = None
                pool.discard(start)
            # previous steps' ends that this step did not start from: those steps were read before it
            for ev in drops:
                pool.release(ev)
            pending.popleft()
            self.resolved += 1
            self._step(rec, seconds)
            if self._mon._orphans:
                self._release_orphans()
            if not all_ and self._queue:
                return  # go back to draining new records

    @staticmethod
    def _wait_newest(api: Any, newest: Any) -> bool:
        """Wait for the newest pending step's end; False if it is done already or cannot be waited on.

        Steps on one stream complete in order, so one wake-up then resolves every step the host had
        queued, not one per step (fewer GIL hand-offs to and from the serving thread). A failure here is
        left for that step's own turn to report; the caller waits on the oldest instead.
        """
        try:
            if api.query(newest):
                return False
            api.wait(newest)
            return True
        except Exception:
            return False

    def _release_orphans(self) -> None:
        """Give back events of dropped or failed steps once every record queued before them is read."""
        orphans = self._mon._orphans
        pool = self._mon._pool
        if pool is None:
            orphans.clear()
            return
        resolved = self.resolved
        while orphans and orphans[0][0] <= resolved:
            pool.release(orphans.popleft()[1])

    # ---- records ----------------------------------------------------------
    def _step(self, rec: tuple[Any, ...], seconds: float | None) -> None:
        _, phase, t0, t1, _ev, batch, tokens, ctx, seq_lens, error = rec
        mon = self._mon
        stats = self._stats[phase]
        if error is not None:
            stats.steps += 1
            stats.errors += 1
            if mon._otel is not None:
                mon._otel.step(phase=phase, model=mon.model_name, start_ns=mon.epoch_ns(t0),
                               end_ns=mon.epoch_ns(t1), attributes={"perfsdk.batch": batch}, error=error)
            return
        nbytes, flops, ntokens = self._cost(phase, batch, tokens, ctx, seq_lens)
        mbu = mfu = None
        if seconds is not None and seconds > 0:
            if nbytes is not None and self._bandwidth and phase != "prefill":
                mbu = nbytes / (seconds * self._bandwidth)
            if flops is not None and self._peak_flops and phase != "decode":
                mfu = flops / (seconds * self._peak_flops)
        prom = mon._prom
        if prom is not None:
            if seconds is not None:
                prom.step[phase].observe(seconds)
            if mbu is not None:
                prom.mbu[phase].observe(mbu)
            if mfu is not None:
                prom.mfu[phase].observe(mfu)
            acc = self._acc[phase]
            if seconds is not None:  # bytes/FLOPs over step seconds must cover the same steps
                acc[0] += nbytes or 0.0
                acc[1] += flops or 0.0
            acc[2] += ntokens
        # deque appends are atomic; stats() copies them, so no lock is needed here
        stats.steps += 1
        if seconds is not None:
            stats.seconds.append(seconds)
        if mbu is not None:
            stats.mbu.append(mbu)
        if mfu is not None:
            stats.mfu.append(mfu)
        if mon._otel is not None and seconds is not None:
            attrs: dict[str, Any] = {"perfsdk.batch": batch, "perfsdk.tokens": ntokens,
                                     "perfsdk.device_seconds": seconds}
            if mbu is not None:
                attrs["perfsdk.mbu"] = mbu
            if mfu is not None:
                attrs["perfsdk.mfu"] = mfu
            mon._otel.step(phase=phase, model=mon.model_name, start_ns=mon.epoch_ns(t0),
                           end_ns=mon.epoch_ns(t1), attributes=attrs, error=None)
        w = mon._window
        if w is not None and seconds is not None:
            w.observe_step(phase, seconds, batch, mbu)

    def _cost(self, phase: str, batch: int, tokens: int | None, ctx: int,
              seq_lens: Any) -> tuple[float | None, float | None, int]:
        """(bytes, FLOPs, tokens) the step had to move/do; None where the model is unknown."""
        m = self._model
        if phase == "decode":
            if m is None:
                return None, None, batch
            return (self._wbytes + self._kv_per_token * ctx,
                    self._two_params * batch + self._attn_per_ctx * ctx, batch)
        if phase == "prefill":
            lens = _prefill_lens(batch, tokens, seq_lens)
            n = sum(lens)
            if m is None:
                return None, None, n
            return (budget.prefill_step_bytes(m, lens, ctx if self._kv else 0),
                    budget.prefill_flops(m, lens, attention=self._kv, cached_tokens=ctx if self._kv else 0), n)
        # mixed: seq_lens are the prefill chunks, batch the decoding sequences
        lens = [int(n) for n in (seq_lens if seq_lens is not None else ())]
        n = sum(lens) + batch
        if m is None:
            return None, None, n
        kv_ctx = ctx if self._kv else 0
        nbytes = budget.mixed_step_bytes(m, lens, kv_ctx) if self._kv else m.weight_bytes
        return nbytes, budget.mixed_step_flops(m, lens, batch, kv_ctx), n

    def _export_counters(self) -> None:
        prom = self._mon._prom
        if prom is None:
            return
        for phase, acc in self._acc.items():
            if acc[2] or acc[0]:
                if acc[0]:
                    prom.step_bytes[phase].inc(acc[0])
                if acc[1]:
                    prom.step_flops[phase].inc(acc[1])
                if acc[2]:
                    prom.step_tokens[phase].inc(acc[2])
                acc[0] = acc[1] = acc[2] = 0.0

    def _first_token(self, req: Request) -> None:
        prom = self._mon._prom
        if prom is not None and req.first_token_ns is not None:
            prom.ttft.observe((req.first_token_ns - req.arrival_ns) / 1e9)

    def _finish(self, req: Request) -> None:
        mon = self._mon
        prom = mon._prom
        end = req.finish_ns if req.finish_ns is not None else req.arrival_ns
        e2e = (end - req.arrival_ns) / 1e9
        first = req.first_token_ns
        ttft = (first - req.arrival_ns) / 1e9 if first is not None else None
        queue = (req.scheduled_ns - req.arrival_ns) / 1e9 if req.scheduled_ns is not None else None
        if prom is not None:
            if queue is not None:
                prom.queue.observe(queue)
            times = req.token_ns
            itl = prom.itl
            for i in range(1, len(times)):
                itl.observe((times[i] - times[i - 1]) / 1e9)
            if ttft is not None and req.output_tokens > 1:
                prom.tpot.observe((e2e - ttft) / (req.output_tokens - 1))
            prom.duration.observe(e2e)
        if mon._otel is not None:
            mon._otel.request(
                operation=req.operation, model=mon.model_name, parent=req._otel_parent,
                start_ns=mon.epoch_ns(req.arrival_ns),
                scheduled_ns=mon.epoch_ns(req.scheduled_ns) if req.scheduled_ns is not None else None,
                first_token_ns=mon.epoch_ns(first) if first is not None else None,
                end_ns=mon.epoch_ns(end), input_tokens=req.prompt_tokens, output_tokens=req.output_tokens,
                finish_reason=req.finish_reason or "stop", error=req.error, ttft_s=ttft, queue_s=queue,
                request_id=req.request_id,
            )

    def _measured(self, rec: tuple[Any, ...]) -> None:
        """Values an engine measured itself (Monitor.record_latencies / record_finished)."""
        mon = self._mon
        prom = mon._prom
        if rec[1] == "latencies":
            if prom is not None:
                for v in rec[2]:
                    if v >= 0:
                        prom.ttft.observe(v)
                for v in rec[3]:
                    if v >= 0:
                        prom.itl.observe(v)
            return
        (_, _, end, e2e, queue, prefill, ttft, tpot, prompt, output, reason, error, request_id) = rec
        if ttft is None and queue is not None and prefill is not None:
            ttft = queue + prefill
        if tpot is None and ttft is not None and output > 1:
            tpot = (e2e - ttft) / (output - 1)
        if prom is not None:
            if queue is not None and queue >= 0:
                prom.queue.observe(queue)
            if tpot is not None and tpot >= 0 and output > 1:
                prom.tpot.observe(tpot)
            if e2e >= 0:
                prom.duration.observe(e2e)
        if mon._otel is not None:
            start = end - round(e2e * 1e9)
            mon._otel.request(
                operation=mon.operation, model=mon.model_name, parent=None, start_ns=mon.epoch_ns(start),
                scheduled_ns=mon.epoch_ns(start + round(queue * 1e9)) if queue is not None else None,
                first_token_ns=mon.epoch_ns(start + round(ttft * 1e9)) if ttft is not None else None,
                end_ns=mon.epoch_ns(end), input_tokens=prompt, output_tokens=output, finish_reason=reason,
                error=error, ttft_s=ttft, queue_s=queue, request_id=request_id,
            )

    def _export_health(self) -> None:
        mon = self._mon
        prom = mon._prom
        if prom is None:
            return
        d = mon._drops()[0] - self._exported_dropped
        if d > 0:
            prom.dropped.inc(d)
            self._exported_dropped += d
        e = mon._errors.count - self._exported_errors
        if e > 0:
            prom.internal_errors.inc(e)
            self._exported_errors += e

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {p: s.summary() for p, s in self._stats.items()}
        out["dropped_records"], out["untimed_steps_event_pool_empty"] = self._mon._drops()
        out["internal_errors"] = self._mon._errors.count
        out["processed_records"] = self.processed
        return out


def _snapshot(d: deque[float]) -> list[float]:
    """Copy a deque another thread appends to (a copy can race with an append: try again)."""
    for _ in range(8):
        try:
            return list(d)
        except RuntimeError:
            continue
    return []


def _prefill_lens(batch: int, tokens: int | None, seq_lens: Any) -> list[int]:
    if seq_lens is not None:
        return [int(n) for n in seq_lens]
    if tokens is None:
        return []
    b = max(batch, 1)
    base, extra = divmod(tokens, b)
    return [base + (1 if i < extra else 0) for i in range(b)]


