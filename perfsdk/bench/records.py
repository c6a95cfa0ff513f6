"""One request's measurements: :class:`RequestRecord`, and the failure reasons.

Times are seconds on the client's ``time.perf_counter`` clock. ``scheduled``
and ``start`` are offsets from the start of the measured run (warm-up requests
use the start of the warm-up); ``ttft``, ``itl``, ``e2el`` are relative to the
request's own ``start``:

- ``ttft``: first chunk that carries generated text (a role-only chat delta
  does not count) minus ``start``;
- ``itl``: every gap between consecutive text-bearing chunks (a chunk that
  carries several tokens gives one gap, as in vLLM);
- ``e2el``: last text-bearing chunk minus ``start`` (vLLM's definition);
  ``stream_end`` is when the stream finished (``[DONE]`` or the failure);
- ``tpot``: ``(e2el - ttft) / (output_tokens - 1)``, ``None`` for one token;
- ``output_tokens``: ``usage.completion_tokens`` when the server reports usage,
  else the number of text-bearing chunks (``usage_reported`` says which).

A failed request keeps whatever it measured before failing, with ``error`` set
to one of the stable reason keys below and ``error_detail`` saying what
happened in words. A request stopped at its time or size limit (``timeout``,
``too_many_chunks``) keeps a :class:`GapSummary` of its gaps in
``itl_summary`` instead of the gaps themselves (``itl`` is then empty), so one
endless stream costs a few hundred bytes in memory and in the result file, not
one number per chunk. Every other request keeps every gap in ``itl``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "CANCELLED",
    "CLIENT_ERROR",
    "CONNECTION_ERROR",
    "ERROR_EVENT",
    "FAILURE_REASONS",
    "LIMIT_REASONS",
    "MALFORMED_EVENT",
    "NOT_EVENT_STREAM",
    "NO_TOKENS",
    "STREAM_CUT",
    "TIMEOUT",
    "TOO_MANY_CHUNKS",
    "GapSummary",
    "RequestRecord",
    "http_reason",
    "percentile",
]

CONNECTION_ERROR = "connection_error"  # refused, DNS, reset before a response
MALFORMED_EVENT = "malformed_event"  # a data: line that is not JSON or not a completion chunk
STREAM_CUT = "stream_cut"  # the stream ended or broke before data: [DONE]
TIMEOUT = "timeout"  # no complete response within --timeout
TOO_MANY_CHUNKS = "too_many_chunks"  # more text chunks than the per-response limit (--max-chunks)
ERROR_EVENT = "error_event"  # the server sent {"error": ...} inside the stream
NOT_EVENT_STREAM = "not_event_stream"  # a 200 that is not text/event-stream
NO_TOKENS = "no_tokens"  # [DONE] arrived but no text was generated
CANCELLED = "cancelled"  # the benchmark itself was cancelled while the request ran
CLIENT_ERROR = "client_error"  # anything else the HTTP client raised

#: Reason keys besides ``http_<status>``; documentation and tests use this table.
FAILURE_REASONS: dict[str, str] = {
    CONNECTION_ERROR: "could not connect, or the connection dropped before a response",
    "http_<status>": "the server answered with a non-200 status",
    MALFORMED_EVENT: "an event that is not valid JSON or not a completion chunk (nested too deeply, too large, "
    "absurd usage counts, a line beyond the client's limit)",
    STREAM_CUT: "the event stream ended or broke before data: [DONE]",
    TIMEOUT: "no complete response within the timeout (the client closes the connection)",
    TOO_MANY_CHUNKS: "more text chunks than the per-response limit (--max-chunks, by default 4 x max_tokens + 64): "
    "the client stops reading and closes the connection",
    ERROR_EVENT: "the server reported an error inside the stream",
    NOT_EVENT_STREAM: "a 200 response that is not text/event-stream",
    NO_TOKENS: "the stream finished without generating any text",
    CANCELLED: "the benchmark was cancelled while the request was running",
    CLIENT_ERROR: "another client-side error",
}


#: The failures of a request stopped at a limit; such a record keeps a summary of its gaps, not the gaps.
LIMIT_REASONS: frozenset[str] = frozenset({TIMEOUT, TOO_MANY_CHUNKS})


def http_reason(status: int) -> str:
    return f"http_{status}"


@dataclass(frozen=True)
class GapSummary:
    """The gaps between text chunks of a request stopped at a limit, in seconds (``None`` with no gap).

    Percentiles interpolate linearly between the gaps, as :func:`percentile` does.
    """

    count: int
    total: float
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of(cls, gaps: Sequence[float]) -> GapSummary:
        if not gaps:
            return cls(0, 0.0)
        ordered = sorted(gaps)
        return cls(
            count=len(ordered),
            total=math.fsum(ordered),
            min=ordered[0],
            max=ordered[-1],
            p50=percentile(ordered, 50.0),
            p90=percentile(ordered, 90.0),
            p99=percentile(ordered, 99.0),
        )

    @classmethod
    def from_dict(cls, d: Any) -> GapSummary:
        """From its JSON form; anything else raises TypeError (the loader names the record)."""
        if not isinstance(d, dict):
            raise TypeError(f"itl_summary: expected an object, got {type(d).__name__}")
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolation percentile (numpy's default) of already sorted values (also
    :func:`perfsdk.bench.report.percentile`: here, below the report, so that both use one)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    pos = (len(sorted_values) - 1) * p / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass
class RequestRecord:
    """Everything measured about one request (see the module docstring for units)."""

    index: int
    warmup: bool = False
    prompt_len: int = 0  # target prompt length in tokens (exact for a byte-level tokenizer)
    max_tokens: int = 0  # output length asked for
    scheduled: float = 0.0
    start: float = 0.0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    itl_summary: GapSummary | None = None  # set, and itl emptied, when the request stopped at a limit
    e2el: float | None = None
    stream_end: float | None = None
    output_tokens: int = 0
    prompt_tokens: int | None = None  # from usage; None when the server did not say
    chunks: int = 0
    usage_reported: bool = False
    http_status: int | None = None
    error: str | None = None
    error_detail: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first, seconds; ``None`` below two tokens."""
        if self.ttft is None or self.e2el is None or self.output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.output_tokens - 1)

    @property
    def input_tokens(self) -> int:
        """Prompt tokens as the server counted them, else the target length."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.prompt_len

    def token_times(self) -> list[float]:
        """Arrival time of each text-bearing chunk, seconds from the run's start."""
        if self.ttft is None:
            return []
        t = self.start + self.ttft
        out = [t]
        for gap in self.itl:
            t += gap
            out.append(t)
        return out

    def fail(self, reason: str, detail: str) -> None:
        # the first failure wins: a timeout that fires during cleanup after a cut stream is not news
        if self.error is None:
            self.error = reason
            self.error_detail = detail

    def summarize_gaps(self) -> None:
        """Replace the gaps with their :class:`GapSummary` (for a request stopped at a limit)."""
        self.itl_summary = GapSummary.of(self.itl)
        self.itl = []

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot"] = self.tpot
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestRecord:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if known.get("itl_summary") is not None:
            known["itl_summary"] = GapSummary.from_dict(known["itl_summary"])
        return cls(**known)
