"""Values an engine measured itself, checked into the records perfsdk's own measurements make.

:meth:`perfsdk.Monitor.record_step` and :meth:`perfsdk.Monitor.record_finished` take what vLLM, SGLang or any
engine timed on its own clock; the checks here turn those arguments into a
:class:`~perfsdk.records.StepRecord` or a :class:`~perfsdk.records.MeasuredRequest`, or raise
:class:`~perfsdk.errors.ConfigError` naming the argument (the Monitor then counts and logs it, or raises in
strict mode)::

    rec = measured_step("decode", 0.021, end_ns, batch=8, context_tokens=8192)
    req = measured_request(end_ns, e2e_s=1.9, queue_s=0.01, output_tokens=90)
"""

from __future__ import annotations

from collections.abc import Sequence

from perfsdk.errors import ConfigError
from perfsdk.records import PHASES, MeasuredRequest, StepRecord, check_count, finite_seconds
from perfsdk.sizes import host_step

__all__ = ["check_end_ns", "measured_request", "measured_step"]


def check_end_ns(where: str, end_ns: object) -> None:
    if end_ns is not None and type(end_ns) is not int:
        raise ConfigError(f"{where}: end_ns must be an int timestamp, got {end_ns!r}")


def measured_step(
    phase: str,
    seconds: float,
    end_ns: int,
    *,
    batch: int = 1,
    tokens: int | None = None,
    context_tokens: int = 0,
    seq_lens: Sequence[int] | None = None,
) -> StepRecord:
    """The record of a step of *seconds* ending at *end_ns* (sizes as :meth:`perfsdk.Monitor.decode` & co.)."""
    if phase not in PHASES:
        raise ConfigError(f"record_step: phase must be one of {PHASES}, got {phase!r}")
    secs = finite_seconds(seconds)
    if secs is None:
        raise ConfigError(f"record_step: seconds must be a finite number >= 0, got {seconds!r}")
    return host_step(phase, secs, end_ns, batch, tokens, context_tokens, seq_lens)


def measured_request(
    end_ns: int,
    *,
    e2e_s: float,
    queue_s: float | None,
    prefill_s: float | None,
    ttft_s: float | None,
    tpot_s: float | None,
    prompt_tokens: int,
    output_tokens: int,
    finish_reason: str,
    error: str | None,
    request_id: str | None,
) -> MeasuredRequest:
    """A finished request an engine timed (negative optional times are left out; the caller counts them)."""
    e2e = finite_seconds(e2e_s)
    if e2e is None:
        raise ConfigError(f"record_finished: e2e_s must be a finite number >= 0, got {e2e_s!r}")
    prompt = check_count("prompt_tokens", prompt_tokens)
    output = check_count("output_tokens", output_tokens)
    return MeasuredRequest(
        end_ns,
        e2e,
        finite_seconds(queue_s),
        finite_seconds(prefill_s),
        finite_seconds(ttft_s),
        finite_seconds(tpot_s),
        prompt,
        output,
        str(finish_reason),
        None if error is None else str(error),
        None if request_id is None else str(request_id),
    )
