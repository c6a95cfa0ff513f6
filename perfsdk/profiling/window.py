"""The opt-in profiler window: a few steady decode steps under a profiler, then a diagnosis.

Usage::

    mon = perfsdk.Monitor(model=..., hardware="auto")
    mon.enable_profiler(                      # off until this call; every argument is optional
        mode="torch",                         # or "nsys": cudaProfilerStart/Stop around the window
        steps=4, wait=0, warmup=1,            # torch.profiler schedule, counted in decode steps
        directory="./perfsdk-traces", keep=10, min_free_mb=512,
        steady_window=32, steady_cv=0.05, warmup_steps=16, steady_timeout_s=120,
        auto=True, auto_drop=0.2, auto_windows=3, cooldown_s=600, max_per_hour=4,
        signal=True,                          # opt-in: SIGUSR2 triggers a capture (main thread only)
    )

    handle = mon.profile(steps=4)             # API trigger; or: curl -X POST 'http://127.0.0.1:9400/profile?steps=4'
    handle = mon.profile(steps=4, steady=False)  # no gate: the serving thread's next step starts the capture
    handle.to_dict()                          # {"accepted": True, "id": 1, "state": "armed", ...}
    result = handle.wait(timeout=60)          # CaptureResult, or None while still waiting
    result.trace                              # .../perfsdk-<host>-<pid>-rank0-<UTC>.pt.trace.json.gz
    result.diagnosis["findings"][0]["kind"]   # "launch_bound"; also written to <trace>.diagnosis.json
    result.steady                             # False when the gate timed out and captured anyway

    # nsys: nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop python serve.py
    #       then mon.profile(mode="nsys") records exactly the window's steps, with perfsdk's NVTX ranges.

and in the log, one line per capture::

    perfsdk profile: launch_bound (91% of the unprofiled 2.09 ms step, GPU busy 9%; profiling inflated steps 1.3x)
        -> Capture the step in a CUDA graph ...; trace: ...

**Triggers.** :meth:`ProfilerWindow.trigger` (``mon.profile()``), ``POST /profile`` on the
metrics server (loopback only unless a token is set), ``SIGUSR2`` only with ``signal=True`` (without
it perfsdk installs no signal handler and ``SIGUSR2`` keeps its default action, ending the process), and,
with ``auto=True``, a drop of the rolling decode MBU *auto_drop* below its trailing baseline for
*auto_windows* windows of *auto_window_steps* steps in a row (at most one automatic capture per
*cooldown_s*, at most *max_per_hour*; see :mod:`perfsdk.profiling.triggers`). One window at a
time: a trigger while another capture is armed, running or being written is refused, with the
reason in ``handle.to_dict()["reason"]`` (HTTP 409).

**Every rank at the same steps.** ``mon.profile(steps=N, steady=False)`` skips the gate: the window
is ready at once, and the next step the serving thread enters starts the profiler. Called at the same
step on every rank of a tensor-parallel group (ranks step in lockstep), it captures the same steps
everywhere, which is what ``perfsdk analyze rank0.json rank1.json`` compares
(:mod:`perfsdk.profiling.ranks`). Each capture exports its share of step time in collectives
(``perfsdk_profile_communication_fraction``), so Prometheus can compare the ranks too.

**The gate.** An accepted trigger *arms* the window. The collector thread feeds every decode step
to a :class:`~perfsdk.profiling.steady.SteadyGate`; when the step-time coefficient of variation
over the last *steady_window* steps of one batch size drops under *steady_cv* (the first
*warmup_steps* steps after enabling, and after every batch-size change, are skipped), or when
*steady_timeout_s* have passed since arming (the capture is then marked ``steady=False``), the
window is ``ready`` and :attr:`ProfilerWindow.wants_steps` turns True: the serving thread's next step starts
the capture. (``wants_steps`` is the flag the steps read, True while ``ready`` or ``running``; it is ``hot``
in ``status()``, and ``ProfilerWindow.hot`` is its old name.)

**The capture.** While ``wants_steps``, each step calls :meth:`~ProfilerWindow.step_begin` and
:meth:`~ProfilerWindow.step_end` on the serving thread: the profiler is started, stepped and
stopped there (see :mod:`perfsdk.profiling.capture`), never from another thread. When ``wants_steps`` is
False (always, unless a capture is imminent or running) the cost to a step is one attribute read.
The schedule (*wait*, *warmup*, *steps*) counts decode steps; prefill and mixed steps that fall
inside the window are recorded (each in its ``perfsdk.<phase>`` range) but not counted, and a
capture that has not seen enough decode steps after *max_capture_s* stops with what it has.
Any exception there is counted in ``perfsdk_internal_errors_total``, aborts the capture, and the
step runs on: a profiler failure never stops serving.

**After.** A background thread writes the trace atomically (disk guard and retention count),
runs :func:`~perfsdk.profiling.analyze.analyze_trace`, writes ``<trace>.diagnosis.json``, logs
the verdict and sets ``perfsdk_profile_gpu_busy_fraction`` and ``perfsdk_profile_communication_fraction``.
The verdict is about the window's decode steps (``Diagnosis.select("decode")``); prefills caught in the
window are kept under ``"other_steps"`` in the diagnosis, not mixed into it.

**Against the unprofiled step.** While it listens, the window keeps the median of the recent
*unprofiled* decode steps per batch size (:class:`~perfsdk.profiling.observer.StepReference`, fed by the
collector with every step's time); when the gate opens it takes the one for the gate's batch. The
diagnosis then reports how much the profiler inflated the steps and computes every share against the
unprofiled step — the kernels' busy time is what a profiler barely changes — and says so in the verdict
(``launch_bound (44% of the unprofiled 2.09 ms step, GPU busy 56%; profiling inflated steps 2.7x)``);
without a reference (too few steps at that batch yet) it says that instead.

**Bytes against the peak.** With the Monitor's ``model=`` and ``hardware=``, the same unprofiled steps
give the bytes a decode step must read (their MBU × time × bandwidth: batch and context included), so
the diagnosis checks the kernels against the peak bandwidth (:mod:`perfsdk.profiling.bandwidth`):
``memory_bound`` only near it, ``slow_kernels`` with the kernels to put under Nsight Compute otherwise.

**Why this module is over 500 lines.** :class:`ProfilerWindow` is one state machine (idle, armed, ready,
running, writing) whose transitions are taken from three threads — the collector's gate, the serving
thread's steps, the writer — under one lock, and they are kept in one file so that each can be read
beside the others. What is not the state machine lives beside it: the handles and results
(:mod:`~perfsdk.profiling.capture_handle`), sessions, files and the checks before arming
(:mod:`~perfsdk.profiling.capture`), the diagnosis of a written trace
(:mod:`~perfsdk.profiling.window_diagnosis`), the gate (:mod:`~perfsdk.profiling.steady`) and the
triggers (:mod:`~perfsdk.profiling.triggers`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Protocol

from perfsdk.config import check_int, check_number
from perfsdk.errors import ConfigError
from perfsdk.profiling.capture import NsysSession, Session, TorchSession, refusal, write_capture
from perfsdk.profiling.capture_handle import ARMED, IDLE, READY, RUNNING, WRITING, CaptureHandle, CaptureResult
from perfsdk.profiling.observer import StepReference, Unprofiled
from perfsdk.profiling.steady import SteadyGate
from perfsdk.profiling.triggers import CaptureBudget, MbuDropDetector, SignalTrigger
from perfsdk.profiling.window_diagnosis import decode_cost, diagnose_capture

if TYPE_CHECKING:
    from perfsdk.profiling.bandwidth import StepCost

__all__ = ["MODES", "CaptureHandle", "CaptureResult", "ProfilerWindow", "WindowHost"]


class WindowHost(Protocol):
    """What a window needs of its Monitor (perfsdk.Monitor is one): its model, GPU and compute dtype (the
    automatic trigger watches MBU; the diagnosis prices a step's bytes and FLOPs against the GPU's peaks),
    and ``window_deps()``: the error guard, the profile gauges' setter and the rank label."""

    model: Any
    hardware: Any
    compute_dtype: str

    def window_deps(self) -> tuple[Any, Any, str]: ...


log = logging.getLogger("perfsdk")

MODES = ("torch", "nsys")
MAX_STEPS = 1000  # a trace of more steps is too large to diagnose or to open in a viewer


class ProfilerWindow:
    """See the module docstring. Built by :meth:`perfsdk.Monitor.enable_profiler`."""

    def __init__(
        self,
        mon: WindowHost,
        *,
        mode: str = "torch",
        steps: int = 4,
        wait: int = 0,
        warmup: int = 1,
        directory: str | os.PathLike[str] = "./perfsdk-traces",
        keep: int = 10,
        min_free_mb: float = 512,
        steady_window: int = 32,
        steady_cv: float = 0.05,
        warmup_steps: int = 16,
        steady_timeout_s: float = 120.0,
        max_capture_s: float = 120.0,
        auto: bool = False,
        auto_drop: float = 0.2,
        auto_windows: int = 3,
        auto_baseline_windows: int = 10,
        auto_window_steps: int = 64,
        cooldown_s: float = 600.0,
        max_per_hour: int = 4,
        signal: bool = False,
        record_shapes: bool = True,
        with_stack: bool = False,
        profile_memory: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.mode = self._check_mode(mode)
        self.steps = self._check_steps(steps)
        self.wait = check_int("wait", wait, 0)
        self.warmup = check_int("warmup", warmup, 0)
        if not isinstance(directory, (str, os.PathLike)) or not os.fspath(directory):
            raise ConfigError(f"directory: expected a path, got {directory!r}")
        self.directory = os.path.abspath(os.fspath(directory))
        self.keep = check_int("keep", keep, 1)
        self.min_free_mb = check_number("min_free_mb", min_free_mb, 0)
        check_int("steady_window", steady_window, 2)
        check_number("steady_cv", steady_cv, 0, open_low=True)
        check_int("warmup_steps", warmup_steps, 0)
        self.steady_timeout_s = check_number("steady_timeout_s", steady_timeout_s, 0, open_low=True)
        self.max_capture_s = check_number("max_capture_s", max_capture_s, 0, open_low=True)
        for name, flag in (
            ("auto", auto),
            ("signal", signal),
            ("record_shapes", record_shapes),
            ("with_stack", with_stack),
            ("profile_memory", profile_memory),
        ):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name}: expected True or False, got {flag!r}")
        check_number("auto_drop", auto_drop, 0, 1, open_low=True)
        if auto_drop >= 1:
            raise ConfigError(f"auto_drop: a fraction below 1, got {auto_drop!r}")
        check_int("auto_windows", auto_windows, 1)
        check_int("auto_baseline_windows", auto_baseline_windows, 1)
        check_int("auto_window_steps", auto_window_steps, 1)
        check_number("cooldown_s", cooldown_s, 0)
        check_int("max_per_hour", max_per_hour, 1)
        if clock is not None and not callable(clock):
            raise ConfigError(f"clock: expected a () -> seconds callable, got {clock!r}")
        if self.mode == "torch" and importlib.util.find_spec("torch") is None:
            from perfsdk.errors import MissingDependencyError

            raise MissingDependencyError("torch", "the profiler window's torch mode")
        self._profiler_options = {
            "record_shapes": record_shapes,
            "with_stack": with_stack,
            "profile_memory": profile_memory,
        }

        self._errors, self._set_profile, self._rank = mon.window_deps()
        self._model, self._hardware = mon.model, mon.hardware
        self._compute_dtype: str | None = getattr(mon, "compute_dtype", None)
        # unprofiled decode steps per batch: what a capture's steps are compared with (fed by the collector)
        self._refs = StepReference()
        self._reference: Unprofiled | None = None
        self._reference_note = ""
        self._clock: Callable[[], float] = clock or time.monotonic
        # wants_steps is the one attribute the serving thread reads per step; written under _lock only
        self.wants_steps = False
        self._lock = threading.Lock()
        self._state = IDLE
        self._handle: CaptureHandle | None = None
        self._session: Session | None = None
        self._owner: int | None = None  # thread that started the profiler: the only one that steps it
        self._armed_at = 0.0
        self._started_at = 0.0
        self._abort_reason: str | None = None
        self._steady = False  # what the gate said when it opened, for the result
        self._step_cv: float | None = None
        self._batch: int | None = None
        self._closed = False
        self._next_id = 0
        self._workers: list[threading.Thread] = []
        self.captures = 0
        self.failures = 0
        self.auto_fired = 0
        self.auto_suppressed = 0
        self.last_result: CaptureResult | None = None
        self._gate = SteadyGate(steady_window, float(steady_cv), warmup_steps)
        self._reset_gate = False
        self._detector = (
            MbuDropDetector(auto_window_steps, float(auto_drop), auto_windows, auto_baseline_windows) if auto else None
        )
        self._budget = CaptureBudget(float(cooldown_s), max_per_hour, self._clock)
        self._signal = SignalTrigger(self._on_signal) if signal else None
        if auto and (mon.model is None or mon.hardware is None):
            log.warning(
                "perfsdk profile: auto=True watches decode MBU, which needs the Monitor's model= and "
                "hardware=; until both are known only API, HTTP and signal triggers capture"
            )

    # ---- validation -----------------------------------------------------------------------------
    @staticmethod
    def _check_mode(mode: Any) -> str:
        if mode not in MODES:
            raise ConfigError(f"mode: expected 'torch' or 'nsys', got {mode!r}")
        return str(mode)

    @staticmethod
    def _check_steps(steps: Any) -> int:
        return check_int("steps", steps, 1, MAX_STEPS)

    # ---- triggers (any thread) --------------------------------------------------------------------
    @property
    def state(self) -> str:
        """``idle``, ``armed`` (waiting for the gate), ``ready``, ``running`` or ``writing``."""
        return self._state

    @property
    def hot(self) -> bool:
        """Deprecated: the old name of :attr:`wants_steps` (``hot`` now names the hot path only)."""
        import warnings

        warnings.warn(
            "ProfilerWindow.hot is deprecated: read ProfilerWindow.wants_steps", DeprecationWarning, stacklevel=2
        )
        return self.wants_steps

    @property
    def steady(self) -> bool:
        """What the gate said when the window last became ready: False when it timed out (or, for
        ``trigger(steady=False)``, the decode steps were not steady then). The capture's result carries it."""
        return self._steady

    def trigger(
        self, steps: int | None = None, mode: str | None = None, reason: str = "api", *, steady: bool = True
    ) -> CaptureHandle:
        """Ask for one capture; refused (``accepted=False`` and a reason) while another is under way.

        *steady*: wait for the steady-state gate (default); ``False`` makes the window ready at once, so
        that the next step entered starts the capture (the same step on every rank when every rank calls
        this at the same step). The result's ``steady`` then says what the gate read at the trigger.
        """
        if not isinstance(steady, bool):
            raise ConfigError(f"steady: expected True or False, got {steady!r}")
        mode = self.mode if mode is None else self._check_mode(mode)
        steps = self.steps if steps is None else self._check_steps(steps)
        refusal = self._precheck(mode)
        with self._lock:
            if refusal is None and self._closed:
                refusal = "closed: the profiler window was closed"
            if refusal is None and self._state != IDLE:
                cur = self._handle
                refusal = (
                    f"busy: capture {cur.id if cur else '?'} ({cur.trigger if cur else '?'}) is "
                    f"{self._state}; one window at a time"
                )
            if refusal is not None:
                log.info("perfsdk profile: %s trigger refused: %s", reason, refusal)
                return CaptureHandle(accepted=False, reason=refusal, mode=mode, steps=steps, trigger=reason)
            self._next_id += 1
            handle = CaptureHandle(accepted=True, id=self._next_id, mode=mode, steps=steps, trigger=reason)
            self._handle = handle
            self._state = ARMED
            self._armed_at = self._clock()
            self._abort_reason = None
            if not steady:  # no gate: ready now, so the serving thread's next step starts the profiler
                self._steady = self._gate.steady
                self._step_cv = self._gate.cv()
                self._batch = self._gate.batch
                self._take_reference()
                self._state = READY
                handle.state = READY
                self.wants_steps = True
        log.info(
            "perfsdk profile: capture %d %s (%s, %s, %d steps)",
            handle.id,
            "armed; waiting for steady decode steps" if steady else "ready; starts at the next step",
            reason,
            mode,
            steps,
        )
        return handle

    def _precheck(self, mode: str) -> str | None:
        """Reasons to refuse before arming: no disk room, no CUDA for nsys."""
        return refusal(mode, self.directory, self.min_free_mb)

    def _on_signal(self) -> None:
        try:
            self.trigger(reason="signal")
        except Exception as e:
            self._errors.record(e, "profiler window SIGUSR2")

    def cancel(self, reason: str = "cancelled") -> bool:
        """Drop an armed capture now; a running one is stopped at its next step. False if none."""
        with self._lock:
            st = self._state
            if st in (ARMED, READY):
                handle = self._to_idle()
            elif st == RUNNING:
                self._abort_reason = reason
                return True
            else:
                return False
        if handle is not None:
            handle._finish(None, reason)
        return True

    def _to_idle(self) -> CaptureHandle | None:
        """Back to idle (caller holds the lock); returns the handle to finish outside it."""
        handle, self._handle = self._handle, None
        self._state = IDLE
        self.wants_steps = False
        self._session = None
        self._owner = None
        self._reset_gate = True  # profiled steps are slower: the collector starts the steady check afresh
        return handle

    # ---- collector thread -----------------------------------------------------------------------
    def observe_step(self, phase: str, seconds: float, batch: int, mbu: float | None) -> None:
        """Every resolved step: feed the gate, the unprofiled reference and the automatic trigger (decode only)."""
        if phase != "decode":
            return
        st = self._state
        if st not in (IDLE, ARMED):  # steps under (or about to be under) the profiler are not normal traffic
            return
        if self._reset_gate:  # the gate has one writer, this thread; other threads only ask for a reset
            self._reset_gate = False
            self._gate.reset()
        self._gate.observe(seconds, batch)
        # the bytes this step had to read, back from its MBU (the core priced it: batch and context included)
        hw = self._hardware
        nbytes = mbu * seconds * hw.memory_bandwidth if mbu is not None and hw is not None else None
        self._refs.observe(phase, batch, seconds, nbytes, self._clock())
        if st == ARMED:
            self._check_gate()
        elif self._detector is not None and mbu is not None and self._detector.observe(mbu):
            self._auto_fire()

    def _check_gate(self) -> None:
        steady = self._gate.steady
        if not steady and self._clock() - self._armed_at < self.steady_timeout_s:
            return
        with self._lock:
            if self._state != ARMED or self._handle is None:
                return
            self._steady = steady
            self._step_cv = self._gate.cv()
            self._batch = self._gate.batch
            self._take_reference()
            self._state = READY
            self._handle.state = READY
            self.wants_steps = True  # from now on the serving thread's next step starts the profiler
        if not steady:
            log.warning(
                "perfsdk profile: decode steps not steady after %.0f s (step-time CV %s); capturing "
                "anyway, marked not steady",
                self.steady_timeout_s,
                "n/a" if self._step_cv is None else f"{self._step_cv:.3f}",
            )

    def _take_reference(self) -> None:
        """The unprofiled decode steps at the gate's batch, as the window opens (caller holds the lock)."""
        self._reference, self._reference_note = self._refs.get("decode", self._batch, self._clock())

    def reference(self, batch: int | None = None) -> tuple[Unprofiled | None, str]:
        """The unprofiled decode step time at *batch* (default: the gate's), or None and why there is none."""
        return self._refs.get("decode", self._gate.batch if batch is None else batch, self._clock())

    def _auto_fire(self) -> None:
        det = self._detector
        refusal = self._budget.refusal()
        if refusal is not None:
            self.auto_suppressed += 1
            log.info("perfsdk profile: decode MBU dropped but no automatic capture (%s)", refusal)
            return
        handle = self.trigger(reason="auto")
        if handle.accepted:
            self.auto_fired += 1
            self._budget.spend()
            log.warning(
                "perfsdk profile: decode MBU %.3f is more than %.0f%% below its baseline for %d windows; "
                "capture %d armed",
                det.last_window if det and det.last_window is not None else 0.0,
                det.drop * 100 if det else 0,
                det.windows if det else 0,
                handle.id,
            )

    # ---- serving thread (only while it wants steps) ----------------------------------------------------------
    def step_begin(self, phase: str) -> None:
        """Before a step, while it wants steps: start the profiler at the first one, open the step's range."""
        try:
            if self._state == READY and not self._start():
                return
            if self._state != RUNNING or threading.get_ident() != self._owner:
                return
            if self._abort_reason is not None:
                self._abort(self._abort_reason)
                return
            session = self._session
            if session is not None:
                session.begin(phase)
        except Exception as e:
            self._fail(e, "profiler window step_begin")

    def step_end(self, phase: str) -> None:
        """After a step, while it wants steps: close its range, step the schedule, stop at the end of the window."""
        if self._state != RUNNING or threading.get_ident() != self._owner:
            return
        try:
            session = self._session
            if session is None:
                return
            done = session.end(phase)
            if self._abort_reason is not None:
                self._abort(self._abort_reason)
                return
            timed_out = self._clock() - self._started_at >= self.max_capture_s
            if not done and not timed_out:
                return
            session.stop()
            self._hand_off(session, truncated=timed_out and not done)
        except Exception as e:
            self._fail(e, "profiler window step_end")

    def _start(self) -> bool:
        with self._lock:
            if self._state != READY or self._handle is None:
                return False
            handle = self._handle
            self._state = RUNNING
            self._owner = threading.get_ident()
        session: Session
        if handle.mode == "torch":
            session = TorchSession(wait=self.wait, warmup=self.warmup, active=handle.steps, **self._profiler_options)
        else:
            session = NsysSession(handle.steps)
        self._session = session
        self._started_at = self._clock()
        handle.state = RUNNING
        session.start()
        return True

    def _abort(self, reason: str) -> None:
        session = self._session
        if session is not None:
            session.abort()
        with self._lock:
            handle = self._to_idle()
        if handle is not None:
            handle._finish(
                CaptureResult(
                    id=handle.id, mode=handle.mode, trigger=handle.trigger, steady=False, steps=0, error=reason
                ),
                reason,
            )

    def _fail(self, exc: BaseException, where: str) -> None:
        """A profiler error on the serving thread: count it, drop the capture, let the step run on."""
        try:
            self._errors.record(exc, where)
            self.failures += 1
            self._abort(f"failed: {type(exc).__name__}: {exc}")
        except Exception:
            self.wants_steps = False

    def _hand_off(self, session: Session, truncated: bool) -> None:
        with self._lock:
            handle = self._handle
            self._state = WRITING
            self.wants_steps = False
            self._session = None
            self._owner = None
            if handle is None:
                self._state = IDLE
                return
            handle.state = WRITING
            ref = self._reference
            meta = {
                "steady": self._steady,
                "step_cv": self._step_cv,
                "batch": self._batch,
                "unprofiled": None if ref is None else ref.to_dict(),
                "unprofiled_note": self._reference_note,
            }
        t = threading.Thread(
            target=self._write_and_diagnose,
            args=(handle, session, meta, truncated),
            name="perfsdk-profile-writer",
            daemon=True,
        )
        self._workers = [w for w in self._workers if w.is_alive()] + [t]
        t.start()

    # ---- background thread ----------------------------------------------------------------------
    def _write_and_diagnose(
        self, handle: CaptureHandle, session: Session, meta: dict[str, Any], truncated: bool
    ) -> None:
        steady = bool(meta["steady"])
        trace = diag = dpath = line = error = None
        try:
            if session.writes_trace:
                trace = write_capture(session, self.directory, self.min_free_mb, self.keep, self._rank)
                capture_meta = {
                    "id": handle.id,
                    "trigger": handle.trigger,
                    "mode": handle.mode,
                    "steps": handle.steps,
                    "wait": self.wait,
                    "warmup": self.warmup,
                    "truncated": truncated,
                    **meta,
                }
                diag, dpath, line = self.diagnose(trace, steady, capture_meta)
            else:
                line = (
                    f"perfsdk profile: nsys capture range closed after {session.done} decode steps "
                    f"(capture {handle.id}, {'steady' if steady else 'not steady'})"
                )
                log.info("%s", line)
        except Exception as e:
            self._errors.record(e, "profiler window write/diagnose")
            self.failures += 1
            error = f"{type(e).__name__}: {e}"
        result = CaptureResult(
            id=handle.id,
            mode=handle.mode,
            trigger=handle.trigger,
            steady=steady,
            steps=handle.steps,
            trace=trace,
            diagnosis=diag,
            diagnosis_path=dpath,
            verdict=line,
            error=error,
            step_cv=meta["step_cv"],
            batch=meta["batch"],
        )
        with self._lock:
            self.captures += error is None
            self.last_result = result
            self._to_idle()
        handle._finish(result, "done" if error is None else "failed")

    def diagnose(
        self, trace: str, steady: bool = True, capture: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], str, str]:
        """Diagnose *trace*'s decode steps, write ``<trace>.diagnosis.json``, log the verdict, export the gauges.

        Against the unprofiled reference in *capture* (``"unprofiled"``, taken when the window opened), or,
        for a trace diagnosed on demand, the current one at ``capture["batch"]`` (default: the gate's batch).
        Returns (diagnosis dict, diagnosis path, verdict line).
        """
        cap = dict(capture or {})
        if "unprofiled" in cap:
            ref = Unprofiled.from_dict(cap["unprofiled"]) if cap["unprofiled"] else None
            note = str(cap.get("unprofiled_note") or "")
        else:
            ref, note = self.reference(cap.get("batch"))
        d, dpath, line, diagnosis = diagnose_capture(
            trace, cost=self._decode_cost(ref), ref=ref, note=note, steady=steady, capture=cap
        )
        log.info("%s", line)
        if self._set_profile is not None:
            self._set_profile(diagnosis.gpu_busy_fraction, diagnosis.communication_share)
        return d, dpath, line

    def _decode_cost(self, ref: Unprofiled | None) -> StepCost:
        """What a decode step at the reference's batch must read, against the Monitor's GPU (see
        :func:`~perfsdk.profiling.window_diagnosis.decode_cost`)."""
        return decode_cost(self._model, self._hardware, ref, self._compute_dtype)

    # ---- lifecycle ------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The window's state, the capture under way (``current``), counters, gate and automatic-trigger
        readings, and the last result (``last``: the result without its diagnosis, plus the diagnosis' findings)."""
        det = self._detector
        with self._lock:
            state, handle = self._state, self._handle
        last = self.last_result
        last_d = None
        if last is not None:
            last_d = {f.name: getattr(last, f.name) for f in fields(last) if f.name != "diagnosis"}
            last_d["findings"] = (last.diagnosis or {}).get("findings", [])
        return {
            "state": state,
            "current": None if handle is None else handle.to_dict(),
            "hot": self.wants_steps,  # the key keeps its old name: status() is public
            "mode": self.mode,
            "captures": self.captures,
            "failures": self.failures,
            "auto": det is not None,
            "auto_fired": self.auto_fired,
            "auto_suppressed": self.auto_suppressed,
            "mbu_baseline": det.baseline if det else None,
            "step_cv": self._gate.cv(),
            "batch": self._gate.batch,
            "last": last_d,
        }

    def close(self, timeout: float | None = 10.0) -> None:
        """Cancel an armed capture, let a written one finish its diagnosis, restore SIGUSR2. Idempotent.

        A capture already running is stopped by the serving thread at its next step.
        """
        with self._lock:
            self._closed = True
        self.cancel("closed")
        for t in list(self._workers):
            t.join(timeout)
        sig, self._signal = self._signal, None
        if sig is not None:
            try:
                sig.restore()
            except Exception as e:
                log.warning("perfsdk profile: SIGUSR2 handler left installed: %s", e)
