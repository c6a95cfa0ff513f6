"""The decorator forms (perfsdk/decorators.py): what can be decorated, what the decorated object looks like,
what the size callables receive, and the step each kind of function makes — on both hot paths."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.testing import FakeClock, monitor_harness

STEP = "perfsdk_step_seconds"
TOKENS = "perfsdk_step_tokens_total"
MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=2e12, flops={"bf16": 500e12})

pytestmark = pytest.mark.usefixtures("each_hot_path")


def originals() -> dict[str, Callable[..., Any]]:
    def function(ids: list[int], *, scale: float = 1.0) -> int:
        """A docstring."""
        return len(ids)

    async def coroutine(prompt: str, temperature: float = 0.0) -> int:
        return len(prompt)

    def generator(n: int) -> Iterator[int]:
        yield from range(n)

    async def async_generator(n: int, /, step: int = 1) -> AsyncIterator[int]:
        for i in range(0, n, step):
            yield i

    return {"function": function, "coroutine": coroutine, "generator": generator, "async_generator": async_generator}


KIND_CHECKS = (inspect.iscoroutinefunction, inspect.isgeneratorfunction, inspect.isasyncgenfunction, inspect.isfunction)


@pytest.mark.parametrize("bare", [True, False], ids=["bare", "sized"])
@pytest.mark.parametrize("kind", sorted(originals()))
def test_the_decorated_function_looks_like_the_original(kind: str, bare: bool) -> None:
    with monitor_harness() as h:
        fn = originals()[kind]
        decorated = h.monitor.decode(fn) if bare else h.monitor.decode(batch=lambda *a, **k: 1)(fn)
        assert inspect.signature(decorated) == inspect.signature(fn)
        assert decorated.__name__ == fn.__name__ and decorated.__qualname__ == fn.__qualname__
        assert decorated.__doc__ == fn.__doc__ and decorated.__wrapped__ is fn
        assert [check(decorated) for check in KIND_CHECKS] == [check(fn) for check in KIND_CHECKS]


def test_methods_class_and_static_methods_keep_their_signatures_and_binding() -> None:
    with monitor_harness() as h:
        mon = h.monitor

        class Engine:
            def plain(self, ids: list[int], k: int = 2) -> int:
                return len(ids) * k

            @mon.decode
            def method(self, ids: list[int], k: int = 2) -> int:
                return len(ids) * k

            @mon.decode
            @classmethod
            def above_classmethod(cls, ids: list[int]) -> str:
                return cls.__name__

            @classmethod
            @mon.decode
            def below_classmethod(cls, ids: list[int]) -> str:
                return cls.__name__

            @mon.decode
            @staticmethod
            def above_staticmethod(ids: list[int]) -> int:
                return len(ids)

            @staticmethod
            @mon.decode
            def below_staticmethod(ids: list[int]) -> int:
                return len(ids)

        e = Engine()
        reference = inspect.signature(Engine.plain)
        assert inspect.signature(Engine.method) == reference
        assert inspect.signature(e.method) == inspect.signature(e.plain)
        for name, returns in (
            ("above_classmethod", "str"),
            ("below_classmethod", "str"),
            ("above_staticmethod", "int"),
            ("below_staticmethod", "int"),
        ):
            assert str(inspect.signature(getattr(Engine, name))) == f"(ids: 'list[int]') -> '{returns}'", name
        assert e.method([1, 2, 3]) == 6 and Engine.method(e, [1], k=5) == 5
        assert Engine.above_classmethod([1]) == e.above_classmethod([1]) == "Engine"
        assert Engine.below_classmethod([1]) == e.below_classmethod([1]) == "Engine"
        assert Engine.above_staticmethod([1, 2]) == e.below_staticmethod([1, 2]) == 2
        assert h.count(STEP, phase="decode") == 8
        assert h.monitor.stats()["internal_errors"] == 0


def test_size_callables_get_the_arguments_the_function_gets() -> None:
    """self for a method (through the instance or the class), cls for a class method, neither for a static
    method or a bound method decorated as it is — as the function itself receives them."""
    with monitor_harness(model=MODEL, hardware=HW) as h:
        mon = h.monitor
        seen: list[tuple[Any, ...]] = []

        def sizes(*args: Any) -> int:
            seen.append(args)
            return len(args[-1])

        batch = lambda *args: sizes(*args)  # noqa: E731, PLW0108 (a named function is the one to time: bare form)

        class Engine:
            @mon.decode(batch=batch, context_tokens=0)
            def method(self, ids: list[int]) -> int:
                return len(ids)

            @mon.decode(batch=batch, context_tokens=0)
            @classmethod
            def cm(cls, ids: list[int]) -> int:
                return len(ids)

            @classmethod
            @mon.decode(batch=batch, context_tokens=0)
            def cm_below(cls, ids: list[int]) -> int:
                return len(ids)

            @mon.decode(batch=batch, context_tokens=0)
            @staticmethod
            def sm(ids: list[int]) -> int:
                return len(ids)

            def unbound(self, ids: list[int]) -> int:
                return len(ids)

        e = Engine()
        bound = mon.decode(batch=batch, context_tokens=0)(e.unbound)
        assert e.method([1]) == 1 and Engine.method(e, [1, 2]) == 2
        assert Engine.cm([1, 2, 3]) == 3 and e.cm_below([1, 2, 3, 4]) == 4
        assert e.sm([1] * 5) == 5 and bound([1] * 6) == 6
        assert seen == [(e, [1]), (e, [1, 2]), (Engine, [1, 2, 3]), (Engine, [1, 2, 3, 4]), ([1] * 5,), ([1] * 6,)]
        assert h.value(TOKENS, phase="decode") == 1 + 2 + 3 + 4 + 5 + 6


def test_an_async_generator_step_spans_its_items_and_passes_asend_and_athrow_through() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:

        @h.monitor.decode(batch=1, context_tokens=10)
        async def echo() -> AsyncIterator[Any]:
            received = None
            while received != "stop":
                clock.advance(0.001)
                try:
                    received = yield received
                except ValueError as e:
                    received = f"caught {e}"

        async def drive() -> list[Any]:
            agen = echo()
            clock.advance(5.0)  # made, not started: not in the step
            got = [await agen.asend(None), await agen.asend("a"), await agen.athrow(ValueError("x"))]
            with pytest.raises(StopAsyncIteration):
                await agen.asend("stop")
            return got

        assert asyncio.run(drive()) == [None, "a", "caught x"]
        assert h.count(STEP, phase="decode") == 1
        assert h.sum(STEP, phase="decode") == pytest.approx(0.003)  # from the first item asked for to the last


def test_aclose_closes_the_decorated_async_generator_at_once() -> None:
    with monitor_harness() as h:
        log: list[str] = []

        @h.monitor.decode
        async def stream() -> AsyncIterator[int]:
            try:
                for i in range(10):
                    yield i
            finally:
                log.append("finally")

        async def drive() -> None:
            agen = stream()
            assert await agen.__anext__() == 0
            await agen.aclose()
            log.append("after aclose")  # its finally ran inside aclose, not at the event loop's shutdown

        asyncio.run(drive())
        assert log == ["finally", "after aclose"]
        assert h.monitor.flush(5)
        assert h.monitor.stats()["decode"]["steps"] == 1  # a step closed early: counted, as a generator's is


def test_an_async_generator_that_raises_records_a_failed_step_and_the_error_reaches_the_caller() -> None:
    with monitor_harness() as h:

        @h.monitor.prefill(tokens=4)
        async def broken(n: int) -> AsyncIterator[int]:
            yield n
            raise KeyError("boom")

        async def drive() -> list[int]:
            return [i async for i in broken(7)]

        with pytest.raises(KeyError, match="boom"):
            asyncio.run(drive())
        assert h.monitor.flush(5)
        assert h.monitor.stats()["prefill"]["errors"] == 1  # the step, recorded as failed
        assert h.monitor.stats()["internal_errors"] == 0


def test_a_generator_step_passes_send_through() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:

        @h.monitor.decode
        def running_sum() -> Iterator[int]:
            total = 0
            while True:
                clock.advance(0.002)
                got = yield total
                if got is None:
                    return
                total += got

        gen = running_sum()
        assert [next(gen), gen.send(3), gen.send(4)] == [0, 3, 7]
        with pytest.raises(StopIteration):
            next(gen)
        assert h.count(STEP, phase="decode") == 1
        assert h.sum(STEP, phase="decode") == pytest.approx(0.006)
