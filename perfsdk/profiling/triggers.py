"""Triggers of the profiler window that are not plain calls: MBU drops and ``SIGUSR2``.

**Automatic.** :class:`MbuDropDetector` groups decode-step MBU into windows of *window_steps*
steps, keeps a trailing baseline (the mean of the last *baseline_windows* healthy window means)
and fires when *windows* windows in a row fall more than *drop* (a fraction) below it::

    det = MbuDropDetector(window_steps=64, drop=0.2, windows=3, baseline_windows=10)
    if det.observe(mbu):          # collector thread, once per decode step
        window.trigger(reason="auto")

Low windows never enter the baseline (a sustained drop must not become its own reference), and
the baseline is relearnt after each firing, so one lasting regression gives one capture, not one
per cooldown. :class:`CaptureBudget` adds the cooldown and the cap on automatic captures per hour.

**Signal (opt-in).** :class:`SignalTrigger` installs a ``SIGUSR2`` handler (main thread only) and
puts the previous handler back on :meth:`~SignalTrigger.restore`. Only
``mon.enable_profiler(signal=True)`` creates one: without it perfsdk installs no signal handler at
all (not on import, not in ``Monitor``, ``serve_metrics`` or ``enable_profiler()``), so ``SIGUSR2``
keeps whatever the process had — for a plain Python process the default action, which terminates
it. Once the windows that installed handlers are closed, the process is back to its own handler,
however many windows were enabled in between. The handler itself only starts a thread: a signal
handler runs on the main thread between two bytecodes, possibly while that thread holds the
window's lock, so taking the lock inside it could deadlock.
"""

from __future__ import annotations

import math
import signal
import threading
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["CaptureBudget", "MbuDropDetector", "SignalTrigger"]


class MbuDropDetector:
    """Rolling decode MBU against its own trailing baseline; see the module docstring."""

    __slots__ = (
        "_acc",
        "_baseline",
        "_n",
        "_streak",
        "baseline_windows",
        "drop",
        "last_window",
        "window_steps",
        "windows",
    )

    def __init__(self, window_steps: int, drop: float, windows: int, baseline_windows: int) -> None:
        self.window_steps = window_steps
        self.drop = drop
        self.windows = windows
        self.baseline_windows = baseline_windows
        self._acc = 0.0
        self._n = 0
        self._baseline: deque[float] = deque(maxlen=baseline_windows)
        self._streak = 0
        self.last_window: float | None = None

    @property
    def baseline(self) -> float | None:
        """Mean MBU of the trailing healthy windows; None until *baseline_windows* are in."""
        b = self._baseline
        return math.fsum(b) / len(b) if len(b) == b.maxlen else None

    @property
    def streak(self) -> int:
        return self._streak

    def relearn(self) -> None:
        """Drop the baseline and the current window (after a capture, or when steps were profiled)."""
        self._baseline.clear()
        self._streak = 0
        self._acc, self._n = 0.0, 0

    def observe(self, mbu: float) -> bool:
        """Add one decode step's MBU; True when the drop has lasted *windows* windows."""
        self._acc += mbu
        self._n += 1
        if self._n < self.window_steps:
            return False
        mean = self._acc / self._n
        self._acc, self._n = 0.0, 0
        self.last_window = mean
        base = self.baseline
        if base is not None and mean < base * (1.0 - self.drop):
            self._streak += 1
            if self._streak >= self.windows:
                self.relearn()
                return True
            return False
        self._streak = 0
        self._baseline.append(mean)
        return False


class CaptureBudget:
    """A cooldown between automatic captures and a cap on how many start in any hour."""

    __slots__ = ("_clock", "_starts", "cooldown_s", "max_per_hour")

    def __init__(self, cooldown_s: float, max_per_hour: int, clock: Callable[[], float]) -> None:
        self.cooldown_s = cooldown_s
        self.max_per_hour = max_per_hour
        self._clock = clock
        self._starts: deque[float] = deque()

    def refusal(self) -> str | None:
        """Why an automatic capture may not start now, or None when it may."""
        now = self._clock()
        while self._starts and now - self._starts[0] >= 3600.0:
            self._starts.popleft()
        if self._starts and now - self._starts[-1] < self.cooldown_s:
            left = self.cooldown_s - (now - self._starts[-1])
            return f"cooldown: last automatic capture {now - self._starts[-1]:.0f} s ago, {left:.0f} s left"
        if len(self._starts) >= self.max_per_hour:
            return f"max_per_hour: {len(self._starts)} automatic captures in the last hour"
        return None

    def spend(self) -> None:
        self._starts.append(self._clock())


class SignalTrigger:
    """``SIGUSR2`` → *callback* on a fresh daemon thread; the old handler comes back on restore()."""

    def __init__(self, callback: Callable[[], object], signum: int | None = None) -> None:
        if signum is None:
            signum = getattr(signal, "SIGUSR2", None)
            if signum is None:
                raise ConfigError("signal: this platform has no SIGUSR2; trigger with mon.profile() or HTTP")
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "signal: a signal handler can only be installed from the main thread; "
                "call enable_profiler(signal=True) there, or use mon.profile() / POST /profile"
            )
        self._signum = signum
        self._callback = callback
        self._previous: Any = signal.signal(signum, self._handle)
        self._installed = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=self._callback, name="perfsdk-profile-signal", daemon=True).start()

    def restore(self) -> None:
        """Put the previous handler back (main thread only; elsewhere it stays until exit). Idempotent."""
        if not self._installed:
            return
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("the SIGUSR2 handler can only be restored from the main thread")
        self._installed = False
        if signal.getsignal(self._signum) == self._handle:  # someone else may have replaced ours since
            signal.signal(self._signum, self._restorable(self._previous))

    @staticmethod
    def _restorable(previous: Any) -> Any:
        """*previous*, skipping handlers of perfsdk triggers that were restored since.

        A second window installed over a first one remembers the first one's handler; the first is
        closed while the second is still on top (so it leaves the handler alone), and when the second
        closes, putting the first one's handler back would leave perfsdk installed for good.
        """
        while True:
            owner = getattr(previous, "__self__", None)
            if not isinstance(owner, SignalTrigger) or owner._installed:
                return previous if previous is not None else signal.SIG_DFL
            previous = owner._previous
