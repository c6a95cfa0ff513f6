"""Device and host timers for the hot path.

A step is timed by a pair of CUDA events recorded on the current stream around
it — recording is asynchronous and never waits for the GPU — and the pair is
read later, on the collector thread, once the end event has completed. Events
come from a bounded pool (:class:`EventPool`) and go back to it after they are
read (16 pairs are made up front, more on demand up to the capacity, so memory
stays bounded); when every pair is in flight the step is counted but not timed
(``stats()["untimed_steps_event_pool_empty"]``): a host interval around an
asynchronous launch would pass for device time.

Events are created with ``blocking=True`` (``cudaEventBlockingSync``): when the
collector must wait for one, its thread sleeps in the driver instead of
spinning a core, and torch releases the GIL for the wait.

Code inside CUDA-graph capture or a torch.compile trace runs once, at capture
time; :func:`capture_check` returns a predicate that is true there, so the
wrappers become no-ops.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["EventPool", "capture_check", "cuda_usable", "make_recorder", "no_record"]


def cuda_usable(force: bool = False) -> bool:
    """Whether CUDA timing can be used without importing torch for the caller.

    perfsdk never imports torch on its own initiative (seconds of start-up for a
    server that may not use it): unless *force*, CUDA is used only when torch is
    already imported and sees a GPU.
    """
    if not force and "torch" not in sys.modules:
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def capture_check(cuda: bool = True) -> Callable[[], bool]:
    """A cheap predicate: are we inside CUDA-graph capture or torch.compile tracing?

    *cuda*: the Monitor times with CUDA (CUDA is initialised, so the raw C check is safe).
    """
    if "torch" not in sys.modules:
        return _never
    import torch

    # the C functions behind torch.cuda.is_current_stream_capturing / torch.compiler.is_compiling:
    # the Python wrappers cost a few µs each on a slow host, the C calls a fraction of that
    capturing: Any = getattr(torch.cuda, "is_current_stream_capturing", None)
    if cuda and hasattr(torch._C, "_cuda_isCurrentStreamCapturing"):
        capturing = torch._C._cuda_isCurrentStreamCapturing
    compiler = getattr(torch, "compiler", None)
    compiling: Any = getattr(compiler, "is_compiling", None) if compiler is not None else None
    cuda_ok = capturing is not None and torch.cuda.is_available()

    if cuda_ok and compiling is not None:
        def check() -> bool:
            return bool(compiling() or capturing())
    elif compiling is not None:
        def check() -> bool:
            return bool(compiling())
    else:
        return _never
    return check


def _never() -> bool:
    return False


def no_record(event: Any) -> None:
    """The recorder of a Monitor without CUDA timing."""


def make_recorder() -> Callable[[Any], None]:
    """``record(event)`` on the current stream, without ``torch.cuda.current_stream()``'s cost.

    ``torch.cuda.Event.record()`` builds a Python ``Stream`` object on every call
    (several µs on a slow host). Here the current stream's raw handle is read
    through one C call and mapped to a cached ``Stream``; a stream seen for the
    first time (a side stream, a new priority) is looked up once the normal way.
    Bound to the device current when the Monitor was built: one Monitor per GPU.
    """
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    base_record = getattr(getattr(torch._C, "_CudaEventBase", None), "record", None)
    if raw is None or base_record is None:  # an older or different build: the public, slower path
        def record_public(event: Any) -> None:
            event.record()
        return record_public
    device = torch.cuda.current_device()
    streams: dict[int, Any] = {}
    current_stream = torch.cuda.current_stream

    def record(event: Any) -> None:
        handle = raw(device)
        stream = streams.get(handle)
        if stream is None:
            stream = streams[handle] = current_stream(device)
        base_record(event, stream)

    return record


class EventPool:
    """A fixed number of reusable CUDA event pairs.

    ``acquire()`` is called on the serving thread and ``release()`` on the
    collector; both are single deque operations (thread-safe under the GIL).
    Events are created lazily up to *capacity* pairs, so an idle Monitor holds
    none.
    """

    def __init__(self, capacity: int, device: Any = None, prefill: int = 16) -> None:
        import torch

        if capacity < 1:
            from perfsdk.errors import ConfigError

            raise ConfigError(f"event_pool_size: must be >= 1, got {capacity}")
        self._torch = torch
        self._device = device
        self.capacity = capacity
        self._free: deque[tuple[Any, Any]] = deque()
        self._created = 0
        self._lock = threading.Lock()
        # Warm a few pairs now so that the first steps do not pay for creation.
        for _ in range(min(capacity, prefill)):
            self._free.append(self._new_pair())

    def _new_pair(self) -> tuple[Any, Any]:
        ev: Any = self._torch.cuda.Event
        self._created += 1
        return ev(enable_timing=True, blocking=True), ev(enable_timing=True, blocking=True)

    def acquire(self) -> tuple[Any, Any] | None:
        try:
            return self._free.popleft()
        except IndexError:
            pass
        with self._lock:
            if self._created < self.capacity:
                return self._new_pair()
        return None

    def release(self, pair: tuple[Any, Any]) -> None:
        self._free.append(pair)

    def discard(self, pair: tuple[Any, Any]) -> None:
        """Forget a pair that failed (a new one may be created in its place)."""
        with self._lock:
            self._created -= 1

    @property
    def in_use(self) -> int:
        return self._created - len(self._free)
