"""Load a torch.profiler (Kineto) chrome trace into typed, sorted event lists.

Works on any trace torch.profiler writes — perfsdk's own windows, vLLM's and
SGLang's ``--profile`` output, or a user's ``prof.export_chrome_trace(...)``::

    from perfsdk.profiling.trace_events import load_trace

    trace = load_trace("step.pt.trace.json.gz")     # .json or .json.gz, or a list of event dicts
    trace.gpu_ops        # kernels, memcpys, memsets: what occupies the GPU, sorted by start
    trace.runtime        # cudaLaunchKernel, cudaGraphLaunch, cudaMemcpyAsync, cuda*Synchronize ...
    trace.launch_of(op)  # the host call that enqueued a GPU op (by correlation id)
    trace.rank           # torch.distributed rank from the trace's "distributedInfo" (None if absent)
    trace.read_stats     # what reading it cost: bytes read (decompressed), scanned and parsed
    load_trace(path, max_bytes=8 * 2**30)   # read past the default limit of 2 GiB of JSON

Only complete events (``"ph": "X"``) carry time; the categories that matter are

* ``kernel``, ``gpu_memcpy``, ``gpu_memset`` — GPU activity (``args.stream``, ``args.correlation``);
* ``cuda_runtime``, ``cuda_driver`` — host API calls (``args.correlation`` links them to GPU ops;
  the ``ac2g`` flow events carry the same id and are used when a GPU op lacks the arg);
* ``cpu_op``, ``user_annotation`` — host work and ``record_function`` ranges (``ProfilerStep#N``,
  ``perfsdk.decode`` ...). ``gpu_user_annotation`` is Kineto's GPU-side echo of a range and is
  *not* GPU activity: counting it would double the busy time. For the matrix products in
  :data:`SHAPED_OPS`, a trace recorded with ``record_shapes=True`` also gives ``args["Input Dims"]``
  and ``args["Input type"]``, kept as :attr:`Event.input_dims` / :attr:`Event.input_types` (what
  :mod:`perfsdk.profiling.bandwidth` prices a kernel's bytes and FLOPs from).

Times stay in the trace's unit, microseconds (Kineto writes fractional µs).

**Large traces.** Engines' traces run to hundreds of MB. A file is read as a stream: the
``traceEvents`` array is cut into pieces of a few MB at event boundaries, each piece is parsed
and turned into :class:`Event` objects at once (names and thread ids shared, unused categories and
fields never built), so memory holds the events the analyser keeps, not the document. With
``msgspec`` installed (``pip install 'perfsdk[analyze]'``) each piece is decoded straight into
small typed records; without it the standard library's ``json`` parses the pieces, slower but with
the same result. ``load_trace(path, parser="json")`` forces the standard library.

**Hostile files.** At most ``max_bytes`` of JSON are read (:data:`DEFAULT_MAX_BYTES`, 2 GiB, counted
after decompression; ``None``: no limit): past it, :class:`TraceTooLargeError`, and nothing beyond
the limit is decompressed, so a small ``.gz`` that would expand to 100 GiB costs what 2 GiB cost. Up
to the limit the reader's work is linear in the file, whatever it holds (long runs of whitespace,
one huge string, strings full of ``},``, deep objects): :attr:`Trace.read_stats` counts it
(:class:`ReadStats`). Whitespace before the document, between pieces and after the events is dropped
as it is read; an event or a string is held whole while it is parsed, so memory is bounded by the
limit (about twice the longest string), not by a piece.

Bad input raises :class:`~perfsdk.errors.ConfigError` naming the file and, where it can, the byte:
unreadable or truncated files, text that is not JSON, bytes that are not UTF-8, nesting deeper than
the parser's recursion limit, a number of more digits than Python converts to int (4300; the msgspec
reader only sees the numbers in the fields it reads), a document without a ``traceEvents`` list.
Events with a ``ts`` or ``dur`` that is not a finite number (NaN, Infinity, 1e999) are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import os
import re
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from perfsdk.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "GPU_CATEGORIES",
    "HOST_API_CATEGORIES",
    "SHAPED_OPS",
    "Event",
    "ReadStats",
    "Trace",
    "TraceTooLargeError",
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
# operators whose recorded input shapes are kept: the matrix products, whose bytes and FLOPs follow from
# their shapes. Only these: a trace of millions of operators would otherwise hold millions of shape lists.
SHAPED_OPS: frozenset[str] = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::mv", "aten::addmv", "aten::_scaled_mm",
})

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


def read_trace_events(path: str | os.PathLike[str], *,
                      max_bytes: int | None = DEFAULT_MAX_BYTES) -> list[dict[str, Any]]:
    """The raw ``traceEvents`` list of a ``.json`` or ``.json.gz`` chrome trace (the whole list in memory).

    :func:`load_trace` streams the file instead (see the module docstring). *max_bytes* as there.
    """
    return _read_trace(os.fspath(path), _check_limit(max_bytes), ReadStats())[0]


def _check_limit(max_bytes: int | None) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_bytes: expected a positive number of bytes or None (no limit), got {max_bytes!r}")
    return max_bytes


def _read_trace(p: str, limit: int | None, stats: ReadStats) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``traceEvents`` list and the document's other top-level keys (``{}`` for the bare-array form)."""
    try:
        with _open(p, limit, stats) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    stats.streamed = False
    stats.parses += 1
    stats.bytes_parsed += len(raw)
    doc = _parse_document(raw, p)
    return _events_of(doc, p), _meta_of(doc)


def _meta_of(doc: Any) -> dict[str, Any]:
    """A trace document's top-level keys other than its events (``{}`` for the bare-array form)."""
    return {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


class _Limited:
    """A binary file that yields at most *limit* bytes; reading past them raises TraceTooLargeError.

    Asks the file for no more than one byte past the limit, so a compression bomb is decompressed
    only that far: memory and time stop at the limit, not at the bomb's size.
    """

    def __init__(self, f: IO[bytes], limit: int | None, stats: ReadStats, p: str, gz: bool) -> None:
        self._f, self._limit, self._stats, self._p, self._gz = f, limit, stats, p, gz
        self._taken = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:  # all of it, a block at a time: never one buffer of the limit's size up front
            blocks = []
            while block := self.read(_READ):
                blocks.append(block)
            return b"".join(blocks)
        limit = self._limit
        if limit is not None:
            n = min(n, limit - self._taken + 1)
        data = self._f.read(n)
        self._taken += len(data)
        self._stats.bytes_read += len(data)
        if limit is not None and self._taken > limit:
            what = "once decompressed" if self._gz else "in the file"
            raise TraceTooLargeError(
                f"trace: {self._p!r} holds more than {_size(limit)} of JSON {what} ({limit} bytes, the limit); "
                "if it is a real trace, raise the limit: perfsdk analyze --max-size 8GiB, or "
                "load_trace(..., max_bytes=...)"
            )
        return data


@contextlib.contextmanager
def _open(p: str, limit: int | None, stats: ReadStats) -> Iterator[_Limited]:
    """The file's bytes, decompressed as they are read when it is gzip, up to *limit* of them."""
    with open(p, "rb") as f:
        # sniff the gzip magic rather than trusting the suffix: tools rename files
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                yield _Limited(g, limit, stats, p, gz)  # type: ignore[arg-type]  # a GzipFile reads bytes
        else:
            yield _Limited(f, limit, stats, p, gz)


def _int_digits_limit() -> int:
    """Python's limit on the digits of an int parsed from text (0: none; absent before 3.10.7)."""
    get: Callable[[], int] | None = getattr(sys, "get_int_max_str_digits", None)
    return get() if get is not None else 0


def _long_number_at(text: bytes | bytearray | memoryview) -> int | None:
    """Where the first number longer than Python's limit on int conversion starts in *text*."""
    digits = _int_digits_limit()
    if digits <= 0:
        return None
    # a run of digits right after JSON punctuation or whitespace: a number, not the inside of a word
    m = re.compile(rb"(?<![^\[\]{}:, \t\r\n])-?[0-9]{%d,}" % (digits + 1)).search(text)
    return None if m is None else m.start()


def _long_number(p: str, at: int | None) -> ConfigError:
    where = "" if at is None else f" at byte {at}"
    return ConfigError(
        f"trace: {p!r} holds a number of more than {_int_digits_limit()} digits (Python's limit on "
        f"converting text to int){where}: it is not a profiler trace"
    )


def _parse_document(raw: bytes, p: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ConfigError(f"trace: {p!r} is nested too deeply to be a chrome trace") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"trace: {p!r} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from e
    except ValueError as e:  # what json raises past Python's limit on int conversion
        at = _long_number_at(raw)
        if at is None:
            raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from None
        raise _long_number(p, at) from None


def _events_of(doc: Any, p: str) -> list[dict[str, Any]]:
    if isinstance(doc, list):  # the bare-array form of the chrome trace format
        return [e for e in doc if isinstance(e, dict)]
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return [e for e in doc["traceEvents"] if isinstance(e, dict)]
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


def _shapes(dims: Any, types: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]] | None:
    """``Input Dims`` / ``Input type`` as tuples; None when absent or not lists of int lists and strings."""
    if HAVE_MSGSPEC:  # deferred by the typed decoder (msgspec.Raw): decoded only for SHAPED_OPS
        if isinstance(dims, msgspec.Raw):
            dims = msgspec.json.decode(dims)
        if isinstance(types, msgspec.Raw):
            types = msgspec.json.decode(types)
    if not isinstance(dims, list) or not isinstance(types, list) or len(dims) != len(types):
        return None
    out: list[tuple[int, ...]] = []
    for d in dims:
        if not isinstance(d, list) or not all(type(x) is int for x in d):
            return None
        out.append(tuple(d))
    return tuple(out), tuple(t if isinstance(t, str) else "" for t in types)


def _finite(v: Any) -> float | None:
    """``float(v)`` when that is a finite number (a timestamp or a duration), else None."""
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return x if math.isfinite(x) else None


_MISSING: Any = object()  # a field the event does not have (JSON null is None)


class _Builder:
    """Turns raw events, one at a time, into a :class:`Trace`; keeps only what the analyser reads."""

    def __init__(self, source: str) -> None:
        self.trace = Trace(source=source)
        t = self.trace
        self._bucket: dict[str, list[Event]] = {
            **dict.fromkeys(GPU_CATEGORIES, t.gpu_ops), **dict.fromkeys(HOST_API_CATEGORIES, t.runtime),
            **dict.fromkeys(_ANNOTATION_CATEGORIES, t.annotations), **dict.fromkeys(_CPU_OP_CATEGORIES, t.cpu_ops),
        }
        # ac2g flows: "s" sits on the launching host call, "f" on the GPU op; both carry the
        # correlation id as "id". Used only to recover a GPU op whose args lack "correlation".
        self.flow_finish: dict[tuple[str, str, float], int] = {}
        self._texts: dict[str, str] = {}  # one string object per distinct name, category and thread

    def _text(self, v: Any) -> str:
        s = "" if v is _MISSING else v if type(v) is str else str(v)
        return self._texts.setdefault(s, s)

    def add(self, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, ident: Any,
            args: Any) -> None:
        """One event's fields (``_MISSING`` where absent); *args* a mapping, a ``_RawArgs`` or anything.

        Called once per event of a trace of up to millions: the common types (str, float, int) take
        the short ways written out here; anything else goes through the general conversions.
        """
        if ph != "X":
            if ph == "f" and cat == "ac2g":
                fid = _int_or_none(None if ident is _MISSING else ident)
                t = _finite(0 if ts is _MISSING else ts)
                if fid is not None and t is not None:
                    self.flow_finish[(self._text(pid), self._text(tid), t)] = fid
            return
        if ts is _MISSING:
            return
        texts = self._texts
        category = texts.get(cat) if type(cat) is str else None
        if category is None:
            category = self._text(cat)
        bucket = self._bucket.get(category)
        if bucket is None:  # a category nothing reads: not even built
            return
        # x - x == 0.0 is False for inf and NaN
        start = ts if type(ts) is float and ts - ts == 0.0 else _finite(ts)
        length = 0.0 if dur is _MISSING else dur if type(dur) is float and dur - dur == 0.0 else _finite(dur)
        if start is None or length is None:
            return
        op_name = (texts.get(name) if type(name) is str else None) or self._text(name)
        shapes = None
        if isinstance(args, _RAW_ARGS):
            corr, stream, nbytes = args.correlation, args.stream, args.bytes
            graph = args.graph_id_spaced
            if graph is _UNSET:
                graph = args.graph_id
            if op_name in SHAPED_OPS and category in _CPU_OP_CATEGORIES:
                shapes = _shapes(args.input_dims, args.input_types)
        elif isinstance(args, Mapping):
            corr, stream, nbytes = args.get("correlation"), args.get("stream"), args.get("bytes")
            # Kineto has spelled this one differently across versions
            graph = args.get("graph id", args.get("graph_id"))
            if op_name in SHAPED_OPS and category in _CPU_OP_CATEGORIES:
                shapes = _shapes(args.get("Input Dims"), args.get("Input type"))
        else:
            corr = stream = nbytes = graph = None
        text = self._text
        bucket.append(Event(
            name=op_name,
            cat=category,
            ts=start,
            dur=max(length, 0.0),
            pid=(texts.get(pid) if type(pid) is str else None) or text(pid),
            tid=(texts.get(tid) if type(tid) is str else None) or text(tid),
            correlation=corr if type(corr) is int else None if corr is None or corr is _UNSET else _int_or_none(corr),
            stream=stream if type(stream) is int else None if stream is None or stream is _UNSET
            else _int_or_none(stream),
            graph_id=graph if type(graph) is int else None if graph is None or graph is _UNSET else _int_or_none(graph),
            nbytes=nbytes if type(nbytes) is int else None if nbytes is None or nbytes is _UNSET
            else _int_or_none(nbytes),
            input_dims=None if shapes is None else shapes[0],
            input_types=None if shapes is None else shapes[1],
        ))

    def add_dict(self, raw: Mapping[str, Any]) -> None:
        g = raw.get
        self.add(g("ph"), g("cat", _MISSING), g("name", _MISSING), g("pid", _MISSING), g("tid", _MISSING),
                 g("ts", _MISSING), g("dur", _MISSING), g("id", _MISSING), g("args"))

    def add_many(self, items: list[Any]) -> None:
        add = self.add
        for raw in items:
            if isinstance(raw, _RAW_EVENT):
                m = _UNSET
                add(None if raw.ph is m else raw.ph, _MISSING if raw.cat is m else raw.cat,
                    _MISSING if raw.name is m else raw.name, _MISSING if raw.pid is m else raw.pid,
                    _MISSING if raw.tid is m else raw.tid, _MISSING if raw.ts is m else raw.ts,
                    _MISSING if raw.dur is m else raw.dur, _MISSING if raw.id is m else raw.id,
                    None if raw.args is m else raw.args)
            elif isinstance(raw, dict):
                self.add_dict(raw)

    def finish(self) -> Trace:
        trace = self.trace
        if self.flow_finish:
            trace.gpu_ops = [_with_flow_correlation(op, self.flow_finish) for op in trace.gpu_ops]
        for lst in (trace.gpu_ops, trace.runtime, trace.annotations, trace.cpu_ops):
            lst.sort(key=lambda e: (e.ts, -e.dur))
        for call in trace.runtime:
            if call.correlation is not None:
                trace._launch_by_corr.setdefault(call.correlation, call)
        return trace


# ---- msgspec: typed records for the fields the builder reads (optional dependency) ----------------

try:
    import msgspec

    _UNSET: Any = msgspec.UNSET

    # gc=False: millions of short-lived records that hold no cycles need not be tracked by the collector
    class _RawArgs(msgspec.Struct, gc=False):
        correlation: Any = msgspec.UNSET
        stream: Any = msgspec.UNSET
        bytes: Any = msgspec.UNSET
        graph_id_spaced: Any = msgspec.field(default=msgspec.UNSET, name="graph id")
        graph_id: Any = msgspec.UNSET
        # kept undecoded (a slice of the input): decoded only for SHAPED_OPS, so that the shapes of
        # every other operator cost nothing
        input_dims: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="Input Dims")
        input_types: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="Input type")

    class _RawEvent(msgspec.Struct, gc=False):
        ph: Any = msgspec.UNSET
        cat: Any = msgspec.UNSET
        name: Any = msgspec.UNSET
        pid: Any = msgspec.UNSET
        tid: Any = msgspec.UNSET
        ts: Any = msgspec.UNSET
        dur: Any = msgspec.UNSET
        id: Any = msgspec.UNSET
        # an event whose args is not an object fails the typed decode; its piece is decoded untyped
        args: _RawArgs | msgspec.UnsetType | None = msgspec.UNSET

    _RAW_EVENT: Any = _RawEvent
    _RAW_ARGS: Any = _RawArgs
    _TYPED = msgspec.json.Decoder(list[_RawEvent])
    _UNTYPED = msgspec.json.Decoder()
    HAVE_MSGSPEC = True
except ImportError:  # the standard library parses; same events, slower
    _UNSET = _MISSING
    _RAW_EVENT = _RAW_ARGS = ()
    HAVE_MSGSPEC = False


class _NotAPiece(Exception):
    """The bytes tried as a run of whole events are not one: cut elsewhere.

    ``string_at``: the index, in the bytes tried, of the string the cut fell inside (the parser said
    so); the next cut lies past that string's end.
    """

    def __init__(self, string_at: int | None = None) -> None:
        super().__init__(string_at)
        self.string_at = string_at


class _BadText(Exception):
    """Text no cut can make a trace of: *what*, at index *at* of the bytes tried (None: not known)."""

    def __init__(self, what: str, at: int | None) -> None:
        super().__init__(what, at)
        self.what, self.at = what, at


class _Decoder:
    """Parses ``[`` + events + ``]`` (any bytes-like object) into a list, counting its work in *stats*.

    Returns the list and the index just past the value: the length of the bytes, or less when the
    array closed early (a real ``]`` of the document inside them: the ``traceEvents`` array ended).
    """

    def __init__(self, parser: Parser, stats: ReadStats) -> None:
        if parser not in ("auto", "msgspec", "json"):
            raise ConfigError(f"parser: expected 'auto', 'msgspec' or 'json', got {parser!r}")
        if parser == "msgspec" and not HAVE_MSGSPEC:
            from perfsdk.errors import MissingDependencyError

            raise MissingDependencyError("msgspec", "load_trace(parser='msgspec')", extra="analyze")
        self._fast = HAVE_MSGSPEC and parser != "json"
        self._stats = stats
        self._json = json.JSONDecoder()

    def _count(self, n: int) -> None:
        self._stats.parses += 1
        self._stats.bytes_parsed += n

    def __call__(self, piece: memoryview) -> tuple[list[Any], int]:
        if self._fast:
            self._count(len(piece))
            try:
                try:
                    return list(_TYPED.decode(piece)), len(piece)
                except msgspec.ValidationError:  # valid JSON of other shapes (args not an object ...)
                    self._count(len(piece))
                    out = _UNTYPED.decode(piece)
                    return (out if isinstance(out, list) else []), len(piece)
            except msgspec.DecodeError:
                # not JSON here (a wrong cut), or what json takes (NaN, Infinity, 1e999, integers past
                # 64 bits) or words precisely (where a string starts, where the array ends)
                pass
        return self._stdlib(piece)

    def _stdlib(self, piece: memoryview) -> tuple[list[Any], int]:
        self._count(len(piece))
        try:
            text = str(piece, "utf-8", "surrogatepass")  # what json.loads does with bytes
        except UnicodeDecodeError as e:
            raise _BadText(f"bytes that are not UTF-8 text ({e.reason})", e.start) from None
        try:
            out, end = self._json.raw_decode(text)
        except json.JSONDecodeError as e:
            if e.msg.startswith("Unterminated string"):
                raise _NotAPiece(len(text[: e.pos].encode("utf-8", "surrogatepass"))) from None
            raise _NotAPiece from None
        except ValueError as e:  # what json raises past Python's limit on int conversion
            at = _long_number_at(piece)
            if at is None:
                raise _BadText(f"text the JSON parser refuses ({e})", None) from None
            raise _BadText(f"a number of more than {_int_digits_limit()} digits (Python's limit on converting "
                           "text to int)", at) from None
        items = out if isinstance(out, list) else []
        if end == len(text):
            return items, len(piece)
        return items, len(text[:end].encode("utf-8", "surrogatepass"))


_READ = 8 * 2**20  # bytes read from the file at a time
_PIECE = 4 * 2**20  # bytes of events parsed at a time (a cut is tried at the first boundary after this)
_HEAD_LIMIT = 64 * 2**20  # the traceEvents key must appear within this many bytes, else parse it whole
_MAX_MISCUTS = 32  # wrong cuts tried for one piece (each doubles it) before the whole document is parsed
_ARRAY_START = re.compile(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[')
_KEY_OPEN = re.compile(rb'"traceEvents"[ \t\r\n]*(?::[ \t\r\n]*)?')  # a key cut off by the end of the buffer
_KEY = b'"traceEvents"'
_CUT = re.compile(rb"\}[ \t\r\n]*([,\]])")  # the end of an object, then the array goes on or ends
_ARRAY_END = re.compile(rb"\}[ \t\r\n]*(\])")
_LAST_CUT = re.compile(rb"(?s:.*)(\}[ \t\r\n]*([,\]]))")  # matched from a position: the last cut after it
_STALL = (-1, -1)  # _Cuts.first: no cut in the bytes it was allowed to look at
_SPACE_RUN = re.compile(rb"[ \t\r\n]*")  # JSON's whitespace
_STRING_BODY = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*', re.DOTALL)  # a string's bytes up to its closing quote
_OPEN, _CLOSE, _QUOTE = ord("["), ord("]"), ord('"')
_SEPARATORS = b",]"


class _Stream:
    """Feeds the ``traceEvents`` array of one open file to a builder, a piece at a time.

    A piece ends after an object followed by ``,`` or ``]``; when the bytes up to such a cut are not a
    run of whole events (the ``}`` closed a nested object, or sat inside a string) a cut further on is
    tried. Parsing from a true event boundary, a piece that parses is exactly a run of whole events,
    so no event is ever split or merged; the document around the array is checked at the end.

    Linear time, whatever the file holds: every search resumes where the last one stopped (never from
    the start of the piece), a wrong cut inside a string moves past that whole string (the parser
    says where it starts), any other wrong cut doubles the piece (so the bytes parsed in failed tries
    are at most twice those of the piece that parses; after _MAX_MISCUTS the whole document is parsed
    instead), and at the end of the file the parser itself finds where the array ends. Memory: one
    piece and one read block, or the longest event when it is longer. Whitespace is dropped as it is
    passed: before the document, before a piece, and after the array; a piece that would run into a
    long stretch without a cut (whitespace between events) ends at the last cut before it instead.

    ``buf[0]`` is the byte before the next event (the array's ``[``, a ``,`` or whitespace); a piece
    is parsed in place, ``buf[0]`` and the byte after its last ``}`` overwritten by ``[`` and ``]``.
    """

    def __init__(self, f: _Limited, decode: _Decoder, builder: _Builder, stats: ReadStats, p: str) -> None:
        self.f, self.decode, self.builder, self.stats, self.p = f, decode, builder, stats, p
        self.buf = bytearray()
        self.base = 0  # the offset in the document of buf[0]
        self.eof = False

    def more(self) -> bool:
        """Append the file's next block to the buffer; False at the end of the file."""
        if self.eof:
            return False
        block = self.f.read(_READ)
        if not block:
            self.eof = True
            return False
        self.buf += block
        return True

    def drop(self, n: int) -> None:
        del self.buf[:n]  # a bytearray moves its start: no copy
        self.base += n

    def scanned(self, n: int) -> None:
        if n > 0:  # a search that starts past the end of the buffer examines nothing
            self.stats.bytes_scanned += n

    def skip_space(self, pos: int) -> int:
        """The index of the first byte at or after *pos* that is not whitespace (the buffer's length at
        the end of the file). Whitespace that runs to the end of the buffer is dropped before reading
        on, all but its last byte, so none accumulates; bytes before *pos* may go with it."""
        buf = self.buf
        while True:
            j = _SPACE_RUN.match(buf, pos).end()  # type: ignore[union-attr]  # '*' always matches
            self.scanned(j - pos)
            if j < len(buf):
                return j
            if j > 1:
                self.drop(j - 1)
            pos = len(buf)
            if not self.more():
                return pos

    def string_end(self, q: int) -> int | None:
        """The index just past the string that opens at ``buf[q]``, reading on as needed (None: the
        file ends inside it, or there is no string there)."""
        buf = self.buf
        if q >= len(buf) or buf[q] != _QUOTE:
            return None
        at = q + 1
        while True:
            j = _STRING_BODY.match(buf, at).end()  # type: ignore[union-attr]
            self.scanned(j - at)
            if j < len(buf) and buf[j] == _QUOTE:
                return j + 1
            at = j  # the end of the buffer, or a backslash that is its last byte: go on from there
            if not self.more():
                return None

    def run(self) -> dict[str, Any] | None:
        """The document's other top-level keys, or None when it is not laid out as this reader expects,
        or is not JSON (then nothing fed counts: the caller parses the whole document, which also
        words the error)."""
        buf = self.buf
        pos = self.skip_space(0)
        if pos >= len(buf):
            return None
        bare = buf[pos] == _OPEN
        at = pos if bare else self.find_array(pos)
        if at is None:
            return None
        head = bytes(buf[:at])
        self.drop(at)  # buf[0] is the array's '['
        after_comma = False
        while True:
            pos = self.skip_space(1)
            if pos >= len(buf):
                return None  # the file ends inside the array
            self.drop(pos - 1)
            if buf[1] == _CLOSE:
                if after_comma:
                    return None  # "[{...}, ]" is not JSON
                tail = 2
                break
            end = self.piece()
            if end is None:
                return None
            if buf[end - 1] == _CLOSE:
                tail = end
                break
            self.drop(end - 1)  # buf[0] is the ',' after the piece
            after_comma = True
        pos = self.skip_space(tail)
        while self.more():  # the rest of the document: a few keys after the events
            pass
        # the document around the array must parse, with "traceEvents" being that very array
        try:
            doc = json.loads(head + b"[]" + bytes(buf[pos:]))
        except (ValueError, RecursionError):
            return None
        if bare:
            return {} if doc == [] else None
        return _meta_of(doc) if isinstance(doc, dict) and doc.get("traceEvents") == [] else None

    def find_array(self, pos: int) -> int | None:
        """The index of the ``[`` that opens the ``traceEvents`` array (None: not in the first _HEAD_LIMIT bytes)."""
        buf, at = self.buf, pos
        while True:
            m = _ARRAY_START.search(buf, at)
            if m is not None:
                self.scanned(m.end() - at)
                return m.end() - 1
            self.scanned(len(buf) - at)
            # resume where a match may still begin: at a key the end of the buffer cut off
            k = buf.rfind(_KEY, at)
            if k >= 0 and _KEY_OPEN.fullmatch(buf, k):
                self.scanned(len(buf) - k)
                at = k
            else:
                at = max(at, len(buf) - len(_KEY) + 1)
            if len(buf) > _HEAD_LIMIT or not self.more():
                return None

    def piece(self) -> int | None:
        """Parse the run of whole events that starts at ``buf[1]``; the index just past the ``,`` or the
        array's ``]`` that follows it (None: no such run, parse the whole document instead)."""
        floor = 1  # the cut's '}' lies at or after this
        reach = _PIECE  # and, while the file goes on, at or after this: pieces of about _PIECE bytes
        cuts = _Cuts(self)
        stalled = False
        for _ in range(_MAX_MISCUTS):
            lo = max(floor, reach)
            cut = cuts.first(lo, None if stalled else lo + _READ)
            if cut is _STALL:
                # a long run without a cut past reach (whitespace, one long event): end the piece at the
                # last cut before the run instead, so that whitespace is dropped, not held in a piece
                stalled = True
                m = _LAST_CUT.match(self.buf, floor)
                self.scanned(len(self.buf) - floor)
                if m is None:
                    continue  # none: read on
                cut = (m.start(1), m.start(2))
            if cut is None:
                break  # the file is read to its end and no cut lies past reach: the last piece
            done, at = self.attempt(*cut)
            if done or at is None:
                return at
            floor = at
            reach = max(reach, 1 + 2 * (floor - 1))  # the next try at least doubles the piece
        else:
            return None
        # the last piece: first up to the first '}' + ']' (where the array ends in a usual layout) ...
        m = _ARRAY_END.search(self.buf, floor)
        self.scanned((m.end() if m else len(self.buf)) - floor)
        if m is not None:
            done, at = self.attempt(m.start(), m.start(1))
            if done or at is None:
                return at
            floor = at
        # ... else up to the last '}' of the file: the parser says where the array ends inside it
        buf = self.buf
        k = buf.rfind(b"}", floor)
        self.scanned(len(buf) - max(k, floor))
        if k < 0:
            return None
        j = _SPACE_RUN.match(buf, k + 1).end()  # type: ignore[union-attr]
        done, at = self.attempt(k, j if j < len(buf) and buf[j] in _SEPARATORS else None)
        return at if done else None

    def attempt(self, brace: int, sep: int | None) -> tuple[bool, int | None]:
        """Parse ``buf[1:brace + 1]`` as a run of events and feed them to the builder.

        Parsed: (True, the index just past the ``,`` or ``]`` at *sep*, or past the array's ``]`` when
        it closed inside). Not a run of events: (False, the least index of the next cut's ``}``), or
        (False, None) when there is none (the file ends inside a string).
        """
        buf = self.buf
        if brace + 1 == len(buf):
            buf.append(0x20)  # room for the ']' (a space at the very end of the document)
        first, after = buf[0], buf[brace + 1]
        buf[0], buf[brace + 1] = _OPEN, _CLOSE
        closed: int | None = None
        try:
            with memoryview(buf) as whole, whole[: brace + 2] as piece:
                items, end = self.decode(piece)
                if end < brace + 2:
                    closed = end  # the array's ']' is buf[end - 1]
                elif sep is not None:
                    closed = sep + 1
                if closed is not None:
                    # inside the view: msgspec.Raw values (recorded shapes) point into it until turned into
                    # Events, and the view cannot be released while they exist
                    self.builder.add_many(items)
                del items
        except _NotAPiece as e:
            buf[0], buf[brace + 1] = first, after
            if e.string_at is None:
                return False, brace + 1
            end_of_string = self.string_end(e.string_at)  # the cut fell inside it: go past it whole
            return False, None if end_of_string is None else max(end_of_string, brace + 1)
        except _BadText as e:
            where = "" if e.at is None else f" at byte {self.base + e.at}"
            raise ConfigError(f"trace: {self.p!r} holds {e.what}{where}: it is not a profiler trace") from None
        except RecursionError:
            raise ConfigError(f"trace: {self.p!r} is nested too deeply to be a chrome trace (in the events "
                              f"from byte {self.base + 1})") from None
        finally:
            buf[0], buf[brace + 1] = first, after
        if closed is None:
            return False, brace + 1
        self.stats.pieces += 1
        return True, closed


class _Cuts:
    """The cut candidates of one piece (``}``, whitespace, then ``,`` or ``]``), each byte searched once."""

    def __init__(self, stream: _Stream) -> None:
        self.s = stream
        self.at = 0  # searched up to here: no candidate '}' before it but `brace`
        self.brace = -1  # a '}' followed by whitespace up to `at`, the end of the buffer (-1: none)

    def first(self, lo: int, stall: int | None = None) -> tuple[int, int] | None:
        """(the ``}``, the ``,`` or ``]``) of the first candidate whose ``}`` lies at or after *lo*,
        reading on until there is one; None at the end of the file, ``_STALL`` when there is none in
        the first *stall* bytes of the buffer (then a later call goes on where this one stopped)."""
        s, buf = self.s, self.s.buf
        if lo > self.at:
            self.at, self.brace = lo, -1
        elif self.brace < lo:
            self.brace = -1
        while True:
            if self.brace >= 0:  # whitespace after a '}' ran to the end of the buffer: go on with it
                j = _SPACE_RUN.match(buf, self.at).end()  # type: ignore[union-attr]
                s.scanned(j - self.at)
                self.at = j
                if j == len(buf):
                    if stall is not None and len(buf) >= stall:
                        return _STALL
                    if not s.more():
                        return None
                    continue
                k, self.brace = self.brace, -1
                if buf[j] in _SEPARATORS:
                    self.at = k + 1
                    return k, j
            m = _CUT.search(buf, self.at)
            if m is not None:
                s.scanned(m.end() - self.at)
                self.at = m.start() + 1
                return m.start(), m.start(1)
            s.scanned(len(buf) - self.at)
            # none in what was read; a '}' followed by nothing but whitespace may still begin one
            k = buf.rfind(b"}", self.at)
            if k >= 0:
                s.scanned(len(buf) - k)
                if _SPACE_RUN.match(buf, k + 1).end() == len(buf):  # type: ignore[union-attr]
                    self.brace = k
            self.at = max(self.at, len(buf))  # (the search may start past what was read: lo is far)
            if stall is not None and len(buf) >= stall:
                return _STALL
            if not s.more():
                return None


def _with_flow_correlation(op: Event, flow_finish: Mapping[tuple[str, str, float], int]) -> Event:
    if op.correlation is not None:
        return op
    cid = flow_finish.get((op.pid, op.tid, op.ts))
    return op if cid is None else dataclasses.replace(op, correlation=cid)


def load_trace(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]], *,
               parser: Parser = "auto", max_bytes: int | None = DEFAULT_MAX_BYTES) -> Trace:
    """Parse a trace file (``.json`` / ``.json.gz``) or an iterable of event dicts.

    *parser*: ``"auto"`` (msgspec when installed, else the standard library), ``"msgspec"`` or
    ``"json"``; files are streamed either way (see the module docstring). *max_bytes*: the most JSON
    read from the file, after decompression (:data:`DEFAULT_MAX_BYTES`, 2 GiB; None: no limit);
    past it, :class:`TraceTooLargeError`, having read no further.
    """
    if not isinstance(source, (str, os.PathLike)):
        builder = _Builder("<events>")
        for raw in source:
            if isinstance(raw, Mapping):
                builder.add_dict(raw)
        return builder.finish()
    p = os.fspath(source)
    limit = _check_limit(max_bytes)
    stats = ReadStats()
    decode = _Decoder(parser, stats)
    try:
        with _open(p, limit, stats) as f:
            builder = _Builder(p)
            meta = _Stream(f, decode, builder, stats, p).run()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    if meta is None:
        # laid out otherwise (or not JSON): parse it whole, which also gives the exact error
        builder = _Builder(p)
        events, meta = _read_trace(p, limit, stats)
        for raw in events:
            builder.add_dict(raw)
    trace = builder.finish()
    trace.read_stats = stats
    dist = meta.get("distributedInfo")
    if isinstance(dist, Mapping):
        trace.rank, trace.world_size = _int_or_none(dist.get("rank")), _int_or_none(dist.get("world_size"))
    return trace
