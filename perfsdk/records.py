"""The hand-off: what the serving thread records, what the step core hands back, as named types.

The serving thread, the step core and the collector meet here and nowhere else. Three kinds of record cross:

* **steps** (:class:`StepRecord`): one per ``with mon.decode(...)``/``prefill``/``mixed`` or
  :meth:`~perfsdk.Monitor.record_step`. The C hot path writes the same fields, in the same order, into a C
  struct of the same name in ``perfsdk/csrc/native.h`` and hands it to the C step core through a lock-free
  ring; the Python hot path (the reference) builds this ``NamedTuple`` and hands it to the Python step core.
  Sizes travel already reduced to what the costs need (``lens_sum``, ``lens_sq``, ``lens_count`` of the
  prefill sequence lengths), so the core never reads a Python object;
* **what the step core counted** (:class:`StepTotals`: per-phase :class:`PhaseTotals`, sampled
  :class:`StepSample` steps, the profiler window's :class:`WindowFeedEntry` and an OpenTelemetry metrics
  sink's :class:`ValueFeedEntry` items; :class:`RecentSteps` for :meth:`perfsdk.Monitor.stats`), bounded by
  :data:`RECENT`, :data:`SAMPLES`, :data:`WINDOW_FEED` and :data:`VALUE_FEED`. The C core
  (``perfsdk._native.StepCore``) is given these capacities when it is built and returns struct sequences
  with the same names and fields (``tests/test_stepcore.py`` checks that field for field);
* **request events** (:class:`FirstToken`, :class:`Tokens`, :class:`Finished`, :class:`MeasuredLatencies`,
  :class:`MeasuredRequest`, :class:`Flush`): Python objects on a bounded :class:`RequestQueue`, read by
  the collector in batches, in the order they were recorded.

:class:`Request` — one request's life, arrival to finish, on the host clock — lives here too: it is what
the serving code holds, and all it does is record.

Values the serving code passes are checked here (:func:`check_count`, :func:`check_lens`,
:func:`seconds_list`): a bad one never raises into the server; the record is dropped, counted in
``perfsdk_internal_errors_total`` with the site, and logged once with the value — unless the Monitor is
*strict* (``Monitor(strict=True)``, on in :mod:`perfsdk.testing`), where it raises
:class:`~perfsdk.errors.ConfigError` so tests catch caller bugs.

This module runs over 500 lines on purpose: it is the one place both languages' hand-off types are
defined, and splitting the records from the checks and the request that make them would put the hand-off
in two places again.
"""

from __future__ import annotations

import math
import operator
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from perfsdk._guard import ErrorGuard
from perfsdk.errors import ConfigError

__all__ = [
    "DECODE",
    "FINISH_REASONS",
    "HOST",
    "MAX_COUNT",
    "MIXED",
    "PHASES",
    "PREFILL",
    "RECENT",
    "SAMPLES",
    "TIMED",
    "UNSIZED",
    "UNTIMED",
    "VALUE_FEED",
    "WINDOW_FEED",
    "Finished",
    "FirstToken",
    "Flush",
    "MeasuredLatencies",
    "MeasuredRequest",
    "NullRequest",
    "PhaseTotals",
    "RecentSteps",
    "Request",
    "RequestQueue",
    "StepRecord",
    "StepSample",
    "StepTotals",
    "Tokens",
    "ValueFeedEntry",
    "WindowFeedEntry",
    "check_count",
    "disconnect_reason",
    "finish_reason_label",
    "lens_summary",
    "negative_seconds",
    "seconds_list",
    "split_evenly",
]

# ---- steps -------------------------------------------------------------------------------------
PREFILL, DECODE, MIXED = 0, 1, 2
PHASES = ("prefill", "decode", "mixed")  # indexed by the codes above
PHASE_CODES = {name: code for code, name in enumerate(PHASES)}

# how a step was timed
TIMED = 0  # CUDA events: device time from `start` to `end`
HOST = 1  # the host clock, t1 - t0 (no GPU, or an engine's own measurement)
UNTIMED = 2  # counted, not timed: not sampled (timing_every), or every event was in flight

# The largest size a step or a request may report. Counters are floats: an increment of 2**53 or more
# would make every later +1 vanish ("float absorption"), so anything near that is a caller bug, refused.
MAX_COUNT = 2**40

NO_TOKENS = -1  # StepRecord.tokens when the caller gave none
# StepRecord.context_tokens of a step with no sizes at all (a function decorated with a bare ``@mon.decode``):
# timed and counted, but its bytes, FLOPs and tokens are unknown, so it has no MBU/MFU. Callers cannot pass
# it: every size they give is checked to be >= 0.
UNSIZED = -1


class StepRecord(NamedTuple):
    """One step, as the step core reads it (the C struct ``StepRecord`` holds the same fields)."""

    phase: int  # PREFILL, DECODE or MIXED
    timing: int  # TIMED, HOST or UNTIMED
    t0: int  # host clock (ns) at entry
    t1: int  # host clock (ns) at exit
    start: Any  # TIMED: the start event (possibly the previous step's end); else None
    end: Any  # TIMED: the end event; else None
    batch: int  # sequences (decode: decoding sequences; mixed: the decoding part)
    tokens: int  # prefill tokens given, or NO_TOKENS
    context_tokens: int  # decode: sum of context lengths; prefill: cached prefix tokens; UNSIZED: no sizes
    lens_sum: int  # prefill/mixed: sum of the prefill sequence lengths
    lens_sq: int  # ... sum of their squares (causal attention FLOPs)
    lens_count: int  # ... how many sequences
    error: str | None  # the user's exception type, when the step raised


def lens_summary(phase: int, batch: int, tokens: int, seq_lens: Sequence[int] | None) -> tuple[int, int, int]:
    """``(sum, sum of squares, count)`` of a step's prefill sequence lengths.

    *seq_lens* when given; else a prefill's *tokens* spread as evenly as possible over *batch* sequences
    (servers often report only the total); a decode step has none.
    """
    if seq_lens is not None:
        s = sq = 0
        for n in seq_lens:
            s += n
            sq += n * n
        return s, sq, len(seq_lens)
    if phase != PREFILL or tokens < 0:
        return 0, 0, 0
    b = max(batch, 1)
    base, extra = divmod(tokens, b)
    return tokens, extra * (base + 1) ** 2 + (b - extra) * base * base, b


def split_evenly(tokens: int, requests: int) -> list[int]:
    """*tokens* over *requests* sequences as evenly as possible (engines report only the sums).

    The same split :func:`lens_summary` summarises for a prefill given only its tokens and batch.
    """
    n = max(int(requests), 1)
    base, extra = divmod(int(tokens), n)
    return [base + (1 if i < extra else 0) for i in range(n) if base or i < extra]


def check_count(field: str, value: Any) -> int:
    """*value* as a non-negative int no larger than :data:`MAX_COUNT`, else :class:`ConfigError` naming it.

    Accepts ``int`` and integer scalars (numpy's, torch's: anything with ``__index__``); refuses ``bool``,
    floats (``1.5``, NaN, inf), strings.
    """
    if type(value) is int:
        n = value
    elif isinstance(value, bool):
        raise ConfigError(f"{field}: expected a non-negative integer, got {value!r}")
    else:
        try:
            n = operator.index(value)
        except TypeError:
            raise ConfigError(f"{field}: expected a non-negative integer, got {value!r}") from None
    if n < 0:
        raise ConfigError(f"{field}: must be >= 0, got {value!r}")
    if n > MAX_COUNT:
        raise ConfigError(f"{field}: {value!r} is beyond any real step or request (at most 2**40)")
    return n


def check_lens(field: str, value: Any) -> tuple[int, ...]:
    """A sequence of sequence lengths, each checked like :func:`check_count`."""
    if isinstance(value, (str, bytes)):
        raise ConfigError(f"{field}: expected a sequence of integers, got {value!r}")
    try:
        items = tuple(value)
    except TypeError:
        raise ConfigError(f"{field}: expected a sequence of integers, got {value!r}") from None
    return tuple(check_count(field, n) for n in items)


def finite_seconds(value: Any) -> float | None:
    """*value* as seconds when it is a finite number in [0, 1e9), else None (an engine's missing or odd value)."""
    if isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if 0 <= f < 1e9 else None


def negative_seconds(value: Any) -> bool:
    """Whether *value* is a finite number below 0: a duration from a clock that went backwards (counted where
    it is refused), not an engine's missing value (None, NaN, an infinity: left out silently)."""
    if isinstance(value, bool) or value is None:
        return False
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return False
    return math.isfinite(f) and f < 0


def seconds_list(values: Any) -> tuple[tuple[float, ...], int]:
    """The finite, non-negative values of *values*, as floats, and how many were negative (ConfigError if
    it is not a sequence)."""
    if values is None or isinstance(values, (str, bytes)):
        raise ConfigError(f"expected a sequence of seconds, got {values!r}")
    try:
        items = list(values)
    except TypeError:
        raise ConfigError(f"expected a sequence of seconds, got {values!r}") from None
    return tuple(f for f in map(finite_seconds, items) if f is not None), sum(map(negative_seconds, items))


# ---- what the step core counted -----------------------------------------------------------------
# Capacities of the core's buffers: the C core is given these when it is built (perfsdk.stepcore.native_core).
RECENT = 4096  # steps kept per phase for stats() (RecentSteps)
SAMPLES = 4096  # sampled steps kept between two takes (for spans); beyond, counted in dropped_samples
WINDOW_FEED = 8192  # decode steps kept for a profiler window between two takes (the latest)
VALUE_FEED = 16384  # timed steps' values kept between two takes for an OpenTelemetry metrics sink; beyond, counted


class PhaseTotals(NamedTuple):
    """What one phase's steps added since the previous take (C: ``perfsdk._native.PhaseTotals``)."""

    steps: int
    errors: int  # steps that raised (the user's exception)
    step_counts: tuple[int, ...]  # per bucket of perfsdk.buckets.STEP, then +Inf (timed steps)
    step_sum: float  # seconds
    mbu_counts: tuple[int, ...]  # per bucket of perfsdk.buckets.UTIL, then +Inf
    mbu_sum: float
    mfu_counts: tuple[int, ...]
    mfu_sum: float
    bytes: float  # of timed steps only: bytes over step seconds stays exact
    flops: float  # the same
    tokens: int  # of every step

    def empty(self) -> bool:
        return self.steps == 0


class StepSample(NamedTuple):
    """One sampled step, for a span: host start/end, device seconds, sizes, utilisation (C:
    ``perfsdk._native.StepSample``)."""

    phase: int
    t0: int
    t1: int
    seconds: float | None
    batch: int
    tokens: int
    mbu: float | None
    mfu: float | None
    error: str | None


class WindowFeedEntry(NamedTuple):
    """A timed decode step, for a profiler window's steadiness check (C: ``perfsdk._native.WindowFeedEntry``)."""

    seconds: float
    batch: int
    mbu: float | None


class ValueFeedEntry(NamedTuple):
    """A timed step's values, for an OpenTelemetry metrics sink (C: ``perfsdk._native.ValueFeedEntry``)."""

    phase: int
    seconds: float
    mbu: float | None
    mfu: float | None


class StepTotals(NamedTuple):
    """Everything a step core's ``take()`` hands over (C: ``perfsdk._native.StepTotals``)."""

    phases: tuple[PhaseTotals, PhaseTotals, PhaseTotals]  # indexed by PREFILL, DECODE, MIXED
    samples: tuple[StepSample, ...]  # at most SAMPLES
    window_feed: tuple[WindowFeedEntry, ...]  # while a profiler window listens: the latest WINDOW_FEED
    value_feed: tuple[ValueFeedEntry, ...]  # while an OpenTelemetry metrics sink listens: at most VALUE_FEED
    value_feed_dropped: int  # timed steps beyond VALUE_FEED since the previous take

    def empty(self) -> bool:
        return all(p.empty() for p in self.phases) and not self.samples and not self.window_feed


class RecentSteps(NamedTuple):
    """One phase's last steps, for :meth:`perfsdk.Monitor.stats` (C: ``perfsdk._native.RecentSteps``)."""

    steps: int  # every step ever counted
    errors: int
    seconds: tuple[float, ...]  # the last RECENT timed steps' seconds
    mbu: tuple[float, ...]  # ... their MBUs (where known)
    mfu: tuple[float, ...]  # ... their MFUs


# ---- request events ----------------------------------------------------------------------------
class FirstToken(NamedTuple):
    """A request emitted its first token (TTFT is observed at once)."""

    request: Request


class Tokens(NamedTuple):
    """*n* tokens each for several requests at once, at *t_ns* (:meth:`perfsdk.Step.tokens`: the step's exit;
    :meth:`perfsdk.Monitor.tokens`: the call). The collector applies it to each request as
    :meth:`Request.tokens` would have at *t_ns* — the first emission is a TTFT, each later one an inter-token
    gap — in order with the request's other events. One event per step, whatever the batch."""

    requests: tuple[Request, ...]
    t_ns: int
    n: int


class Finished(NamedTuple):
    """A request finished: queue time, inter-token gaps, TPOT, duration and its span."""

    request: Request


class MeasuredLatencies(NamedTuple):
    """Times to first token and inter-token gaps an engine measured itself (seconds)."""

    ttft_s: tuple[float, ...]
    itl_s: tuple[float, ...]


class MeasuredRequest(NamedTuple):
    """A finished request an engine timed itself (:meth:`perfsdk.Monitor.record_finished`)."""

    end_ns: int
    e2e_s: float
    queue_s: float | None
    prefill_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    prompt_tokens: int
    output_tokens: int
    finish_reason: str
    error: str | None
    request_id: str | None


class Flush(NamedTuple):
    """A flush marker: the collector sets *done* once everything recorded before it is exported.

    ``sinks=False`` is a *drain* (a scrape's): export to the sinks, without waiting for them to deliver (a
    span exporter's network round trip is not a scrape's business), and export what the core has counted
    even when it could not catch up within *timeout*.
    """

    done: threading.Event
    timeout: float | None
    result: list[bool]  # [True] when everything before the marker was counted and exported in time
    sinks: bool = True


RequestEvent = FirstToken | Tokens | Finished | MeasuredLatencies | MeasuredRequest | Flush


class RequestQueue:
    """The bounded queue of request events, and what a :class:`Request` needs to record into it.

    ``push`` never blocks: beyond *capacity* events are dropped and counted (``dropped``). A flush
    marker is never dropped.
    """

    __slots__ = ("_events", "capacity", "clock", "dropped", "errors", "markers", "strict")

    def __init__(self, capacity: int, clock: Callable[[], int], errors: ErrorGuard, strict: bool) -> None:
        self._events: deque[RequestEvent] = deque()
        self.capacity = capacity
        self.clock = clock
        self.errors = errors
        self.strict = strict
        self.dropped = 0
        self.markers: list[Flush] = []  # flush markers queued and not yet read

    def push(self, event: RequestEvent) -> None:
        if len(self._events) >= self.capacity:
            self.dropped += 1  # the collector is behind: count it, never wait
            return
        self._events.append(event)

    def push_marker(self, event: Flush) -> None:
        self.markers.append(event)
        self._events.append(event)

    def pop(self) -> RequestEvent | None:
        try:
            ev = self._events.popleft()
        except IndexError:
            return None
        if type(ev) is Flush:
            self.markers.remove(ev)
        return ev

    def __len__(self) -> int:
        return len(self._events)

    def after_fork(self) -> None:
        """In a forked child: the queued events and flush markers are the parent's (its collector exports
        them, and the threads waiting on the markers are there), so the child's queue starts empty."""
        self._events = deque()
        self.markers = []
        self.dropped = 0

    def token_args(self, where: str, requests: Any, n: Any) -> tuple[tuple[Any, ...], int] | None:
        """*requests* as a tuple and *n* checked (as :meth:`Request.tokens` checks it), or None once refused.

        Strict, every item must be a :class:`Request` too (off strict mode the collector leaves out and counts
        anything else: the serving thread's cost must not grow with the batch)."""
        if type(n) is not int or n < 0 or n > MAX_COUNT:
            try:
                n = check_count("n", n)
            except ConfigError as e:
                self.refuse(where, str(e))
                return None
        if isinstance(requests, (str, bytes)):
            self.refuse(where, f"expected a sequence of requests, got {requests!r}")
            return None
        try:
            reqs = tuple(requests)
        except Exception:  # not iterable, or an iterator that fails: the serving code's problem, never raised
            self.refuse(where, f"expected a sequence of requests, got {requests!r}")
            return None
        if self.strict:
            for r in reqs:
                if not isinstance(r, Request):
                    self.refuse(where, f"expected perfsdk requests (Monitor.request()), got {r!r}")
        return reqs, n

    def tokens_now(self, where: str, requests: Any, n: Any) -> None:
        """*n* tokens each for *requests*, now: one :class:`Tokens` event (checked as :meth:`token_args` does)."""
        args = self.token_args(where, requests, n)
        if args is not None and args[0] and args[1]:
            self.push(Tokens(args[0], self.clock(), args[1]))

    def went_back(self, where: str, n: int) -> None:
        """*n* negative times (a clock that went backwards, the serving code's or an engine's): left out, counted
        in ``perfsdk_internal_errors_total`` and logged once — never raised, strict or not."""
        if n:
            self.errors.count_problem(
                f"{where} clock", "negative times (a clock that went backwards) are not observed", n
            )

    def refuse(self, where: str, problem: str) -> None:
        """A bad value from the serving code: raise when strict, else count and log once (never raise)."""
        if self.strict:
            raise ConfigError(f"{where}: {problem}")
        self.errors.record(ConfigError(problem), where)


# ---- finish reasons ----------------------------------------------------------------------------
#: The values of the request counter's ``finish_reason`` label: the OpenAI / GenAI semantic-convention reasons,
#: vLLM's ``abort`` (the client went away, or the engine dropped the request), ``cancelled`` (the task serving
#: it was cancelled), ``error``, and ``other`` for anything else (a bounded label, whatever an engine passes).
FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "abort", "cancelled", "error", "other")


def finish_reason_label(reason: str, error: str | None) -> str:
    """The ``finish_reason`` label of a finished request: ``error`` when it failed, else *reason* when it is
    one of :data:`FINISH_REASONS`, else ``other``."""
    if error is not None:
        return "error"
    r = reason.strip().lower() if isinstance(reason, str) else ""
    return r if r in FINISH_REASONS else "other"


def disconnect_reason(exc: BaseException) -> str | None:
    """``"abort"`` for a :class:`GeneratorExit` (a streaming response closed because its client went away),
    ``"cancelled"`` for a cancellation (asyncio's or concurrent.futures' ``CancelledError``, trio's
    ``Cancelled``), None for a real error."""
    if isinstance(exc, GeneratorExit):
        return "abort"
    for k in type(exc).__mro__:  # by name: importing asyncio here would cost every process perfsdk starts in
        if k.__name__ == "CancelledError" or (k.__name__ == "Cancelled" and k.__module__.startswith("trio")):
            return "cancelled"
    return None


_FINISH_LOCK = threading.Lock()  # finish() is once per request; a lock per request would cost more than one


def _new_finish_lock() -> None:
    # in a forked child another thread of the parent may have held it at the fork, and is not there to let go
    global _FINISH_LOCK
    _FINISH_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_finish_lock)


def _time_arg(q: RequestQueue, where: str, t_ns: Any) -> int | None:
    """The clock now, or *t_ns* when it is an int timestamp; None (refused) otherwise."""
    if t_ns is None:
        return q.clock()
    if type(t_ns) is int:
        return t_ns
    q.refuse(where, f"t_ns must be an int timestamp in nanoseconds, got {t_ns!r}")
    return None


class Request:
    """One request's life: arrival → scheduled → tokens → finish. Host clock.

    Created by :meth:`perfsdk.Monitor.request` at arrival. Thread-safe for one writer at a time (arrival on
    an HTTP thread, tokens on the engine thread is fine); :meth:`finish` may race (one call wins).

    An engine loop that emits a token for every running sequence each step records them with one call per
    step instead of one per request: ``step.tokens(running)`` inside the step (:meth:`perfsdk.Step.tokens`,
    stamped with the step's exit) or ``mon.tokens(running)`` (:meth:`perfsdk.Monitor.tokens`, stamped now).
    The collector then applies them to each request — TTFT, inter-token gaps, TPOT and counts exactly as
    :meth:`tokens` at that time would — so :attr:`output_tokens`, :attr:`token_ns` and
    :attr:`first_token_ns` lag on the serving thread until its next round (:meth:`perfsdk.Monitor.flush`
    waits for it). Finish a request after the step whose tokens it emitted (a token stamped after the
    finish is not the request's), and record one request's tokens one way, not both.
    """

    __slots__ = (
        "_exported",
        "_otel_parent",
        "_q",
        "arrival_ns",
        "error",
        "finish_ns",
        "finish_reason",
        "first_token_ns",
        "operation",
        "output_tokens",
        "prompt_tokens",
        "request_id",
        "scheduled_ns",
        "token_ns",
    )

    def __init__(
        self,
        queue: RequestQueue,
        prompt_tokens: int,
        arrival_ns: int,
        operation: str,
        request_id: str | None,
        otel_parent: Any,
    ) -> None:
        self._q = queue
        self.prompt_tokens = prompt_tokens
        self.arrival_ns = arrival_ns
        self.scheduled_ns: int | None = None
        self.first_token_ns: int | None = None
        self.token_ns: list[int] = []
        self.output_tokens = 0
        self.finish_ns: int | None = None
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.operation = operation
        self.request_id = request_id
        self._otel_parent = otel_parent
        self._exported = False  # the collector has read its Finished event: later tokens are not its

    def scheduled(self, t_ns: int | None = None) -> None:
        """The request left the waiting queue (its queue time ends, prefill may start).

        A time before the request's arrival (a *t_ns*, or a clock that went backwards) is refused and counted:
        no queue time is observed for it.
        """
        if self.scheduled_ns is None:
            t = _time_arg(self._q, "request.scheduled", t_ns)
            if t is None:
                return
            if t < self.arrival_ns:
                self._q.refuse("request.scheduled", f"time {t} is before the request's arrival ({self.arrival_ns})")
                return
            self.scheduled_ns = t

    def tokens(self, n: int = 1, t_ns: int | None = None) -> None:
        """*n* tokens were emitted now: the first call sets TTFT, each later one is an inter-token gap."""
        if type(n) is not int or n < 0 or n > MAX_COUNT:
            try:
                n = check_count("n", n)
            except ConfigError as e:
                self._q.refuse("request.tokens", str(e))
                return
        if n == 0 or self.finish_ns is not None:
            return  # nothing emitted, or a late token after finish(): the request's record is closed
        q = self._q
        t = q.clock() if t_ns is None else _time_arg(q, "request.tokens", t_ns)
        if t is None:
            return
        if t < self.arrival_ns or (self.token_ns and t < self.token_ns[-1]):
            q.refuse("request.tokens", f"t_ns {t} is before the request's arrival or its previous token")
            return
        self.output_tokens += n
        self.token_ns.append(t)
        if self.first_token_ns is None:
            self.first_token_ns = t
            q.push(FirstToken(self))

    def finish(self, reason: str = "stop", error: BaseException | str | None = None, t_ns: int | None = None) -> None:
        """Record the end (``"stop"``, ``"length"``, ``"abort"``, …, or an error); later calls are ignored.

        An *error* that is a client going away is not an error: a :class:`GeneratorExit` (a streaming response
        closed mid-stream) finishes the request as ``"abort"``, a ``CancelledError`` as ``"cancelled"``
        (:func:`disconnect_reason`). A *t_ns* before the request's arrival or its last token is refused
        (counted, the request finishes now instead). A clock that went backwards past either makes no negative
        duration either: the collector observes neither the request's duration nor its TPOT then, and counts it.
        """
        q = self._q
        t = _time_arg(q, "request.finish", t_ns)
        if t is not None and t_ns is not None:
            last = self.token_ns[-1] if self.token_ns else self.arrival_ns
            if t < last:
                q.refuse(
                    "request.finish",
                    f"t_ns {t_ns} is before the request's arrival ({self.arrival_ns}) or its last token ({last})",
                )
                t = None
        if t is None:
            t = q.clock()
        with _FINISH_LOCK:
            if self.finish_ns is not None:
                return
            self.finish_ns = t
        if isinstance(error, BaseException) and (gone := disconnect_reason(error)) is not None:
            error, reason = None, gone
        if error is not None:
            self.error = error if isinstance(error, str) else type(error).__qualname__
            reason = "error" if reason == "stop" else reason
        self.finish_reason = reason if isinstance(reason, str) else str(reason)
        q.push(Finished(self))

    @property
    def finished(self) -> bool:
        return self.finish_ns is not None

    def __enter__(self) -> Request:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:  # a client that went away finishes as "abort" / "cancelled" (finish() tells them apart)
            self.finish("error", error=exc)
        else:
            self.finish("stop")


class NullRequest(Request):
    """What a disabled Monitor hands out: every method does nothing, every field reads as empty."""

    def __init__(self) -> None:
        self.prompt_tokens = self.output_tokens = self.arrival_ns = 0
        self.scheduled_ns = self.first_token_ns = self.finish_ns = None
        self.token_ns = []
        self.finish_reason = self.error = self.request_id = None
        self.operation = ""
        self._otel_parent = None
        self._exported = True
        self._q = None  # type: ignore[assignment]  # records into no queue

    def scheduled(self, t_ns: int | None = None) -> None:
        return None

    def tokens(self, n: int = 1, t_ns: int | None = None) -> None:
        return None

    def finish(self, reason: str = "stop", error: BaseException | str | None = None, t_ns: int | None = None) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        return None


NULL_REQUEST = NullRequest()
