"""The floors: how fast a step *could* be, and how close a measured one came.

Pure functions over a :class:`~perfsdk.model.ModelSpec` and plain numbers — no
torch, no threads — named after the formulas they compute (the seeds' "start
with a budget")::

    from perfsdk import budget
    from perfsdk.model import ModelSpec
    from perfsdk.hardware import get

    m, h100 = ModelSpec.named("llama-3-8b"), get("h100-sxm")
    budget.decode_floor_s(m, h100.memory_bandwidth, context_tokens=4096)   # 0.0049 s
    budget.prefill_floor_s(m, h100.peak_flops("bf16"), [2048], attention=False)   # 0.031 s (7.5 B doing math)
    budget.mbu(budget.decode_step_bytes(m, 4096), 9.8e-3, h100.memory_bandwidth)  # ~0.50

Decode reads every weight once per step plus every sequence's KV cache, so it
is priced in bytes over bandwidth — every weight except an *untied* input
embedding, of which a step reads one row per sequence (a tied one is the LM
head and is read whole, once). The seeds round a step to ``params × bytes``;
for Llama-3-8B the difference is the 1.05 GB input table (of 16.06 GB). Prefill multiplies every weight with every
prompt token (2 FLOPs per parameter per token) plus causal attention
(``2 × layers × heads × head_dim × n²`` per sequence of *n* tokens), so it is
priced in FLOPs over peak. ``context_tokens`` is always the *sum* of the
context lengths of the sequences in the step (batch 8 at 1,024 tokens each is
8,192). All figures are per GPU when the spec is (:meth:`ModelSpec.with_tp`).

The formulas themselves are :class:`~perfsdk.stepcost.StepCosts`' — the ones the
step core prices every measured step with — so a floor and a measured step's MBU
and MFU agree to the last bit (``tests/test_stepcore.py``). This module checks
its arguments, names each quantity, and keeps one rule of its own: a floor needs
only the part of the attention shape its term uses (KV bytes: layers, KV heads
and head_dim; attention FLOPs: layers, heads and head_dim), where the step core
prices both only with the whole shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

from perfsdk.errors import ConfigError
from perfsdk.model import ModelSpec
from perfsdk.stepcost import StepCosts, attention_coefficients, utilization

__all__ = [
    "attention_flops",
    "decode_floor_s",
    "decode_flops",
    "decode_step_bytes",
    "kv_bytes_per_token",
    "mbu",
    "mfu",
    "mixed_step_bytes",
    "mixed_step_flops",
    "prefill_floor_s",
    "prefill_flops",
    "prefill_step_bytes",
    "tokens_per_s",
]


def _nonneg(field: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{field}: must be a non-negative number, got {value!r}")
    return value


def _positive(field: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field}: must be a positive number, got {value!r}")
    return value


def _seq_lens(seq_lens: int | Iterable[int]) -> list[int]:
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    for n in lens:
        _nonneg("seq_lens", n)
    return lens


def _costs(model: ModelSpec) -> StepCosts:
    return StepCosts.of(model)


def _with_attention(model: ModelSpec) -> StepCosts:
    """*model*'s costs with its attention terms: layers, heads and head_dim suffice here (the caller checked)."""
    c = StepCosts.of(model)
    attn = attention_coefficients(model)
    if c.kv or attn is None:
        return c
    return replace(c, kv=True, attn_decode=attn[0], attn_causal=attn[1], attn_prefix=attn[2])


def _without_attention(model: ModelSpec) -> StepCosts:
    return replace(StepCosts.of(model), kv=False)


def _need_attention_shape(model: ModelSpec) -> None:
    if model.layers is None or model.heads is None or model.head_dim is None:
        raise ConfigError(f"model {model.name or '(unnamed)'}: attention FLOPs need layers, heads and head_dim")


def kv_bytes_per_token(model: ModelSpec) -> float:
    """``2 (K and V) × layers × kv_heads × head_dim × kv_bytes``: Llama-3-8B in BF16 → 131,072."""
    return model.kv_bytes_per_token


def decode_step_bytes(model: ModelSpec, context_tokens: int = 0, batch: int = 1) -> float:
    """Bytes one decode step of *batch* sequences must read: every weight once (an untied input embedding:
    one row per sequence), plus the KV cache of every context token."""
    _nonneg("context_tokens", context_tokens)
    _nonneg("batch", batch)
    c = _costs(model)
    if context_tokens and not c.kv:
        # KV bytes need layers, kv_heads and head_dim only (ModelSpec.kv_bytes_per_token names what is missing)
        c = replace(c, kv_bytes_per_token=model.kv_bytes_per_token)
    return c.decode_bytes(batch, context_tokens)


def prefill_step_bytes(model: ModelSpec, seq_lens: int | Iterable[int], cached_tokens: int = 0) -> float:
    """Bytes a prefill step must move: weights once (an untied input embedding: one row per new token), KV
    written for new tokens and read for cached ones."""
    new = sum(_seq_lens(seq_lens))
    _nonneg("cached_tokens", cached_tokens)
    return _costs(model).prefill_bytes(new, cached_tokens)


def attention_flops(model: ModelSpec, seq_lens: int | Iterable[int], cached_tokens: int = 0) -> float:
    """Causal self-attention FLOPs of a prefill: ``2 × layers × heads × head_dim × Σ n²``, plus
    ``4 × layers × heads × head_dim × Σ n·c`` for the new tokens attending to a cached prefix.

    (QKᵀ and PV are each ``2·n²·head_dim`` per head; the causal mask halves both. Against a prefix of
    ``c`` cached tokens each of the ``n`` new queries sees all ``c``: ``4·n·c·head_dim``.) *cached_tokens*
    is the prefix length summed over the sequences; spread evenly over them, as servers report sums.
    """
    _need_attention_shape(model)
    _nonneg("cached_tokens", cached_tokens)
    lens = _seq_lens(seq_lens)
    return _with_attention(model).attention_flops(sum(lens), sum(n * n for n in lens), len(lens), cached_tokens)


def prefill_flops(
    model: ModelSpec, seq_lens: int | Iterable[int], *, attention: bool = True, cached_tokens: int = 0
) -> float:
    """FLOPs of a prefill: ``2 × params × Σ n`` plus causal attention when ``attention`` (over a cached
    prefix of *cached_tokens* too: :func:`attention_flops`)."""
    lens = _seq_lens(seq_lens)
    if not attention:
        return _without_attention(model).prefill_flops(sum(lens), 0, len(lens), 0)
    _need_attention_shape(model)
    _nonneg("cached_tokens", cached_tokens)
    return _with_attention(model).prefill_flops(sum(lens), sum(n * n for n in lens), len(lens), cached_tokens)


def decode_flops(model: ModelSpec, batch: int, context_tokens: int = 0) -> float:
    """FLOPs of a decode step: ``2 × params × batch`` plus attention over the context (``4·layers·heads·hd·Σctx``)."""
    _nonneg("batch", batch)
    _nonneg("context_tokens", context_tokens)
    return _with_attention(model).decode_flops(batch, context_tokens)


def mixed_step_bytes(
    model: ModelSpec, prefill_seq_lens: Sequence[int], decode_context_tokens: int, decode_batch: int = 0
) -> float:
    """Bytes of a chunked-prefill + decode step: weights once (an untied input embedding: one row per new
    token and per decoding sequence), decode KV reads, prefill KV writes."""
    new = sum(_seq_lens(prefill_seq_lens))
    _nonneg("decode_context_tokens", decode_context_tokens)
    _nonneg("decode_batch", decode_batch)
    return _costs(model).mixed_bytes(decode_batch, decode_context_tokens, new)


def mixed_step_flops(
    model: ModelSpec, prefill_seq_lens: Sequence[int], decode_batch: int, decode_context_tokens: int
) -> float:
    """FLOPs of a chunked-prefill + decode step: the prefill's plus the decode's (:meth:`StepCosts.mixed_flops`
    where the whole attention shape is known)."""
    attention = model.has_attention_shape
    return prefill_flops(model, prefill_seq_lens, attention=attention) + decode_flops(
        model, decode_batch, decode_context_tokens
    )


def decode_floor_s(model: ModelSpec, bandwidth: float, context_tokens: int = 0, batch: int = 1) -> float:
    """The fastest a decode step can be: :func:`decode_step_bytes` over peak bandwidth (bytes/s)."""
    return decode_step_bytes(model, context_tokens, batch) / _positive("bandwidth", bandwidth)


def prefill_floor_s(
    model: ModelSpec, peak_flops: float, seq_lens: int | Iterable[int], *, attention: bool = True
) -> float:
    """The fastest a prefill can be: :func:`prefill_flops` over dense peak FLOP/s."""
    return prefill_flops(model, seq_lens, attention=attention) / _positive("peak_flops", peak_flops)


def tokens_per_s(step_seconds: float, batch: int = 1) -> float:
    """Output tokens per second of a decode step that emits ``batch`` tokens."""
    return batch / _positive("step_seconds", step_seconds)


def mbu(step_bytes: float, seconds: float, bandwidth: float) -> float:
    """Model bandwidth utilisation: ``bytes / (seconds × peak bandwidth)``, 0–1 (above 1 means a wrong peak)."""
    return utilization(
        _nonneg("step_bytes", step_bytes), _positive("seconds", seconds), _positive("bandwidth", bandwidth)
    )


def mfu(step_flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``FLOPs / (seconds × dense peak FLOP/s)``, 0–1."""
    return utilization(
        _nonneg("step_flops", step_flops), _positive("seconds", seconds), _positive("peak_flops", peak_flops)
    )
