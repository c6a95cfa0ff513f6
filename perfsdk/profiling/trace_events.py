"""Load a torch.profiler (Kineto) chrome trace into typed, sorted event lists.

Works on any trace torch.profiler writes — perfsdk's own windows, vLLM's and
SGLang's ``--profile`` output, or a user's ``prof.export_chrome_trace(...)``::

    from perfsdk.profiling.trace_events import load_trace

    trace = load_trace("step.pt.trace.json.gz")     # .json or .json.gz, or a list of event dicts
    trace.gpu_ops        # kernels, memcpys, memsets: what occupies the GPU, sorted by start
    trace.runtime        # cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, cuda*Synchronize ...
    trace.launch_of(op)  # the host call that enqueued a GPU op (by correlation id)
    trace.rank           # torch.distributed rank from the trace's "distributedInfo" (None if absent)

Only complete events (``"ph": "X"``) carry time; the categories that matter are

* ``kernel``, ``gpu_memcpy``, ``gpu_memset`` — GPU activity (``args.stream``, ``args.correlation``);
* ``cuda_runtime``, ``cuda_driver`` — host API calls (``args.correlation`` links them to GPU ops;
  the ``ac2g`` flow events carry the same id and are used when a GPU op lacks the arg);
* ``cpu_op``, ``user_annotation`` — host work and ``record_function`` ranges (``ProfilerStep#N``,
  ``perfsdk.decode`` ...). ``gpu_user_annotation`` is Kineto's GPU-side echo of a range and is
  *not* GPU activity: counting it would double the busy time.

Times stay in the trace's unit, microseconds (Kineto writes fractional µs).
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError

__all__ = [
    "GPU_CATEGORIES",
    "HOST_API_CATEGORIES",
    "Event",
    "Trace",
    "load_trace",
    "read_trace_events",
]

# GPU activity: only these occupy an engine. Kineto's "cuda_sync" (GPU-side "Stream Sync"
# markers), "gpu_user_annotation" and "ac2g" flows are deliberately left out.
GPU_CATEGORIES: frozenset[str] = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Host-side CUDA API calls; the driver API shows up for Triton launches (cuLaunchKernel).
HOST_API_CATEGORIES: frozenset[str] = frozenset({"cuda_runtime", "cuda_driver"})
_ANNOTATION_CATEGORIES: frozenset[str] = frozenset({"user_annotation"})
_CPU_OP_CATEGORIES: frozenset[str] = frozenset({"cpu_op", "python_function"})


@dataclass(frozen=True, slots=True)
class Event:
    """One complete (``"ph": "X"``) trace event, with the fields the analyser needs."""

    name: str
    cat: str
    ts: float  # µs
    dur: float  # µs
    pid: str
    tid: str
    correlation: int | None = None
    stream: int | None = None
    graph_id: int | None = None
    nbytes: int | None = None

    @property
    def end(self) -> float:
        return self.ts + self.dur

    @property
    def thread(self) -> tuple[str, str]:
        return (self.pid, self.tid)


@dataclass
class Trace:
    """A parsed trace: events by role, each list sorted by start time."""

    gpu_ops: list[Event] = field(default_factory=list)
    runtime: list[Event] = field(default_factory=list)
    annotations: list[Event] = field(default_factory=list)
    cpu_ops: list[Event] = field(default_factory=list)
    source: str = "<events>"
    # torch.profiler writes "distributedInfo" (backend, rank, world_size) when a process group is up
    rank: int | None = None
    world_size: int | None = None
    _launch_by_corr: dict[int, Event] = field(default_factory=dict, repr=False)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_ops)

    def launch_of(self, op: Event) -> Event | None:
        """The host API call that enqueued *op* (``cudaLaunchKernel``, ``cudaGraphLaunch`` ...)."""
        if op.correlation is None:
            return None
        return self._launch_by_corr.get(op.correlation)


def read_trace_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The raw ``traceEvents`` list of a ``.json`` or ``.json.gz`` chrome trace."""
    return _read_trace(path)[0]


def _read_trace(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``traceEvents`` list and the document's other top-level keys (``{}`` for the bare-array form)."""
    p = os.fspath(path)
    try:
        with open(p, "rb") as f:
            head = f.read(2)
            f.seek(0)
            # sniff the gzip magic rather than trusting the suffix: tools rename files
            raw = gzip.decompress(f.read()) if head == b"\x1f\x8b" else f.read()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from e
    if isinstance(doc, list):  # the bare-array form of the chrome trace format
        return [e for e in doc if isinstance(e, dict)], {}
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        meta = {k: v for k, v in doc.items() if k != "traceEvents"}
        return [e for e in doc["traceEvents"] if isinstance(e, dict)], meta
    raise ConfigError(f"trace: {p!r} has no 'traceEvents' list")


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            return None
    return None


def _event(raw: Mapping[str, Any]) -> Event | None:
    try:
        ts = float(raw["ts"])
        dur = float(raw.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    args = raw.get("args")
    a: Mapping[str, Any] = args if isinstance(args, Mapping) else {}
    # Kineto has spelled a few of these differently across versions
    graph = a.get("graph id", a.get("graph_id"))
    return Event(
        name=str(raw.get("name", "")),
        cat=str(raw.get("cat", "")),
        ts=ts,
        dur=max(dur, 0.0),
        pid=str(raw.get("pid", "")),
        tid=str(raw.get("tid", "")),
        correlation=_int_or_none(a.get("correlation")),
        stream=_int_or_none(a.get("stream")),
        graph_id=_int_or_none(graph),
        nbytes=_int_or_none(a.get("bytes")),
    )


def _with_flow_correlation(op: Event, flow_finish: Mapping[tuple[str, str, float], int]) -> Event:
    if op.correlation is not None:
        return op
    cid = flow_finish.get((op.pid, op.tid, op.ts))
    return op if cid is None else dataclasses.replace(op, correlation=cid)


def load_trace(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]]) -> Trace:
    """Parse a trace file (``.json`` / ``.json.gz``) or an iterable of event dicts."""
    meta: Mapping[str, Any] = {}
    if isinstance(source, (str, os.PathLike)):
        raw_events: Sequence[Mapping[str, Any]]
        raw_events, meta = _read_trace(source)
        name = os.fspath(source)
    else:
        raw_events = list(source)
        name = "<events>"
    trace = Trace(source=name)
    dist = meta.get("distributedInfo")
    if isinstance(dist, Mapping):
        trace.rank, trace.world_size = _int_or_none(dist.get("rank")), _int_or_none(dist.get("world_size"))
    # ac2g flows: "s" sits on the launching host call, "f" on the GPU op; both carry the
    # correlation id as "id". Used only to recover a GPU op whose args lack "correlation".
    flow_finish: dict[tuple[str, str, float], int] = {}
    for raw in raw_events:
        ph = raw.get("ph")
        if ph == "f" and raw.get("cat") == "ac2g":
            fid = _int_or_none(raw.get("id"))
            if fid is not None:
                flow_finish[(str(raw.get("pid", "")), str(raw.get("tid", "")), float(raw.get("ts", 0)))] = fid
            continue
        if ph != "X":
            continue
        ev = _event(raw)
        if ev is None:
            continue
        if ev.cat in GPU_CATEGORIES:
            trace.gpu_ops.append(ev)
        elif ev.cat in HOST_API_CATEGORIES:
            trace.runtime.append(ev)
        elif ev.cat in _ANNOTATION_CATEGORIES:
            trace.annotations.append(ev)
        elif ev.cat in _CPU_OP_CATEGORIES:
            trace.cpu_ops.append(ev)
    if flow_finish:
        trace.gpu_ops = [_with_flow_correlation(op, flow_finish) for op in trace.gpu_ops]
    for lst in (trace.gpu_ops, trace.runtime, trace.annotations, trace.cpu_ops):
        lst.sort(key=lambda e: (e.ts, -e.dur))
    for call in trace.runtime:
        if call.correlation is not None:
            trace._launch_by_corr.setdefault(call.correlation, call)
    return trace
