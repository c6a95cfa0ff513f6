"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

:func:`send_request` POSTs a completions or chat request with ``"stream": true``
and ``stream_options.include_usage``, reads the Server-Sent Events stream
(``data: {...}`` events, ``data: [DONE]`` at the end), stamps every chunk with
``time.perf_counter`` and fills a :class:`~perfsdk.bench.records.RequestRecord`.
It never raises for a server fault: a refused connection, a non-200 status, an
event that is not JSON, a stream that stops before ``[DONE]``, an error event
or a timeout is recorded as the request's ``error`` (see ``records.py`` for the
reason keys). Only cancellation propagates, after being recorded.

Whatever the server sends, one response can cost at most one failed request:
events nested deeper than the JSON parser's recursion limit, events larger
than :data:`MAX_EVENT_BYTES`, ``usage`` counts that are not plausible token
counts (negative, or beyond 2**53) and error bodies in undecodable charsets are
``malformed_event`` or ``http_<status>`` failures; server text quoted in a
failure's detail is clipped and has control characters escaped, so it cannot
break the report or the terminal. Anything else the client raises is a
``client_error`` with the exception named, never the end of the run.

One response also costs bounded memory, whatever its length. Each gap between
text chunks is kept (``record.itl``), so the number of text chunks a response
may send is limited: by default :func:`chunk_limit` of the request's
``max_tokens``, ``4 * max_tokens + 64`` (a server that honours ``max_tokens``
sends at most one text chunk per token; the margin leaves room for servers that
stream pieces of tokens), at most :data:`MAX_DERIVED_CHUNKS`; ``max_chunks=N``
(``--max-chunks``) sets it for every request. A stream that goes past it is
stopped and fails as ``too_many_chunks``. A request stopped at its limit, of
chunks or of time (``timeout``), keeps a summary of its gaps instead of the
gaps (:meth:`RequestRecord.summarize_gaps`). Bytes never accumulate: each event
is parsed and dropped as it ends, and an event is at most
:data:`MAX_EVENT_BYTES`.

On a timeout, a stream over its limit or a malformed event the client stops
reading and closes the connection, so the server sees the disconnect and can
free the sequence.

::

    async with aiohttp.ClientSession() as session:
        rec = RequestRecord(index=0, prompt_len=128, max_tokens=64)
        payload = build_payload("completions", model="m", prompt=text, max_tokens=64)
        await send_request(session, url, payload, rec, timeout_s=30.0)   # at most 4 * 64 + 64 chunks
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from perfsdk.bench.records import (
    CANCELLED,
    CLIENT_ERROR,
    CONNECTION_ERROR,
    ERROR_EVENT,
    LIMIT_REASONS,
    MALFORMED_EVENT,
    NO_TOKENS,
    NOT_EVENT_STREAM,
    STREAM_CUT,
    TIMEOUT,
    TOO_MANY_CHUNKS,
    RequestRecord,
    http_reason,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "CHUNK_MARGIN",
    "CHUNK_SLACK",
    "MAX_DERIVED_CHUNKS",
    "MAX_EVENT_BYTES",
    "build_payload",
    "chunk_limit",
    "send_request",
]

_DETAIL_CHARS = 300  # enough of a server's error body to say what went wrong
_BODY_BYTES = 64 * 1024  # of a non-200 or non-stream body, read for the detail; the rest is not needed
#: Largest Server-Sent Event accepted (its data: lines together). An OpenAI-style chunk is well under
#: a kilobyte; a server that never ends an event must not grow the client's memory without bound.
MAX_EVENT_BYTES = 16 * 2**20
#: The default limit of text chunks per response is ``CHUNK_MARGIN * max_tokens + CHUNK_SLACK`` ...
CHUNK_MARGIN = 4
CHUNK_SLACK = 64
#: ... and never more than this (about 32 MB of gaps) unless ``max_chunks`` says so.
MAX_DERIVED_CHUNKS = 1_000_000
# usage counts above 2**53 lose integer precision as floats (throughputs are floats): not a token count
_MAX_COUNT = 2**53


def build_payload(
    endpoint: str, *, model: str, prompt: str, max_tokens: int, ignore_eos: bool = False, temperature: float = 0.0
) -> dict[str, Any]:
    """The JSON body for ``/v1/completions`` (``endpoint="completions"``) or ``/v1/chat/completions``."""
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": temperature,
        "max_tokens": max_tokens,
    }
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        # newer OpenAI-style servers read this name for chat; older ones read max_tokens
        body["max_completion_tokens"] = max_tokens
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True  # vLLM / SGLang extension: generate exactly max_tokens
    return body


def chunk_limit(max_tokens: int, max_chunks: int | None = None) -> int:
    """Text chunks one response may send: *max_chunks* when given, else derived from *max_tokens*."""
    if max_chunks is not None:
        return max_chunks
    return min(CHUNK_MARGIN * max(max_tokens, 0) + CHUNK_SLACK, MAX_DERIVED_CHUNKS)


class _StreamFailure(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, Any],
    record: RequestRecord,
    *,
    timeout_s: float,
    t0: float | None = None,
    headers: Mapping[str, str] | None = None,
    max_chunks: int | None = None,
) -> RequestRecord:
    """Send one request and fill *record*; *t0* is the run's start on ``perf_counter``.

    At most :func:`chunk_limit` text chunks are read: *max_chunks*, or else derived from
    ``record.max_tokens`` (from the payload's ``max_tokens`` when the record leaves it 0).
    """
    import aiohttp  # optional dependency, imported at the point of use
    from aiohttp.http_exceptions import HttpProcessingError

    st = time.perf_counter()
    record.start = st - (t0 if t0 is not None else st)
    asked = record.max_tokens or payload.get("max_tokens")
    asked = asked if isinstance(asked, int) else 0
    limit = chunk_limit(asked, max_chunks)
    if max_chunks is not None:
        why = "max_chunks"
    elif limit == MAX_DERIVED_CHUNKS:
        why = f"the default's ceiling for max_tokens={asked}"
    else:
        why = f"{CHUNK_MARGIN} x max_tokens ({asked}) + {CHUNK_SLACK}"
    state = _State(st, limit, why)
    try:
        await asyncio.wait_for(_stream(session, url, payload, record, state=state, headers=headers), timeout_s)
    except _StreamFailure as e:
        record.fail(e.reason, e.detail)
    except (TimeoutError, asyncio.TimeoutError):  # distinct classes before Python 3.11
        where = f"after {record.chunks} text chunks" if state.headers else "before the response headers"
        record.fail(TIMEOUT, f"no complete response within {timeout_s:g} s ({where})")
    except asyncio.CancelledError:
        record.fail(CANCELLED, "the benchmark was cancelled while this request was running")
        record.stream_end = time.perf_counter() - st
        raise
    except aiohttp.ClientConnectorError as e:
        record.fail(CONNECTION_ERROR, f"cannot connect to {url}: {e.os_error or e}")
    except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
        if state.headers:
            record.fail(STREAM_CUT, f"the connection broke after {record.chunks} chunks: {_describe(e)}")
        else:
            record.fail(CONNECTION_ERROR, f"the connection broke before a response: {_describe(e)}")
    except aiohttp.ClientError as e:
        record.fail(CLIENT_ERROR, _describe(e))
    except (UnicodeDecodeError, ValueError) as e:
        record.fail(MALFORMED_EVENT, _describe(e))
    except HttpProcessingError as e:  # aiohttp's parser: e.g. a line longer than its limit (LineTooLong)
        if state.headers:
            record.fail(MALFORMED_EVENT, f"a stream line longer than the client accepts or bad framing: {_describe(e)}")
        else:
            record.fail(CLIENT_ERROR, f"the response could not be parsed: {_describe(e)}")
    except Exception as e:  # the last guard: one response never ends the run, whatever it does
        record.fail(CLIENT_ERROR, f"unexpected {_describe(e)}")
    record.stream_end = time.perf_counter() - st
    if record.ok:
        _finish(record, state)
    elif record.error in LIMIT_REASONS:
        record.summarize_gaps()  # the gaps of an endless stream would fill memory and the result file
    return record


class _State:
    __slots__ = ("completion_tokens", "done", "headers", "last", "limit_why", "max_chunks", "st")

    def __init__(self, st: float, max_chunks: int, limit_why: str) -> None:
        self.st = st
        self.max_chunks = max_chunks
        self.limit_why = limit_why  # how the limit was set, for the failure's detail
        self.headers = False
        self.done = False
        self.last: float | None = None
        self.completion_tokens: int | None = None


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    payload: Mapping[str, Any],
    record: RequestRecord,
    *,
    state: _State,
    headers: Mapping[str, str] | None,
) -> None:
    st = state.st
    async with session.post(url, json=dict(payload), headers=dict(headers or {})) as resp:
        state.headers = True
        record.http_status = resp.status
        if resp.status != 200:
            body = await _body_excerpt(resp)
            raise _StreamFailure(
                http_reason(resp.status), f"HTTP {resp.status} {_clip(resp.reason or '')}: {_clip(body)}".strip()
            )
        ctype = resp.headers.get("Content-Type", "")
        if "event-stream" not in ctype:
            body = await _body_excerpt(resp)
            raise _StreamFailure(
                NOT_EVENT_STREAM, f"expected text/event-stream, got {_clip(ctype) or 'no Content-Type'}: {_clip(body)}"
            )
        data_lines: list[str] = []
        event_bytes = 0
        async for raw in resp.content:
            now = time.perf_counter()
            line = raw.decode("utf-8").rstrip("\r\n")
            if line:
                if line.startswith("data:"):
                    value = line[5:]
                    data_lines.append(value[1:] if value.startswith(" ") else value)
                    event_bytes += len(raw)
                    if event_bytes > MAX_EVENT_BYTES:
                        raise _StreamFailure(
                            MALFORMED_EVENT,
                            f"an event grew beyond {MAX_EVENT_BYTES // 2**20} MiB without ending "
                            f"({len(data_lines)} data: lines so far)",
                        )
                # comments (":") and event:/id:/retry: fields carry no tokens
                continue
            if data_lines:  # a blank line ends an event
                _on_event("\n".join(data_lines), now, record, st, state)
                data_lines.clear()
                event_bytes = 0
                if state.done:
                    return
        if data_lines:  # the last event had no blank line after it; still an event
            _on_event("\n".join(data_lines), time.perf_counter(), record, st, state)
        if not state.done:
            raise _StreamFailure(STREAM_CUT, f"the stream ended without data: [DONE] after {record.chunks} text chunks")


def _on_event(data: str, now: float, record: RequestRecord, st: float, state: _State) -> None:
    if data.strip() == "[DONE]":
        state.done = True
        return
    try:
        obj = json.loads(data)
    except json.JSONDecodeError as e:
        raise _StreamFailure(MALFORMED_EVENT, f"event is not JSON ({e.msg}): {_clip(data)}") from None
    except RecursionError:  # [[[[...]]]] deeper than the interpreter's recursion limit
        raise _StreamFailure(MALFORMED_EVENT, f"event is nested too deeply to parse: {_clip(data)}") from None
    except ValueError as e:  # e.g. an integer beyond Python's 4,300-digit conversion limit
        raise _StreamFailure(MALFORMED_EVENT, f"event is not usable JSON ({e}): {_clip(data)}") from None
    if not isinstance(obj, dict):
        raise _StreamFailure(MALFORMED_EVENT, f"event is not a JSON object: {_clip(data)}")
    if obj.get("error") is not None:
        err = obj["error"]
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise _StreamFailure(ERROR_EVENT, f"server error in stream: {_clip(str(msg))}")
    usage = obj.get("usage")
    if isinstance(usage, dict):
        prompt_tokens = _count(usage, "prompt_tokens", data)
        if prompt_tokens is not None:
            record.prompt_tokens = prompt_tokens
        completion_tokens = _count(usage, "completion_tokens", data)
        if completion_tokens is not None:
            state.completion_tokens = completion_tokens
    choices = obj.get("choices")
    if choices is None:
        if usage is None:
            raise _StreamFailure(MALFORMED_EVENT, f"event has neither choices nor usage: {_clip(data)}")
        return
    if not isinstance(choices, list):
        raise _StreamFailure(MALFORMED_EVENT, f"'choices' is not a list: {_clip(data)}")
    if not choices:
        return
    choice = choices[0]
    if not isinstance(choice, dict):
        raise _StreamFailure(MALFORMED_EVENT, f"a choice is not an object: {_clip(data)}")
    if _text_of(choice):
        if record.chunks >= state.max_chunks:
            raise _StreamFailure(
                TOO_MANY_CHUNKS,
                f"the stream sent more than {state.max_chunks:,} text chunks, the per-response limit "
                f"({state.limit_why}; --max-chunks sets it); stopped reading",
            )
        record.chunks += 1
        if record.ttft is None:
            record.ttft = now - st
        elif state.last is not None:
            record.itl.append(now - state.last)
        state.last = now


def _count(usage: dict[str, Any], key: str, data: str) -> int | None:
    """A usage token count: None when absent or not an integer; a failure when it cannot be one."""
    value = usage.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        return None  # servers send null or leave fields out; the client then counts chunks
    if not 0 <= value <= _MAX_COUNT:
        # a negative count makes TPOT negative; a 400-digit one overflows every throughput
        raise _StreamFailure(MALFORMED_EVENT, f"usage.{key} is not a token count: {_clip(data)}")
    return value


async def _body_excerpt(resp: aiohttp.ClientResponse) -> str:
    """The start of a response body as text, whatever its size or declared charset.

    ``resp.text()`` would read the whole body (a server may send gigabytes) and decode it with the
    declared charset, which may be a codec that cannot decode bytes at all (``charset=rot13``).
    """
    chunks: list[bytes] = []
    size = 0
    while size < _BODY_BYTES:
        chunk = await resp.content.read(_BODY_BYTES - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _text_of(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if isinstance(text, str) and text:
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def _finish(record: RequestRecord, state: _State) -> None:
    if state.completion_tokens is not None:
        record.output_tokens = state.completion_tokens
        record.usage_reported = True
    else:
        record.output_tokens = record.chunks
    if record.chunks == 0:
        record.fail(NO_TOKENS, "the stream finished with data: [DONE] but carried no generated text")
        return
    if state.last is not None:
        record.e2el = state.last - state.st  # to the last text chunk, as vLLM measures it


def _clip(text: str) -> str:
    """Server text for a failure's detail: short, one line, printable and encodable.

    Control characters (terminal escapes included) and lone surrogates, which a JSON ``\\ud800`` escape
    yields and which no UTF-8 stream can print, are written as escapes.
    """
    text = text.strip()
    cut = len(text) > _DETAIL_CHARS
    text = text[:_DETAIL_CHARS]  # before escaping: the text may be a 16 MiB event
    if not text.isprintable():
        text = "".join(c if c.isprintable() else _escape(c) for c in text)[:_DETAIL_CHARS]
    return text + "…" if cut else text


def _escape(c: str) -> str:
    if c == "\n":
        return "\\n"
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _describe(e: BaseException) -> str:
    text = _clip(str(e))
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
