"""The decorator forms implemented with ``wrapt.decorator``: measured by ``benchmarks/decorator_cost.py``
against the closures perfsdk ships (perfsdk/decorators.py says why it ships those). Same behaviour, same
tests passed (tests/test_decorators.py, tests/test_monitor.py) when it was perfsdk's implementation; only
the forms the benchmark measures are kept (functions, methods and coroutines)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

import wrapt

from perfsdk._guard import ErrorGuard
from perfsdk.hotpath import NoStep
from perfsdk.records import NO_TOKENS, UNSIZED
from perfsdk.sizes import check_sizes

__all__ = ["decorate"]

F = TypeVar("F", bound=Callable[..., Any])


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

    kind = _kind(fn)
    if kind not in _WRAPPERS:
        raise NotImplementedError(f"the wrapt comparison keeps only the measured forms, not a {kind}")
    return cast(F, _WRAPPERS[kind](make)(fn))


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


_WRAPPERS: dict[str, Callable[[Callable[..., Any]], Any]] = {
    "function": _function,
    "coroutine": _coroutine,
}  # generators and async generators: not measured, so not kept here (perfsdk/decorators.py has them)
