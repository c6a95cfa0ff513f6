"""The decorator forms of a step: ``@mon.decode(...)``, ``@mon.prefill(...)``, ``@mon.mixed(...)``.

Every call of the decorated function is one step, sized like the ``with`` form or from the call's own
arguments::

    @mon.decode(batch=lambda ids, ctx: len(ids), context_tokens=lambda ids, ctx: sum(ctx))
    def decode_step(ids, ctx): ...

    @mon.prefill(tokens=lambda prompt, **_: len(prompt), batch=1)
    async def prefill(prompt, *, temperature=1.0): ...   # one step from the call to the return

    @mon.decode                                          # bare: a timed step with no sizes (no MBU/MFU)
    def forward(x): ...

What can be decorated: functions, methods, ``classmethod``/``staticmethod`` objects (above or below the
decorator), coroutine functions (one step from the call to the ``return``, its awaits included),
generator and async-generator functions (one step from the first item asked for to the last; values
sent in with ``send``/``asend`` and exceptions thrown in reach the function, ``close``/``aclose``
runs its ``finally``). The decorated function keeps the original's ``inspect.signature``, ``__name__``,
``__qualname__``, ``__doc__`` and ``__wrapped__`` (``functools.wraps``), and ``inspect.iscoroutinefunction``
& co. answer as they would for it.

Sizes given as callables are called with the call's arguments, ``self``/``cls`` first for a method
(as the function itself receives them). One that raises or returns a bad value is counted in
``perfsdk_internal_errors_total`` (logged once) and that call runs untimed. Under a torch.compile
trace the wrapper is a no-op (a Python step that records nothing), as under CUDA-graph capture.

Without parentheses Python calls ``mon.decode(fn)``: :func:`bare_function` tells the function to time
from a size callable given positionally (``@mon.decode(lambda ids: len(ids))``).

**Why closures, not ``wrapt``.** perfsdk uses ``wrapt`` where it is the field's tool, to patch engines and
undo it (:mod:`perfsdk.engines.instrumentor`); the decorator forms were written with ``wrapt.decorator``
too, and measured: ``wrapt``'s C ``FunctionWrapper`` asks the wrapped function for ``__self__`` on every
call (to tell a bound method), and for a plain function that lookup raises and clears an
``AttributeError`` — about 0.5 µs, more than a whole decorated step costs on the C hot path. Side by side
in one run (``benchmarks/decorator_cost.py``; 2-core CPU, wrapt 2.5.2, median ns per call over 9
interleaved rounds of 20,000; ``benchmarks/results/cpu_decorator_cost.json``), C hot path, ns::

    form               these closures   before (625e1a1)   wrapt.decorator
    sizes as values               431                515             1,047
    size callables              1,925              1,956             2,557
    bare                        1,015              1,075             1,683
    method                        469                516               983
    coroutine                     965              1,019             1,551

(the Python hot path: wrapt 1.3-1.5x the closures before, these 0.90-0.94x). So the forms stay
``functools.wraps`` closures — one Python frame per call, the step opened in it when the sizes are values
— and keep what ``wrapt`` would have given them here: signatures, methods, class and static methods in
either order, and ``send``/``asend``/``athrow``/``close`` passed through.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, cast

from perfsdk._guard import ErrorGuard
from perfsdk.hotpath import NoStep
from perfsdk.records import NO_TOKENS, UNSIZED
from perfsdk.sizes import check_sizes

__all__ = ["bare_function", "decorate"]

F = TypeVar("F", bound=Callable[..., Any])


def bare_function(phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> Any:
    """The function a bare ``@mon.decode`` / ``@mon.prefill`` / ``@mon.mixed`` (no parentheses) decorates, or None.

    Without parentheses Python calls ``mon.decode(fn)``: the function arrives as the phase's first size
    (decode: *batch*; prefill: *tokens*; mixed: the prefill lengths) with every other size at its default.
    A *named* function (``def``/``async def``, generators too), a bound method, or a ``staticmethod`` /
    ``classmethod`` object there is the function to time; a lambda, a ``functools.partial``, a builtin such
    as ``len`` or a callable object stays a size callable (``@mon.decode(batch=lambda ids, **_: len(ids))``).
    """
    if phase == "decode":
        lead, rest = batch, tokens is None and _is_int(context_tokens, 0) and seq_lens is None
    elif phase == "prefill":
        lead, rest = tokens, _is_int(batch, 1) and _is_int(context_tokens, 0) and seq_lens is None
    else:
        lead, rest = seq_lens, _is_int(batch, 0) and tokens is None and _is_int(context_tokens, 0)
    return lead if rest and _is_step_function(lead) else None


def _is_int(v: Any, n: int) -> bool:
    return type(v) is int and v == n


def _is_step_function(x: Any) -> bool:
    if isinstance(x, (staticmethod, classmethod)):
        return True
    if inspect.ismethod(x):
        x = x.__func__
    return inspect.isfunction(x) and x.__name__ != "<lambda>"


def decorate(
    new_step: Callable[..., Any],
    unsized: Callable[[str], Any],
    compiling: Callable[[], bool],
    errors: ErrorGuard,
    step: Any,
    fn: F,
) -> F:
    """*fn* with every call one step made like *step* (the decorator form, for both hot paths).

    *new_step* ``(phase, batch, tokens, context_tokens, seq_lens)`` makes a step; *unsized* ``(phase)``
    makes one with no sizes (a *step* whose ``context_tokens`` is :data:`~perfsdk.records.UNSIZED`: a
    bare ``@mon.decode``); *compiling* says whether torch.compile is tracing; *errors* counts a size
    callable that fails. A ``staticmethod``/``classmethod`` object is unwrapped, decorated and wrapped again.
    """
    if isinstance(fn, (staticmethod, classmethod)):
        return cast(F, type(fn)(decorate(new_step, unsized, compiling, errors, step, fn.__func__)))
    phase = step.phase
    batch, tokens, context_tokens, seq_lens = step.sizes
    kind = _kind(fn)
    make: Callable[[tuple[Any, ...], dict[str, Any]], Any]
    if context_tokens == UNSIZED:

        def make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return NoStep(phase) if compiling() else unsized(phase)

    elif any(callable(v) for v in (batch, tokens, context_tokens, seq_lens)):

        def make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if compiling():  # torch.compile traces this: the Python Step, a no-op there
                return NoStep(phase)
            try:
                vals = [v(*args, **kwargs) if callable(v) else v for v in (batch, tokens, context_tokens, seq_lens)]
                b, t, c, s, _ = check_sizes(phase, *vals)
            except Exception as e:  # a size callable that fails or returns a bad value: the call still runs
                errors.record(e, f"@{phase} size callable")
                return NoStep(phase)
            return new_step(phase, b, None if t == NO_TOKENS else t, c, s)

    elif kind == "function":  # the common case: the step made in the wrapper itself, one call less per call

        @functools.wraps(fn)
        def sized(*args: Any, **kwargs: Any) -> Any:
            with NoStep(phase) if compiling() else new_step(phase, batch, tokens, context_tokens, seq_lens):
                return fn(*args, **kwargs)

        return cast(F, sized)
    else:

        def make(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return NoStep(phase) if compiling() else new_step(phase, batch, tokens, context_tokens, seq_lens)

    return cast(F, _WRAPPERS[kind](fn, make))


def _kind(fn: Any) -> str:
    if inspect.isasyncgenfunction(fn):
        return "async generator"
    if inspect.iscoroutinefunction(fn):
        return "coroutine"
    if inspect.isgeneratorfunction(fn):
        return "generator"
    return "function"


def _function(fn: Callable[..., Any], make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        with make(args, kwargs):
            return fn(*args, **kwargs)

    return timed


def _coroutine(fn: Callable[..., Any], make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> Any:
        with make(args, kwargs):
            return await fn(*args, **kwargs)

    return timed


def _generator(fn: Callable[..., Any], make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        with make(args, kwargs):  # entered when the first item is asked for
            return (yield from fn(*args, **kwargs))  # send, throw and close reach the function

    return timed


def _async_generator(fn: Callable[..., Any], make: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def timed(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        # what ``yield from`` does for a generator (async generators have none): values sent in reach the
        # function through asend, exceptions through athrow, and aclose closes it at once
        with make(args, kwargs):  # entered when the first item is asked for
            agen = fn(*args, **kwargs)
            try:
                item = await agen.__anext__()
            except StopAsyncIteration:
                return
            while True:
                try:
                    sent = yield item
                except GeneratorExit:
                    await agen.aclose()
                    raise
                except BaseException as e:
                    try:
                        item = await agen.athrow(e)
                    except StopAsyncIteration:
                        return
                else:
                    try:
                        item = await agen.asend(sent)
                    except StopAsyncIteration:
                        return

    return timed


_WRAPPERS: dict[str, Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]] = {
    "function": _function,
    "coroutine": _coroutine,
    "generator": _generator,
    "async generator": _async_generator,
}
