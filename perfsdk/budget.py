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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from perfsdk.errors import ConfigError
from perfsdk.model import ModelSpec

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


def kv_bytes_per_token(model: ModelSpec) -> float:
    """``2 (K and V) × layers × kv_heads × head_dim × kv_bytes``: Llama-3-8B in BF16 → 131,072."""
    return model.kv_bytes_per_token


def decode_step_bytes(model: ModelSpec, context_tokens: int = 0, batch: int = 1) -> float:
    """Bytes one decode step of *batch* sequences must read: every weight once (an untied input embedding:
    one row per sequence), plus the KV cache of every context token."""
    _nonneg("context_tokens", context_tokens)
    _nonneg("batch", batch)
    kv = model.kv_bytes_per_token * context_tokens if context_tokens else 0.0
    return model.step_weight_bytes + model.embedding_row_bytes * batch + kv


def prefill_step_bytes(model: ModelSpec, seq_lens: int | Iterable[int], cached_tokens: int = 0) -> float:
    """Bytes a prefill step must move: weights once (an untied input embedding: one row per new token), KV
    written for new tokens and read for cached ones."""
    new = sum(_seq_lens(seq_lens))
    _nonneg("cached_tokens", cached_tokens)
    weights = model.step_weight_bytes + model.embedding_row_bytes * new
    if not model.has_attention_shape:
        return weights
    return weights + model.kv_bytes_per_token * (new + cached_tokens)


def attention_flops(model: ModelSpec, seq_lens: int | Iterable[int], cached_tokens: int = 0) -> float:
    """Causal self-attention FLOPs of a prefill: ``2 × layers × heads × head_dim × Σ n²``, plus
    ``4 × layers × heads × head_dim × Σ n·c`` for the new tokens attending to a cached prefix.

    (QKᵀ and PV are each ``2·n²·head_dim`` per head; the causal mask halves both. Against a prefix of
    ``c`` cached tokens each of the ``n`` new queries sees all ``c``: ``4·n·c·head_dim``.) *cached_tokens*
    is the prefix length summed over the sequences; spread evenly over them, as servers report sums.
    """
    if model.layers is None or model.heads is None or model.head_dim is None:
        raise ConfigError(f"model {model.name or '(unnamed)'}: attention FLOPs need layers, heads and head_dim")
    _nonneg("cached_tokens", cached_tokens)
    lens = _seq_lens(seq_lens)
    per_token = model.layers * (model.heads // model.tp) * model.head_dim
    within = 2.0 * per_token * sum(n * n for n in lens)
    prefix = 4.0 * per_token * cached_tokens * sum(lens) / len(lens) if cached_tokens and lens else 0.0
    return within + prefix


def prefill_flops(model: ModelSpec, seq_lens: int | Iterable[int], *, attention: bool = True,
                  cached_tokens: int = 0) -> float:
    """FLOPs of a prefill: ``2 × params × Σ n`` plus causal attention when ``attention`` (over a cached
    prefix of *cached_tokens* too: :func:`attention_flops`)."""
    lens = _seq_lens(seq_lens)
    linear = 2.0 * model.params * sum(lens)
    return linear + (attention_flops(model, lens, cached_tokens) if attention else 0.0)


def decode_flops(model: ModelSpec, batch: int, context_tokens: int = 0) -> float:
    """FLOPs of a decode step: ``2 × params × batch`` plus attention over the context (``4·layers·heads·hd·Σctx``)."""
    _nonneg("batch", batch)
    _nonneg("context_tokens", context_tokens)
    attn = 0.0
    if context_tokens and model.layers and model.heads and model.head_dim:
        attn = 4.0 * model.layers * (model.heads // model.tp) * model.head_dim * context_tokens
    return 2.0 * model.params * batch + attn


def mixed_step_bytes(model: ModelSpec, prefill_seq_lens: Sequence[int], decode_context_tokens: int,
                     decode_batch: int = 0) -> float:
    """Bytes of a chunked-prefill + decode step: weights once (an untied input embedding: one row per new
    token and per decoding sequence), decode KV reads, prefill KV writes."""
    new = sum(_seq_lens(prefill_seq_lens))
    _nonneg("decode_context_tokens", decode_context_tokens)
    _nonneg("decode_batch", decode_batch)
    weights = model.step_weight_bytes + model.embedding_row_bytes * (new + decode_batch)
    if not model.has_attention_shape:
        return weights
    return weights + model.kv_bytes_per_token * (decode_context_tokens + new)


def mixed_step_flops(
    model: ModelSpec, prefill_seq_lens: Sequence[int], decode_batch: int, decode_context_tokens: int
) -> float:
    """FLOPs of a chunked-prefill + decode step: the prefill's plus the decode's."""
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
    return _nonneg("step_bytes", step_bytes) / (_positive("seconds", seconds) * _positive("bandwidth", bandwidth))


def mfu(step_flops: float, seconds: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``FLOPs / (seconds × dense peak FLOP/s)``, 0–1."""
    return _nonneg("step_flops", step_flops) / (_positive("seconds", seconds) * _positive("peak_flops", peak_flops))
