"""The profiler's own slowdown: profiled steps against the same steps unprofiled.

A profiler changes what it measures (the seeds' "observer effect"): torch.profiler records every
operator and launch on the host, so a profiled step takes longer — inside vLLM on an H200 a 2.09 ms
decode step was 7.0 ms under the profiler. What it barely changes is the GPU's own work: kernels run
at the same speed. So a diagnosis made against the profiled step blames the server for the profiler's
overhead (``launch_bound 48 %, GPU busy 21 %``), while against the unprofiled step the same kernels keep
the GPU busy 56 %.

The correction, given the unprofiled step time of the same phase (and batch)::

    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.observer import Unprofiled

    diag = analyze_trace("decode.pt.trace.json.gz", unprofiled=Unprofiled(step_us=2090.0, source="bench"))
    diag.observer["inflation"]      # 3.35: profiled steps took 3.35x the unprofiled one
    diag.gpu_busy_fraction          # busy time over the *unprofiled* step
    diag.steps                      # as measured under the profiler (what the timeline plot draws)

* GPU-side time — kernels, copies, collectives — is kept as measured: its share is of the unprofiled step.
* The idle time is what the profiler inflated: it is shrunk to ``unprofiled − busy``, each kind of idle
  (waiting for a launch, after a sync, other) in proportion to its profiled size.
* A CPU-only trace has no GPU time to keep: the whole host step is scaled, so its shares do not move
  and only the inflation is reported.
* An unprofiled step shorter than the kernels' busy time cannot be the same step (another batch, or
  context): the window is clamped to the busy time and the diagnosis says the reference does not match.

perfsdk's profiler window knows the reference itself: :class:`StepReference` keeps the median of the last
:data:`REFERENCE_STEPS` unprofiled steps per (phase, batch), fed by the collector while the window
listens, and the window takes it for the batch its steady gate saw when it opened. ``perfsdk analyze
--unprofiled-ms`` gives it by hand.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from perfsdk.config import check_number

__all__ = [
    "REFERENCE_MAX_AGE_S",
    "REFERENCE_MIN_STEPS",
    "REFERENCE_STEPS",
    "StepReference",
    "Unprofiled",
    "correct_step",
    "correct_steps",
    "observer_lines",
    "observer_summary",
]

# Unprofiled steps per (phase, batch) the reference is the median of: enough that a few stray steps
# (a GC pause, a profiled step the collector delivered late) do not move it, few enough to follow drift.
REFERENCE_STEPS = 64
# Fewer steps than this at the batch are no reference: the median of a handful is one hiccup from wrong.
REFERENCE_MIN_STEPS = 8
# Steps older than this are not "the same steps": context grows and traffic changes over minutes.
REFERENCE_MAX_AGE_S = 300.0
# (phase, batch) keys kept; the least recently fed is forgotten first (a server sees a few dozen batch sizes).
_MAX_KEYS = 256


@dataclass(frozen=True)
class Unprofiled:
    """The unprofiled step time (µs) the profiled steps are compared with, and where it comes from."""

    step_us: float
    steps: int = 0  # how many unprofiled steps it is the median of (0: given by hand)
    batch: int | None = None
    source: str = ""
    bytes: float | None = None  # the median bytes those steps had to read (the window prices steps with it)

    def __post_init__(self) -> None:
        v = check_number("unprofiled step time", self.step_us, 0, open_low=True, what="a number of µs")
        object.__setattr__(self, "step_us", v)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step_us": round(self.step_us, 2),
            "steps": self.steps,
            "batch": self.batch,
            "source": self.source,
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Unprofiled:
        return cls(
            step_us=float(d["step_us"]),
            steps=int(d.get("steps") or 0),
            batch=d.get("batch"),
            source=str(d.get("source") or ""),
            bytes=d.get("bytes"),
        )


class StepReference:
    """Recent unprofiled step times per (phase, batch); thread-safe (one writer, any reader)."""

    def __init__(
        self, steps: int = REFERENCE_STEPS, min_steps: int = REFERENCE_MIN_STEPS, max_age_s: float = REFERENCE_MAX_AGE_S
    ) -> None:
        self._steps, self._min, self._max_age = steps, min_steps, max_age_s
        self._lock = threading.Lock()
        self._by_key: OrderedDict[tuple[str, int], deque[tuple[float, float, float | None]]] = OrderedDict()

    def observe(self, phase: str, batch: int, seconds: float, nbytes: float | None, now: float) -> None:
        """One unprofiled step of *phase* at *batch* that took *seconds* (and had *nbytes* to read)."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        key = (phase, batch)
        with self._lock:
            q = self._by_key.get(key)
            if q is None:
                q = self._by_key[key] = deque(maxlen=self._steps)
                while len(self._by_key) > _MAX_KEYS:
                    self._by_key.popitem(last=False)
            else:
                self._by_key.move_to_end(key)
            q.append((now, seconds, nbytes))

    def get(self, phase: str, batch: int | None, now: float) -> tuple[Unprofiled | None, str]:
        """The reference for *phase* at *batch*, or None and the reason there is none."""
        if batch is None:
            return None, f"no unprofiled {phase} step seen yet"
        with self._lock:
            recent = [e for e in self._by_key.get((phase, batch), ()) if now - e[0] <= self._max_age]
        if len(recent) < self._min:
            return None, (
                f"{len(recent)} unprofiled {phase} steps at batch {batch} in the last "
                f"{self._max_age:.0f} s (a reference needs {self._min})"
            )
        nbytes = [e[2] for e in recent if e[2] is not None]
        return Unprofiled(
            step_us=statistics.median(e[1] for e in recent) * 1e6,
            steps=len(recent),
            batch=batch,
            source=f"perfsdk's step timer: median of {len(recent)} unprofiled {phase} steps at batch {batch}",
            bytes=statistics.median(nbytes) if len(nbytes) == len(recent) else None,
        ), ""


def correct_step(step: Any, ref: Unprofiled, has_gpu: bool) -> Any:
    """A copy of *step* (a ``StepStats``) as it would have been unprofiled; see the module docstring."""
    if has_gpu:
        window = step.gpu_window_us
        if window <= 0 or step.gpu_start_us is None:
            return step
        busy = step.gpu_busy_us
        new_window = max(ref.step_us, busy)
        idle = window - busy
        f = (new_window - busy) / idle if idle > 0 else 0.0
        return dataclasses.replace(
            step,
            gpu_end_us=step.gpu_start_us + new_window,
            idle_launch_wait_us=step.idle_launch_wait_us * f,
            idle_after_sync_us=step.idle_after_sync_us * f,
            idle_other_us=step.idle_other_us * f,
        )
    if step.host_dur_us <= 0:
        return step
    f = ref.step_us / step.host_dur_us
    return dataclasses.replace(
        step,
        host_dur_us=ref.step_us,
        host_comm_us=step.host_comm_us * f,
        host_read_us=step.host_read_us * f,
        sync_blocked_us=step.sync_blocked_us * f,
        category_us={c: v * f for c, v in step.category_us.items()},
    )


def correct_steps(
    steps: Sequence[Any], phases: Sequence[str], refs: Mapping[str, Unprofiled], has_gpu: bool
) -> tuple[list[Any], dict[str, dict[str, Any]]]:
    """The basis of a diagnosis: each step (a ``StepStats`` of the phase beside it) corrected where its phase
    has a reference, else as measured; and per phase with a reference and steps, :func:`observer_summary`."""
    basis = [correct_step(s, refs[p], has_gpu) if p in refs else s for s, p in zip(steps, phases, strict=True)]
    observer = {}
    for p, ref in refs.items():
        mine = [s for s, q in zip(steps, phases, strict=True) if q == p]
        if mine:
            observer[p] = observer_summary(mine, ref, has_gpu, p)
    return basis, observer


def observer_summary(measured: Sequence[Any], ref: Unprofiled, has_gpu: bool, phase: str) -> dict[str, Any]:
    """The inflation of *measured* (profiled steps of *phase*) over *ref*, as the diagnosis reports it."""
    if has_gpu:
        steps = [s for s in measured if s.gpu_window_us > 0]
        profiled = statistics.fmean(s.gpu_window_us for s in steps) if steps else 0.0
        busy = statistics.fmean(s.gpu_busy_us for s in steps) if steps else 0.0
    else:
        steps = list(measured)
        profiled = statistics.fmean(s.host_dur_us for s in steps) if steps else 0.0
        busy = 0.0
    inflation = profiled / ref.step_us if profiled > 0 else None
    note = None
    if has_gpu and busy > ref.step_us:
        note = (
            f"the kernels alone ran {busy / 1000:.3f} ms per step, longer than the unprofiled "
            f"{ref.step_us / 1000:.3f} ms step: the reference is not the same step (another batch or "
            "context?); shares are of the kernels' time"
        )
    elif inflation is not None and inflation < 1:
        note = (
            "profiled steps were faster than the unprofiled reference: it may not be the same step "
            "(another batch or context?)"
        )
    return {
        "phase": phase,
        "steps": len(steps),
        "profiled_step_us": round(profiled, 2),
        "profiled_host_step_us": round(statistics.fmean(s.host_dur_us for s in measured), 2) if measured else None,
        "unprofiled_step_us": round(ref.step_us, 2),
        "inflation": None if inflation is None else round(inflation, 3),
        "reference": ref.to_dict(),
        "note": note,
    }


def observer_lines(observer: Mapping[str, Mapping[str, Any]], note: str, has_gpu: bool, corrected: bool) -> list[str]:
    """The report's lines on the profiler's inflation (or on its absence: shares of the profiled step)."""
    if not observer:
        why = note or "none given: perfsdk analyze --unprofiled-ms MS"
        return [
            f"  no unprofiled step time to compare with ({why}): shares are of the profiled step, "
            "which the profiler itself slows"
        ]
    out = []
    for phase, o in observer.items():
        infl, ref = o["inflation"], o["reference"]
        if infl is None:
            out.append(f"  {phase} steps: no profiled step time to compare")
            continue
        cpu = "" if has_gpu else " (CPU-only: unchanged)"
        out.append(
            f"  profiling inflated {phase} steps {infl:.2f}x: {o['profiled_step_us'] / 1000:.3f} ms profiled "
            f"against {o['unprofiled_step_us'] / 1000:.3f} ms unprofiled ({ref['source'] or 'given'}); "
            f"shares are of the unprofiled step{cpu}"
        )
        if o.get("note"):
            out.append(f"  note: {o['note']}")
    if not corrected:
        out.append(f"  other steps: no unprofiled reference ({note or 'none given'}), shares of the profiled step")
    return out
