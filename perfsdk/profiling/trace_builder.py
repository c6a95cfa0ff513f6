"""Turning raw trace events into a :class:`~perfsdk.profiling.trace_model.Trace`, one event at a time.

:class:`TraceBuilder` takes each event's fields as the reader found them (a dict from ``json``, a
:class:`~perfsdk.profiling.trace_decode.RawEvent` from msgspec) and keeps only what the analyser reads:
complete (``"X"``) events of the categories that matter, their names and thread ids shared, their times
checked finite, the recorded shapes of the matrix products; ``ac2g`` flow ends recover a GPU op's missing
correlation id::

    from perfsdk.profiling.trace_builder import TraceBuilder

    builder = TraceBuilder("<events>")
    builder.add_dict({"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "pid": 0, "tid": 7})
    trace = builder.finish()          # every list sorted by start; launches indexed by correlation id
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from perfsdk.profiling.trace_decode import MISSING, RAW_ARGS, RAW_EVENT, UNSET, decode_raw
from perfsdk.profiling.trace_model import (
    ANNOTATION_CATEGORIES,
    CPU_OP_CATEGORIES,
    GPU_CATEGORIES,
    HOST_API_CATEGORIES,
    SHAPED_OPS,
    Event,
    Trace,
)

__all__ = ["TraceBuilder", "int_or_none"]


def int_or_none(v: Any) -> int | None:
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
    # deferred by the typed decoder (msgspec.Raw): decoded only for SHAPED_OPS
    dims, types = decode_raw(dims), decode_raw(types)
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


class TraceBuilder:
    """Turns raw events, one at a time, into a :class:`Trace`; keeps only what the analyser reads."""

    def __init__(self, source: str) -> None:
        self.trace = Trace(source=source)
        t = self.trace
        self._bucket: dict[str, list[Event]] = {
            **dict.fromkeys(GPU_CATEGORIES, t.gpu_ops),
            **dict.fromkeys(HOST_API_CATEGORIES, t.runtime),
            **dict.fromkeys(ANNOTATION_CATEGORIES, t.annotations),
            **dict.fromkeys(CPU_OP_CATEGORIES, t.cpu_ops),
        }
        # ac2g flows: "s" sits on the launching host call, "f" on the GPU op; both carry the
        # correlation id as "id". Used only to recover a GPU op whose args lack "correlation".
        self.flow_finish: dict[tuple[str, str, float], int] = {}
        self._texts: dict[str, str] = {}  # one string object per distinct name, category and thread

    def _text(self, v: Any) -> str:
        s = "" if v is MISSING else v if type(v) is str else str(v)
        return self._texts.setdefault(s, s)

    def add(self, ph: Any, cat: Any, name: Any, pid: Any, tid: Any, ts: Any, dur: Any, ident: Any, args: Any) -> None:
        """One event's fields (``MISSING`` where absent); *args* a mapping, a ``RawArgs`` or anything.

        Called once per event of a trace of up to millions: the common types (str, float, int) take
        the short ways written out here; anything else goes through the general conversions.
        """
        if ph != "X":
            if ph == "f" and cat == "ac2g":
                fid = int_or_none(None if ident is MISSING else ident)
                t = _finite(0 if ts is MISSING else ts)
                if fid is not None and t is not None:
                    self.flow_finish[(self._text(pid), self._text(tid), t)] = fid
            return
        if ts is MISSING:
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
        length = 0.0 if dur is MISSING else dur if type(dur) is float and dur - dur == 0.0 else _finite(dur)
        if start is None or length is None:
            return
        op_name = (texts.get(name) if type(name) is str else None) or self._text(name)
        shapes = None
        if isinstance(args, RAW_ARGS):
            corr, stream, nbytes = args.correlation, args.stream, args.bytes
            graph = args.graph_id_spaced
            if graph is UNSET:
                graph = args.graph_id
            if op_name in SHAPED_OPS and category in CPU_OP_CATEGORIES:
                shapes = _shapes(args.input_dims, args.input_types)
        elif isinstance(args, Mapping):
            corr, stream, nbytes = args.get("correlation"), args.get("stream"), args.get("bytes")
            # Kineto has spelled this one differently across versions
            graph = args.get("graph id", args.get("graph_id"))
            if op_name in SHAPED_OPS and category in CPU_OP_CATEGORIES:
                shapes = _shapes(args.get("Input Dims"), args.get("Input type"))
        else:
            corr = stream = nbytes = graph = None
        text = self._text
        bucket.append(
            Event(
                name=op_name,
                cat=category,
                ts=start,
                dur=max(length, 0.0),
                pid=(texts.get(pid) if type(pid) is str else None) or text(pid),
                tid=(texts.get(tid) if type(tid) is str else None) or text(tid),
                correlation=corr if type(corr) is int else None if corr is None or corr is UNSET else int_or_none(corr),
                stream=stream
                if type(stream) is int
                else None
                if stream is None or stream is UNSET
                else int_or_none(stream),
                graph_id=graph
                if type(graph) is int
                else None
                if graph is None or graph is UNSET
                else int_or_none(graph),
                nbytes=nbytes
                if type(nbytes) is int
                else None
                if nbytes is None or nbytes is UNSET
                else int_or_none(nbytes),
                input_dims=None if shapes is None else shapes[0],
                input_types=None if shapes is None else shapes[1],
            )
        )

    def add_dict(self, raw: Mapping[str, Any]) -> None:
        g = raw.get
        self.add(
            g("ph"),
            g("cat", MISSING),
            g("name", MISSING),
            g("pid", MISSING),
            g("tid", MISSING),
            g("ts", MISSING),
            g("dur", MISSING),
            g("id", MISSING),
            g("args"),
        )

    def add_many(self, items: list[Any]) -> None:
        add = self.add
        for raw in items:
            if isinstance(raw, RAW_EVENT):
                m = UNSET
                add(
                    None if raw.ph is m else raw.ph,
                    MISSING if raw.cat is m else raw.cat,
                    MISSING if raw.name is m else raw.name,
                    MISSING if raw.pid is m else raw.pid,
                    MISSING if raw.tid is m else raw.tid,
                    MISSING if raw.ts is m else raw.ts,
                    MISSING if raw.dur is m else raw.dur,
                    MISSING if raw.id is m else raw.id,
                    None if raw.args is m else raw.args,
                )
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


def _with_flow_correlation(op: Event, flow_finish: Mapping[tuple[str, str, float], int]) -> Event:
    if op.correlation is not None:
        return op
    cid = flow_finish.get((op.pid, op.tid, op.ts))
    return op if cid is None else dataclasses.replace(op, correlation=cid)
