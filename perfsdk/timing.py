"""Device and host timers for the hot path.

A step is timed by CUDA events recorded on the current stream around it —
recording is asynchronous and never waits for the GPU — and read later, on the
collector thread, once the end event has completed. A step that follows the
previous one closely starts at that step's end event (one record per step; see
:class:`perfsdk.Monitor`'s ``chain_gap_us``). Events come from a bounded pool
(:class:`EventPool`) and go back to it once nothing can read them any more (32
are made up front, more on demand up to the capacity, so memory stays
bounded); when every event is in flight the step is counted but not timed
(``stats()["untimed_steps_event_pool_empty"]``): a host interval around an
asynchronous launch would pass for device time.

Events are created with the default flags, not blocking sync: between two
CUDA-graph replays a blocking-sync record costs the GPU more
(``benchmarks/graph_gaps.py``). Nothing waits on them in the driver: the step
core polls them (``poll_wait``) and sleeps between polls, off the GIL.

Two implementations of the same small event API (:class:`EventApi`), chosen
once per Monitor by :func:`event_api`: raw driver handles through ``libcuda``
(:mod:`perfsdk.cuda_driver`: the cheapest record, and it keeps the GIL), else
``torch.cuda.Event`` objects recorded through a cached stream
(:class:`TorchEvents`). ``PERFSDK_CUDA_EVENTS=torch`` forces the second.

Code inside CUDA-graph capture or a torch.compile trace runs once, at capture
time; :func:`capture_check` returns a predicate that is true there, so the
wrappers become no-ops.

After ``os.fork()`` a child cannot use its parent's CUDA context (NVIDIA: a
process forked after CUDA was initialised must not call CUDA), so it cannot
do GPU work either: a Monitor that timed with CUDA events times the child's
steps with the host clock — honest there, where every step is host work — and
says so once in the log (:meth:`EventPool.abandon` lets the parent's events go
without a CUDA call).
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

__all__ = ["EventApi", "EventPool", "TorchEvents", "capture_check", "capture_checks", "cuda_usable", "event_api"]


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


def capture_checks(cuda: bool = True) -> tuple[Callable[[], bool] | None, Callable[[], Any] | None]:
    """``(compiling, capturing)``, for the C hot path: each a cheap ``() -> bool``, or None where it cannot be.

    *compiling* is ``torch.compiler.is_compiling`` (torch.compile's tracer knows it, and sees True), to
    call in Python *before* any C code, which the tracer could not follow. *capturing*: torch's C call
    behind ``torch.cuda.is_current_stream_capturing``, when the Monitor times with CUDA.
    """
    if "torch" not in sys.modules:
        return None, None
    import torch

    compiler = getattr(torch, "compiler", None)
    compiling = getattr(compiler, "is_compiling", None) if compiler is not None else None
    capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) if cuda else None
    return compiling, capturing


def _never() -> bool:
    return False


class EventApi(Protocol):
    """What the Monitor (hot path) and the collector need from a kind of CUDA event."""

    name: str

    def new(self) -> Any: ...
    def destroy(self, ev: Any) -> None: ...
    def make_stream(self) -> Callable[[], int]: ...
    def make_record_on(self) -> Callable[[Any, int], Any]: ...
    def raise_for(self, code: int) -> None: ...
    def query(self, ev: Any) -> bool: ...
    def wait(self, ev: Any) -> None: ...
    def elapsed_s(self, start: Any, end: Any) -> float: ...
    def thread_setup(self) -> None: ...
    def close(self) -> None: ...


class TorchEvents:
    """``torch.cuda.Event`` objects (timing, default flags), recorded through a cached ``Stream`` per handle."""

    name = "torch"

    def __init__(self) -> None:
        import torch

        self._event: Any = torch.cuda.Event

    #: the step core waits for these events by polling (synchronize() on them would spin a CPU)
    poll_wait = True

    def new(self) -> Any:
        return self._event(enable_timing=True)  # not blocking-sync: cheaper on the GPU; the core polls

    def destroy(self, ev: Any) -> None:
        pass  # freed with the object

    def make_stream(self) -> Callable[[], int]:
        """``() -> handle`` of the calling thread's current stream."""
        import functools

        import torch

        raw = torch._C._cuda_getCurrentRawStream
        return functools.partial(raw, torch.cuda.current_device())

    def make_record_on(self) -> Callable[[Any, int], Any]:
        """``record_on(event, stream_handle)``; returns None (raises on a CUDA error).

        A stream handle seen for the first time (a side stream, a new priority) is looked up once the
        normal way and its ``Stream`` cached. Bound to the device current when the Monitor was built.
        """
        import torch

        device = torch.cuda.current_device()
        streams: dict[int, Any] = {}
        current_stream = torch.cuda.current_stream
        base_record: Any = torch._C._CudaEventBase.record

        def record_on(event: Any, handle: int) -> None:
            stream = streams.get(handle)
            if stream is None:
                stream = streams[handle] = current_stream(device)
            base_record(event, stream)

        return record_on

    def raise_for(self, code: int) -> None:
        raise RuntimeError(f"CUDA event record failed ({code})")  # not reached: torch raises itself

    def query(self, ev: Any) -> bool:
        return bool(ev.query())

    def wait(self, ev: Any) -> None:
        ev.synchronize()  # torch releases the GIL while the driver sleeps

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1e3

    def thread_setup(self) -> None:
        from perfsdk.cuda_driver import relax_capture_mode

        relax_capture_mode()

    def close(self) -> None:
        pass


def event_api(choice: str | None = None) -> EventApi:
    """The event implementation for this process: ``"driver"`` where libcuda allows, else ``"torch"``.

    *choice*: ``"auto"`` (default), ``"driver"`` (raise if unavailable) or ``"torch"``.
    """
    from perfsdk.errors import ConfigError

    choice = (choice or "auto").lower()
    if choice not in ("auto", "driver", "torch"):
        raise ConfigError(f"PERFSDK_CUDA_EVENTS: expected 'auto', 'driver' or 'torch', got {choice!r}")
    if choice != "torch":
        from perfsdk.cuda_driver import driver_events

        api = driver_events()
        if api is not None:
            return api
        if choice == "driver":
            raise ConfigError(
                "PERFSDK_CUDA_EVENTS=driver: libcuda.so.1 or torch's raw-stream call is not usable "
                "here; use 'torch' or 'auto'"
            )
    if not _torch_raw_stream_calls():
        raise ConfigError(
            "CUDA event timing needs torch._C._cuda_getCurrentRawStream and _CudaEventBase "
            "(torch >= 2.1); use timing='host'"
        )
    return TorchEvents()


def _torch_raw_stream_calls() -> bool:
    import torch

    return hasattr(torch._C, "_cuda_getCurrentRawStream") and hasattr(torch._C, "_CudaEventBase")


class EventPool:
    """A bounded number of reusable events of one :class:`EventApi`, each handed out with references.

    An event is held by the step that recorded it and, between steps, by its serving thread (the end of
    a thread's last step may start its next one); it goes back to the free list when the last holder
    lets go (:meth:`unref`). The Python hot path and step core use this pool; the C ones keep the same
    pool in C (``perfsdk/csrc/stepcore.c``). ``acquire()`` never blocks: events are created lazily up
    to *capacity* (a few up front so that the first steps do not pay for creation), then None.
    """

    def __init__(self, api: EventApi, capacity: int, prefill: int = 32) -> None:
        if type(capacity) is not int or capacity < 2:
            from perfsdk.errors import ConfigError

            raise ConfigError(f"event pool: must hold at least 2 events (one step), got {capacity!r}")
        self.api = api
        self.capacity = capacity
        self._free: deque[Any] = deque()
        self._refs: dict[Any, int] = {}
        self.created = 0
        self._lock = threading.Lock()
        for _ in range(min(capacity, prefill)):
            self._free.append(self._new())

    def _new(self) -> Any:
        ev = self.api.new()
        self.created += 1
        return ev

    def acquire(self) -> Any:
        """A free event with one reference (the caller's), or None when *capacity* are in use."""
        try:
            ev = self._free.popleft()
        except IndexError:
            with self._lock:
                if self.created >= self.capacity:
                    return None
                ev = self._new()
        self._refs[ev] = 1  # nobody else knows this event yet: no lock needed
        return ev

    def hold(self, ev: Any) -> None:
        """One more holder of an event the caller holds (no one else can let go of it meanwhile)."""
        self._refs[ev] += 1

    def unref(self, ev: Any) -> None:
        """One holder lets go; the last one puts the event back on the free list."""
        with self._lock:
            n = self._refs[ev] - 1
            if n:
                self._refs[ev] = n
                return
            del self._refs[ev]
        if self.capacity:  # after close() events are not reused (nor destroyed: a thread may hold them)
            self._free.append(ev)

    def reserve(self, events: int) -> None:
        """Create events now, up to *events* free ones (within the capacity), so no step pays for creation."""
        with self._lock:
            while len(self._free) < events and self.created < self.capacity:
                self._free.append(self._new())

    def close(self) -> None:
        """Stop handing out events; destroy the free ones and release the API.

        Later ``acquire()`` calls return None (steps after close are counted, not timed) and ``unref()``
        keeps nothing. Events still held — a serving thread may be between its enter and exit — are left
        alone and go with the process.
        """
        with self._lock:
            self.capacity = 0
            free = list(self._free)
            self._free.clear()
        for ev in free:
            try:
                self.api.destroy(ev)
            except Exception:
                pass
        self.api.close()

    def abandon(self) -> None:
        """In a forked child: hand out no more events and destroy none (they are the parent's, and this process
        may not call CUDA); a new lock, since a thread of the parent may have held the old one at the fork."""
        self._lock = threading.Lock()
        self.capacity = 0
        self._free.clear()

    @property
    def in_use(self) -> int:
        """Events held by a step or a thread."""
        return len(self._refs)

    @property
    def free(self) -> int:
        return len(self._free)
