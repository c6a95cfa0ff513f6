"""What a loaded trace is: :class:`Event` (one complete trace event, the fields the analyser reads),
:class:`Trace` (events by role, sorted), :class:`ReadStats` (what reading it cost), and the categories
that decide an event's role. :mod:`perfsdk.profiling.trace_events` builds them (and re-exports them)::

    from perfsdk.profiling.trace_events import load_trace

    trace = load_trace("step.pt.trace.json.gz")
    op = trace.gpu_ops[0]             # an Event: name, cat, ts, dur (µs), pid, tid, correlation ...
    trace.launch_of(op)               # the host call that enqueued it
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from perfsdk.errors import ConfigError

__all__ = [
    "ANNOTATION_CATEGORIES",
    "CPU_OP_CATEGORIES",
    "DEFAULT_MAX_BYTES",
    "GPU_CATEGORIES",
    "HOST_API_CATEGORIES",
    "SHAPED_OPS",
    "Event",
    "Parser",
    "ReadStats",
    "Trace",
    "TraceTooLargeError",
]

# GPU activity: only these occupy an engine. Kineto's "cuda_sync" (GPU-side "Stream Sync"
# markers), "gpu_user_annotation" and "ac2g" flows are deliberately left out.
GPU_CATEGORIES: frozenset[str] = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Host-side CUDA API calls; the driver API shows up for Triton launches (cuLaunchKernel).
HOST_API_CATEGORIES: frozenset[str] = frozenset({"cuda_runtime", "cuda_driver"})
ANNOTATION_CATEGORIES: frozenset[str] = frozenset({"user_annotation"})
CPU_OP_CATEGORIES: frozenset[str] = frozenset({"cpu_op", "python_function"})
# operators whose recorded input shapes are kept: the matrix products, whose bytes and FLOPs follow from
# their shapes. Only these: a trace of millions of operators would otherwise hold millions of shape lists.
SHAPED_OPS: frozenset[str] = frozenset(
    {
        "aten::mm",
        "aten::addmm",
        "aten::bmm",
        "aten::baddbmm",
        "aten::matmul",
        "aten::linear",
        "aten::mv",
        "aten::addmv",
        "aten::_scaled_mm",
    }
)

Parser = Literal["auto", "msgspec", "json"]


DEFAULT_MAX_BYTES = 2 * 2**30
"""The most JSON :func:`load_trace` reads from one trace unless told otherwise: 2 GiB, counted after
decompression. Kineto traces of a few steps are tens to hundreds of MB; a 1 MB ``.gz`` can hold 1 GiB."""


class TraceTooLargeError(ConfigError):
    """The trace holds more bytes (after decompression) than the limit it was read with."""


@dataclass
class ReadStats:
    """What reading one trace cost (:attr:`Trace.read_stats`), counted as the reader works.

    Every count grows linearly with the file, whatever it holds (long runs of whitespace, one huge
    string, cut patterns inside strings); ``tests/test_trace_events.py`` checks that on such files.
    """

    bytes_read: int = 0  # bytes of JSON taken from the file (decompressed), fallback included
    bytes_scanned: int = 0  # bytes examined for the array, event boundaries, whitespace and string ends
    bytes_parsed: int = 0  # bytes given to a JSON parser, failed attempts included
    parses: int = 0  # parser calls (a piece msgspec refuses and json then takes counts twice)
    pieces: int = 0  # runs of events parsed
    buffer_peak: int = 0  # the most bytes the reader held at once (what the file costs in memory, beside events)
    streamed: bool = True  # False: the document was laid out otherwise and parsed whole


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
    # SHAPED_OPS recorded with record_shapes=True: each input's dims ([] for a scalar) and type name
    input_dims: tuple[tuple[int, ...], ...] | None = None
    input_types: tuple[str, ...] | None = None

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
    # what reading the file cost (bytes read, scanned and parsed); all zero for a list of events
    read_stats: ReadStats = field(default_factory=ReadStats, repr=False, compare=False)
    _launch_by_corr: dict[int, Event] = field(default_factory=dict, repr=False)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_ops)

    def launch_of(self, op: Event) -> Event | None:
        """The host API call that enqueued *op* (``cudaLaunchKernel``, ``cudaGraphLaunch`` ...)."""
        if op.correlation is None:
            return None
        return self._launch_by_corr.get(op.correlation)
