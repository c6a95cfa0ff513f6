"""The public entry point: :class:`Monitor`, its :class:`Request` and :class:`Phase`.

Wrap the request lifecycle (host clock: what users feel) and every prefill,
decode or mixed step (device clock: what the GPU did)::

    import perfsdk

    mon = perfsdk.Monitor(
        model=perfsdk.ModelSpec.named("llama-3-8b"),   # or ModelSpec.from_hf_config(cfg), or None
        hardware="auto",                                # detect the GPU; or "h100-sxm", or a HardwareSpec
        service="my-llm",
    )
    mon.serve_metrics(port=9400)                        # Prometheus /metrics on 127.0.0.1:9400

    # a request: TTFT, inter-token latency, TPOT, queue time, duration, and a span
    with mon.request(prompt_tokens=512) as req:
        req.scheduled()                                 # leaves the waiting queue
        for tok in generate():
            req.tokens(1)                               # first call: TTFT; later ones: ITL
    # or, across callbacks / asyncio tasks: req = mon.request(...); ...; req.finish("length")

    # a step: device time, MBU (decode), MFU (prefill), an NVTX range
    with mon.prefill(tokens=512, batch=1):
        logits = model(prompt)
    with mon.decode(batch=8, context_tokens=sum(ctx_lens)):
        graph.replay()                                  # wrap *around* replay, never inside capture
    with mon.mixed(prefill_seq_lens=[256], decode_batch=7, context_tokens=7000):
        step()                                          # chunked prefill + decode: MBU and MFU

    @mon.decode(batch=lambda ids, **_: ids.shape[0])    # decorator: values from the call's arguments
    def decode_step(ids, ...): ...

    # values an engine measured itself (perfsdk.engines.vllm does this for vLLM)
    mon.record_step("decode", 0.021, batch=8, context_tokens=8192)
    mon.record_latencies(ttft_s=[0.12], itl_s=[0.021, 0.020])
    mon.record_finished(e2e_s=1.9, queue_s=0.01, prefill_s=0.11, output_tokens=90)

    mon.flush()                                         # everything recorded so far is exported
    mon.close()

The serving thread only records — a clock read, a pooled CUDA event (two when a
step does not follow the previous one closely), an NVTX push/pop while Nsight is
attached, and one append to a bounded queue; the collector thread
(:mod:`perfsdk.collector`) computes and exports. Nothing here waits for the
GPU, and nothing here raises into serving code except the user's own
exceptions (which propagate unchanged and are recorded as errors) and
configuration mistakes at construction. Where perfsdk's C extension is built,
the step wrappers' enter/exit run in C (``perfsdk/_hotpath.c``; :class:`Phase`
below is the same algorithm in Python, and the fallback).

``perfsdk.Monitor()`` with no arguments works: host timers (or CUDA events
when torch is already imported and sees a GPU), MBU/MFU off with one warning
saying what to pass. Settings also come from the environment (explicit
arguments win): ``PERFSDK_ENABLED=0``, ``PERFSDK_MODEL`` (a known model name),
``PERFSDK_HARDWARE``, ``PERFSDK_SERVICE``, ``PERFSDK_MODEL_NAME``,
``PERFSDK_METRICS_PORT`` (serve /metrics at start; under torchrun each rank on that port plus its
``LOCAL_RANK``, so the ranks of one host do not collide), ``PERFSDK_NVTX``,
``PERFSDK_OTEL``, ``PERFSDK_TIMING``, ``PERFSDK_CUDA_EVENTS``, ``PERFSDK_QUEUE_SIZE``,
``PERFSDK_STEP_SPAN_RATE``.
"""

from __future__ import annotations

import abc
import functools
import inspect
import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from perfsdk._guard import ErrorGuard
from perfsdk.errors import ConfigError
from perfsdk.model import ModelSpec

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from perfsdk.collector import Collector
    from perfsdk.hardware import HardwareSpec
    from perfsdk.metrics_server import MetricsServer

__all__ = ["Monitor", "Phase", "Request"]

log = logging.getLogger("perfsdk")

F = TypeVar("F", bound=Callable[..., Any])

# record tags (tuples on the queue, read by the collector)
STEP = "s"
FIRST_TOKEN = "f"
FINISH = "r"
FLUSH = "x"
MEASURED = "o"  # values measured elsewhere (an engine's own timers): see Monitor.record_latencies/record_finished
_PHASES = ("prefill", "decode", "mixed")

_UNSET: Any = object()
_FINISH_LOCK = threading.Lock()  # finish() is once per request; a lock per request would cost more than one
_SKIPPED = -1  # a Phase entry that records nothing (inside CUDA-graph capture, or after an internal error)
_TRUE = ("1", "true", "yes", "on")


class _LastEnd:
    """One serving thread's last timed step: its end event (a possible next start), stream, host end, exit number.

    When the thread ends its thread-local state goes, and with it this object: the event is handed to the
    Monitor's orphans, to be given back to the pool once the collector has read past it.
    """

    __slots__ = ("_orphan", "ev", "seq", "stream", "t1")

    def __init__(self, orphan: Callable[..., None]) -> None:
        self.ev: Any = None
        self.stream = 0
        self.t1 = 0
        self.seq = -1
        self._orphan = orphan

    def __del__(self) -> None:
        ev = self.ev
        if ev is not None:
            try:
                self._orphan(ev)
            except Exception:
                pass


class _ThreadSteps(threading.local):
    """Per serving thread: a :class:`_LastEnd`, or the C hot path's ``LastEnd`` (*factory*).

    ``threading.local`` calls ``__init__`` once per thread, with these arguments.
    """

    def __init__(self, orphan: Callable[..., None], factory: Callable[[Callable[..., None]], Any] = _LastEnd) -> None:
        self.h = factory(orphan)


def _load_hotpath() -> Any:
    """The C hot path (``perfsdk._hotpath``), or None where it was not built."""
    try:
        from perfsdk import _hotpath

        return _hotpath
    except ImportError:
        return None


def _no_stream() -> int:
    return 0


def _no_record_on(event: Any, stream: int) -> None:
    return None


def _no_raise(code: int) -> None:
    return None


def _empty_pop() -> Any:
    raise IndexError


def _sampler(every: int) -> Callable[[], bool]:
    """``() -> bool``: True once every *every* calls (Monitor(timing_every=N))."""
    counter = itertools.count(1)
    return lambda: next(counter) % every == 0


def _env(name: str) -> str | None:
    v = os.environ.get(name)
    return v if v not in (None, "") else None


def _env_bool(name: str, default: bool | str) -> bool | str:
    v = _env(name)
    if v is None:
        return default
    return v.lower() in _TRUE if v.lower() in (*_TRUE, "0", "false", "no", "off") else v


class Request:
    """One request's life: arrival → scheduled → tokens → finish. Host clock.

    Created by :meth:`Monitor.request` at arrival. Thread-safe for one writer at a
    time (arrival on an HTTP thread, tokens on the engine thread is fine).
    """

    __slots__ = (
        "_mon", "_otel_parent", "arrival_ns", "error", "finish_ns", "finish_reason", "first_token_ns",
        "operation", "output_tokens", "prompt_tokens", "request_id", "scheduled_ns", "token_ns",
    )

    def __init__(self, mon: Monitor, prompt_tokens: int, arrival_ns: int, operation: str,
                 request_id: str | None, otel_parent: Any) -> None:
        self._mon = mon
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

    def scheduled(self, t_ns: int | None = None) -> None:
        """The request left the waiting queue (its queue time ends, prefill may start)."""
        if self.scheduled_ns is None:
            self.scheduled_ns = self._mon._clock() if t_ns is None else t_ns

    def tokens(self, n: int = 1, t_ns: int | None = None) -> None:
        """*n* tokens were emitted now: the first call sets TTFT, each later one is an inter-token gap."""
        if n <= 0 or self.finish_ns is not None:
            return  # nothing emitted, or a late token after finish(): the request's record is closed
        mon = self._mon
        t = mon._clock() if t_ns is None else t_ns
        self.output_tokens += n
        self.token_ns.append(t)
        if self.first_token_ns is None:
            self.first_token_ns = t
            mon._push((FIRST_TOKEN, self))

    def finish(self, reason: str = "stop", error: BaseException | str | None = None,
               t_ns: int | None = None) -> None:
        """Record the end (``"stop"``, ``"length"``, ``"abort"``, …, or an error); later calls are ignored.

        Safe to race (an abort on the HTTP thread, the last token on the engine thread): one call wins.
        """
        mon = self._mon
        t = mon._clock() if t_ns is None else t_ns
        with _FINISH_LOCK:
            if self.finish_ns is not None:
                return
            self.finish_ns = t
        if error is not None:
            self.error = error if isinstance(error, str) else type(error).__qualname__
            reason = "error" if reason == "stop" else reason
        self.finish_reason = reason
        mon._push((FINISH, self))

    @property
    def finished(self) -> bool:
        return self.finish_ns is not None

    def __enter__(self) -> Request:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.finish("error", error=exc)
        else:
            self.finish("stop")


class _NullRequest(Request):
    """What a disabled Monitor hands out: every method does nothing, every field reads as empty."""

    def __init__(self) -> None:
        self.prompt_tokens = self.output_tokens = self.arrival_ns = 0
        self.scheduled_ns = self.first_token_ns = self.finish_ns = None
        self.token_ns = []
        self.finish_reason = self.error = self.request_id = None
        self.operation = ""
        self._otel_parent = None

    def scheduled(self, t_ns: int | None = None) -> None:
        return None

    def tokens(self, n: int = 1, t_ns: int | None = None) -> None:
        return None

    def finish(self, reason: str = "stop", error: BaseException | str | None = None,
               t_ns: int | None = None) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        return None


def _check_count(field: str, value: Any) -> Any:
    """Validate a size given to a phase: a non-negative int, or a callable (decorator form)."""
    if type(value) is int and value >= 0:
        return value
    if callable(value):
        return value
    if isinstance(value, bool) or (type(value) is int and value < 0):
        raise ConfigError(f"{field}: expected a non-negative integer, got {value!r}")
    try:
        import operator

        as_int = operator.index(value)  # numpy and torch integer scalars
    except TypeError:
        raise ConfigError(f"{field}: expected a non-negative integer or a callable, got {value!r}") from None
    if as_int < 0:
        raise ConfigError(f"{field}: must be >= 0, got {value!r}")
    return as_int


class Phase(metaclass=abc.ABCMeta):  # noqa: B024 (ABC only so that the C Step registers as a Phase)
    """One prefill, decode or mixed step: a context manager and a decorator.

    This class is the reference implementation. Where perfsdk's C extension is built,
    ``Monitor.prefill/decode/mixed`` return its ``Step`` instead — the same algorithm
    without the interpreter's cost (``Monitor.hot_path`` says which; both pass the same
    tests, and ``isinstance(step, Phase)`` holds for both).

    As a context manager each ``with`` times one step (``with mon.decode(...)`` builds a
    fresh one per step); the same object may be re-entered while open on the *same*
    thread (nested), but is not meant to be shared by threads. As a decorator every
    call is one step with its own Phase, and any size given as a callable is called
    with the wrapped function's arguments. (An ``async def`` step's range spans its
    awaits: keep device work of one step inside one coroutine.)
    """

    __slots__ = ("_batch", "_ctx", "_dynamic", "_ev", "_mon", "_outer", "_phase", "_seq_lens", "_stream", "_t0",
                 "_tokens")

    def __init__(self, mon: Monitor, phase: str, batch: Any, tokens: Any, context_tokens: Any,
                 seq_lens: Any) -> None:
        self._mon = mon
        self._phase = phase
        dynamic = False
        # fast path: plain ints; anything else goes through validation (and may be a callable)
        if type(batch) is not int or batch < 0:
            batch = _check_count("batch", batch)
            dynamic = callable(batch)
        if tokens is not None and (type(tokens) is not int or tokens < 0):
            tokens = _check_count("tokens", tokens)
            dynamic = dynamic or callable(tokens)
        if type(context_tokens) is not int or context_tokens < 0:
            context_tokens = _check_count("context_tokens", context_tokens)
            dynamic = dynamic or callable(context_tokens)
        if seq_lens is not None and callable(seq_lens):
            dynamic = True
        self._batch = batch
        self._tokens = tokens
        self._ctx = context_tokens
        self._seq_lens = seq_lens
        self._dynamic = dynamic
        self._t0: int | None = None  # start of the open entry; _SKIPPED when capture/trace made it a no-op
        self._ev: Any = None
        self._stream = 0
        self._outer: list[tuple[int | None, Any, int]] | None = None  # enclosing entries when re-entered

    def __enter__(self) -> Phase:
        mon = self._mon
        if not mon._enabled:
            return self
        if self._dynamic:
            raise ConfigError(
                f"{self._phase}: sizes given as callables only work in the decorator form (@mon.{self._phase}(...))"
            )
        if self._t0 is not None:  # re-entered while open (nested): keep the outer entry
            if self._outer is None:
                self._outer = []
            self._outer.append((self._t0, self._ev, self._stream))
            self._ev = None  # the outer entry's events are not this entry's to give back
        try:
            if mon._capturing():
                self._t0 = _SKIPPED  # capture/trace time: the work is not really running now
                return self
            w = mon._window
            if w is not None and w.hot:
                w.step_begin(self._phase)
            pool = mon._pool
            if pool is None:
                self._t0 = mon._clock()
            elif mon._sampling and not mon._sampled():
                self._ev = False  # not sampled (timing_every): counted, not timed
                self._t0 = mon._clock()
            else:
                # The timed path, inlined: it runs every step. Take the end event first; then either
                # start from this thread's previous step's end (same stream, no other step exited since,
                # within chain_gap_us: one record per step) or take and record a fresh start, handing the
                # previous end to the collector to give back once the step that ended with it is read.
                try:
                    end = mon._pool_pop()
                except IndexError:
                    end = pool.acquire()
                if end is None:
                    mon._untimed_pool_empty += 1  # every event in flight: counted, not timed
                    self._ev = False
                    self._t0 = mon._clock()
                else:
                    self._ev = (None, end, ())  # owned from here on: given back if anything below fails
                    stream = self._stream = mon._stream()  # the end is recorded on the same stream
                    h = mon._local.h
                    now = self._t0 = mon._clock()
                    last = h.ev
                    if (last is not None and h.seq == mon._last_exit and h.stream == stream
                            and now - h.t1 < mon._chain_gap_ns):
                        h.ev = None
                        self._ev = (last, end, ())
                    else:
                        self._start_fresh(mon, pool, end, stream, h)
            if mon._nvtx_on:  # last, so that a failure above leaves no range open
                mon._nvtx_push(self._phase, self._batch)
        except Exception as e:
            mon._errors.record(e, f"{self._phase}.__enter__")
            self._abandon(mon)
        return self

    def _start_fresh(self, mon: Monitor, pool: Any, end: Any, stream: int, h: _LastEnd) -> None:
        """Record a fresh start event (the step does not follow the previous one closely)."""
        start = pool.acquire()
        if start is None:
            self._ev = False
            pool.release(end)  # never recorded: nobody else knows it
            mon._untimed_pool_empty += 1
            return
        last = h.ev
        if last is not None:
            h.ev = None
            self._ev = (start, end, (last,))
        else:
            self._ev = (start, end, ())
        r = mon._record_on(start, stream)
        if r:
            mon._raise_for(r)

    def _abandon(self, mon: Monitor) -> None:
        """After an internal error: give the events back and record nothing for this entry."""
        ev, self._ev, self._t0 = self._ev, None, _SKIPPED
        if ev:
            mon._give_back(ev)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        mon = self._mon
        if not mon._enabled:
            return
        try:
            t0, ev, stream = self._t0, self._ev, self._stream
            if self._outer:
                self._t0, self._ev, self._stream = self._outer.pop()
            else:
                self._t0 = self._ev = None
            if t0 is None or t0 == _SKIPPED:
                return
            if mon._nvtx_on:  # first: the range closes even if what follows fails
                try:
                    mon._nvtx_pop()
                except Exception as e:  # the step is still timed and counted
                    mon._errors.record(e, f"{self._phase}.__exit__ nvtx")
            try:
                t1 = mon._clock()
            except Exception:
                if ev:
                    mon._give_back(ev)  # the end was never recorded
                raise
            if ev:
                before = mon._exits
                try:
                    r = mon._record_on(ev[1], stream)
                    if r:
                        mon._raise_for(r)
                except Exception:
                    mon._give_back(ev)
                    raise
                h = mon._local.h
                inner = h.ev  # a nested step's end on this thread: given back after this step is read
                h.ev, h.stream, h.t1 = ev[1], stream, t1
                seq = mon._exits = next(mon._exit_seq)
                # another thread's step exited while the record ran (a record that releases the GIL): its
                # GPU work may sit after this end event, so the next step must not start from it
                h.seq = seq if seq == before + 1 else -1
                mon._last_exit = seq
                if inner is not None:
                    ev = (ev[0], ev[1], (*ev[2], inner))
            elif ev is False:
                mon._exits = next(mon._exit_seq)  # every exit is numbered (see above)
                mon._last_exit = 0  # an untimed step: the next timed one must not start before it
            q = mon._queue
            if len(q) < mon._queue_cap:
                q.append((STEP, self._phase, t0, t1, ev, self._batch, self._tokens, self._ctx, self._seq_lens,
                          None if exc_type is None else exc_type.__qualname__))
            else:
                mon._dropped += 1  # the collector is behind: count it, never wait
                if ev:
                    mon._orphan(ev[0], *ev[2])  # given back once the collector has read past them
            w = mon._window
            if w is not None and w.hot:
                w.step_end(self._phase)
        except Exception as e:
            mon._errors.record(e, f"{self._phase}.__exit__")

    def __call__(self, fn: F) -> F:
        sizes = (self._batch, self._tokens, self._ctx, self._seq_lens)
        return _decorate(self._mon, self._phase, sizes, self._dynamic, fn)


def _decorate(mon: Monitor, phase: str, sizes: tuple[Any, Any, Any, Any], dynamic: bool, fn: F) -> F:
    """*fn* with every call one step (the decorator form of a Phase or of the C hot path's Step)."""

    def fresh(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Phase:
        if mon._compiling():  # torch.compile traces this: the Python Phase, a no-op there
            return Phase(mon, phase, 0, None, 0, None)
        if not dynamic:
            return mon._new_step(phase, *sizes)
        try:
            vals = [v(*args, **kwargs) if callable(v) else v for v in sizes]
            return mon._new_step(phase, *vals)
        except Exception as e:  # a size callable that fails or returns a bad value: the call still runs
            mon._errors.record(e, f"@{phase} size callable")
            return mon._new_step(phase, 0, None, 0, None)

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            with fresh(args, kwargs):
                return await fn(*args, **kwargs)

        return cast(F, awrapper)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with fresh(args, kwargs):
            return fn(*args, **kwargs)

    return cast(F, wrapper)


class Monitor:
    """Instrument a serving loop; see the module docstring for a guide.

    Args:
        model: a :class:`~perfsdk.model.ModelSpec`, a known model name, or a Hugging Face config
            (dict or object). ``None``: no MBU/MFU.
        hardware: ``"auto"`` (detect the GPU), a datasheet name (``"h100-sxm"``), ``"calibrate"``
            (measured ceilings), a :class:`~perfsdk.hardware.HardwareSpec`, or ``None``.
        service: the service name (OpenTelemetry resource-independent; used in logs).
        model_name: the ``model`` label and span model name (default: the spec's name).
        registry: the Prometheus registry to write to (default: the global one).
        prometheus / otel: turn a sink off.
        nvtx: ``None``/``"auto"`` (default): NVTX ranges only when Nsight Systems/Compute is attached
            (``NVTX_INJECTION64_PATH``; they are free then, and skipped otherwise); ``True`` or ``"nvtx"``:
            always, through the ``nvtx`` package; ``"torch"``: through ``torch.cuda.nvtx``; ``False``: never.
        tracer_provider: an OpenTelemetry provider (default: the global one; none set costs nothing).
        timing: ``"auto"`` (CUDA events if torch is imported and sees a GPU), ``"cuda"``, ``"host"``.
        cuda_events: how CUDA events are made and recorded: ``"auto"`` (default: raw driver events through
            libcuda, the cheapest record, else torch's), ``"driver"``, ``"torch"`` (``torch.cuda.Event``).
        operation: GenAI operation name of request spans (``"chat"``, ``"text_completion"``, …).
        queue_size: records the collector may lag behind before dropping (never blocking).
        event_pool_size: timed steps in flight at most (two CUDA events each); beyond, steps are counted
            but not timed.
        chain_gap_us: a step entered within this many µs of the previous step's exit, on the same thread
            and stream, starts at the previous step's end event (one event record per step instead of two,
            which is most of the hot path's cost). Its device time then also covers any GPU work queued
            in that gap, as a whole decode iteration's would. ``0``: two events per step, always.
        timing_every: time every N-th step with CUDA events (default 1: all). The others still count as
            steps and tokens, but not in step time, MBU/MFU or the byte and FLOP counters (so that
            bytes / step seconds stays exact in PromQL): recording two events is much of the hot path's
            cost on a slow host, and N=4 spares three steps in four of it.
        step_span_rate: fraction of steps that get a span (0: none).
        compute_dtype: dtype whose dense peak MFU divides by (default: the model's dtype, bf16 for
            integer weights).
        rank: ``"auto"`` adds a ``rank`` label when this process is one rank of several; an int forces it.
        hot_path: ``"auto"`` (default): the step wrappers' enter/exit in C (``perfsdk._hotpath``) where the
            extension was built, else in Python; ``"c"`` (raise if not built) or ``"python"``. The two run
            the same algorithm; C costs a fraction of the CPU per step. ``Monitor.hot_path`` says which.
        clock: a ``() -> int`` nanosecond clock (tests); default ``time.perf_counter_ns``.
        enabled: ``False`` makes every call a no-op.
    """

    def __init__(
        self,
        model: ModelSpec | str | Mapping[str, Any] | Any | None = _UNSET,
        hardware: HardwareSpec | str | None = _UNSET,
        *,
        service: str | None = None,
        model_name: str | None = None,
        registry: CollectorRegistry | None = None,
        prometheus: bool = True,
        otel: bool | None = None,
        tracer_provider: Any = None,
        nvtx: bool | str | None = None,
        timing: str | None = None,
        cuda_events: str | None = None,
        operation: str = "text_completion",
        queue_size: int | None = None,
        event_pool_size: int = 1024,
        chain_gap_us: float = 10.0,
        timing_every: int = 1,
        step_span_rate: float | None = None,
        compute_dtype: str | None = None,
        rank: int | str | None = "auto",
        hot_path: str | None = None,
        clock: Callable[[], int] | None = None,
        poll_interval: float = 0.005,
        enabled: bool | None = None,
    ) -> None:
        self._errors = ErrorGuard()
        self._enabled = bool(_env_bool("PERFSDK_ENABLED", True) if enabled is None else enabled)
        self.service = service or _env("PERFSDK_SERVICE") or "perfsdk"
        self._clock: Callable[[], int] = clock or time.perf_counter_ns
        self._epoch_offset_ns = time.time_ns() - self._clock()
        self.operation = operation
        self._window: Any = None
        self._server: MetricsServer | None = None
        self._closed = False
        self._dropped = 0
        self._untimed_pool_empty = 0  # steps counted but not timed because every event was in flight
        self._collector: Collector | None = None

        self.model = self._resolve_model(_env("PERFSDK_MODEL") if model is _UNSET else model)
        spec_name = self.model.name if self.model else ""
        self.model_name = model_name or _env("PERFSDK_MODEL_NAME") or spec_name or "unknown"
        hw_arg = (_env("PERFSDK_HARDWARE") or "auto") if hardware is _UNSET else hardware
        self.hardware = self._resolve_hardware(hw_arg)
        self.compute_dtype = compute_dtype or self._default_compute_dtype()

        raw_qs = queue_size if queue_size is not None else _env("PERFSDK_QUEUE_SIZE") or 65536
        try:
            qs = int(raw_qs)
        except (TypeError, ValueError):
            raise ConfigError(f"queue_size: expected an integer, got {raw_qs!r}") from None
        if qs < 1:
            raise ConfigError(f"queue_size: must be >= 1, got {qs}")
        self._queue_cap = qs
        if type(timing_every) is not int or timing_every < 1:
            raise ConfigError(f"timing_every: must be an integer >= 1, got {timing_every!r}")
        self._timing_every = timing_every
        self._sampling = timing_every > 1
        self._sampled = _sampler(timing_every)
        self._queue: deque[tuple[Any, ...]] = deque()
        rate = float(step_span_rate if step_span_rate is not None else _env("PERFSDK_STEP_SPAN_RATE") or 0.0)
        if not 0.0 <= rate <= 1.0:
            raise ConfigError(f"step_span_rate: must be within [0, 1], got {rate}")
        if poll_interval <= 0:
            raise ConfigError(f"poll_interval: must be > 0, got {poll_interval}")

        # ---- choose implementations once (STYLE 3) ----
        from perfsdk import timing as _timing
        from perfsdk.nvtx_ranges import make_nvtx

        mode = (timing or _env("PERFSDK_TIMING") or "auto").lower()
        if mode not in ("auto", "cuda", "host"):
            raise ConfigError(f"timing: expected 'auto', 'cuda' or 'host', got {mode!r}")
        use_cuda = self._enabled and (mode == "cuda" or (mode == "auto" and _timing.cuda_usable()))
        if mode == "cuda" and not _timing.cuda_usable(force=True):
            raise ConfigError("timing='cuda': torch does not see a CUDA device here; use timing='host' or 'auto'")
        self.timing = "cuda" if use_cuda else "host"
        events = (cuda_events or _env("PERFSDK_CUDA_EVENTS") or "auto").lower()
        if events not in ("auto", "driver", "torch"):
            raise ConfigError(f"cuda_events: expected 'auto', 'driver' or 'torch', got {events!r}")
        if type(event_pool_size) is not int or event_pool_size < 1:
            raise ConfigError(f"event_pool_size: must be an integer >= 1, got {event_pool_size!r}")
        if not isinstance(chain_gap_us, (int, float)) or not 0 <= chain_gap_us <= 10_000:
            raise ConfigError(f"chain_gap_us: expected microseconds within [0, 10000], got {chain_gap_us!r}")
        self._chain_gap_ns = int(chain_gap_us * 1000)
        self._pool = _timing.EventPool(_timing.event_api(events), 2 * event_pool_size) if use_cuda else None
        self.cuda_events = self._pool.api.name if self._pool is not None else None
        self._orphans: deque[tuple[int, Any]] = deque()  # (read mark, event): given back by the collector
        self._local = _ThreadSteps(self._orphan)
        self._exit_seq = itertools.count(1)  # numbers timed exits; a step chains only onto the latest one
        self._last_exit = 0
        self._exits = 0  # the latest exit number handed out (timed or not)
        self._stream: Callable[[], int] = _no_stream
        self._record_on: Callable[[Any, int], Any] = _no_record_on
        self._raise_for: Callable[[int], None] = _no_raise
        self._pool_pop: Callable[[], Any] = _empty_pop
        if self._pool is not None:
            api = self._pool.api
            self._stream, self._record_on, self._raise_for = api.make_stream(), api.make_record_on(), api.raise_for
            self._pool_pop = self._pool._free.popleft  # the hot path's fast acquire (falls back to acquire())
        self._capturing = _timing.capture_check(use_cuda) if self._enabled else _timing._never
        # the C path checks graph capture itself; torch.compile tracing must be caught before a C call
        self._compile_check, self._cuda_capturing = _timing.capture_checks(use_cuda)
        self._compiling: Callable[[], bool] = _timing._never
        nvtx_choice = _env_bool("PERFSDK_NVTX", "auto") if nvtx is None else nvtx
        nv = make_nvtx(nvtx_choice if self._enabled else False)
        self.nvtx_backend = nv.backend
        self._nvtx_on = nv.backend != "none"  # the hot path skips even the no-op calls when off
        self._nvtx_push = nv.push
        self._nvtx_pop = nv.pop

        self._extra_label_values: tuple[str, ...] = ()
        extra_labels: tuple[str, ...] = ()
        r = _detect_rank(rank)
        if r is not None:
            extra_labels, self._extra_label_values = ("rank",), (str(r),)

        from perfsdk.sinks.prometheus import PrometheusSink, metric_set

        self.registry = registry
        self._prom: PrometheusSink | None = None
        if prometheus:
            from prometheus_client import REGISTRY

            self.registry = registry if registry is not None else REGISTRY
            self._prom = PrometheusSink(metric_set(self.registry, extra_labels), self.model_name,
                                        self._extra_label_values)
            if self.hardware is not None:
                flops = {k: float(v) for k, v in self.hardware.flops.items()}
                self._prom.set_hardware(self.hardware.name, self.hardware.memory_bandwidth, flops)

        self._otel = None
        use_otel = bool(_env_bool("PERFSDK_OTEL", True) if otel is None else otel)
        if use_otel and self._enabled:
            from perfsdk.sinks.otel import make_otel_sink

            self._otel = make_otel_sink(tracer_provider, rate)
            if self._otel is None and otel:
                from perfsdk.errors import MissingDependencyError

                raise MissingDependencyError("opentelemetry-api", "OpenTelemetry spans", extra="otel")
        self._capture_ctx = self._otel.capture_context if self._otel is not None else None

        hp = (hot_path or _env("PERFSDK_HOT_PATH") or "auto").lower()
        if hp not in ("auto", "c", "python"):
            raise ConfigError(f"hot_path: expected 'auto', 'c' or 'python', got {hp!r}")
        if hp == "c" and _load_hotpath() is None:
            raise ConfigError("hot_path='c': perfsdk's C extension (perfsdk._hotpath) is not built in this install; "
                              "reinstall with a C compiler and the Python headers, or use hot_path='python'")
        self.hot_path = "c" if hp != "python" and _load_hotpath() is not None else "python"
        self._hot: Any = None
        self._bind_hot()

        self._warn_missing()
        if self._enabled:
            from perfsdk.collector import Collector

            self._collector = Collector(self, poll_interval)
            self._collector.start()
        port = _env("PERFSDK_METRICS_PORT")
        if port is not None and self._enabled:
            self.serve_metrics(port=_rank_port(port), addr=_env("PERFSDK_METRICS_ADDR") or "127.0.0.1")

    # ---- construction helpers ----------------------------------------
    @staticmethod
    def _resolve_model(model: Any) -> ModelSpec | None:
        if model is None or isinstance(model, ModelSpec):
            return model
        if isinstance(model, str):
            return ModelSpec.named(model)
        if isinstance(model, Mapping) or hasattr(model, "to_dict"):
            return ModelSpec.from_hf_config(model)
        raise ConfigError(
            f"model: expected a ModelSpec, a known model name or a Hugging Face config, got {type(model).__name__}"
        )

    @staticmethod
    def _resolve_hardware(hardware: Any) -> HardwareSpec | None:
        from perfsdk import hardware as hw

        if isinstance(hardware, str) and hardware.lower() == "auto":
            try:
                return hw.resolve("auto")
            except Exception as e:  # an unknown GPU is not a reason to refuse to monitor
                log.warning("perfsdk: could not map this GPU to a datasheet row (%s); MBU/MFU off", e)
                return None
        return hw.resolve(hardware)

    def _default_compute_dtype(self) -> str:
        dt = self.model.dtype if self.model is not None else "bfloat16"
        return "bf16" if dt.startswith(("int", "uint", "fp4", "nvfp4", "mxfp4")) or "byte" in dt else dt

    def _warn_missing(self) -> None:
        missing = []
        if self.model is None:
            missing.append("model=perfsdk.ModelSpec.named(...) or ModelSpec.from_hf_config(config)")
        if self.hardware is None:
            missing.append("hardware='h100-sxm' (a datasheet name), a HardwareSpec, or 'calibrate' "
                           "(no GPU was detected)")
        if missing and self._enabled:
            log.warning("perfsdk: MBU/MFU are off until you pass %s. Latency metrics work without them.",
                        " and ".join(missing))
        if self.model is not None and not self.model.has_attention_shape:
            log.warning("perfsdk: model %s has no layers/kv_heads/head_dim: KV-cache bytes and attention "
                        "FLOPs are left out of MBU/MFU", self.model.name or "(unnamed)")

    # ---- hot path ------------------------------------------------------
    def _bind_hot(self) -> None:
        """Choose the step implementation and bind the C hot path to this Monitor's current parts.

        Called once by the constructor; tests that swap a part (a scripted GPU, a failing NVTX) call it again.
        """
        if self._hot is not None:  # keep what the previous binding counted
            d, u = self._hot.counts()
            self._dropped += d
            self._untimed_pool_empty += u
        self._hot = None
        self._new_step: Callable[..., Phase] = functools.partial(Phase, self)
        hp = _load_hotpath() if self.hot_path == "c" and self._enabled else None
        self._compiling = _timing_never  # the Python Phase checks tracing in __enter__
        if hp is None:
            if not isinstance(getattr(self._local, "h", None), _LastEnd):
                self._local = _ThreadSteps(self._orphan)
            return
        pool = self._pool
        record_fn = is_capturing_fn = 0
        if pool is not None and self._record_on is pool.api.make_record_on():
            # driver events: the C code calls cuEventRecord and cuStreamIsCapturing itself
            address = getattr(pool.api, "record_address", None)
            record_fn = address() if address is not None else 0
            capture = getattr(pool.api, "capture_check_address", None)
            if record_fn and capture is not None and self._cuda_capturing is not None:
                is_capturing_fn = capture()
        if not isinstance(getattr(self._local, "h", None), hp.LastEnd):
            self._local = _ThreadSteps(self._orphan, hp.LastEnd)
        native_clock = self._clock is time.perf_counter_ns and sys.platform.startswith("linux")
        self._hot = hp.Hot(
            mon=self, clock=None if native_clock else self._clock,
            capturing=self._cuda_capturing, is_capturing_fn=is_capturing_fn, stream=self._stream,
            record_on=self._record_on, record_fn=record_fn,
            raise_for=self._raise_for, pool_pop=self._pool_pop if pool is not None else None,
            pool_acquire=pool.acquire if pool is not None else None,
            pool_release=pool.release if pool is not None else None,
            queue=self._queue, queue_cap=self._queue_cap, local=self._local, nvtx_on=self._nvtx_on,
            nvtx_push=self._nvtx_push, nvtx_pop=self._nvtx_pop, errors_record=self._errors.record,
            orphan=self._orphan, give_back=self._give_back, decorate=self._decorate_step,
            slow_step=self._slow_step, chain_gap_ns=self._chain_gap_ns, every=self._timing_every,
        )
        self._hot.window = self._window
        self._new_step = self._hot.step
        if self._compile_check is not None:
            self._compiling = self._compile_check
        hp_step: Any = hp.make_step
        self._make_c_step = hp_step

    def _slow_step(self, phase: str, batch: Any, tokens: Any, ctx: Any, seq_lens: Any) -> Any:
        """The C path's constructor for sizes that are not plain ints: validated here, as Phase does."""
        p = Phase(self, phase, batch, tokens, ctx, seq_lens)  # raises ConfigError for a bad value
        if p._dynamic:
            return p  # callables: a decorator only (each call makes a C step from the values)
        return self._make_c_step(self._hot, phase, p._batch, p._tokens, p._ctx, p._seq_lens)

    def _decorate_step(self, step: Any, fn: F) -> F:
        return _decorate(self, step.phase, step.sizes, False, fn)

    def _drops(self) -> tuple[int, int]:
        """(steps dropped because the queue was full, steps not timed because every event was in flight)."""
        d, u = self._dropped, self._untimed_pool_empty
        if self._hot is not None:
            hd, hu = self._hot.counts()
            d, u = d + hd, u + hu
        return d, u

    def _push(self, record: tuple[Any, ...]) -> None:
        # (Phase.__exit__ inlines the same two lines: it runs every step, and a call costs a frame)
        q = self._queue
        if len(q) >= self._queue_cap:
            self._dropped += 1  # exported by the collector; the server never waits
            return
        q.append(record)

    def _give_back(self, ev: tuple[Any, Any, tuple[Any, ...]]) -> None:
        """Events of a step that will not be pushed (an internal error): none may be reused too early.

        The end was never recorded as far as anyone else knows: straight back to the pool. The start
        may be the previous step's end, and the others are previous ends, which a step still waiting
        in the queue may need: orphans, given back once the collector has read past them.
        """
        pool = self._pool
        if pool is None:
            return
        try:
            pool.release(ev[1])
            if ev[0] is not None:
                self._orphan(ev[0], *ev[2])
            elif ev[2]:
                self._orphan(*ev[2])
        except Exception:
            pass

    def _orphan(self, *events: Any) -> None:
        """Hand *events* to the collector, to give back once it has read every record queued before now."""
        c = self._collector
        # Read in this order, a record moving between the queue, the pending steps and the read count
        # meanwhile is counted twice, never missed: the mark can only be late, never early.
        mark = len(self._queue) + (len(c._pending) + c.resolved if c is not None else 0)
        for ev in events:
            self._orphans.append((mark, ev))

    def request(self, prompt_tokens: int = 0, *, operation: str | None = None, request_id: str | None = None,
                arrival_ns: int | None = None) -> Request:
        """A request arrived now (or at *arrival_ns* on this Monitor's clock)."""
        if not self._enabled:
            return _NULL_REQUEST
        if type(prompt_tokens) is not int or prompt_tokens < 0:
            prompt_tokens = _check_count("prompt_tokens", prompt_tokens)
        parent = None
        if self._capture_ctx is not None:
            try:
                parent = self._capture_ctx()
            except Exception as e:
                self._errors.record(e, "request context")
        return Request(self, prompt_tokens, self._clock() if arrival_ns is None else arrival_ns,
                       operation or self.operation, request_id, parent)

    def prefill(self, tokens: int | Callable[..., int] | None = None, batch: int | Callable[..., int] = 1, *,
                seq_lens: Sequence[int] | Callable[..., Sequence[int]] | None = None,
                cached_tokens: int | Callable[..., int] = 0) -> Phase:
        """One prefill step of *batch* sequences, *tokens* prompt tokens in all (or their *seq_lens*).

        ``cached_tokens``: prefix tokens already in the KV cache (read, not recomputed; the new tokens attend
        to them, which MFU counts).
        """
        if self._compiling():  # torch.compile traces this call: the Python Phase, a no-op there
            return Phase(self, "prefill", batch, tokens, cached_tokens, seq_lens)
        return self._new_step("prefill", batch, tokens, cached_tokens, seq_lens)

    def decode(self, batch: int | Callable[..., int] = 1,
               context_tokens: int | Callable[..., int] = 0) -> Phase:
        """One decode step: *batch* sequences, *context_tokens* = the sum of their context lengths."""
        if self._compiling():  # torch.compile traces this call: the Python Phase, a no-op there
            return Phase(self, "decode", batch, None, context_tokens, None)
        return self._new_step("decode", batch, None, context_tokens, None)

    def mixed(self, prefill_seq_lens: Sequence[int] | Callable[..., Sequence[int]] = (),
              decode_batch: int | Callable[..., int] = 0,
              context_tokens: int | Callable[..., int] = 0) -> Phase:
        """A chunked-prefill + decode step: prefill chunks of *prefill_seq_lens* tokens, and *decode_batch*
        sequences decoding over *context_tokens* context tokens in all. Reports MBU and MFU."""
        if self._compiling():  # torch.compile traces this call: the Python Phase, a no-op there
            return Phase(self, "mixed", decode_batch, None, context_tokens, prefill_seq_lens)
        return self._new_step("mixed", decode_batch, None, context_tokens, prefill_seq_lens)

    # ---- values measured elsewhere ----------------------------------------
    # For engines that time themselves (vLLM's and SGLang's stat loggers; perfsdk.engines): the values
    # go through the same queue, collector, histograms and spans as those perfsdk measures.
    def record_step(self, phase: str, seconds: float, *, batch: int = 1, tokens: int | None = None,
                    context_tokens: int = 0, seq_lens: Sequence[int] | None = None,
                    end_ns: int | None = None) -> None:
        """A step someone else timed (*seconds*, ending now or at *end_ns*): counted, timed and costed
        (bytes, FLOPs, MBU, MFU) like a step perfsdk timed itself. Sizes as in :meth:`prefill`,
        :meth:`decode` and :meth:`mixed` (for ``"mixed"``: *batch* decoding sequences, *seq_lens* the
        prefill chunks). Host time: an engine's step timer includes what its loop does around the GPU."""
        if not self._enabled:
            return
        if phase not in _PHASES:
            raise ConfigError(f"record_step: phase must be one of {_PHASES}, got {phase!r}")
        if not (isinstance(seconds, (int, float)) and 0 <= seconds < 1e9):  # also NaN and inf
            raise ConfigError(f"record_step: seconds must be a finite number >= 0, got {seconds!r}")
        p = Phase(self, phase, batch, tokens, context_tokens, seq_lens)  # validates the sizes
        if p._dynamic:
            raise ConfigError("record_step: sizes must be values, not callables")
        t1 = self._clock() if end_ns is None else end_ns
        self._push((STEP, phase, t1 - round(seconds * 1e9), t1, None, p._batch, p._tokens, p._ctx, p._seq_lens,
                    None))

    def record_latencies(self, ttft_s: Sequence[float] = (), itl_s: Sequence[float] = ()) -> None:
        """Times to first token and inter-token gaps (seconds) someone else measured, for the histograms."""
        if self._enabled and (len(ttft_s) or len(itl_s)):
            self._push((MEASURED, "latencies", _seconds(ttft_s), _seconds(itl_s)))

    def record_finished(self, *, e2e_s: float, queue_s: float | None = None, prefill_s: float | None = None,
                        ttft_s: float | None = None, tpot_s: float | None = None, prompt_tokens: int = 0,
                        output_tokens: int = 0, finish_reason: str = "stop", error: str | None = None,
                        request_id: str | None = None, end_ns: int | None = None) -> None:
        """A finished request someone else timed (seconds; it ended now or at *end_ns*).

        Observed: request duration (*e2e_s*), queue time, and time per output token (*tpot_s*, or
        ``(e2e - ttft) / (output_tokens - 1)`` when only *ttft_s* is given). TTFT itself is not observed
        here (engines report it as it happens: :meth:`record_latencies`); *ttft_s*, or *queue_s* +
        *prefill_s*, places the first token in the request's span.
        """
        if not self._enabled:
            return
        e2e = _finite(e2e_s)
        if e2e is None:
            raise ConfigError(f"record_finished: e2e_s must be a finite number >= 0, got {e2e_s!r}")
        end = self._clock() if end_ns is None else end_ns
        self._push((MEASURED, "finished", end, e2e, _finite(queue_s), _finite(prefill_s), _finite(ttft_s),
                    _finite(tpot_s), int(prompt_tokens), int(output_tokens), finish_reason, error, request_id))

    # ---- control -------------------------------------------------------
    def flush(self, timeout: float | None = 10.0) -> bool:
        """Block until everything recorded so far is processed and exported (``False`` on timeout)."""
        c = self._collector
        if c is None or not c.is_alive():
            return not self._enabled
        done = threading.Event()
        self._queue.append((FLUSH, done))  # a marker is never dropped
        c.wake()
        return done.wait(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Flush, stop the collector, stop the metrics server. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._window is not None:
            try:
                self._window.close()
            except Exception as e:
                self._errors.record(e, "window.close")
        self.flush(timeout)
        if self._collector is not None:
            self._collector.stop(timeout)
        if self._pool is not None and (self._collector is None or not self._collector.is_alive()):
            self._pool.close()  # nothing in flight any more: destroy the events
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def serve_metrics(self, port: int = 9400, addr: str = "127.0.0.1", *, token: str | None = None) -> MetricsServer:
        """Serve ``GET /metrics`` (and ``POST /profile``, a profiler-window trigger) on a daemon thread.

        Binding anywhere but loopback requires *token* for the trigger (``Authorization: Bearer …``).
        """
        from perfsdk.metrics_server import MetricsServer

        if self._server is not None:
            return self._server
        self._server = MetricsServer(self, port=port, addr=addr, token=token)
        return self._server

    def stats(self) -> dict[str, Any]:
        """Rolling per-phase statistics (last few thousand steps) and the SDK's health counters."""
        out = (self._collector.stats() if self._collector is not None
               else {"dropped_records": self._drops()[0], "internal_errors": self._errors.count})
        if self._window is not None:
            out["profiler"] = self._window.status()
        return out

    def epoch_ns(self, t: int) -> int:
        """Convert a timestamp of this Monitor's clock to Unix epoch nanoseconds."""
        return t + self._epoch_offset_ns

    # ---- profiler window ----------------------------------------------
    def enable_profiler(self, **config: Any) -> Any:
        """Set up the opt-in profiler window (see :mod:`perfsdk.profiling.window`); returns it.

        Called again with settings, it replaces the window (a capture armed by the old one is cancelled);
        without settings it returns the current one.
        """
        from perfsdk.profiling.window import ProfilerWindow

        if self._window is not None and not config:
            return self._window
        if self._window is not None and self._window.state in ("ready", "running", "writing"):
            # the serving thread drives a running capture through the current window; swapping it now
            # would leave torch.profiler recording with nobody to stop it
            raise ConfigError("enable_profiler: a capture is in progress; change settings once it has finished")
        new = ProfilerWindow(self, **config)  # validate before dropping the old window
        old, self._window = self._window, new
        if self._hot is not None:
            self._hot.window = new  # the C hot path's copy
        if old is not None:
            old.close()
        return new

    def profile(self, steps: int | None = None, mode: str | None = None, reason: str = "api", *,
                steady: bool = True) -> Any:
        """Ask for one profiler capture of *steps* steady-state steps; returns a handle to wait on.

        ``steady=False``: no steady-state gate; the next step entered starts the capture (called at the same
        step on every rank of a tensor-parallel group, it captures the same steps on each).
        """
        w = self._window if self._window is not None else self.enable_profiler()
        return w.trigger(steps=steps, mode=mode, reason=reason, steady=steady)


_NULL_REQUEST = _NullRequest()


def _finite(v: Any) -> float | None:
    """*v* as seconds when it is a finite number >= 0, else None (an engine's missing or odd value)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if 0 <= f < 1e9 else None


def _seconds(values: Sequence[float]) -> tuple[float, ...]:
    """The finite, non-negative values of *values*, as floats."""
    return tuple(f for f in map(_finite, values) if f is not None)


def _timing_never() -> bool:
    return False


def _register_step_type() -> None:
    hp = _load_hotpath()
    if hp is not None:
        Phase.register(hp.Step)


_register_step_type()


def _rank_port(base: str) -> int:
    """``PERFSDK_METRICS_PORT`` for this process: the base port plus ``LOCAL_RANK`` (torchrun's local rank).

    Every rank of a host gets its own /metrics port (one scrape target per rank: a rank that dies shows as
    a target down), from one setting shared by all ranks. Port 0 (any free port) stays 0.
    """
    try:
        port = int(base)
    except ValueError:
        raise ConfigError(f"PERFSDK_METRICS_PORT: expected a port number, got {base!r}") from None
    local = os.environ.get("LOCAL_RANK", "")
    return port + int(local) if port and local.isdigit() else port


def _detect_rank(rank: int | str | None) -> int | None:
    if rank is None or rank == "none":
        return None
    if isinstance(rank, int):
        return rank
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:
        pass
    world = os.environ.get("WORLD_SIZE")
    if world and world.isdigit() and int(world) > 1:
        return int(os.environ.get("RANK", "0") or 0)
    return None
