"""One owner of a Monitor's mutable hot-path state, chosen once when the Monitor is built.

:func:`perfsdk.assembly.assemble` builds one :class:`Recorder` per Monitor — :class:`PythonRecorder` (the
reference hot path, :mod:`perfsdk.hotpath`), :class:`NativeRecorder` (the C one, ``perfsdk._native``) or
:class:`OffRecorder` (a disabled Monitor) — in the manner of prometheus_client's ``ValueClass =
get_value_class()``: nothing asks afterwards which one it has. It owns, each in one place:

* the :class:`~perfsdk.hotpath.HotState` (and, in C, the ``Hot`` built from it) and the step factory,
  ``make(phase, batch, tokens, context_tokens, seq_lens)``, which ``Monitor.decode()`` and its siblings call;
* the step core (``core``) and its events (``events``, an :class:`Events`: reserve, close, in use — the
  :class:`~perfsdk.timing.EventPool` of the Python path, the pool the C core keeps in C, or none);
* the profiler window: :meth:`Recorder.set_window` is the one place it is set (the hot path's per-step copy
  and the core's window feed follow); the collector and the Monitor read :attr:`Recorder.window`;
* the steps counted but not timed because every event was in flight (:attr:`Recorder.event_pool_empty`,
  ``stats()["untimed_steps_event_pool_empty"]``);
* what changes later in a Monitor's life (:mod:`perfsdk.lifecycle` calls these): :meth:`~Recorder.stop`
  (closed: every later step a counted no-op), :meth:`~Recorder.stop_core`, :meth:`~Recorder.after_fork`
  (a forked child times with the host clock) and :meth:`~Recorder.rebind`.

Nothing here runs per step but ``make`` itself, which is the chosen implementation's constructor.
:mod:`perfsdk.testing` reads and drives a Monitor's recorder for tests (``MonitorProbe``).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import Any, Protocol

from perfsdk._guard import ErrorGuard
from perfsdk.decorators import bare_function, decorate
from perfsdk.errors import ConfigError
from perfsdk.hotpath import HotState, LastEnd, NoStep, Step, ThreadSteps
from perfsdk.records import UNSIZED
from perfsdk.sizes import check_sizes

__all__ = [
    "CoreEvents",
    "Events",
    "NativeRecorder",
    "NoEvents",
    "OffRecorder",
    "PythonRecorder",
    "Recorder",
    "load_native",
]


class Events(Protocol):
    """A Monitor's CUDA events, whichever side keeps them."""

    @property
    def in_use(self) -> int:
        """Events held by a step or a serving thread."""

    @property
    def created(self) -> int:
        """Events made so far."""

    def reserve(self, events: int) -> None:
        """Make events now, up to *events* free ones (within the capacity), so that no step pays for one."""

    def close(self) -> None:
        """After the core stopped: destroy the free events; later steps are counted, not timed."""

    def abandon(self) -> None:
        """In a forked child: hand out no more events and destroy none (they are the parent's)."""


class NoEvents:
    """Host timing: no events."""

    in_use = 0
    created = 0

    def reserve(self, events: int) -> None:
        pass

    def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class CoreEvents:
    """The event pool the C step core keeps in C (atomic reference counts), as :class:`Events`."""

    def __init__(self, core: Any) -> None:
        self.core = core

    @property
    def in_use(self) -> int:
        return int(self.core.events_in_use)

    @property
    def created(self) -> int:
        return int(self.core.events_created)

    def reserve(self, events: int) -> None:
        self.core.reserve(events)

    def close(self) -> None:
        self.core.close_events()

    def abandon(self) -> None:
        pass  # the core's after_fork() dropped them already (it owns them)


class Recorder(abc.ABC):
    """The one owner of a Monitor's hot-path state (see the module docstring).

    Makes the step objects: C steps from the C hot path (odd sizes validated in Python), Python
    :class:`~perfsdk.hotpath.Step` objects otherwise. A bad size raises in strict mode; otherwise the step
    is a :class:`~perfsdk.hotpath.NoStep` (runs, records nothing) and the value is counted and logged once.
    """

    hot_path = "python"  # what Monitor.hot_path says

    def __init__(
        self,
        state: HotState,
        core: Any,
        events: Events,
        *,
        timing: str,
        cuda_events: str | None,
        compiling: Callable[[], bool],
        strict: bool,
    ) -> None:
        self.state = state
        self.core = core
        self.events = events
        self.timing = timing  # "cuda" or "host" (host after a fork)
        self.cuda_events = cuda_events  # "driver", "torch", a scripted GPU's name, or None
        self.compiling = compiling  # torch.compile's "am I tracing?", asked before any C code runs
        self.errors: ErrorGuard = state.errors
        self.strict = strict
        self.make: Callable[..., Any] = self._none
        self._window: Any = None
        self._on_closed: Callable[[str], None] | None = None  # set by stop(): counts each step asked for
        state.decorate = functools.partial(decorate, self._make, self.unsized, compiling, self.errors)
        self._bind()

    # ---- what an implementation provides ----------------------------------------------------------
    @abc.abstractmethod
    def _bind(self) -> None:
        """Bind ``make`` (and in C, the ``Hot``) to the current state."""

    @abc.abstractmethod
    def _arm(self, window: Any) -> None:
        """Hand *window* to the hot path's own per-step copy."""

    @abc.abstractmethod
    def _unsized(self, phase: str) -> Any:
        """A step with no sizes (see :meth:`unsized`)."""

    @property
    @abc.abstractmethod
    def event_pool_empty(self) -> int:
        """Steps counted but not timed because every event was in flight."""

    def _carry(self) -> None:  # noqa: B027 (optional: only the C path counts outside the state)
        """Before the hot path is bound again: keep in the state what it counted."""

    # ---- the profiler window ------------------------------------------------------------------------
    @property
    def window(self) -> Any:
        """The profiler window (:class:`~perfsdk.profiling.window.ProfilerWindow`), or None."""
        return self._window

    def set_window(self, window: Any) -> None:
        """The one place a Monitor's profiler window is set (None: none): the hot path calls its hooks while
        it is armed, and the core keeps every decode step for it while it is set."""
        self._window = window
        self._arm(window)
        self.core.feed_window = window is not None

    # ---- a Monitor's life ---------------------------------------------------------------------------
    def stop(self, on_call: Callable[[str], None]) -> None:
        """The Monitor no longer records (closed): every later step is a no-op that calls *on_call(phase)*
        (which counts it). Bound once, here — the steps themselves check nothing."""
        self._on_closed = on_call
        self.make = self._closed

    def stop_core(self, timeout: float | None) -> bool:
        """Stop the core's thread within *timeout*; once it ended, nothing is in flight: close the events."""
        stopped = bool(self.core.stop(timeout))
        if stopped:
            self.events.close()
        return stopped

    def after_fork(self) -> bool:
        """In a forked child, before anything else: the core made anew in place; CUDA-event timing, which a
        forked child cannot use, becomes host timing. True when it did (the parent timed with events)."""
        cuda = self.timing == "cuda"
        self.core.after_fork(cuda)
        if cuda:
            self.events.abandon()
            self._host_timing()
        return cuda

    def _host_timing(self) -> None:
        """A forked child cannot use its parent's CUDA context: time its steps with the host clock (every step
        there is host work: the child can launch nothing on the GPU)."""
        self.timing, self.cuda_events = "host", None
        self.rebind(
            pool=None,
            stream=None,
            record_on=None,
            raise_for=None,
            ensure_context=None,
            record_fn=0,
            is_capturing_fn=0,
            event_pool_empty=0,
            **self._host_fields(),
        )

    @abc.abstractmethod
    def _host_fields(self) -> dict[str, Any]:
        """The state's fields for host timing that differ between the implementations."""

    def rebind(self, **fields: Any) -> None:
        """Set *fields* of the :class:`~perfsdk.hotpath.HotState` and bind the hot path to it again (a forked
        child's host timing; :mod:`perfsdk.testing`'s fault injection). What was counted stays counted."""
        self._carry()
        for name, value in fields.items():
            if not hasattr(self.state, name):
                raise ConfigError(f"rebind: the hot state has no field {name!r}")
            setattr(self.state, name, value)
        self._bind()
        self._arm(self._window)
        if self._on_closed is not None:
            self.make = self._closed

    # ---- making steps -------------------------------------------------------------------------------
    def _make(self, *args: Any) -> Any:
        return self.make(*args)

    def _closed(
        self, phase: str, batch: Any = 1, tokens: Any = None, context_tokens: Any = 0, seq_lens: Any = None
    ) -> Any:
        assert self._on_closed is not None
        self._on_closed(phase)
        return self._none(phase, batch, tokens, context_tokens, seq_lens)

    @staticmethod
    def _none(phase: str, batch: Any = 1, tokens: Any = None, context_tokens: Any = 0, seq_lens: Any = None) -> Any:
        fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
        return fn if fn is not None else NoStep(phase)  # a bare @mon.decode on a disabled Monitor: fn itself

    def _bare(self, phase: str, fn: Any) -> Any:
        """``mon.decode(fn)``: a bare ``@mon.decode`` — *fn* with every call a timed step without sizes."""
        assert self.state.decorate is not None
        return self.state.decorate(self.unsized(phase), fn)

    def unsized(self, phase: str) -> Any:
        """A step with no sizes: timed and counted, no bytes or FLOPs (so no MBU/MFU), no tokens."""
        if self._on_closed is not None:
            self._on_closed(phase)
            return NoStep(phase)
        return self._unsized(phase)

    def refused(self, phase: str, e: ConfigError) -> Step:
        """A step with a bad size: strict raises; otherwise it runs unrecorded, counted and logged once."""
        if self.strict:
            raise e
        self.errors.record(e, f"{phase}() sizes")
        return NoStep(phase, self.state.requests)  # its tokens are still the requests'


class PythonRecorder(Recorder):
    """The Python hot path (:class:`~perfsdk.hotpath.Step`) over the :class:`~perfsdk.hotpath.HotState`."""

    def _bind(self) -> None:
        self.make = self._python

    def _arm(self, window: Any) -> None:
        self.state.window = window

    @property
    def event_pool_empty(self) -> int:
        return self.state.event_pool_empty

    def _host_timing(self) -> None:
        self.events = NoEvents()  # the parent's events: neither used nor destroyed here
        super()._host_timing()

    def _host_fields(self) -> dict[str, Any]:
        from perfsdk import timing

        return {"local": ThreadSteps(LastEnd, None), "capturing": timing.capture_checks(False)[0]}

    def _python(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> Any:
        if not (type(batch) is int and (tokens is None or type(tokens) is int) and seq_lens is None):
            fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
            if fn is not None:
                return self._bare(phase, fn)
        try:
            return Step(self.state, phase, batch, tokens, context_tokens, seq_lens)
        except ConfigError as e:
            return self.refused(phase, e)

    def _unsized(self, phase: str) -> Any:
        step = Step(self.state, phase, 0, None, 0, None)
        step._context_tokens = UNSIZED
        return step


class NativeRecorder(Recorder):
    """The C hot path: a ``perfsdk._native.Hot`` built from the state, field by field, making C steps."""

    hot_path = "c"

    def __init__(self, native: Any, state: HotState, core: Any, events: Events, **kw: Any) -> None:
        self.native = native
        self.hot: Any = None  # the C Hot: it reads the state once, when bound
        super().__init__(state, core, events, **kw)

    def _bind(self) -> None:
        self.state.slow_step = self.slow
        self.hot = self.native.Hot(self.state)  # starts from state.event_pool_empty
        self.make = self.hot.step

    def _carry(self) -> None:
        self.state.event_pool_empty = self.hot.event_pool_empty

    def _arm(self, window: Any) -> None:
        self.hot.window = window

    @property
    def event_pool_empty(self) -> int:
        return int(self.hot.event_pool_empty)

    def _host_fields(self) -> dict[str, Any]:
        # torch.compile's check stays (the C path asks it in Python, before any C code); CUDA's capture check goes
        return {"capturing": None, "local": ThreadSteps(self.native.LastEnd, self.core)}

    def _unsized(self, phase: str) -> Any:
        return self.native.make_step(self.hot, phase, 0, None, UNSIZED, None)

    def slow(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any) -> Any:
        """The C path's constructor for sizes that are not plain ints: validated here, as Step does."""
        fn = bare_function(phase, batch, tokens, context_tokens, seq_lens)
        if fn is not None:
            return self._bare(phase, fn)
        try:
            b, t, c, lens, dynamic = check_sizes(phase, batch, tokens, context_tokens, seq_lens)
        except ConfigError as e:
            return self.refused(phase, e)
        if dynamic:
            return Step(self.state, phase, batch, tokens, context_tokens, seq_lens)  # a decorator only
        return self.native.make_step(self.hot, phase, b, None if t < 0 else t, c, lens)


class OffRecorder(Recorder):
    """A disabled Monitor's: every step a no-op (a bare ``@mon.decode`` hands the function back untouched)."""

    def __init__(self, state: HotState, core: Any, events: Events, *, hot_path: str, **kw: Any) -> None:
        self.hot_path = hot_path  # what was asked for ("c" or "python"): nothing runs either way
        super().__init__(state, core, events, **kw)

    def _bind(self) -> None:
        self.make = self._none

    def _arm(self, window: Any) -> None:
        pass  # no step ever calls a window's hooks

    @property
    def event_pool_empty(self) -> int:
        return 0

    def _host_fields(self) -> dict[str, Any]:
        return {}

    def _unsized(self, phase: str) -> Any:
        return NoStep(phase)


def load_native() -> Any:
    """perfsdk's C extension (``perfsdk._native``: the hot path and the step core), or None where not built."""
    try:
        from perfsdk import _native

        return _native
    except ImportError:
        return None


def _register_native_step() -> None:
    """``isinstance(step, perfsdk.Step)`` holds for the C steps too."""
    native = load_native()
    if native is not None:
        Step.register(native.Step)


_register_native_step()
