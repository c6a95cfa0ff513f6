"""The hot path: what ``with mon.decode(...)`` runs on the serving thread, in Python (the reference).

Two implementations of one algorithm, chosen once per Monitor: ``perfsdk._native.Step`` (C; what runs
wherever the extension was built) and :class:`Step` here — the specification, and the fallback. Both
read one :class:`HotState` (the C ``Hot`` is built from it, field by field; a Monitor's
:class:`~perfsdk.recorder.Recorder` owns both and chooses one), both pass the same tests
(``tests/test_monitor.py``, ``tests/test_cuda_steps.py`` run each test on both), and both hand their
steps to a step core (:mod:`perfsdk.stepcore`) through :class:`~perfsdk.records.StepRecord` only.

Per step, on the serving thread:

1. *enter* — skip everything inside CUDA-graph capture or a torch.compile trace (that code runs once,
   at capture time); call the profiler window's hook while it wants steps; take an *end* event from
   the pool and either start from this thread's previous step's end event (same stream, no other step
   exited since, entered within ``chain_gap_us`` of its exit: one record per step) or record a fresh
   start; push an NVTX range when a tool is attached;
2. *exit* — pop the NVTX range, read the clock, record the end event, keep it as the thread's last end
   (:class:`LastEnd`, in a ``threading.local``), and push one :class:`StepRecord` to the core —
   a bounded append that drops and counts when full, never waits — and, when the step was told which
   requests it emitted tokens for (:meth:`Step.tokens`), one :class:`~perfsdk.records.Tokens` event for
   all of them to the request queue, stamped with the exit's clock read: one call and one append per step
   whatever the batch (the collector applies it to each request).

Events are counted references (:class:`~perfsdk.timing.EventPool`): a step holds its start and end, a
thread holds its last end; the core lets go of a step's two once it has read them. Nothing here waits
for the GPU, and nothing raises into serving code except the user's own exceptions (which propagate
unchanged; the step is recorded with their type as its error) and, in strict mode, bad sizes.
"""

from __future__ import annotations

import abc
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from perfsdk._guard import ErrorGuard
from perfsdk.errors import ConfigError
from perfsdk.records import (
    DECODE,
    HOST,
    MAX_COUNT,
    NO_TOKENS,
    PHASE_CODES,
    TIMED,
    UNTIMED,
    Request,
    RequestQueue,
    StepRecord,
    Tokens,
    lens_summary,
)
from perfsdk.sizes import check_sizes

__all__ = ["CUDA_ERROR_INVALID_CONTEXT", "HotState", "LastEnd", "Step", "ThreadSteps"]

F = TypeVar("F", bound=Callable[..., Any])

CUDA_ERROR_INVALID_CONTEXT = 201  # a driver call on a thread with no current context

_IDLE, _OPEN, _SKIPPED = 0, 1, 2
_new_record = tuple.__new__
_TOKEN_ARGS = (list, tuple)  # step.tokens()'s requests as they come from serving code: taken as they are


def _never() -> bool:
    return False


@dataclass(eq=False)
class HotState:
    """Everything the hot path uses, bound once per Monitor; the C ``Hot`` reads the same fields.

    Owned by the Monitor's :class:`~perfsdk.recorder.Recorder`, which alone writes it (``window`` through
    ``Recorder.set_window``). The counters at the end are this (Python) hot path's own; the C one counts
    in C, starting from ``event_pool_empty`` when it is bound.
    """

    core: Any  # the step core: push(StepRecord) -> bool (C: its ring)
    errors: ErrorGuard
    local: threading.local  # .h: this thread's LastEnd
    clock: Callable[[], int] | None  # None: time.perf_counter_ns (C reads CLOCK_MONOTONIC itself)
    capturing: Callable[[], bool] | None  # inside graph capture or a torch.compile trace? (None: never)
    is_capturing_fn: int = 0  # C: cuStreamIsCapturing's address (asked about the step's stream)
    stream: Callable[[], int] | None = None  # the current stream's handle; None: host timing
    record_on: Callable[[Any, int], int] | None = None  # record(event, stream) -> CUresult (0: success)
    record_fn: int = 0  # C: cuEventRecord's address
    raise_for: Callable[[int], None] | None = None  # raise for a failed record's code
    ensure_context: Callable[[], None] | None = None  # make the events' context current on this thread
    pool: Any = None  # the Python EventPool (the C core keeps its own)
    nvtx_on: bool = False
    nvtx_push: Callable[[str, int], Any] = lambda phase, batch: None
    nvtx_pop: Callable[[], Any] = lambda: None
    window: Any = None  # the profiler window (its .wants_steps is read every step), or None
    decorate: Callable[[Any, Any], Any] | None = None  # (step, fn) -> fn with each call one step
    slow_step: Callable[..., Any] | None = None  # the validating constructor (odd sizes)
    chain_gap_ns: int = 10_000
    every: int = 1  # time every N-th step (timing_every)
    strict: bool = False
    requests: RequestQueue | None = None  # where step.tokens() records (None: nowhere)
    # the Python hot path's counters
    event_pool_empty: int = 0  # steps counted but not timed because every event was in flight
    last_exit: int = 0  # exit number of the latest timed step (0: an untimed one came after)
    exits: int = 0  # the latest exit number handed out (timed or not)
    count: int = 0  # steps entered (for every)
    exit_seq: Any = field(default_factory=lambda: itertools.count(1))


class LastEnd:
    """One serving thread's last timed step: its end event (a possible next start), stream, exit time, number.

    When the thread ends its ``threading.local`` goes, and with it this object: the event's reference is
    let go of (the step that ended with it may still hold it until the core has read it).
    """

    __slots__ = ("ev", "pool", "seq", "stream", "t1")

    def __init__(self, pool: Any) -> None:
        self.ev: Any = None
        self.stream = 0
        self.t1 = 0
        self.seq = -1
        self.pool = pool

    def __del__(self) -> None:
        ev = self.ev
        if ev is not None and self.pool is not None:
            try:
                self.pool.unref(ev)
            except Exception:
                pass


class ThreadSteps(threading.local):
    """Per serving thread: a :class:`LastEnd` (or the C hot path's), made by *factory* with *pool*.

    ``threading.local`` calls ``__init__`` once per thread, with these arguments.
    """

    def __init__(self, factory: Callable[[Any], Any], pool: Any) -> None:
        self.h = factory(pool)


class Step(metaclass=abc.ABCMeta):  # noqa: B024 (ABC only so that the C Step registers as a Step)
    """One prefill, decode or mixed step: a context manager and a decorator.

    Made by ``Monitor.prefill/decode/mixed``. As a context manager each ``with`` times one step (``with
    mon.decode(...)`` builds a fresh one per step); the same object may be re-entered while open on the
    *same* thread (nested), but is not meant to be shared by threads. As a decorator every call is one
    step, and any size given as a callable is called with the wrapped function's arguments. (An ``async
    def`` step's range spans its awaits: keep device work of one step inside one coroutine.)

    ``isinstance(step, perfsdk.Step)`` holds for the C implementation too.
    """

    __slots__ = (
        "_batch",
        "_code",
        "_context_tokens",
        "_dynamic",
        "_emitted",
        "_ev",
        "_hot",
        "_lens",
        "_outer",
        "_phase",
        "_seq_lens",
        "_state",
        "_stream",
        "_t0",
        "_tokens",
    )

    def __init__(self, hot: HotState, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> None:
        self._hot = hot
        self._phase = phase
        code = self._code = PHASE_CODES[phase]
        # fast path: plain ints; anything else goes through validation (and may be a callable)
        if (
            type(batch) is int
            and 0 <= batch <= MAX_COUNT
            and type(context_tokens) is int
            and 0 <= context_tokens <= MAX_COUNT
            and (tokens is None or (type(tokens) is int and 0 <= tokens < 2**31))
            and seq_lens is None
        ):
            self._batch, self._context_tokens, self._seq_lens, self._dynamic = batch, context_tokens, None, False
            self._tokens = NO_TOKENS if tokens is None else tokens
        else:
            self._batch, self._tokens, self._context_tokens, self._seq_lens, self._dynamic = check_sizes(
                phase, batch, tokens, context_tokens, seq_lens
            )
        # what the step's cost needs of its sequence lengths, once (as the C step does)
        self._lens = (
            (0, 0, 0)
            if code == DECODE or self._dynamic
            else lens_summary(code, self._batch, self._tokens, self._seq_lens)
        )
        self._state = _IDLE
        self._t0 = 0
        self._ev: Any = None  # None: no events; False: not timed; (start, end): held events
        self._stream = 0
        self._outer: list[tuple[int, int, Any, int]] | None = None  # enclosing entries when re-entered
        self._emitted: list[tuple[tuple[Request, ...], int]] | None = None  # tokens(): pushed at exit

    @property
    def phase(self) -> str:
        return self._phase

    @property
    def sizes(self) -> tuple[Any, Any, Any, Any]:
        """``(batch, tokens, context_tokens, seq_lens)``; tokens is None when not given."""
        return (self._batch, None if self._tokens == NO_TOKENS else self._tokens, self._context_tokens, self._seq_lens)

    def tokens(self, requests: Sequence[Request], n: int = 1) -> None:
        """This step emitted *n* tokens (default 1) for each of *requests*: one call per step, whatever the batch.

        Recorded with the step: at its exit, one :class:`~perfsdk.records.Tokens` event for all of them, stamped
        with the exit's clock read — each request's token time, as a ``req.tokens(n)`` per request right after the
        step would have been. The collector applies it to each request (the first token: TTFT; later ones:
        inter-token gaps; TPOT and counts at finish), in order with the requests' other events, so finish a
        request after the step that emitted its last token. Its ``output_tokens``, ``token_ns`` and
        ``first_token_ns`` are the collector's to update: on the serving thread they lag until its next round
        (:class:`~perfsdk.records.Request`). Called outside ``with``, the tokens are recorded now.
        """
        hot = self._hot
        q = hot.requests
        if q is None:
            return
        if hot.strict or type(n) is not int or not 0 < n <= MAX_COUNT or type(requests) not in _TOKEN_ARGS:
            args = q.token_args("step.tokens", requests, n)
            if args is None:
                return
            reqs, n = args
        else:
            reqs = tuple(requests)
        if not reqs or not n:
            return
        if self._state == _IDLE:  # not inside the step: now
            q.push(_new_record(Tokens, (reqs, q.clock(), n)))
        elif self._emitted is None:
            self._emitted = [(reqs, n)]
        else:
            self._emitted.append((reqs, n))

    def _emit(self, t: int | None) -> None:
        """Push the tokens this step was told of (:meth:`tokens`), stamped *t* (None: a clock read now)."""
        hot = self._hot
        emitted, self._emitted = self._emitted, None
        try:
            q = hot.requests
            assert q is not None
            assert emitted is not None
            if t is None:
                t = q.clock()
            for reqs, n in emitted:
                q.push(_new_record(Tokens, (reqs, t, n)))
        except Exception as e:
            hot.errors.record(e, f"{self._phase}.tokens")

    def __enter__(self) -> Step:
        hot = self._hot
        if self._dynamic:
            raise ConfigError(
                f"{self._phase}: sizes given as callables only work in the decorator form (@mon.{self._phase}(...))"
            )
        if self._state != _IDLE:  # re-entered while open (nested): keep the outer entry
            if self._outer is None:
                self._outer = []
            self._outer.append((self._state, self._t0, self._ev, self._stream))
            self._ev = None  # the outer entry's events are not this entry's to let go of
            self._state = _IDLE
        try:
            if hot.capturing is not None and hot.capturing():
                self._state = _SKIPPED  # capture/trace time: the work is not really running now
                return self
            w = hot.window
            if w is not None and w.wants_steps:
                w.step_begin(self._phase)
            clock = hot.clock or time.perf_counter_ns
            pool = hot.pool
            if pool is None:
                self._t0 = clock()
            elif hot.every > 1 and (hot.count + 1) % hot.every != 0:
                hot.count += 1
                self._ev = False  # not sampled (timing_every): counted, not timed
                self._t0 = clock()
            else:
                hot.count += 1
                self._enter_timed(hot, pool, clock)
            self._state = _OPEN
            if hot.nvtx_on:  # last, so that a failure above leaves no range open
                hot.nvtx_push(self._phase, self._batch)
        except Exception as e:
            hot.errors.record(e, f"{self._phase}.__enter__")
            self._abandon()
        return self

    def _enter_timed(self, hot: HotState, pool: Any, clock: Callable[[], int]) -> None:
        """Take the end event first; then either start from this thread's previous step's end (same stream,
        no other step exited since, within chain_gap_us: one record per step) or record a fresh start."""
        end = pool.acquire()
        if end is None:
            hot.event_pool_empty += 1  # every event in flight: counted, not timed
            self._ev = False
            self._t0 = clock()
            return
        self._ev = (None, end)  # held from here on: let go of if anything below fails
        assert hot.stream is not None
        stream = self._stream = hot.stream()  # the end is recorded on the same stream
        h = hot.local.h
        now = self._t0 = clock()
        last = h.ev
        if last is not None and h.seq == hot.last_exit and h.stream == stream and now - h.t1 < hot.chain_gap_ns:
            h.ev = None  # the thread's hold on it becomes this step's
            self._ev = (last, end)
            return
        start = pool.acquire()
        if start is None:
            self._ev = False
            pool.unref(end)  # never recorded: nobody else knows it
            hot.event_pool_empty += 1
            return
        self._ev = (start, end)
        if last is not None:
            h.ev = None
            pool.unref(last)  # the thread no longer holds it; the step that ended with it may
        _record(hot, start, stream)

    def _abandon(self) -> None:
        """After an internal error: let go of the events and record nothing for this entry."""
        ev, self._ev, self._state = self._ev, None, _SKIPPED
        if ev:
            _let_go(self._hot, ev)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        hot = self._hot
        state, t0, ev, stream = self._state, self._t0, self._ev, self._stream
        if self._outer:
            self._state, self._t0, self._ev, self._stream = self._outer.pop()
        else:
            self._state, self._ev = _IDLE, None
        if state != _OPEN:
            if self._emitted is not None:  # not timed (capture time, an internal error): still the requests' tokens
                self._emit(None)
            return
        exit_t = None
        try:
            if hot.nvtx_on:  # first: the range closes even if what follows fails
                try:
                    hot.nvtx_pop()
                except Exception as e:  # the step is still timed and counted
                    hot.errors.record(e, f"{self._phase}.__exit__ nvtx")
            # A timed step reads the clock after its end record, not before: a record that waited for room in a
            # full launch queue (graphs replayed back to back) still sits right behind the step's work, and the
            # chain gap to the next step must count from its return.
            clock = hot.clock or time.perf_counter_ns
            t1 = 0 if ev else clock()
            timing = HOST if ev is None else UNTIMED
            start = end = None
            if ev:
                start, end = ev
                before = hot.exits
                try:
                    _record(hot, end, stream)
                    t1 = clock()
                except Exception:
                    _let_go(hot, ev)  # unrecorded, or recorded and never to be read
                    raise
                h = hot.local.h
                inner = h.ev  # a nested step's end on this thread: the thread lets go of it
                hot.pool.hold(end)  # the thread holds it too: a possible next start
                h.ev, h.stream, h.t1 = end, stream, t1
                seq = hot.exits = next(hot.exit_seq)
                # another thread's step exited while the record ran (a record that releases the GIL): its
                # GPU work may sit after this end event, so the next step must not start from it
                h.seq = seq if seq == before + 1 else -1
                hot.last_exit = seq
                if inner is not None:
                    hot.pool.unref(inner)
                timing = TIMED
            elif ev is False:
                hot.exits = next(hot.exit_seq)  # every exit is numbered (see above)
                hot.last_exit = 0  # an untimed step: the next timed one must not start before it
            exit_t = t1
            s, sq, n = self._lens
            # tuple.__new__ skips the NamedTuple's Python-level __new__ (the same object, a frame cheaper)
            error = None if exc_type is None else exc_type.__qualname__
            rec = _new_record(
                StepRecord,
                (
                    self._code,
                    timing,
                    t0,
                    t1,
                    start,
                    end,
                    self._batch,
                    self._tokens,
                    self._context_tokens,
                    s,
                    sq,
                    n,
                    error,
                ),
            )
            if not hot.core.push(rec) and ev:
                _let_go(hot, ev)  # dropped (the core is behind): the step's holds end here
            w = hot.window
            if w is not None and w.wants_steps:
                w.step_end(self._phase)
        except Exception as e:
            hot.errors.record(e, f"{self._phase}.__exit__")
        if self._emitted is not None:
            self._emit(exit_t)

    def __call__(self, fn: F) -> F:
        hot = self._hot
        if hot.decorate is None:
            raise ConfigError("this step cannot decorate (the Monitor is not fully built)")
        return cast(F, hot.decorate(self, fn))

    def __repr__(self) -> str:
        return f"<perfsdk step {self._phase} batch={self._batch!r}>"


class NoStep(Step):
    """A step that records nothing: a disabled Monitor's, or one refused for a bad size (counted) — whose
    :meth:`tokens` still records the requests' tokens (now) when given the Monitor's *requests* queue."""

    __slots__ = ("_requests",)

    def __init__(self, phase: str, requests: RequestQueue | None = None) -> None:
        self._requests = requests
        self._emitted = None
        self._phase = phase
        self._code = PHASE_CODES.get(phase, 0)
        self._lens = (0, 0, 0)
        self._batch, self._tokens, self._context_tokens, self._seq_lens = 0, NO_TOKENS, 0, None
        self._dynamic = False
        self._state = _IDLE
        self._outer = None

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        return None

    def tokens(self, requests: Sequence[Request], n: int = 1) -> None:
        if self._requests is not None:
            self._requests.tokens_now("step.tokens", requests, n)

    def __call__(self, fn: F) -> F:
        return fn


def _record(hot: HotState, ev: Any, stream: int) -> None:
    """Record *ev* on *stream*; once more after making the context current on a thread without one."""
    assert hot.record_on is not None
    assert hot.raise_for is not None
    r = hot.record_on(ev, stream)
    if not r:
        return
    # A new engine thread whose first CUDA call is a perfsdk step has no current context
    # (CUDA_ERROR_INVALID_CONTEXT): make the events' context current, as the runtime would on the
    # thread's first call, and try again. Off the steady path: only after a failure.
    if r == CUDA_ERROR_INVALID_CONTEXT and hot.ensure_context is not None:
        hot.ensure_context()
        r = hot.record_on(ev, stream)
        if not r:
            return
    hot.raise_for(r)


def _let_go(hot: HotState, ev: tuple[Any, Any]) -> None:
    """A step that will not be pushed (an internal error) lets go of its events."""
    pool = hot.pool
    if pool is None:
        return
    for e in ev:
        if e is not None:
            try:
                pool.unref(e)
            except Exception:
                pass
