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
runs its ``finally``). The decorated object is a ``wrapt`` function wrapper: a transparent proxy of the
function, so ``inspect.signature``, ``__name__``, ``__doc__``, ``__wrapped__`` and ``isinstance`` checks
are the original's, and ``inspect.iscoroutinefunction`` & co. answer as they would for it.

Sizes given as callables are called with the call's arguments, ``self``/``cls`` first for a method
(as the function itself receives them). One that raises or returns a bad value is counted in
``perfsdk_internal_errors_total`` (logged once) and that call runs untimed. Under a torch.compile
trace the wrapper is a no-op (a Python step that records nothing), as under CUDA-graph capture.

Without parentheses Python calls ``mon.decode(fn)``: :func:`bare_function` tells the function to time
from a size callable given positionally (``@mon.decode(lambda ids: len(ids))``).

**Cost.** ``wrapt``'s C ``FunctionWrapper`` calls one Python wrapper per call, as the ``functools.wraps``
closure it replaced did; with sizes that are values the wrapper opens the step itself instead of going
through a per-call helper. Measured side by side in one run (``python benchmarks/decorator_cost.py``,
2-core CPU, C hot path, median of 9 rounds of 20,000 calls; ``benchmarks/results/cpu_decorator_cost.json``):
see that file for the figures; the wrapt form is no slower than the closure form it replaced.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any, TypeVar, cast

import wrapt

from perfsdk._guard import ErrorGuard
from perfsdk.hotpath import NoStep, check_sizes
from perfsdk.records import NO_TOKENS, UNSIZED

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
    callable that fails.
    """
    phase = step.phase
    batch, tokens, context_tokens, seq_lens = step.sizes
    make: Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]
    if context_tokens == UNSIZED:

        def make(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return NoStep(phase) if compiling() else unsized(phase)
    elif any(callable(v) for v in (batch, tokens, context_tokens, seq_lens)):

        def make(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if compiling():  # torch.compile traces this: the Python Step, a no-op there
                return NoStep(phase)
            # wrapt hands a method's self (a classmethod's cls) apart; the function receives it first, and
            # so do the size callables. A bound method decorated as it is keeps its self to itself.
            if instance is not None and wrapped is not fn:
                args = (instance, *args)
            try:
                vals = [v(*args, **kwargs) if callable(v) else v for v in (batch, tokens, context_tokens, seq_lens)]
                b, t, c, s, _ = check_sizes(phase, *vals)
            except Exception as e:  # a size callable that fails or returns a bad value: the call still runs
                errors.record(e, f"@{phase} size callable")
                return NoStep(phase)
            return new_step(phase, b, None if t == NO_TOKENS else t, c, s)
    else:
        if _kind(fn) == "function":  # the common case, one Python call less per call
            return cast(F, _static_function(new_step, compiling, phase, batch, tokens, context_tokens, seq_lens)(fn))

        def make(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return NoStep(phase) if compiling() else new_step(phase, batch, tokens, context_tokens, seq_lens)

    return cast(F, _WRAPPERS[_kind(fn)](make)(fn))


def _kind(fn: Any) -> str:
    target = fn.__func__ if isinstance(fn, (staticmethod, classmethod)) else fn
    if inspect.isasyncgenfunction(target):
        return "async generator"
    if inspect.iscoroutinefunction(target):
        return "coroutine"
    if inspect.isgeneratorfunction(target):
        return "generator"
    return "function"


def _static_function(
    new_step: Callable[..., Any],
    compiling: Callable[[], bool],
    phase: str,
    batch: Any,
    tokens: Any,
    context_tokens: Any,
    seq_lens: Any,
) -> Any:
    @wrapt.decorator
    def timed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with NoStep(phase) if compiling() else new_step(phase, batch, tokens, context_tokens, seq_lens):
            return wrapped(*args, **kwargs)

    return timed


def _function(make: Callable[..., Any]) -> Any:
    @wrapt.decorator
    def timed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with make(wrapped, instance, args, kwargs):
            return wrapped(*args, **kwargs)

    return timed


def _coroutine(make: Callable[..., Any]) -> Any:
    @wrapt.decorator
    async def timed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with make(wrapped, instance, args, kwargs):
            return await wrapped(*args, **kwargs)

    return timed


def _generator(make: Callable[..., Any]) -> Any:
    @wrapt.decorator
    def timed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Generator[Any, Any, Any]:
        with make(wrapped, instance, args, kwargs):  # entered when the first item is asked for
            return (yield from wrapped(*args, **kwargs))  # send, throw and close reach the function

    return timed


def _async_generator(make: Callable[..., Any]) -> Any:
    @wrapt.decorator
    async def timed(
        wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> AsyncGenerator[Any, Any]:
        # what ``yield from`` does for a generator (async generators have none): values sent in reach the
        # function through asend, exceptions through athrow, and aclose closes it
        with make(wrapped, instance, args, kwargs):  # entered when the first item is asked for
            agen = wrapped(*args, **kwargs)
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


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Any]] = {
    "function": _function,
    "coroutine": _coroutine,
    "generator": _generator,
    "async generator": _async_generator,
}
