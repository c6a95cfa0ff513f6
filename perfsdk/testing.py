"""Testing helpers: an in-memory Monitor you can read back, a scripted GPU, and a probe of its insides.

::

    from perfsdk.testing import FakeClock, monitor_harness

    clock = FakeClock()
    with monitor_harness(model="llama-3-8b", hardware="h100-sxm", clock=clock) as h:
        req = h.monitor.request(prompt_tokens=16)
        clock.advance(0.050)
        req.tokens(1)                       # TTFT = 50 ms
        req.finish()
        assert h.value("gen_ai_server_time_to_first_token_seconds_sum") == 0.05
        assert h.count("gen_ai_server_time_to_first_token_seconds") == 1
        [span] = [s for s in h.spans() if s.name.startswith("text_completion")]

The harness gives the Monitor a fresh ``CollectorRegistry`` (nothing global is
touched), turns strict mode on (a bad value from the code under test raises
:class:`~perfsdk.errors.ConfigError` instead of being dropped and counted) and,
when the OpenTelemetry SDK is installed, its own
``TracerProvider`` with an ``InMemorySpanExporter`` (the global provider is
left alone). Reads flush the Monitor first, so everything recorded before the
read is visible.

**CUDA-event timing without a GPU.** :class:`ScriptedGpu` offers CUDA's event API over integer events
whose records take a GPU clock the test moves; both hot paths and both step cores run against it (the C
ones through C function pointers with libcuda's signatures)::

    gpu = ScriptedGpu()
    with monitor_harness(model="llama-3-8b", hardware="h100-sxm", gpu=gpu) as h:
        with h.monitor.decode(batch=8, context_tokens=8192):
            gpu.now_ms += 1.5               # the step's device time
        assert h.sum("perfsdk_step_seconds", phase="decode") == 0.0015

:func:`scripted_monitor` makes a plain Monitor on a scripted GPU (your registry, your settings).

**The probe** (``h.probe``, or :func:`probe` for any Monitor) is what perfsdk's own tests and benchmarks
read of a Monitor's insides and the few things they do to it, so that no test needs a private attribute:
the event pool (``probe.events.in_use``, ``created``, ``reserve(n)``), a step core that has fallen behind
(``with probe.paused_core(): ...``; ``probe.waiting``), a raw :class:`~perfsdk.records.StepRecord`
(``probe.push_step(record)``), the core's last steps (``probe.recent("decode")``), failing callbacks on the
hot path (``with probe.hooks(nvtx_pop=boom): ...``), the collector's thread. Its answers follow the
Monitor's parts; read them, do not keep them across a :meth:`MonitorHarness.reopen`.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from perfsdk.cuda_driver import DriverAddresses
from perfsdk.monitor import Monitor
from perfsdk.recorder import Events
from perfsdk.records import PHASES, StepRecord

__all__ = ["FakeClock", "MonitorHarness", "MonitorProbe", "ScriptedGpu", "monitor_harness", "probe", "scripted_monitor"]

CUDA_ERROR_NOT_READY = 600
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_UNKNOWN = 999

_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_IS_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_EVENT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_ELAPSED = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_void_p, ctypes.c_void_p)


class FakeClock:
    """A nanosecond clock that moves only when told: ``Monitor(clock=FakeClock())``."""

    def __init__(self, start_ns: int = 1_000_000_000) -> None:
        self.now_ns = start_ns

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> int:
        self.now_ns += round(seconds * 1e9)
        return self.now_ns


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])


class ScriptedGpu:
    """CUDA's event API (:class:`perfsdk.timing.EventApi`) over integer events whose records take the GPU
    clock of the moment (``now_ms``, moved by the test).

    The Python hot path and core call the methods; the C ones call the same methods through C function
    pointers (:meth:`addresses`), so a subclass that overrides a method changes both. Elapsed times are
    rounded to float32 milliseconds, as ``cuEventElapsedTime`` reports them, so both read the same numbers.
    Scripted failures: ``fail_record_after`` (records beyond that many fail), ``fail_elapsed`` (the next N
    reads fail), ``capturing`` (inside a CUDA-graph capture), ``record_waits`` (each record moves a
    :class:`FakeClock` on, as a record waiting for room in a full launch queue does).
    """

    name = "fake"
    poll_wait = False  # True: the core waits by querying (as for perfsdk's own, non-blocking-sync, events)
    pool_capacity = 64  # events the Monitor may make (the Monitor reads these two)
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
        self.record_waits: tuple[FakeClock, float] | None = None  # (clock, seconds per record)
        self._callbacks: list[Any] = []  # the ctypes callbacks, kept alive

    # ---- serving-thread side ---------------------------------------------------------------------
    def new(self) -> int:
        self.made += 1
        return self.made

    def destroy(self, ev: int) -> None:
        pass

    def make_stream(self) -> Callable[[], int]:
        return lambda: self.stream

    def make_record_on(self) -> Callable[[int, int], int]:
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
        """(The status of) cuStreamIsCapturing: 0 success; the Python path asks :meth:`capture_check`."""
        return 0

    def capture_check(self) -> bool:
        return self.capturing

    # ---- step-core side --------------------------------------------------------------------------
    def query(self, ev: int) -> bool:
        return True

    def wait(self, ev: int) -> None:
        self.waits += 1

    def elapsed_s(self, start: int, end: int) -> float:
        if self.fail_elapsed:
            self.fail_elapsed -= 1
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return _f32(self.t_ms[end] - self.t_ms[start]) / 1e3

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
        return DriverAddresses(
            record=addr[0],
            is_capturing=addr[1],
            query=addr[2],
            synchronize=0 if self.poll_wait else addr[3],
            elapsed=addr[4],
            ctx_set_current=0,
            context=0,
            exchange_capture_mode=0,
        )


def scripted_monitor(gpu: ScriptedGpu | None, **monitor_kwargs: Any) -> Monitor:
    """``Monitor(**monitor_kwargs)`` whose steps are timed with CUDA events on *gpu*, as ``timing="cuda"``
    would on a real one (None: as configured, no scripted GPU)."""
    return Monitor(**monitor_kwargs, _events=gpu)


class MonitorProbe:
    """What perfsdk's own tests and benchmarks read of a Monitor's insides (see the module docstring)."""

    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor
        self._recorder = monitor._recorder  # the Monitor's one owner of its hot path (perfsdk.recorder.Recorder)

    @property
    def events(self) -> Events:
        """The Monitor's CUDA events, whichever side keeps them: ``in_use``, ``created``, ``reserve(n)``."""
        return self._recorder.events

    @contextlib.contextmanager
    def paused_core(self) -> Iterator[MonitorProbe]:
        """A step core that reads nothing meanwhile (one that has fallen behind); it carries on at the exit."""
        core = self._recorder.core
        core.pause(True)
        try:
            yield self
        finally:
            core.pause(False)

    @property
    def waiting(self) -> int:
        """Step records pushed and not yet counted by the core."""
        return int(self._recorder.core.waiting)

    def push_step(self, record: StepRecord) -> bool:
        """Hand *record* to the step core as the hot path would (False: dropped, the core is behind)."""
        return bool(self._recorder.core.push(record))

    def recent(self, phase: str) -> Any:
        """The core's last steps of *phase*, as ``stats()`` reads them: (steps, errors, seconds, MBUs, MFUs)."""
        return self._recorder.core.recent(PHASES.index(phase))

    @property
    def core_implementation(self) -> str:
        """Which step core counts: ``"c"`` or ``"python"``."""
        return str(self._recorder.core.implementation)

    @property
    def feeds(self) -> dict[str, bool]:
        """Whether the core keeps every decode step for a profiler window (``window_feed``) and every timed
        step's values for an OpenTelemetry metrics sink (``value_feed``)."""
        core = self._recorder.core
        return {"window_feed": bool(core.feed_window), "value_feed": bool(core.feed_values)}

    @contextlib.contextmanager
    def hooks(
        self,
        *,
        nvtx_push: Callable[[str, int], Any] | None = None,
        nvtx_pop: Callable[[], Any] | None = None,
        clock: Callable[[], int] | None = None,
        stream: Callable[[], int] | None = None,
        capturing: Callable[[], bool] | None = None,
    ) -> Iterator[None]:
        """Replace callbacks the hot path calls on every step (fault injection), both implementations alike: an
        NVTX range's push or pop (NVTX is on meanwhile), the clock, the current stream's handle, the CUDA-graph
        capture check. What was there is put back at the exit."""
        given = {"nvtx_push": nvtx_push, "nvtx_pop": nvtx_pop, "clock": clock, "stream": stream, "capturing": capturing}
        changes: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        if nvtx_push is not None or nvtx_pop is not None:
            changes["nvtx_on"] = True
        state = self._recorder.state
        before = {k: getattr(state, k) for k in changes}
        self._recorder.rebind(**changes)
        try:
            yield
        finally:
            self._recorder.rebind(**before)

    @property
    def sinks(self) -> list[Any]:
        """The sinks the collector hands results to (Prometheus, OpenTelemetry spans and metrics)."""
        return list(self.monitor._parts.sinks)

    @property
    def collector_thread(self) -> threading.Thread | None:
        """The collector's thread (None: not started — a disabled Monitor's, or a closed child's after a fork
        that could not take perfsdk's locks)."""
        return self.monitor._collector

    def hot_objects(self) -> dict[str, Any]:
        """The hot path's own objects — ``core`` (the step core), ``state`` (the
        :class:`~perfsdk.hotpath.HotState`) and ``hot`` (the C ``Hot`` built from it, or the state itself in
        Python) — for tests of the C extension's reference counts and attribute handling."""
        r = self._recorder
        return {"core": r.core, "state": r.state, "hot": getattr(r, "hot", r.state)}


def probe(monitor: Monitor) -> MonitorProbe:
    """A :class:`MonitorProbe` of *monitor* (any Monitor; a harness has ``h.probe``)."""
    return MonitorProbe(monitor)


class MonitorHarness:
    """A Monitor wired to a private registry and an in-memory span exporter.

    *gpu*: a :class:`ScriptedGpu` that times the Monitor's steps with CUDA events (default: host timing).
    """

    def __init__(self, *, gpu: ScriptedGpu | None = None, **monitor_kwargs: Any) -> None:
        self.registry = CollectorRegistry()
        self.exporter: Any = None
        self.tracer_provider: Any = None
        try:
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import SimpleSpanProcessor
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            self.exporter = InMemorySpanExporter()
            self.tracer_provider = TracerProvider()
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        except ImportError:
            pass
        kwargs: dict[str, Any] = {"timing": "host", "nvtx": False, "model": None, "hardware": None, "strict": True}
        kwargs.update(monitor_kwargs)
        if self.tracer_provider is not None:
            kwargs.setdefault("tracer_provider", self.tracer_provider)
        else:
            kwargs.setdefault("otel", False)
        self.kwargs = kwargs
        self.gpu = gpu
        self.monitor = scripted_monitor(gpu, registry=self.registry, **kwargs)

    def reopen(self, *, gpu: ScriptedGpu | None = None, **changes: Any) -> Monitor:
        """Close the Monitor and make a new one on the same registry and span exporter, with *changes* to
        its settings (and *gpu*, when given, as its scripted GPU). Returns it (also ``self.monitor``)."""
        self.monitor.close()
        self.kwargs.update(changes)
        if gpu is not None:
            self.gpu = gpu
        self.monitor = scripted_monitor(self.gpu, registry=self.registry, **self.kwargs)
        return self.monitor

    @property
    def probe(self) -> MonitorProbe:
        """A :class:`MonitorProbe` of the current Monitor."""
        return MonitorProbe(self.monitor)

    def flush(self) -> None:
        if not self.monitor.flush(timeout=30):
            raise TimeoutError("perfsdk collector did not drain within 30 s")

    def value(self, name: str, **labels: str) -> float | None:
        """A sample's value (``..._sum``, ``..._count``, ``..._total``, a bucket with ``le=``), after a flush."""
        self.flush()
        if "model" not in labels and not name.startswith(("perfsdk_dropped", "perfsdk_internal", "perfsdk_hardware")):
            labels["model"] = self.monitor.model_name
        return self.registry.get_sample_value(name, labels)

    def count(self, histogram: str, **labels: str) -> float:
        """Observations in a histogram (0 when it has none)."""
        return self.value(f"{histogram}_count", **labels) or 0.0

    def sum(self, histogram: str, **labels: str) -> float:
        return self.value(f"{histogram}_sum", **labels) or 0.0

    def spans(self) -> list[Any]:
        """Finished spans, oldest first (empty without the OpenTelemetry SDK)."""
        self.flush()
        if self.exporter is None:
            return []
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush()
        return list(self.exporter.get_finished_spans())

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self.monitor.close()
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()


@contextlib.contextmanager
def monitor_harness(*, gpu: ScriptedGpu | None = None, **monitor_kwargs: Any) -> Iterator[MonitorHarness]:
    """``with monitor_harness(...) as h:`` — a :class:`MonitorHarness`, closed on exit."""
    h = MonitorHarness(gpu=gpu, **monitor_kwargs)
    try:
        yield h
    finally:
        h.close()
