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

**The parts.** This module is the entry point; the work is split by job: the event model
(:mod:`~perfsdk.profiling.trace_model`: :class:`Event`, :class:`Trace`, :class:`ReadStats`), the
streaming reader (:mod:`~perfsdk.profiling.trace_stream`: cuts, limits, the whole-document fallback),
the parsers of a piece (:mod:`~perfsdk.profiling.trace_decode`: msgspec's typed records, else ``json``)
and the events-to-:class:`Trace` builder (:mod:`~perfsdk.profiling.trace_builder`).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.trace_builder import TraceBuilder, int_or_none
from perfsdk.profiling.trace_decode import HAVE_MSGSPEC, Decoder
from perfsdk.profiling.trace_model import (
    DEFAULT_MAX_BYTES,
    GPU_CATEGORIES,
    HOST_API_CATEGORIES,
    SHAPED_OPS,
    Event,
    Parser,
    ReadStats,
    Trace,
    TraceTooLargeError,
)
from perfsdk.profiling.trace_stream import Stream, check_limit, open_limited, read_document

__all__ = [
    "DEFAULT_MAX_BYTES",
    "GPU_CATEGORIES",
    "HAVE_MSGSPEC",
    "HOST_API_CATEGORIES",
    "SHAPED_OPS",
    "Event",
    "ReadStats",
    "Trace",
    "TraceTooLargeError",
    "load_trace",
    "read_trace_events",
]

# The reader's sizes, looked up here at each load (tests shrink them to hit every boundary case).
_READ = 8 * 2**20  # bytes read from the file at a time
_PIECE = 4 * 2**20  # bytes of events parsed at a time (a cut is tried at the first boundary after this)
_Builder = TraceBuilder  # the name the tests' reference reader uses


def read_trace_events(
    path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_MAX_BYTES
) -> list[dict[str, Any]]:
    """The raw ``traceEvents`` list of a ``.json`` or ``.json.gz`` chrome trace (the whole list in memory).

    :func:`load_trace` streams the file instead (see the module docstring). *max_bytes* as there.
    """
    return read_document(os.fspath(path), check_limit(max_bytes), ReadStats(), _READ)[0]


def load_trace(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    *,
    parser: Parser = "auto",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Trace:
    """Parse a trace file (``.json`` / ``.json.gz``) or an iterable of event dicts.

    *parser*: ``"auto"`` (msgspec when installed, else the standard library), ``"msgspec"`` or
    ``"json"``; files are streamed either way (see the module docstring). *max_bytes*: the most JSON
    read from the file, after decompression (:data:`DEFAULT_MAX_BYTES`, 2 GiB; None: no limit);
    past it, :class:`TraceTooLargeError`, having read no further.
    """
    if not isinstance(source, (str, os.PathLike)):
        builder = TraceBuilder("<events>")
        for raw in source:
            if isinstance(raw, Mapping):
                builder.add_dict(raw)
        return builder.finish()
    p = os.fspath(source)
    limit = check_limit(max_bytes)
    stats = ReadStats()
    decode = Decoder(parser, stats)
    try:
        with open_limited(p, limit, stats, _READ) as f:
            builder = TraceBuilder(p)
            meta = Stream(f, decode, builder, stats, p, read_size=_READ, piece_size=_PIECE).run()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    if meta is None:
        # laid out otherwise (or not JSON): parse it whole, which also gives the exact error
        builder = TraceBuilder(p)
        events, meta = read_document(p, limit, stats, _READ)
        for raw in events:
            builder.add_dict(raw)
    trace = builder.finish()
    trace.read_stats = stats
    dist = meta.get("distributedInfo")
    if isinstance(dist, Mapping):
        trace.rank, trace.world_size = int_or_none(dist.get("rank")), int_or_none(dist.get("world_size"))
    return trace
