"""A scripted GPU for the CPU suite: CUDA's event API, for both hot paths and both step cores.

Events are integers (as driver handles are); each takes the GPU clock of the moment it is recorded, and
the test moves that clock (``gpu.now_ms``). The Python path calls the methods (perfsdk.timing.EventApi);
the C path calls the same methods through C function pointers (:meth:`FakeGpu.addresses`: ctypes
callbacks with libcuda's signatures), so a subclass that overrides a method changes both. Elapsed times
are rounded to float32 milliseconds, as ``cuEventElapsedTime`` reports them, so the two paths read the
same numbers.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from typing import Any

from perfsdk.cuda_driver import DriverAddresses

CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_UNKNOWN = 999

_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_IS_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_EVENT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_ELAPSED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)


def f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


class FakeGpu:
    """perfsdk.timing.EventApi over integer events whose records take the (test-moved) GPU clock."""

    name = "fake"
    poll_wait = False  # True: the core waits by querying (as for perfsdk's own, non-blocking-sync, events)
    pool_capacity = 64  # events the Monitor may make (Monitor(_events=gpu) reads these two)
    pool_prefill = 32

    def __init__(self, capacity: int = 64) -> None:
        self.pool_capacity = capacity
        self.now_ms = 0.0
        self.stream = 7
        self.made = 0
        self.records = 0
        self.waits = 0
        self.t_ms: dict[int, float] = {}  # event -> GPU clock when last recorded
        self.on_stream: dict[int, int] = {}
        self.fail_record_after: int | None = None
        self.fail_elapsed = 0  # the next N reads fail
        self.capturing = False
        # a record that waits for room in a full launch queue: each record moves this host clock on
        self.record_waits: tuple[Any, float] | None = None  # (FakeClock, seconds per record)
        self._callbacks: list[Any] = []  # the ctypes callbacks, kept alive

    # ---- serving-thread side ---------------------------------------------------------------------
    def new(self) -> int:
        self.made += 1
        return self.made

    def destroy(self, ev: int) -> None:
        pass

    def make_stream(self) -> Any:
        return lambda: self.stream

    def make_record_on(self) -> Any:
        def record_on(ev: int, stream: int) -> int:
            if self.fail_record_after is not None and self.records >= self.fail_record_after:
                return CUDA_ERROR_ILLEGAL_ADDRESS
            self.records += 1
            self.t_ms[ev], self.on_stream[ev] = self.now_ms, stream
            if self.record_waits is not None:
                clock, s = self.record_waits
                clock.advance(s)
            return 0
        return record_on

    def raise_for(self, code: int) -> None:
        raise RuntimeError(f"cuEventRecord failed ({code})")

    def is_capturing(self, stream: int) -> int:
        """(status of) cuStreamIsCapturing: 0 success; the Python path asks :meth:`capture_check`."""
        return 0

    def capture_check(self) -> bool:
        return self.capturing

    # ---- collector side ------------------------------------------------------------------------
    def query(self, ev: int) -> bool:
        return True

    def wait(self, ev: int) -> None:
        self.waits += 1

    def elapsed_s(self, start: int, end: int) -> float:
        if self.fail_elapsed:
            self.fail_elapsed -= 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return f32(self.t_ms[end] - self.t_ms[start]) / 1e3

    def thread_setup(self) -> None:
        pass

    def close(self) -> None:
        pass

    # ---- the same through C function pointers (the C hot path and step core) -----------------------
    def addresses(self) -> DriverAddresses:
        record_on = self.make_record_on()

        def record(ev: int | None, stream: int | None) -> int:
            try:
                return int(record_on(ev or 0, stream or 0))
            except Exception:
                return CUDA_ERROR_UNKNOWN

        def is_capturing(stream: int | None, status: Any) -> int:
            code = self.is_capturing(stream or 0)
            status[0] = 1 if (code == 0 and self.capturing) else 0
            return code

        def query(ev: int | None) -> int:
            try:
                return 0 if self.query(ev or 0) else CUDA_ERROR_NOT_READY
            except Exception:
                return CUDA_ERROR_UNKNOWN

        def synchronize(ev: int | None) -> int:
            try:
                self.wait(ev or 0)
                return 0
            except Exception:
                return CUDA_ERROR_UNKNOWN

        def elapsed(ms: Any, start: int | None, end: int | None) -> int:
            try:
                ms[0] = self.elapsed_s(start or 0, end or 0) * 1e3
                return 0
            except Exception:
                return CUDA_ERROR_ILLEGAL_ADDRESS

        cbs = [_RECORD(record), _IS_CAPTURING(is_capturing), _EVENT(query), _EVENT(synchronize), _ELAPSED(elapsed)]
        self._callbacks.extend(cbs)
        addr = [int(ctypes.cast(cb, ctypes.c_void_p).value or 0) for cb in cbs]
        return DriverAddresses(record=addr[0], is_capturing=addr[1], query=addr[2],
                               synchronize=0 if self.poll_wait else addr[3],
                               elapsed=addr[4], ctx_set_current=0, context=0, exchange_capture_mode=0)


class ThreadContextGpu(FakeGpu):
    """The driver's per-thread current context: a thread that never made one current gets 201."""

    def __init__(self, ensure: bool = True, capacity: int = 64) -> None:
        super().__init__(capacity)
        self.current = {threading.get_ident()}  # the main thread touched CUDA already
        self.context_calls = 0
        self.capture_checks = 0
        if ensure:
            self.ensure_context = self._ensure

    def _ensure(self) -> None:
        self.context_calls += 1
        self.current.add(threading.get_ident())

    def make_record_on(self) -> Any:
        inner = super().make_record_on()

        def record_on(ev: int, stream: int) -> int:
            if threading.get_ident() not in self.current:
                return CUDA_ERROR_INVALID_CONTEXT
            return int(inner(ev, stream))
        return record_on

    def is_capturing(self, stream: int) -> int:
        if threading.get_ident() not in self.current:
            return CUDA_ERROR_INVALID_CONTEXT
        self.capture_checks += 1
        return 0
