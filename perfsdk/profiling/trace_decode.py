"""Parsing a run of trace events: msgspec's typed records where msgspec is installed, else ``json``.

:class:`Decoder` parses ``[`` + events + ``]`` (one piece of the ``traceEvents`` array, cut by
:mod:`perfsdk.profiling.trace_stream`) into a list of records: with msgspec, :class:`RawEvent` structs that
hold only the fields :class:`~perfsdk.profiling.trace_builder.TraceBuilder` reads (recorded shapes kept
undecoded, as ``msgspec.Raw``); without it, or where msgspec refuses the text, the standard library's dicts.
A piece that is not a run of whole events raises :class:`NotAPiece` (cut elsewhere); text no cut can make
a trace of raises :class:`BadText`::

    from perfsdk.profiling.trace_decode import Decoder
    from perfsdk.profiling.trace_model import ReadStats

    decode = Decoder("auto", ReadStats())
    items, end = decode(memoryview(b'[{"ph": "X", "name": "k", "ts": 1, "dur": 2}]'))
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.trace_model import Parser, ReadStats

__all__ = [
    "HAVE_MSGSPEC",
    "MISSING",
    "RAW_ARGS",
    "RAW_EVENT",
    "UNSET",
    "BadText",
    "Decoder",
    "NotAPiece",
    "decode_raw",
    "long_number_at",
    "long_number_error",
]

MISSING: Any = object()  # a field the event does not have (JSON null is None)


def int_digits_limit() -> int:
    """Python's limit on the digits of an int parsed from text (0: none; absent before 3.10.7)."""
    get: Callable[[], int] | None = getattr(sys, "get_int_max_str_digits", None)
    return get() if get is not None else 0


def long_number_at(text: bytes | bytearray | memoryview) -> int | None:
    """Where the first number longer than Python's limit on int conversion starts in *text*."""
    digits = int_digits_limit()
    if digits <= 0:
        return None
    # a run of digits right after JSON punctuation or whitespace: a number, not the inside of a word
    m = re.compile(rb"(?<![^\[\]{}:, \t\r\n])-?[0-9]{%d,}" % (digits + 1)).search(text)
    return None if m is None else m.start()


def long_number_error(p: str, at: int | None) -> ConfigError:
    where = "" if at is None else f" at byte {at}"
    return ConfigError(
        f"trace: {p!r} holds a number of more than {int_digits_limit()} digits (Python's limit on "
        f"converting text to int){where}: it is not a profiler trace"
    )


# ---- msgspec: typed records for the fields the builder reads (optional dependency) ----------------

try:
    import msgspec

    UNSET: Any = msgspec.UNSET

    # gc=False: millions of short-lived records that hold no cycles need not be tracked by the collector
    class RawArgs(msgspec.Struct, gc=False):
        correlation: Any = msgspec.UNSET
        stream: Any = msgspec.UNSET
        bytes: Any = msgspec.UNSET
        graph_id_spaced: Any = msgspec.field(default=msgspec.UNSET, name="graph id")
        graph_id: Any = msgspec.UNSET
        # kept undecoded (a slice of the input): decoded only for SHAPED_OPS, so that the shapes of
        # every other operator cost nothing
        input_dims: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="Input Dims")
        input_types: msgspec.Raw | msgspec.UnsetType = msgspec.field(default=msgspec.UNSET, name="Input type")

    class RawEvent(msgspec.Struct, gc=False):
        ph: Any = msgspec.UNSET
        cat: Any = msgspec.UNSET
        name: Any = msgspec.UNSET
        pid: Any = msgspec.UNSET
        tid: Any = msgspec.UNSET
        ts: Any = msgspec.UNSET
        dur: Any = msgspec.UNSET
        id: Any = msgspec.UNSET
        # an event whose args is not an object fails the typed decode; its piece is decoded untyped
        args: RawArgs | msgspec.UnsetType | None = msgspec.UNSET

    RAW_EVENT: Any = RawEvent
    RAW_ARGS: Any = RawArgs
    _TYPED = msgspec.json.Decoder(list[RawEvent])
    _UNTYPED = msgspec.json.Decoder()
    HAVE_MSGSPEC = True
except ImportError:  # the standard library parses; same events, slower
    UNSET = MISSING
    RAW_EVENT = RAW_ARGS = ()
    HAVE_MSGSPEC = False


def decode_raw(value: Any) -> Any:
    """A value the typed decoder kept undecoded (``msgspec.Raw``: recorded shapes), decoded; others as they are."""
    if HAVE_MSGSPEC and isinstance(value, msgspec.Raw):
        return msgspec.json.decode(value)
    return value


class NotAPiece(Exception):
    """The bytes tried as a run of whole events are not one: cut elsewhere.

    ``string_at``: the index, in the bytes tried, of the string the cut fell inside (the parser said
    so); the next cut lies past that string's end.
    """

    def __init__(self, string_at: int | None = None) -> None:
        super().__init__(string_at)
        self.string_at = string_at


class BadText(Exception):
    """Text no cut can make a trace of: *what*, at index *at* of the bytes tried (None: not known)."""

    def __init__(self, what: str, at: int | None) -> None:
        super().__init__(what, at)
        self.what, self.at = what, at


class Decoder:
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
            raise BadText(f"bytes that are not UTF-8 text ({e.reason})", e.start) from None
        try:
            out, end = self._json.raw_decode(text)
        except json.JSONDecodeError as e:
            if e.msg.startswith("Unterminated string"):
                raise NotAPiece(len(text[: e.pos].encode("utf-8", "surrogatepass"))) from None
            raise NotAPiece from None
        except ValueError as e:  # what json raises past Python's limit on int conversion
            at = long_number_at(piece)
            if at is None:
                raise BadText(f"text the JSON parser refuses ({e})", None) from None
            raise BadText(
                f"a number of more than {int_digits_limit()} digits (Python's limit on converting text to int)", at
            ) from None
        items = out if isinstance(out, list) else []
        if end == len(text):
            return items, len(piece)
        return items, len(text[:end].encode("utf-8", "surrogatepass"))
