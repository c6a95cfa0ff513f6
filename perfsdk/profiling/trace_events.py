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

Bad input raises :class:`~perfsdk.errors.ConfigError` naming the file: unreadable or truncated
files, text that is not JSON, nesting deeper than the parser's recursion limit, a document without
a ``traceEvents`` list. Events with a ``ts`` or ``dur`` that is not a finite number are skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from perfsdk.errors import ConfigError

__all__ = [
    "GPU_CATEGORIES",
    "HOST_API_CATEGORIES",
    "SHAPED_OPS",
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
# operators whose recorded input shapes are kept: the matrix products, whose bytes and FLOPs follow from
# their shapes. Only these: a trace of millions of operators would otherwise hold millions of shape lists.
SHAPED_OPS: frozenset[str] = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
    "aten::mv", "aten::addmv", "aten::_scaled_mm",
})

Parser = Literal["auto", "msgspec", "json"]


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
    """The raw ``traceEvents`` list of a ``.json`` or ``.json.gz`` chrome trace (the whole list in memory).

    :func:`load_trace` streams the file instead (see the module docstring).
    """
    return _read_trace(path)[0]


def _read_trace(path: str | os.PathLike[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``traceEvents`` list and the document's other top-level keys (``{}`` for the bare-array form)."""
    p = os.fspath(path)
    try:
        with _open(p) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    doc = _parse_document(raw, p)
    return _events_of(doc, p), _meta_of(doc)


def _meta_of(doc: Any) -> dict[str, Any]:
    """A trace document's top-level keys other than its events (``{}`` for the bare-array form)."""
    return {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}


@contextlib.contextmanager
def _open(p: str) -> Iterator[IO[bytes]]:
    """The file's bytes, decompressed as they are read when it is gzip."""
    with open(p, "rb") as f:
        # sniff the gzip magic rather than trusting the suffix: tools rename files
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                yield g  # type: ignore[misc]  # a GzipFile reads bytes like any binary file
        else:
            yield f


def _parse_document(raw: bytes, p: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ConfigError(f"trace: {p!r} is nested too deeply to be a chrome trace") from None
    except ValueError as e:
        raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from e


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
    """The bytes tried as a run of whole events are not one: cut elsewhere."""


def _decoder(parser: Parser) -> Callable[[bytes], list[Any]]:
    if parser == "msgspec" or (parser == "auto" and HAVE_MSGSPEC):
        if not HAVE_MSGSPEC:
            from perfsdk.errors import MissingDependencyError

            raise MissingDependencyError("msgspec", "load_trace(parser='msgspec')", extra="analyze")

        def decode_msgspec(piece: bytes) -> list[Any]:
            try:
                try:
                    return list(_TYPED.decode(piece))
                except msgspec.ValidationError:  # valid JSON of other shapes (args not an object ...)
                    out = _UNTYPED.decode(piece)
                    return out if isinstance(out, list) else []
            except msgspec.DecodeError:
                pass  # not JSON here; NaN and Infinity are not JSON either, yet json.loads takes them
            return decode_json(piece)

        return decode_msgspec
    if parser not in ("json", "auto"):
        raise ConfigError(f"parser: expected 'auto', 'msgspec' or 'json', got {parser!r}")
    return decode_json


def decode_json(piece: bytes) -> list[Any]:
    try:
        out = json.loads(piece)
    except json.JSONDecodeError:
        raise _NotAPiece from None
    return out if isinstance(out, list) else []


_READ = 8 * 2**20  # bytes read from the file at a time
_PIECE = 4 * 2**20  # bytes of events parsed at a time (a cut is tried at the first boundary after this)
_HEAD_LIMIT = 64 * 2**20  # the traceEvents key must appear within this many bytes, else parse it whole
_ARRAY_START = re.compile(rb'"traceEvents"\s*:\s*\[')
_CUT = re.compile(rb"\}\s*([,\]])")  # the end of an object, then the array goes on or ends
_ARRAY_END = re.compile(rb"\}\s*(\])")
_SPACE = b" \t\r\n"


def _stream_events(f: IO[bytes], decode: Callable[[bytes], list[Any]], builder: _Builder) -> dict[str, Any] | None:
    """Feed the ``traceEvents`` of the open file *f* to *builder* piece by piece; returns the document's
    other top-level keys (``distributedInfo`` …).

    Returns None when the document is not laid out as this reader expects, or is not JSON (then
    nothing it fed counts: the caller parses the whole document, which also words the error). A
    piece ends after an object followed by ``,`` or ``]``; when the bytes up to such a cut are not a
    run of whole events (the ``}`` closed a nested object, or sat inside a string) a cut further on is
    tried. Parsing from a true event boundary, a piece that parses is exactly a run of whole events,
    so no event is ever split or merged; the document around the array is checked at the end.
    """
    buf = f.read(_READ)
    eof = len(buf) < _READ

    def more() -> bool:
        nonlocal buf, eof
        if eof:
            return False
        block = f.read(_READ)
        eof = len(block) < _READ
        buf += block
        return bool(block)

    # where does the events array start?
    while not buf.strip(_SPACE) and more():
        pass
    lead = len(buf) - len(buf.lstrip(_SPACE))
    bare = buf[lead:lead + 1] == b"["
    if bare:
        array_at = lead
    else:
        m = _ARRAY_START.search(buf)
        while m is None and len(buf) < _HEAD_LIMIT and more():
            m = _ARRAY_START.search(buf)
        if m is None:
            return None
        array_at = m.end() - 1
    head = buf[:array_at]
    buf = buf[array_at + 1:]
    pos = 0
    failures = 0
    while True:
        while True:  # to the first byte of the next event, or the end of the array
            while pos < len(buf) and buf[pos] in _SPACE:
                pos += 1
            if pos < len(buf) or not more():
                break
        if pos >= len(buf):
            return None  # the file ends inside the array
        if buf[pos] == ord("]"):
            tail_at = pos + 1
            break
        floor = pos  # a cut must lie at or after this
        reach = pos + _PIECE - 1  # and, while the file goes on, at or after this (pieces of ~_PIECE)
        while True:
            m = None
            while True:
                if reach < len(buf):
                    m = _CUT.search(buf, max(reach, floor))
                    if m is not None:
                        break
                if not more():
                    break
            if m is None:  # the end of the file is near: the end of the array, else the next cut
                m = _ARRAY_END.search(buf, floor) or _CUT.search(buf, floor)
            if m is None:
                return None
            try:
                items = decode(b"[" + buf[pos:m.start() + 1] + b"]")
                break
            except _NotAPiece:
                failures += 1
                if failures > 64:  # not a run of objects (or not JSON): let the whole parse say why
                    return None
                floor = m.start() + 1
                reach = pos + 2 * (floor - pos)  # grow the piece geometrically: O(log n) retries
        builder.add_many(items)
        if m.group(1) == b"]":
            tail_at = m.end()
            break
        buf = buf[m.end():]  # drop what was parsed: memory holds about one piece and one read block
        pos = 0
        failures = 0
    while more():
        pass
    # the document around the array must parse, with "traceEvents" being that very array
    try:
        doc = json.loads(head + b"[]" + buf[tail_at:])
    except (ValueError, RecursionError):
        return None
    if bare:
        return {} if doc == [] else None
    return _meta_of(doc) if isinstance(doc, dict) and doc.get("traceEvents") == [] else None


def _with_flow_correlation(op: Event, flow_finish: Mapping[tuple[str, str, float], int]) -> Event:
    if op.correlation is not None:
        return op
    cid = flow_finish.get((op.pid, op.tid, op.ts))
    return op if cid is None else dataclasses.replace(op, correlation=cid)


def load_trace(source: str | os.PathLike[str] | Iterable[Mapping[str, Any]], *,
               parser: Parser = "auto") -> Trace:
    """Parse a trace file (``.json`` / ``.json.gz``) or an iterable of event dicts.

    *parser*: ``"auto"`` (msgspec when installed, else the standard library), ``"msgspec"`` or
    ``"json"``; files are streamed either way (see the module docstring).
    """
    if not isinstance(source, (str, os.PathLike)):
        builder = _Builder("<events>")
        for raw in source:
            if isinstance(raw, Mapping):
                builder.add_dict(raw)
        return builder.finish()
    p = os.fspath(source)
    decode = _decoder(parser)
    try:
        with _open(p) as f:
            builder = _Builder(p)
            try:
                meta = _stream_events(f, decode, builder)
            except RecursionError:
                raise ConfigError(f"trace: {p!r} is nested too deeply to be a chrome trace") from None
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    if meta is None:
        # laid out otherwise (or not JSON): parse it whole, which also gives the exact error
        builder = _Builder(p)
        events, meta = _read_trace(p)
        for raw in events:
            builder.add_dict(raw)
    trace = builder.finish()
    dist = meta.get("distributedInfo")
    if isinstance(dist, Mapping):
        trace.rank, trace.world_size = _int_or_none(dist.get("rank")), _int_or_none(dist.get("world_size"))
    return trace
