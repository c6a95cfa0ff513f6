"""A Monitor's life once built: starting and closing it, a constructor that fails, and ``os.fork()``.

:class:`perfsdk.Monitor` calls into here; nothing here runs per step. What changes in the hot path (its step
maker, core, events and timing) changes through the Monitor's :class:`~perfsdk.recorder.Recorder`, their one
owner; the rest of what a Monitor runs (collector, sinks, request queue, metrics server) is started and
stopped here.

* **A constructor that fails** leaves nothing behind: settings that cannot work (the metrics port plus
  ``LOCAL_RANK`` past 65535, an address off loopback from the environment) are refused and the metrics
  port is bound before any thread starts; whatever had started is stopped again (:func:`release`).
* **After** :meth:`~perfsdk.Monitor.close` a call that records (``request``, ``decode``/``prefill``/``mixed``,
  ``record_*``) is a no-op counted in ``stats()["calls_after_close"]`` and logged once (:class:`Recording`;
  the step maker is rebound once, the steps check nothing); one that would start something
  (``serve_metrics``, ``enable_profiler``, ``profile``) raises :class:`~perfsdk.errors.MonitorClosedError`;
  ``flush`` says whether ``close`` exported everything; ``stats`` and ``metrics_text`` read the final values.
  A request begun before and finished after close is dropped, counted in ``dropped_records``.
* **os.fork()** (gunicorn ``--preload``, pre-fork workers): a Monitor keeps working in the child, in the
  manner of the Prometheus and OpenTelemetry clients (``os.register_at_fork``). The fork waits (at most
  :data:`FORK_QUIESCE` s) until no perfsdk thread holds a lock the child would need — the registry's
  update lock (every metric write and scrape) and the span sink's build lock (a span exporter's locks).
  In the child the step core is made anew in place (the C one re-initialises its mutexes and empties its
  ring: the parent's queued and counted steps are the parent's to export), and so are the request queue,
  the span queue and the collector (a new thread); the parent's metrics server stays the parent's (the
  child closes its copy of the socket); CUDA-event timing, which a forked child cannot use, becomes host
  timing. The child says both once, when it first exports something (a copy that stays idle, as a
  Monitor inherited by a worker that makes its own, says nothing). If the fork could not take the span
  lock, the child builds no spans (each dropped and counted; metrics go on); if it could not take the
  registry's, the child's Monitor is closed: it records nothing, counted, and says once to create the
  Monitor after the fork. ``docs/metrics.md`` ("Pre-fork servers") says what the child's metrics are.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfsdk.metrics_server import MetricsServer

__all__ = ["FORK_QUIESCE", "Recording", "bind", "close", "flush", "release", "serve", "start", "track"]

log = logging.getLogger("perfsdk")

FORK_QUIESCE = 5.0  # how long os.fork() waits at most for perfsdk's threads to finish a metric write or a span


class Recording:
    """Whether a Monitor records; once it does not (closed, or unusable after a fork), what calls on it count."""

    __slots__ = ("calls", "enabled", "flushed", "on", "pushed_at_close", "service", "why")

    def __init__(self, enabled: bool, service: str) -> None:
        self.enabled = enabled
        self.on = enabled
        self.service = service
        self.why = "closed"
        self.calls = 0  # calls that recorded nothing because the Monitor does not record any more
        self.flushed = not enabled  # close() exported everything
        self.pushed_at_close = 0  # the core's pushes when it stopped (a step object entered later adds one)

    def refused(self, what: str) -> None:
        """A call that would record on a Monitor that no longer does: count it, say so once."""
        if not self.enabled:
            return  # a disabled Monitor: every call is a no-op by design
        self.calls += 1
        if self.calls == 1:
            if self.why == "fork":
                log.error(
                    "perfsdk: %s() in a process forked while this Monitor's exporter was busy records "
                    "nothing here. Create the Monitor after the fork (gunicorn: in post_fork). Such calls are "
                    "counted in stats()['calls_after_close']; logged once.",
                    what,
                )
            else:
                log.warning(
                    "perfsdk: %s() on a closed Monitor (service %r) records nothing; such calls are counted "
                    "in stats()['calls_after_close'] (logged once)",
                    what,
                    self.service,
                )

    def reason(self) -> str:
        if self.why == "fork":
            return (
                f"this Monitor (service {self.service!r}) cannot be used in this process: it was forked while "
                "the Monitor's exporter was busy; create a Monitor after the fork"
            )
        return f"this Monitor (service {self.service!r}) is closed"

    def late(self, core: Any) -> int:
        """Calls after close, with steps made before it and entered after (they reach the stopped core)."""
        extra = max(0, core.pushed - self.pushed_at_close) if not self.on and core is not None else 0
        return self.calls + extra


def start(mon: Any, cfg: Any, server: Any) -> None:
    """Start an enabled Monitor's threads (the step core, the collector) and its metrics server, in that order."""
    from perfsdk import assembly
    from perfsdk.collector import Collector

    assembly.warn_missing(mon.model, mon.hardware, mon._hardware_asked)
    parts, recorder = mon._parts, mon._recorder
    core, otel = recorder.core, parts.otel
    mon._collector = Collector(
        core,
        parts.requests,
        parts.sinks,
        mon._errors,
        model=mon.model_name,
        operation=mon.operation,
        epoch_offset_ns=mon._epoch_offset_ns,
        export_interval=cfg.export_interval,
        recorder=recorder,
        peaks=assembly.peak_notes(mon.hardware, mon.compute_dtype),
        spans_dropped=None
        if otel is None
        else lambda: {"sample_cap": core.dropped_samples, "queue_full": otel.dropped},
    )
    core.start()
    mon._collector.start()
    if server is not None:
        mon._server = server
        server.start()
    track(mon)


def bind(mon: Any, endpoint: tuple[int, str] | None) -> MetricsServer | None:
    """The metrics server of ``PERFSDK_METRICS_PORT`` (*endpoint*: port, address), bound now and served once all
    runs (:func:`start`): a port in use fails the constructor before any thread starts."""
    if endpoint is None:
        return None
    from perfsdk.metrics_server import MetricsServer

    return MetricsServer(mon, port=endpoint[0], addr=endpoint[1], errors=mon._errors, start=False)


def serve(mon: Any, port: int | None, addr: str, token: str | None) -> MetricsServer:
    """:meth:`perfsdk.Monitor.serve_metrics`: one metrics server per Monitor, started here."""
    from perfsdk.errors import ConfigError, MonitorClosedError
    from perfsdk.metrics_server import MetricsServer

    if mon._closed:
        raise MonitorClosedError(f"serve_metrics: {mon._life.reason()}; create a new Monitor to serve metrics")
    running: MetricsServer | None = mon._server
    if running is not None:
        if port not in (None, 0, running.port) or addr != running.addr:
            raise ConfigError(
                f"serve_metrics: this Monitor already serves {running.url}; close it first to serve {addr}:{port}"
            )
        return running
    server = mon._server = MetricsServer(
        mon, port=9400 if port is None else port, addr=addr, token=token, errors=mon._errors
    )
    return server


def stop_recording(mon: Any, why: str) -> None:
    """Every later call that records is a counted no-op: steps through the step maker (rebound once here),
    requests and measured values through :class:`Recording`; a request begun before and finished after is
    dropped, counted."""
    mon._life.on = False
    mon._life.why = why
    mon._recorder.stop(mon._life.refused)
    mon._parts.requests.capacity = 0


def flush(mon: Any, timeout: float | None, sinks: bool = True) -> bool:
    """:meth:`perfsdk.Monitor.flush` of a Monitor not yet closed (and the flush inside :func:`close`)."""
    from perfsdk.records import Flush

    c = mon._collector
    if c is None or not c.is_alive():
        return not mon._life.enabled
    marker = Flush(threading.Event(), timeout, [], sinks)
    mon._parts.requests.push_marker(marker)  # a marker is never dropped
    c.wake()
    return marker.done.wait(timeout) and all(marker.result)


def close(mon: Any, timeout: float | None) -> None:
    """:meth:`perfsdk.Monitor.close`: stop recording, flush, release, within *timeout* in all."""
    untrack(mon)
    deadline = None if timeout is None else time.monotonic() + timeout
    window = mon._recorder.window
    if window is not None:
        try:
            window.close(_left(deadline))
        except Exception as e:
            mon._errors.record(e, "window.close")
    if mon._life.enabled:
        stop_recording(mon, "closed")  # nothing new after the flush below
    mon._life.flushed = flush(mon, _left(deadline))
    release(mon, _left(deadline))


def release(mon: Any, timeout: float | None) -> None:
    """Stop the threads, close the sinks, the events and the server, within *timeout* in all (close, and a
    constructor that failed: whatever of it exists)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    if mon._collector is not None:
        mon._collector.stop(_left(deadline))
    parts = getattr(mon, "_parts", None)  # None: the constructor failed before anything was built
    if parts is not None:
        for s in parts.sinks:
            try:
                s.close(_left(deadline))
            except Exception as e:
                mon._errors.record(e, f"{type(s).__name__}.close")
        parts.recorder.stop_core(_left(deadline))  # and once stopped, its events
        mon._life.pushed_at_close = parts.recorder.core.pushed
    if mon._server is not None:
        mon._server.close(_left(deadline))


def abandon(mon: Any, server: Any) -> None:
    """A constructor failed: release whatever of the Monitor exists (its own error is the one raised)."""
    mon._closed = True
    untrack(mon)
    try:
        release(mon, 2.0)
    except Exception as e:
        log.error("perfsdk: releasing what a failed Monitor() had started failed: %s", e)
    if server is not None:
        server.close(0)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


# ---- os.fork() --------------------------------------------------------------------------------------------------
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # enabled Monitors not yet closed
_live_lock = threading.Lock()  # guards _LIVE (held for an add, a discard or a copy only)
_fork_monitors: list[Any] = []  # _LIVE when the fork began: the child restarts these
_fork_held: dict[int, tuple[threading.Lock, bool]] = {}  # id(lock) -> (lock, acquired), between before and after


def track(mon: Any) -> None:
    """*mon* runs: a fork restarts it in the child."""
    with _live_lock:
        _LIVE.add(mon)


def untrack(mon: Any) -> None:
    with _live_lock:
        _LIVE.discard(mon)


def fork_locks(mon: Any) -> dict[str, threading.Lock]:
    """The locks a fork waits for: perfsdk's threads hold them while they write a metric (``"metrics"``: the
    registry's update lock, taken by the collector's exports and every scrape) or build a span (``"spans"``:
    while the span exporter's own locks may be held)."""
    from perfsdk.sinks.prometheus import update_lock

    parts = mon._parts
    locks = {}
    if parts.prom is not None:
        locks["metrics"] = update_lock(parts.registry)
    if parts.otel is not None:
        locks["spans"] = parts.otel.building
    return locks


def restart_in_child(mon: Any, got: dict[str, bool]) -> None:
    """In the child of ``os.fork()``, before it runs anything else: the parts made anew (module docstring).
    *got*: which of :func:`fork_locks` the fork took (a lock it could not take may be held forever here)."""
    mon._errors.reset()  # the parent's errors are the parent's
    server, mon._server = mon._server, None
    if server is not None:
        server.close(0)  # this process's copy of the socket only: the port stays the parent's
    parts = mon._parts
    cuda = mon._recorder.after_fork()  # perfsdk's own state made anew whatever the fork found; CUDA events: host timing
    parts.requests.after_fork()
    if parts.otel is not None:
        parts.otel.after_fork(usable=got.get("spans", True))  # if not: spans dropped and counted, metrics go on
    if not got.get("metrics", True):
        # a perfsdk thread held a lock of the registry or the span exporter at the fork: nobody will ever let go
        # of it in this process, so nothing here may write a metric or build a span
        stop_recording(mon, "fork")
        mon._closed = True
        mon._collector = None
        untrack(mon)
        return
    mon._collector = mon._collector.forked()
    if server is not None and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        mon._collector.notices.append(
            f"perfsdk: forked (pid {os.getpid()}): {server.url}/metrics is the parent's; this process's metrics are "
            "served by nothing until it calls serve_metrics() with a port of its own (or set PROMETHEUS_MULTIPROC_DIR "
            'before the fork; docs/metrics.md, "Pre-fork servers")'
        )
    if cuda:
        mon._collector.notices.append(
            f"perfsdk: forked (pid {os.getpid()}) from a process that times steps with CUDA events, which a forked "
            "child cannot use (nor the GPU): this process's steps are timed with the host clock. To time GPU work in "
            "a worker, start it with spawn or forkserver and make its Monitor there."
        )
    mon._recorder.core.start()
    mon._collector.start()


def _before_fork() -> None:
    """Wait (at most FORK_QUIESCE s in all) until no perfsdk thread holds a lock the child would need."""
    deadline = time.monotonic() + FORK_QUIESCE
    _fork_held.clear()
    _fork_monitors.clear()
    try:
        with _live_lock:
            _fork_monitors.extend(_LIVE)
        for mon in _fork_monitors:
            for lk in fork_locks(mon).values():
                if id(lk) not in _fork_held:  # two Monitors on one registry share its lock
                    _fork_held[id(lk)] = (lk, lk.acquire(timeout=max(0.0, deadline - time.monotonic())))
    except Exception as e:  # never fail a fork
        log.error("perfsdk: preparing for fork failed: %s", e)


def _release_fork_locks() -> None:
    for lk, acquired in _fork_held.values():
        if acquired:
            lk.release()


def _after_fork_in_parent() -> None:
    _release_fork_locks()
    _fork_held.clear()
    _fork_monitors.clear()


def _after_fork_in_child() -> None:
    global _live_lock
    _live_lock = threading.Lock()  # another thread of the parent may have held it
    _release_fork_locks()  # the forking thread took them; in the child it is the only thread
    for mon in _fork_monitors:
        try:
            got = {name: _fork_held.get(id(lk), (lk, False))[1] for name, lk in fork_locks(mon).items()}
            restart_in_child(mon, got)
        except Exception as e:  # never fail the child: the Monitor records nothing there, and says so
            log.error(
                "perfsdk: restarting a Monitor after fork failed (%s: %s); it records nothing in this "
                "process: create the Monitor after the fork",
                type(e).__name__,
                e,
            )
            try:
                stop_recording(mon, "fork")
            except Exception:
                pass
    _fork_held.clear()
    _fork_monitors.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
