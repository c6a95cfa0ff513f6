"""CUDA events through the driver API, for the cheapest possible record on the hot path.

perfsdk times a step with CUDA events. Through torch, one record costs 2.4–3.6
µs on the H200 hosts even with a cached stream (6.6–12.5 µs through
``Event.record()``), and torch releases the GIL inside it, so a collector thread
waiting for the GIL takes it in the middle of the serving thread's step
boundary. Here the same events are plain driver
handles (``CUevent``) created and recorded through ``libcuda`` with
:mod:`ctypes`:

* ``record`` is one ``torch._C._cuda_getCurrentRawStream`` call (the current
  stream's handle, no ``Stream`` object) and one ``cuEventRecord`` through a
  :class:`ctypes.PyDLL` function — which keeps the GIL, so the serving thread's
  step boundary is never a point where another thread can cut in. The other
  side of that: when the GPU's launch queue is full the record waits for room
  holding the GIL, as any launch from that thread would wait anyway (the
  collector then waits for the GIL, not the GPU);
* ``query`` and ``elapsed_s`` run on the step core. The events are made with
  the default flags, not ``CU_EVENT_BLOCKING_SYNC``: a blocking-sync event
  costs the GPU 0.5–0.8 µs more per record between two graph replays (an
  H200, ``benchmarks/graph_gaps.py``), and cuEventSynchronize on a default event
  spins a CPU. So the core waits by polling (``poll_wait``): a query every poll
  interval, sleeping between; ``wait`` (cuEventSynchronize, through
  :class:`ctypes.CDLL`, which releases the GIL) is there for other callers.

Runtime and driver handles are the same objects, so an event recorded here on
torch's stream orders with torch's work exactly as ``torch.cuda.Event`` would.
The events live in the device's primary context (the one torch uses), which
this module retains while it holds events and makes current on the collector
thread.

Used by :class:`perfsdk.Monitor` when ``libcuda`` and torch's raw-stream call are
there (``PERFSDK_CUDA_EVENTS=torch`` selects torch's events instead);
:func:`driver_events` returns None when they are not.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["CudaDriverError", "DriverAddresses", "DriverEvents", "driver_events", "relax_capture_mode"]

CU_EVENT_DEFAULT = 0x0
CU_EVENT_BLOCKING_SYNC = 0x1
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_INVALID_CONTEXT = 201
CU_STREAM_CAPTURE_MODE_RELAXED = 2


class DriverAddresses(NamedTuple):
    """The driver functions the C hot path and step core call directly (addresses; 0 where absent).

    Signatures are libcuda's: ``cuEventRecord(event, stream)``, ``cuStreamIsCapturing(stream, int*)``,
    ``cuEventQuery(event)``, ``cuEventSynchronize(event)``, ``cuEventElapsedTime(float*, start, end)``,
    ``cuCtxSetCurrent(context)`` and ``cuThreadExchangeStreamCaptureMode(int*)``; events and streams are the
    handles :meth:`EventApi.new` and the stream call return. ``synchronize`` is 0 where the core waits by
    polling (perfsdk's own events are not blocking-sync ones). A scripted GPU in the tests provides the same
    through ctypes callbacks.
    """

    record: int
    is_capturing: int
    query: int
    synchronize: int
    elapsed: int
    ctx_set_current: int
    context: int
    exchange_capture_mode: int


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed; ``code`` is the ``CUresult``."""

    def __init__(self, call: str, code: int, name: str | None = None) -> None:
        self.code = code
        super().__init__(f"{call} failed: {name or 'CUDA error'} ({code})")


_LIB_LOCK = threading.Lock()
_LIBS: tuple[Any, Any] | None = None


def _libs() -> tuple[Any, Any]:
    """libcuda twice: as PyDLL (calls keep the GIL) and CDLL (calls release it). Raises OSError if absent."""
    global _LIBS
    with _LIB_LOCK:
        if _LIBS is None:
            _LIBS = (ctypes.PyDLL("libcuda.so.1"), ctypes.CDLL("libcuda.so.1"))
        return _LIBS


def _fn(lib: Any, names: tuple[str, ...], argtypes: list[Any]) -> Any:
    for name in names:
        f = getattr(lib, name, None)
        if f is not None:
            f.argtypes = argtypes
            f.restype = ctypes.c_int
            return f
    raise AttributeError(f"libcuda has none of {names}")


class DriverEvents:
    """Timing events as raw ``CUevent`` handles (ints) in one device's primary context.

    Build it on a thread that uses the device (the Monitor's constructor). Not
    for direct use: :class:`perfsdk.Monitor` drives it.
    """

    name = "driver"

    def __init__(self, device: int, raw_stream: Callable[[int], int]) -> None:
        py, c = _libs()
        vp, u, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        pvp = ctypes.POINTER(ctypes.c_void_p)
        self._device = device
        self._raw_stream = raw_stream
        self._error_name = _fn(c, ("cuGetErrorName",), [i, ctypes.POINTER(ctypes.c_char_p)])
        _fn(c, ("cuInit",), [u])(0)
        dev = i()
        self._check("cuDeviceGet", _fn(c, ("cuDeviceGet",), [ctypes.POINTER(i), i])(ctypes.byref(dev), device))
        context = vp()
        retain = _fn(c, ("cuDevicePrimaryCtxRetain",), [pvp, i])
        self._check("cuDevicePrimaryCtxRetain", retain(ctypes.byref(context), dev))
        self._dev = dev.value
        self._context = context.value
        self._ctx_release = _fn(c, ("cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"), [i])
        self._ctx_set = _fn(c, ("cuCtxSetCurrent",), [vp])
        self._ctx_get = _fn(c, ("cuCtxGetCurrent",), [pvp])
        self._ctx_push = _fn(c, ("cuCtxPushCurrent_v2", "cuCtxPushCurrent"), [vp])
        self._ctx_pop = _fn(c, ("cuCtxPopCurrent_v2", "cuCtxPopCurrent"), [pvp])
        self._create = _fn(c, ("cuEventCreate",), [pvp, u])
        self._destroy = _fn(c, ("cuEventDestroy_v2", "cuEventDestroy"), [vp])
        self._record_fn = _fn(py, ("cuEventRecord",), [vp, vp])  # PyDLL: keeps the GIL (hot path)
        self._query = _fn(py, ("cuEventQuery",), [vp])  # PyDLL: returns at once; no reason to drop the GIL
        self._sync = _fn(c, ("cuEventSynchronize",), [vp])  # CDLL: releases the GIL while the driver sleeps
        self._elapsed = _fn(
            py, ("cuEventElapsedTime_v2", "cuEventElapsedTime"), [ctypes.POINTER(ctypes.c_float), vp, vp]
        )
        self._exchange_mode = _fn(c, ("cuThreadExchangeStreamCaptureMode",), [ctypes.POINTER(i)])
        self._ms = ctypes.c_float()
        self._ms_ref = ctypes.byref(self._ms)
        self._closed = False

    # ---- errors -------------------------------------------------------
    def _check(self, call: str, code: int) -> None:
        if code != CUDA_SUCCESS:
            raise CudaDriverError(call, code, self._name(code))

    def _name(self, code: int) -> str | None:
        s = ctypes.c_char_p()
        try:
            if self._error_name(code, ctypes.byref(s)) == CUDA_SUCCESS and s.value:
                return s.value.decode()
        except Exception:
            pass
        return None

    # ---- the event-API interface (see perfsdk.timing.EventApi) ----------
    #: the step core waits for these events by polling (they are not blocking-sync events)
    poll_wait = True

    def ensure_context(self) -> None:
        """Make the primary context current on this thread if no context is (the runtime does the same).

        The hot path calls this when a driver call answers ``CUDA_ERROR_INVALID_CONTEXT``: a new engine
        thread whose first CUDA call is perfsdk's step has no current context yet.
        """
        cur = ctypes.c_void_p()
        if self._ctx_get(ctypes.byref(cur)) == CUDA_SUCCESS and not cur.value:
            self._check("cuCtxSetCurrent", self._ctx_set(self._context))

    def new(self) -> int:
        # in this device's primary context whatever is current on the calling thread (which may be
        # another device's): pushed for the call, popped after
        self._check("cuCtxPushCurrent", self._ctx_push(self._context))
        try:
            ev = ctypes.c_void_p()
            self._check("cuEventCreate", self._create(ctypes.byref(ev), CU_EVENT_DEFAULT))
        finally:
            self._ctx_pop(ctypes.byref(ctypes.c_void_p()))
        return int(ev.value or 0)

    def destroy(self, ev: int) -> None:
        if not self._closed:
            self._destroy(ev)

    def make_stream(self) -> Callable[[], int]:
        """``() -> handle`` of the calling thread's current stream (one C call, no ``Stream`` object)."""
        import functools

        return functools.partial(self._raw_stream, self._device)

    def make_record_on(self) -> Callable[[int, int], int]:
        """``record_on(event, stream_handle) -> CUresult``: the bare ctypes function (0 is success).

        The hot path checks the result itself (``raise_for``), which spares a Python frame per record.
        """
        return self._record_fn  # type: ignore[no-any-return]

    def record_address(self) -> int:
        """The address of ``cuEventRecord`` itself, for the C hot path (``perfsdk/csrc/hotpath.c``) to call directly."""
        return int(ctypes.cast(self._record_fn, ctypes.c_void_p).value or 0)

    def capture_check_address(self) -> int:
        """The address of ``cuStreamIsCapturing``, for the C hot path's graph-capture check (0: none)."""
        try:
            py, _ = _libs()
            return int(ctypes.cast(py.cuStreamIsCapturing, ctypes.c_void_p).value or 0)
        except (OSError, AttributeError):
            return 0

    def addresses(self) -> Any:
        """The driver functions the C hot path and step core call directly (a :class:`DriverAddresses`)."""
        py, _ = _libs()

        def address(name: str) -> int:
            f = getattr(py, name, None)
            return int(ctypes.cast(f, ctypes.c_void_p).value or 0) if f is not None else 0

        return DriverAddresses(
            record=self.record_address(),
            is_capturing=self.capture_check_address(),
            query=address("cuEventQuery"),
            synchronize=0 if self.poll_wait else address("cuEventSynchronize"),  # 0: the core polls
            elapsed=address("cuEventElapsedTime_v2") or address("cuEventElapsedTime"),
            ctx_set_current=address("cuCtxSetCurrent"),
            context=int(self._context or 0),
            exchange_capture_mode=address("cuThreadExchangeStreamCaptureMode"),
        )

    def raise_for(self, code: int) -> None:
        """Raise :class:`CudaDriverError` for a failed record's result code."""
        self._check("cuEventRecord", code)

    def query(self, ev: int) -> bool:
        r = self._query(ev)
        if r == CUDA_SUCCESS:
            return True
        if r == CUDA_ERROR_NOT_READY:
            return False
        self._check("cuEventQuery", r)
        return False

    def wait(self, ev: int) -> None:
        self._check("cuEventSynchronize", self._sync(ev))

    def elapsed_s(self, start: int, end: int) -> float:
        # one thread (the collector) calls this, so the shared out-parameter is safe
        self._check("cuEventElapsedTime", self._elapsed(self._ms_ref, start, end))
        return self._ms.value / 1e3

    def thread_setup(self) -> None:
        """On the collector thread: the events' context current, and CUDA's relaxed capture mode.

        While another thread captures a CUDA graph in the default global mode,
        ``cuEventQuery``/``cuEventSynchronize`` from any other thread invalidate
        the capture; the collector opts out, as PyTorch's NCCL watchdog does.
        """
        self.ensure_context()
        relax_capture_mode()

    def close(self) -> None:
        """Give the primary-context reference back (events not destroyed yet die with the context)."""
        if not self._closed:
            self._closed = True
            self._ctx_release(self._dev)


def relax_capture_mode() -> None:
    """Put the calling thread in CUDA's *relaxed* stream-capture mode (``cuThreadExchangeStreamCaptureMode``).

    While another thread captures a CUDA graph in the default global mode, "potentially unsafe" calls from
    any other thread — ``cuEventQuery`` and ``cuEventSynchronize`` among them — invalidate the capture. A
    thread that reads events (the Python step core; the C core does the same through the function's
    address) opts out, as PyTorch's NCCL watchdog thread does. No driver library (a CPU box): nothing to do.
    """
    try:
        _, c = _libs()
        mode = ctypes.c_int(CU_STREAM_CAPTURE_MODE_RELAXED)
        c.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    except (OSError, AttributeError):
        pass


def driver_events(device: int | None = None) -> DriverEvents | None:
    """:class:`DriverEvents` for *device* (default: torch's current one), or None where unavailable.

    Unavailable: no ``libcuda.so.1`` (not Linux, no NVIDIA driver), a driver
    without these entry points, or a torch without ``_cuda_getCurrentRawStream``.
    """
    try:
        import torch

        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is None:
            return None
        dev = torch.cuda.current_device() if device is None else device
        return DriverEvents(dev, raw)
    except Exception:  # no driver, no device, a driver without these calls: torch's events instead
        return None
