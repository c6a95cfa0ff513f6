"""What one profiler capture does: profiler sessions, trace files, the disk guard, retention.

Two sessions share one shape, driven by :class:`~perfsdk.profiling.window.ProfilerWindow` on
the **serving thread** — ``start()`` at the first step of the window, ``begin(phase)`` /
``end(phase)`` around every step (``end`` returns True when the window is complete), ``stop()``
at the end — and ``export(path)`` later on a background thread:

* :class:`TorchSession` — ``torch.profiler.profile`` with a ``schedule(wait, warmup, active)``
  counted in decode steps (``prof.step()`` after each one), CPU and (where present) CUDA
  activities, shapes on, stacks and memory off by default, each step inside a
  ``record_function("perfsdk.<phase>")`` range that :func:`~perfsdk.profiling.analyze.analyze_trace`
  uses as its step boundaries.
* :class:`NsysSession` — ``cudaProfilerStart()`` before the first step and ``cudaProfilerStop()``
  after the last, so ``nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop``
  records exactly those steps, with perfsdk's NVTX ranges. Nothing is written by perfsdk.

Files: :func:`trace_name` gives ``perfsdk-<host>-<pid>-rank<r>-<UTC time>.pt.trace.json.gz``;
:func:`write_trace` exports to a hidden temporary name in the same directory and renames it
(atomic: a reader never sees half a trace); :func:`free_mb` is the disk guard's probe and
:func:`prune` keeps the newest *keep* traces (and their ``.diagnosis.json``); :func:`refusal` says why a
capture cannot be armed (no disk room, no CUDA for nsys) before anything starts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "TRACE_SUFFIX",
    "NsysSession",
    "Session",
    "TorchSession",
    "diagnosis_path",
    "free_mb",
    "prune",
    "refusal",
    "trace_name",
    "verdict",
    "write_capture",
    "write_json_atomic",
    "write_trace",
]

TRACE_SUFFIX = ".pt.trace.json.gz"
DIAGNOSIS_SUFFIX = ".diagnosis.json"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class Session:
    """One capture's profiler; see the module docstring for the protocol."""

    mode = "none"
    writes_trace = False

    def __init__(self, steps: int) -> None:
        self.steps = steps  # decode steps the session spans in all
        self.done = 0

    def start(self) -> None:
        raise NotImplementedError

    def begin(self, phase: str) -> None:
        pass

    def end(self, phase: str) -> bool:
        if phase == "decode":
            self.done += 1
        return self.done >= self.steps

    def stop(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        """Stop after a failure; never raises."""
        try:
            self.stop()
        except Exception:
            pass

    def export(self, path: str) -> None:
        raise NotImplementedError


class TorchSession(Session):
    mode = "torch"
    writes_trace = True

    def __init__(
        self, *, wait: int, warmup: int, active: int, record_shapes: bool, with_stack: bool, profile_memory: bool
    ) -> None:
        super().__init__(wait + warmup + active)
        self._schedule = (wait, warmup, active)
        self._options = (record_shapes, with_stack, profile_memory)
        self._prof: Any = None
        self._open: list[Any] = []
        self._record_function: Any = None
        self._stopped: Any = None  # the finished profiler, until export() writes it

    def start(self) -> None:
        import torch
        import torch.profiler as tp

        activities = [tp.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(tp.ProfilerActivity.CUDA)
        wait, warmup, active = self._schedule
        shapes, stack, memory = self._options
        prof = tp.profile(
            activities=activities,
            schedule=tp.schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            on_trace_ready=_keep_in_memory,
            record_shapes=shapes,
            with_stack=stack,
            profile_memory=memory,
        )
        self._record_function = tp.record_function
        prof.start()
        self._prof = prof

    def begin(self, phase: str) -> None:
        rf = self._record_function(f"perfsdk.{phase}")
        rf.__enter__()
        self._open.append(rf)

    def end(self, phase: str) -> bool:
        if self._open:
            self._open.pop().__exit__(None, None, None)
        if phase == "decode":
            self._prof.step()  # the schedule counts decode steps
            self.done += 1
        return self.done >= self.steps

    def stop(self) -> None:
        while self._open:  # a step cut short by an abort
            self._open.pop().__exit__(None, None, None)
        if self._prof is not None:
            prof, self._prof = self._prof, None
            prof.stop()
            self._stopped = prof

    def abort(self) -> None:
        try:
            self.stop()
        except Exception:
            pass
        self._prof = None

    def export(self, path: str) -> None:
        prof = self._stopped
        if prof is None:
            raise RuntimeError("no stopped profiler to export")
        try:
            prof.export_chrome_trace(path)  # gzip-compressed because the name ends in .gz
        finally:
            self._stopped = None  # the trace is large: let it go as soon as it is on disk


def _keep_in_memory(prof: Any) -> None:
    """on_trace_ready: nothing. The trace is exported later, off the serving thread."""


class NsysSession(Session):
    mode = "nsys"

    def start(self) -> None:
        import torch.cuda.profiler

        cuda_profiler: Any = torch.cuda.profiler  # untyped in torch's stubs
        cuda_profiler.start()  # cudaProfilerStart: opens nsys's cudaProfilerApi capture range

    def stop(self) -> None:
        import torch.cuda.profiler

        cuda_profiler: Any = torch.cuda.profiler
        cuda_profiler.stop()  # cudaProfilerStop: closes it (--capture-range-end=stop ends the capture)


# ---- files ----------------------------------------------------------------------------------------


def trace_name(rank: int | str, now: float | None = None) -> str:
    """``perfsdk-<host>-<pid>-rank<r>-<UTC timestamp>.pt.trace.json.gz`` (milliseconds: no collisions)."""
    t = time.time() if now is None else now
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t)) + f".{int(t * 1000) % 1000:03d}Z"
    host = _UNSAFE.sub("_", socket.gethostname()) or "host"
    return f"perfsdk-{host}-{os.getpid()}-rank{rank}-{stamp}{TRACE_SUFFIX}"


def diagnosis_path(trace: str | os.PathLike[str]) -> str:
    return os.fspath(trace) + DIAGNOSIS_SUFFIX


def free_mb(directory: str | os.PathLike[str]) -> float:
    """Free space, in MiB, of the file system holding *directory* (its nearest existing parent)."""
    p = Path(directory).resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free / 2**20


def refusal(mode: str, directory: str, min_free_mb: float) -> str | None:
    """Why a capture in *mode* cannot be armed (no disk room under *directory*, no CUDA for nsys); None if it can."""
    if mode == "nsys":
        try:
            import torch

            if not torch.cuda.is_available():
                return "nsys: no CUDA device here; cudaProfilerStart needs one (use mode='torch')"
        except Exception as e:
            return f"nsys: torch with CUDA is needed ({type(e).__name__}: {e})"
        return None
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        return f"directory: cannot create {directory}: {e.strerror or e}"
    free = free_mb(directory)
    if free < min_free_mb:
        return (
            f"disk: only {free:.0f} MiB free under {directory}, below min_free_mb="
            f"{min_free_mb:g}; free space or lower min_free_mb"
        )
    return None


def write_trace(session: Session, directory: str | os.PathLike[str], name: str) -> str:
    """Export *session*'s trace to ``directory/name`` atomically; returns the path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    final = d / name
    tmp = d / f".{name}.{os.getpid()}.tmp.json.gz"
    try:
        session.export(str(tmp))
        os.replace(tmp, final)
    finally:
        if tmp.exists():
            tmp.unlink()
    return str(final)


def write_capture(session: Session, directory: str, min_free_mb: float, keep: int, rank: int | str) -> str:
    """Write *session*'s trace under *directory* (refused below *min_free_mb* free), keep the newest *keep*."""
    free = free_mb(directory)
    if free < min_free_mb:
        raise OSError(
            f"disk: only {free:.0f} MiB free under {directory} (min_free_mb={min_free_mb:g}); trace not written"
        )
    trace = write_trace(session, directory, trace_name(rank))
    prune(directory, keep)
    return trace


def write_json_atomic(path: str | os.PathLike[str], obj: Mapping[str, Any]) -> None:
    tmp = f"{os.fspath(path)}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def prune(directory: str | os.PathLike[str], keep: int) -> list[str]:
    """Delete all but the newest *keep* perfsdk traces in *directory* (with their diagnoses)."""
    d = Path(directory)
    traces = sorted(
        (p for p in d.glob(f"perfsdk-*{TRACE_SUFFIX}") if p.is_file()), key=lambda p: (p.stat().st_mtime_ns, p.name)
    )
    removed: list[str] = []
    for p in traces[: max(0, len(traces) - keep)]:
        for victim in (p, Path(diagnosis_path(p))):
            try:
                victim.unlink()
                removed.append(str(victim))
            except FileNotFoundError:
                pass
    return removed


def verdict(diagnosis: Mapping[str, Any], trace: str, steady: bool) -> str:
    """The one log line: top finding, its share (of the unprofiled step where the diagnosis had one, and the
    profiler's inflation), the next change to try, and where the trace is."""
    findings = diagnosis.get("findings") or []
    busy = diagnosis.get("gpu_busy_fraction")
    busy_txt = "" if busy is None else f", GPU busy {busy:.0%}"
    note = "" if steady else " [not steady: captured at the gate's timeout]"
    observed = [o for o in (diagnosis.get("observer") or {}).values() if o.get("inflation") is not None]
    if observed:
        o = observed[0]
        basis = f"of the unprofiled {o['unprofiled_step_us'] / 1000:.2f} ms step"
        inflation = f"; profiling inflated steps {o['inflation']:.1f}x"
    else:
        why = diagnosis.get("unprofiled_note")
        basis = "of the profiled step"
        inflation = "; no unprofiled reference" + (f": {why}" if why else "")
    if not findings:
        cats = (diagnosis.get("summary") or {}).get("category_shares") or {}
        where = ""
        if cats and busy is None:  # a CPU-only trace: say where the host's operator time went
            top_cats = sorted(cats.items(), key=lambda kv: -kv[1])[:3]
            where = "; CPU-only trace, host op time: " + ", ".join(f"{c} {v:.0%}" for c, v in top_cats)
        return f"perfsdk profile: no finding above thresholds{busy_txt}{inflation}{where}{note}; trace: {trace}"
    top = findings[0]
    advice = str(top.get("suggestion", "")).split(". ")[0].rstrip(".")
    return (
        f"perfsdk profile: {top.get('kind')} ({float(top.get('share', 0.0)):.0%} {basis}{busy_txt}{inflation})"
        f" -> {advice}{note}; trace: {trace}"
    )
