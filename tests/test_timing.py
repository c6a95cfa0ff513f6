"""The event pool and the event-API choice (CPU: the driver path itself runs in benchmarks/overhead.py)."""

from __future__ import annotations

import pytest

from perfsdk.cuda_driver import driver_events
from perfsdk.errors import ConfigError
from perfsdk.timing import EventPool, event_api


class _CountingApi:
    name = "counting"

    def __init__(self) -> None:
        self.made = 0
        self.destroyed = 0
        self.closed = False

    def new(self) -> int:
        self.made += 1
        return self.made

    def destroy(self, ev: int) -> None:
        self.destroyed += 1

    def close(self) -> None:
        self.closed = True


def test_pool_is_bounded_lazy_and_reserve_fills_it() -> None:
    api = _CountingApi()
    pool = EventPool(api, capacity=4, prefill=1)  # type: ignore[arg-type]
    assert api.made == 1  # one up front
    evs = [pool.acquire() for _ in range(5)]
    assert evs[-1] is None  # capacity 4: the fifth is refused, never blocks
    assert pool.in_use == 4
    for ev in evs[:4]:
        pool.unref(ev)
    assert pool.in_use == 0
    assert api.made == 4
    pool2 = EventPool(_CountingApi(), capacity=6, prefill=0)  # type: ignore[arg-type]
    pool2.reserve(10)  # capped by the capacity
    assert pool2.in_use == 0 and pool2.free == 6


def test_closed_pool_destroys_free_events_and_times_nothing_more() -> None:
    api = _CountingApi()
    pool = EventPool(api, capacity=8, prefill=3)  # type: ignore[arg-type]
    held = pool.acquire()  # a serving thread may be between enter and exit when close() comes
    pool.close()
    assert api.destroyed == 2  # the free ones; the held one is not destroyed under its user
    assert api.closed
    assert pool.acquire() is None
    pool.unref(held)  # let go of after close: kept by nobody, never handed out again
    assert pool.acquire() is None


def test_an_event_goes_back_when_its_last_holder_lets_go() -> None:
    """A step holds its end; its thread holds it too (the next step may start there): two references."""
    api = _CountingApi()
    pool = EventPool(api, capacity=2, prefill=2)  # type: ignore[arg-type]
    a, b = pool.acquire(), pool.acquire()
    assert a is not None and b is not None and pool.acquire() is None
    pool.hold(a)
    pool.unref(a)
    assert pool.in_use == 2 and pool.acquire() is None  # still held once
    pool.unref(a)
    assert pool.in_use == 1 and pool.acquire() == a


def test_pool_size_and_choice_are_validated() -> None:
    with pytest.raises(ConfigError, match="at least 2 events"):
        EventPool(_CountingApi(), capacity=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="PERFSDK_CUDA_EVENTS"):
        event_api("cupy")


def test_driver_events_are_unavailable_without_a_gpu_driver() -> None:
    """On a box without libcuda (CI): None, and an explicit 'driver' request says why."""
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        pytest.skip("an NVIDIA driver is installed here")
    except OSError:
        pass
    assert driver_events(0) is None
    with pytest.raises(ConfigError, match="libcuda"):
        event_api("driver")
