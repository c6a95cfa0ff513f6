"""What a profiler-window trigger returns and what a capture produced: :class:`CaptureHandle` and
:class:`CaptureResult`, with the window's states. Re-exported by :mod:`perfsdk.profiling.window`::

    handle = mon.profile(steps=4)             # a CaptureHandle
    handle.accepted, handle.reason, handle.state
    result = handle.wait(timeout=60)          # a CaptureResult, or None while still waiting (or refused)
    result.trace, result.verdict, result.diagnosis["findings"]
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ARMED", "IDLE", "READY", "RUNNING", "WRITING", "CaptureHandle", "CaptureResult"]

# window states
IDLE, ARMED, READY, RUNNING, WRITING = "idle", "armed", "ready", "running", "writing"


@dataclass(frozen=True)
class CaptureResult:
    """What one capture produced; ``error`` is set when it failed (the server kept serving)."""

    id: int
    mode: str
    trigger: str
    steady: bool
    steps: int
    trace: str | None = None
    diagnosis: dict[str, Any] | None = field(default=None, repr=False)
    diagnosis_path: str | None = None
    verdict: str | None = None
    error: str | None = None
    step_cv: float | None = None
    batch: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CaptureHandle:
    """What a trigger returns: whether it was accepted (and why not), and a way to wait for it."""

    def __init__(
        self,
        *,
        accepted: bool,
        reason: str | None = None,
        id: int = 0,
        mode: str = "",
        steps: int = 0,
        trigger: str = "",
    ) -> None:
        self.accepted = accepted
        self.reason = reason
        self.id = id
        self.mode = mode
        self.steps = steps
        self.trigger = trigger
        self.state = ARMED if accepted else "refused"
        self.result: CaptureResult | None = None
        self._done = threading.Event()
        if not accepted:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> CaptureResult | None:
        """The result once the capture is written and diagnosed; None on timeout or if refused."""
        self._done.wait(timeout)
        return self.result

    def _finish(self, result: CaptureResult | None, state: str) -> None:
        self.result = result
        self.state = state
        self._done.set()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"accepted": self.accepted, "state": self.state}
        if self.reason is not None:
            d["reason"] = self.reason
        if self.accepted:
            d.update(id=self.id, mode=self.mode, steps=self.steps, trigger=self.trigger)
        if self.result is not None:
            d["result"] = {k: v for k, v in self.result.to_dict().items() if k != "diagnosis"}
        return d
