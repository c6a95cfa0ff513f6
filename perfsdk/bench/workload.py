"""The requests a run sends, built one at a time as they are asked for.

:func:`planned_requests` is a generator: each :class:`PlannedRequest` (its
prompt, lengths and send time) is drawn from the run's seeded streams when the
sender asks for the next one, so memory does not grow with ``num_prompts``
(``--num-prompts 100000000`` starts sending at once; with ``--duration`` it
stops when the time is up, the rest never built)::

    from itertools import islice
    from perfsdk.bench.workload import planned_requests

    plan = planned_requests(cfg)                 # nothing built yet
    first = next(plan)                           # the first warm-up request (or measured, without warm-up)
    first.index, first.prompt_len, first.max_tokens, first.scheduled

    again = list(islice(planned_requests(cfg), 10))   # the same ten requests: same seed, same requests

The warm-up requests come first (``warmup=True``, ``scheduled`` 0), then the
measured ones on the arrival schedule (``arrivals.py``). Seeded streams, each
consumed in request order:

- ``perfsdk.bench.lengths:<seed>``: the input lengths (:meth:`LengthSpec.draw`;
  a fixed length draws nothing);
- the output lengths: from the same stream when the input length is fixed,
  else from ``perfsdk.bench.output_lengths:<seed>``;
- ``perfsdk.bench.prompts:<seed>``: the words of each prompt;
- ``perfsdk.bench.arrivals:<seed>``: the gaps between measured requests.

Before the requests were built lazily, every output length was drawn from the
lengths stream after every input length, which a lazy plan cannot do without
drawing all of them first. So for a seed the prompts, input lengths and send
times are those of earlier versions, and so are the output lengths when either
length is fixed (both are by default); when both are distributions
(``--input-len uniform:… --output-len uniform:…``) the output lengths come from
their own stream and differ from those of earlier versions.

Each repetition of ``--repeat`` calls :func:`planned_requests` afresh, so every
repetition sends the same requests on the same schedule; ``warmup=False``
skips the warm-up requests (drawn, to keep the streams in step, then dropped).

:func:`build_ahead` builds the first requests before the clock starts (at most
:data:`AHEAD_REQUESTS` and :data:`AHEAD_BYTES` of prompt text), so a burst
(``--request-rate inf``) of an ordinary size goes out without building prompts
between sends, as when every prompt was built up front; the rest are built one
at a time, each while the sender waits for its send time.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from perfsdk.bench.arrivals import iter_arrival_offsets
from perfsdk.bench.config import BenchConfig
from perfsdk.bench.prompts import synthetic_prompt

__all__ = ["AHEAD_BYTES", "AHEAD_REQUESTS", "PlannedRequest", "build_ahead", "planned_requests"]

#: At most this many requests are built before the clock starts ...
AHEAD_REQUESTS = 1024
#: ... holding at most this much prompt text (UTF-8 bytes; the synthetic prompts are ASCII).
AHEAD_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send: what to ask for and when (seconds from the measured run's start)."""

    index: int  # 0.. over the warm-up requests, then the measured ones
    warmup: bool
    prompt: str
    prompt_len: int  # target prompt length in tokens (bytes of the synthetic prompt)
    max_tokens: int
    scheduled: float


def planned_requests(config: BenchConfig, *, warmup: bool = True) -> Iterator[PlannedRequest]:
    """The run's requests, lazily: the warm-up ones (unless *warmup* is False), then the measured ones."""
    n_warm, n = config.warmup, config.num_prompts
    # checked now, not at the first next(): a bad rate fails before anything is sent
    offsets = iter_arrival_offsets(n, rate=config.request_rate, burstiness=config.burstiness, seed=config.seed)
    return _requests(config, n_warm, n, offsets, warmup)


def _requests(
    config: BenchConfig, n_warm: int, n: int, offsets: Iterator[float], warmup: bool
) -> Iterator[PlannedRequest]:
    in_spec, out_spec = config.input_spec, config.output_spec
    in_lengths = random.Random(f"perfsdk.bench.lengths:{config.seed}")
    # a fixed input length draws nothing, so the output lengths come from the start of the lengths stream,
    # as they did when all were drawn up front; otherwise they need a stream of their own (see above)
    fixed_input = in_spec.kind == "fixed"
    out_lengths = in_lengths if fixed_input else random.Random(f"perfsdk.bench.output_lengths:{config.seed}")
    words = random.Random(f"perfsdk.bench.prompts:{config.seed}")

    def build(i: int, scheduled: float) -> PlannedRequest:
        in_len = in_spec.draw(in_lengths)
        out_len = out_spec.draw(out_lengths)
        prompt = synthetic_prompt(in_len, words, index=i)
        return PlannedRequest(i, i < n_warm, prompt, in_len, out_len, scheduled)

    for i in range(n_warm):
        req = build(i, 0.0)  # built even when skipped: the streams must stay in step
        if warmup:
            yield req
    for j, offset in enumerate(offsets):
        yield build(n_warm + j, offset)


def build_ahead(
    plan: Iterator[PlannedRequest], *, max_requests: int = AHEAD_REQUESTS, max_bytes: int = AHEAD_BYTES
) -> Iterator[PlannedRequest]:
    """*plan* with its first requests built now (see the module docstring), the same requests in order."""
    head: list[PlannedRequest] = []
    size = 0
    while len(head) < max_requests and size < max_bytes:
        req = next(plan, None)
        if req is None:
            break
        head.append(req)
        size += len(req.prompt)
    return itertools.chain(head, plan)
