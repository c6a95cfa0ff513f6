"""Reading a trace file as a stream: the ``traceEvents`` array cut into pieces at event boundaries.

:class:`Stream` feeds one open file's events to a :class:`~perfsdk.profiling.trace_builder.TraceBuilder`,
a piece of a few MB at a time, each parsed by a :class:`~perfsdk.profiling.trace_decode.Decoder`; a file
laid out otherwise is read whole (:func:`read_document`), which also words any error. :class:`Limited`
stops reading (and decompressing) one byte past the limit. How the cuts are found, and why the work
stays linear in the file whatever it holds, is :class:`Stream`'s docstring; the user's guide is
:mod:`perfsdk.profiling.trace_events`, whose :func:`~perfsdk.profiling.trace_events.load_trace` drives
this module::

    with open_limited(path, limit, stats, block=8 * 2**20) as f:
        meta = Stream(f, Decoder("auto", stats), TraceBuilder(path), stats, path,
                      read_size=8 * 2**20, piece_size=4 * 2**20).run()   # None: read it whole instead
"""

from __future__ import annotations

import contextlib
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from typing import IO, Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.trace_builder import TraceBuilder
from perfsdk.profiling.trace_decode import BadText, Decoder, NotAPiece, long_number_at, long_number_error
from perfsdk.profiling.trace_model import ReadStats, TraceTooLargeError

__all__ = ["Limited", "Stream", "check_limit", "meta_of", "open_limited", "read_document"]


def check_limit(max_bytes: int | None) -> int | None:
    if max_bytes is None:
        return None
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigError(f"max_bytes: expected a positive number of bytes or None (no limit), got {max_bytes!r}")
    return max_bytes


def read_document(
    p: str, limit: int | None, stats: ReadStats, block: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The ``traceEvents`` list and the document's other top-level keys (``{}`` for the bare-array form)."""
    try:
        with open_limited(p, limit, stats, block) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:  # missing file, corrupt or truncated gzip
        raise ConfigError(f"trace: cannot read {p!r}: {e}") from e
    stats.streamed = False
    stats.parses += 1
    stats.bytes_parsed += len(raw)
    doc = parse_document(raw, p)
    return events_of(doc, p), meta_of(doc)


def meta_of(doc: Any) -> dict[str, Any]:
    """A trace document's top-level keys other than its events (``{}`` for the bare-array form)."""
    return {k: v for k, v in doc.items() if k != "traceEvents"} if isinstance(doc, dict) else {}


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} bytes"


class Limited:
    """A binary file that yields at most *limit* bytes; reading past them raises TraceTooLargeError.

    Asks the file for no more than one byte past the limit, so a compression bomb is decompressed
    only that far: memory and time stop at the limit, not at the bomb's size.
    """

    def __init__(self, f: IO[bytes], limit: int | None, stats: ReadStats, p: str, gz: bool, block: int) -> None:
        self._f, self._limit, self._stats, self._p, self._gz = f, limit, stats, p, gz
        self._block = block  # bytes read at a time by read()
        self._taken = 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:  # all of it, a block at a time: never one buffer of the limit's size up front
            blocks = []
            while block := self.read(self._block):
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
def open_limited(p: str, limit: int | None, stats: ReadStats, block: int) -> Iterator[Limited]:
    """The file's bytes, decompressed as they are read when it is gzip, up to *limit* of them."""
    with open(p, "rb") as f:
        # sniff the gzip magic rather than trusting the suffix: tools rename files
        gz = f.read(2) == b"\x1f\x8b"
        f.seek(0)
        if gz:
            with gzip.GzipFile(fileobj=f, mode="rb") as g:
                yield Limited(g, limit, stats, p, gz, block)  # type: ignore[arg-type]  # a GzipFile reads bytes
        else:
            yield Limited(f, limit, stats, p, gz, block)


def parse_document(raw: bytes, p: str) -> Any:
    try:
        return json.loads(raw)
    except RecursionError:
        raise ConfigError(f"trace: {p!r} is nested too deeply to be a chrome trace") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"trace: {p!r} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from e
    except ValueError as e:  # what json raises past Python's limit on int conversion
        at = long_number_at(raw)
        if at is None:
            raise ConfigError(f"trace: {p!r} is not a JSON chrome trace: {e}") from None
        raise long_number_error(p, at) from None


def events_of(doc: Any, p: str) -> list[dict[str, Any]]:
    if isinstance(doc, list):  # the bare-array form of the chrome trace format
        return [e for e in doc if isinstance(e, dict)]
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return [e for e in doc["traceEvents"] if isinstance(e, dict)]
    raise ConfigError(f"trace: {p!r} has no 'traceEvents' list")


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


class Stream:
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

    def __init__(
        self,
        f: Limited,
        decode: Decoder,
        builder: TraceBuilder,
        stats: ReadStats,
        p: str,
        *,
        read_size: int,
        piece_size: int,
    ) -> None:
        self.f, self.decode, self.builder, self.stats, self.p = f, decode, builder, stats, p
        self.read_size = read_size  # bytes read from the file at a time
        self.piece_size = piece_size  # bytes of events parsed at a time (a cut is tried at the first boundary after)
        self.buf = bytearray()
        self.base = 0  # the offset in the document of buf[0]
        self.eof = False

    def more(self) -> bool:
        """Append the file's next block to the buffer; False at the end of the file."""
        if self.eof:
            return False
        block = self.f.read(self.read_size)
        if not block:
            self.eof = True
            return False
        self.buf += block
        self.stats.buffer_peak = max(self.stats.buffer_peak, len(self.buf))
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
        return meta_of(doc) if isinstance(doc, dict) and doc.get("traceEvents") == [] else None

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
        reach = self.piece_size  # and, while the file goes on, at or after this: pieces of about that size
        cuts = _Cuts(self)
        stalled = False
        for _ in range(_MAX_MISCUTS):
            lo = max(floor, reach)
            cut = cuts.first(lo, None if stalled else lo + self.read_size)
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
        except NotAPiece as e:
            buf[0], buf[brace + 1] = first, after
            if e.string_at is None:
                return False, brace + 1
            end_of_string = self.string_end(e.string_at)  # the cut fell inside it: go past it whole
            return False, None if end_of_string is None else max(end_of_string, brace + 1)
        except BadText as e:
            where = "" if e.at is None else f" at byte {self.base + e.at}"
            raise ConfigError(f"trace: {self.p!r} holds {e.what}{where}: it is not a profiler trace") from None
        except RecursionError:
            raise ConfigError(
                f"trace: {self.p!r} is nested too deeply to be a chrome trace (in the events from byte {self.base + 1})"
            ) from None
        finally:
            buf[0], buf[brace + 1] = first, after
        if closed is None:
            return False, brace + 1
        self.stats.pieces += 1
        return True, closed


class _Cuts:
    """The cut candidates of one piece (``}``, whitespace, then ``,`` or ``]``), each byte searched once."""

    def __init__(self, stream: Stream) -> None:
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
