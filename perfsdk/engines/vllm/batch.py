"""What one vLLM step computes, read from its ``SchedulerOutput``: :func:`step_shape`.

vLLM's scheduler hands every worker a ``SchedulerOutput`` per step (``vllm.v1.core.sched.output``):
the new requests (``scheduled_new_reqs``: ``NewRequestData`` with ``num_computed_tokens``), the
requests it has seen before (``scheduled_cached_reqs``: ``CachedRequestData`` with parallel lists
``req_ids``, ``num_computed_tokens``, ``num_output_tokens`` and the set ``resumed_req_ids``), and the
tokens scheduled for each (``num_scheduled_tokens``, draft tokens of speculative decoding included).
That is the exact batch composition; nothing here is estimated::

    shape = step_shape(scheduler_output)
    shape.phase             # "prefill", "decode", "mixed" (chunked prefill beside decodes), or None
    shape.prefill_lens      # new tokens of each prefill chunk, e.g. (125, 2)
    shape.prefill_cached    # their tokens already in the KV cache (prefix-cache hits, earlier chunks)
    shape.decode_tokens     # tokens the decoding sequences compute (one each, plus verified drafts)
    shape.decode_context    # sum of the decoding sequences' context lengths

A request is in prefill when it is new, resumed after preemption (it recomputes its tokens), or has
produced no output yet (``num_output_tokens == 0``: a later chunk of a chunked prefill) — vLLM's own
rule (``CachedRequestData.is_context_phase``), plus resumed requests, which vLLM counts as decodes
although they recompute. Every other request decodes, including a speculative-decoding verify step,
which scores ``1 + drafts`` tokens of one sequence and is not a prefill.

A decoding sequence's context is ``num_computed_tokens + num_scheduled_tokens``: every token whose
key and value the step reads, its own included. Under async scheduling (vLLM's default) a step is
scheduled before the previous one has returned, and ``num_computed_tokens`` already counts the
previous step's token (a placeholder until it is sampled) — which that step does attend to.

No vLLM import: this reads attributes, so it runs wherever the objects come from. Cost: one pass
over the step's requests in C (``sum``, ``in``) for a pure decode step; the Python loop runs only
over the few requests in prefill.
"""

from __future__ import annotations

from typing import Any

from perfsdk.engines._common import StepShape

__all__ = ["StepShape", "step_shape"]


def step_shape(scheduler_output: Any) -> StepShape:
    """The :class:`StepShape` of one ``SchedulerOutput``."""
    scheduled: dict[str, int] = scheduler_output.num_scheduled_tokens
    lens: list[int] = []
    cached = 0
    for new in scheduler_output.scheduled_new_reqs:
        n = scheduled.get(new.req_id, 0)
        if n:
            lens.append(n)
            cached += new.num_computed_tokens
    running = scheduler_output.scheduled_cached_reqs
    computed: list[int] = running.num_computed_tokens
    outputs: list[int] = running.num_output_tokens
    resumed = running.resumed_req_ids
    decode_computed = sum(computed)
    decode_requests = len(running.req_ids)
    if resumed or 0 in outputs:  # prefill chunks among the running requests: rare, so looped only then
        for i, req_id in enumerate(running.req_ids):
            if outputs[i] == 0 or req_id in resumed:
                n = scheduled.get(req_id, 0)
                if n:
                    lens.append(n)
                    cached += computed[i]
                decode_computed -= computed[i]
                decode_requests -= 1
    decode_tokens = int(scheduler_output.total_num_scheduled_tokens) - sum(lens)
    return StepShape(tuple(lens), cached, decode_requests, decode_tokens, decode_computed + decode_tokens)
