"""A step's sizes, checked: what ``mon.decode(...)``, ``mon.prefill(...)`` and ``mon.mixed(...)`` accept, and
the record of a step an engine timed itself::

    check_sizes("prefill", 2, 300, 0, [100, 200])   # (2, 300, 0, (100, 200), False)
    host_step("decode", 0.021, end_ns, 8, None, 8192, None)   # a StepRecord timed on the host

Every size is a non-negative integer no larger than :data:`~perfsdk.records.MAX_COUNT` (numpy's and torch's
integer scalars too), named in the :class:`~perfsdk.errors.ConfigError` otherwise; a size given as a callable
is kept for the decorator form to call with the step's arguments.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.records import HOST, NO_TOKENS, PHASE_CODES, StepRecord, check_count, check_lens, lens_summary

__all__ = ["LENS_SQ_MAX", "check_sizes", "host_step"]

LENS_SQ_MAX = 2**62  # the sum of squared sequence lengths travels as a 64-bit integer (the C record's)


def check_sizes(
    phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any
) -> tuple[int, int, int, tuple[int, ...] | None, bool]:
    """Validated sizes ``(batch, tokens or NO_TOKENS, context_tokens, seq_lens, dynamic)``.

    Raises :class:`ConfigError` naming the field. Callables are kept as they are (``dynamic``: only the
    decorator form can call them with the step's arguments).
    """
    ctx_name = "cached_tokens" if phase == "prefill" else "context_tokens"
    dynamic = any(callable(v) for v in (batch, tokens, context_tokens, seq_lens))
    b = batch if callable(batch) else check_count("batch", batch)
    t = tokens if callable(tokens) else (NO_TOKENS if tokens is None else check_count("tokens", tokens))
    c = context_tokens if callable(context_tokens) else check_count(ctx_name, context_tokens)
    lens: Any = seq_lens
    if seq_lens is not None and not callable(seq_lens):
        lens = check_lens("seq_lens" if phase == "prefill" else "prefill_seq_lens", seq_lens)
    if not dynamic and lens_summary(PHASE_CODES[phase], b, t, lens)[1] >= LENS_SQ_MAX:
        raise ConfigError(f"{phase}: sequence lengths {lens if lens is not None else t!r} are beyond any real step")
    return b, t, c, lens, dynamic


def host_step(
    phase: str,
    seconds: float,
    end_ns: int,
    batch: Any,
    tokens: Any,
    context_tokens: Any,
    seq_lens: Sequence[int] | None,
) -> StepRecord:
    """The record of a step someone else timed (:meth:`perfsdk.Monitor.record_step`). Raises ConfigError."""
    b, t, c, lens, dynamic = check_sizes(phase, batch, tokens, context_tokens, seq_lens)
    if dynamic:
        raise ConfigError("record_step: sizes must be values, not callables")
    code = PHASE_CODES[phase]
    s, sq, n = lens_summary(code, b, t, lens)
    return StepRecord(code, HOST, end_ns - round(seconds * 1e9), end_ns, None, None, b, t, c, s, sq, n, None)
