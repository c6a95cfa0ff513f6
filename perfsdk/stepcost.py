"""What one step had to move and compute: bytes, FLOPs and tokens, as a few multiply-adds — the one source of
perfsdk's cost formulas.

:class:`StepCosts` holds a model's per-step coefficients on one GPU, precomputed once from its
:class:`~perfsdk.model.ModelSpec`, and the formulas as named pieces: :meth:`~StepCosts.decode_bytes`,
:meth:`~StepCosts.decode_flops`, :meth:`~StepCosts.prefill_bytes`, :meth:`~StepCosts.prefill_flops` (with
:meth:`~StepCosts.attention_flops`), :meth:`~StepCosts.mixed_bytes` and :meth:`~StepCosts.mixed_flops`.
Everything that prices a step uses them:

* the Python step core (:class:`~perfsdk.stepcore.PyStepCore`) through :meth:`~StepCosts.cost`;
* the C step core (``perfsdk/csrc/stepcore.c``), which is given these coefficients when it is built and does
  the same floating-point operations in the same order, so both cores agree to the last bit;
* :mod:`perfsdk.budget`, the floors, a thin layer that checks its arguments and calls these pieces
  (``tests/test_stepcore.py`` checks all three equal)::

    costs = StepCosts.of(ModelSpec.named("llama-3-8b"), bandwidth=4.8e12, peak_flops=989e12)
    costs.decode_bytes(batch=8, context_tokens=8192)  # weights + 8 embedding rows + 8192 x KV bytes per token
    costs.cost(DECODE, batch=8, context_tokens=8192, lens_sum=0, lens_sq=0, lens_count=0)
    # (bytes, FLOPs, tokens) = (that, 2 x params x 8 + attention, 8)

Decode reads every weight plus the KV cache of every context token; prefill multiplies every weight with
every new token and attends causally within each sequence (``Σ n²``) and over a cached prefix; a mixed
(chunked-prefill) step is both. Without the model's attention shape (layers, heads, KV heads, head dim) the
KV and attention terms are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsdk.model import ModelSpec
from perfsdk.records import DECODE, PREFILL

__all__ = ["StepCosts", "attention_coefficients", "utilization"]


def attention_coefficients(model: ModelSpec) -> tuple[float, float, float] | None:
    """``(decode, causal, prefix)`` attention FLOPs per context token, per ``n²`` of a prefill sequence and per new
    token per cached prefix token (``4``, ``2`` and ``4 × layers × heads × head_dim``, heads per GPU); None without
    layers, heads and head_dim."""
    if model.layers is None or model.heads is None or model.head_dim is None:
        return None
    per_token = model.layers * (model.heads // model.tp) * model.head_dim
    return 4.0 * model.layers * (model.heads // model.tp) * model.head_dim, 2.0 * per_token, 4.0 * per_token


def utilization(amount: float, seconds: float, peak: float) -> float:
    """MBU or MFU: *amount* (bytes, FLOPs) over what *peak* (bytes/s, FLOP/s) allows in *seconds*."""
    return amount / (seconds * peak)


@dataclass(frozen=True)
class StepCosts:
    """Per-step cost coefficients of one model on one GPU (zeros where unknown), and the formulas over them."""

    known: bool  # a model is set: bytes and FLOPs can be priced
    kv: bool  # the model's attention shape is known: KV bytes and attention FLOPs are priced
    weight_bytes: float  # read whole by every step (ModelSpec.step_weight_bytes)
    row_bytes: float  # per looked-up token of an untied input embedding (ModelSpec.embedding_row_bytes)
    kv_bytes_per_token: float
    two_params: float  # 2 x params: FLOPs per token through the weights
    attn_decode: float  # 4 x layers x heads x head_dim: decode attention FLOPs per context token
    attn_causal: float  # 2 x layers x heads x head_dim: prefill attention FLOPs per n^2
    attn_prefix: float  # 4 x layers x heads x head_dim: per new token per cached prefix token
    bandwidth: float  # bytes/s MBU divides by (0: none)
    peak_flops: float  # FLOP/s MFU divides by (0: none)

    @classmethod
    def of(cls, model: ModelSpec | None, bandwidth: float | None = None, peak_flops: float | None = None) -> StepCosts:
        bw, peak = float(bandwidth or 0.0), float(peak_flops or 0.0)
        if model is None:
            return cls(False, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, bw, peak)
        kv = model.has_attention_shape
        attn = attention_coefficients(model) if kv else None
        attn_decode, attn_causal, attn_prefix = attn if attn is not None else (0.0, 0.0, 0.0)
        return cls(
            known=True,
            kv=kv,
            weight_bytes=float(model.step_weight_bytes),
            row_bytes=float(model.embedding_row_bytes),
            kv_bytes_per_token=float(model.kv_bytes_per_token) if kv else 0.0,
            two_params=2.0 * model.params,
            attn_decode=attn_decode,
            attn_causal=attn_causal,
            attn_prefix=attn_prefix,
            bandwidth=bw,
            peak_flops=peak,
        )

    # ---- the formulas (perfsdk/csrc/stepcore.c's cost() does these operations, in this order) -----------------
    def decode_bytes(self, batch: float, context_tokens: float) -> float:
        """Every weight once (an untied input embedding: one row per sequence), plus the KV cache of every context
        token (*context_tokens*: the sum over the *batch* sequences)."""
        return self.weight_bytes + self.row_bytes * batch + self.kv_bytes_per_token * context_tokens

    def decode_flops(self, batch: float, context_tokens: float) -> float:
        """``2 × params`` per sequence, plus attention over every context token."""
        return self.two_params * batch + self.attn_decode * context_tokens

    def prefill_bytes(self, new_tokens: float, cached_tokens: float) -> float:
        """Weights once (an untied input embedding: one row per new token), KV written for the new tokens and read
        for the cached ones."""
        weights = self.weight_bytes + self.row_bytes * new_tokens
        if not self.kv:
            return weights
        return weights + self.kv_bytes_per_token * (new_tokens + cached_tokens)

    def attention_flops(self, new_tokens: float, squares: float, sequences: float, cached_tokens: float) -> float:
        """Causal attention within each sequence (*squares*: ``Σ n²``), plus the new tokens attending to a cached
        prefix of *cached_tokens* in all, spread evenly over the *sequences* (servers report sums)."""
        prefix = self.attn_prefix * cached_tokens * new_tokens / sequences if cached_tokens and sequences else 0.0
        return self.attn_causal * squares + prefix

    def prefill_flops(self, new_tokens: float, squares: float, sequences: float, cached_tokens: float) -> float:
        """``2 × params`` per new token, plus :meth:`attention_flops` where the attention shape is known."""
        linear = self.two_params * new_tokens
        if not self.kv:
            return linear
        return linear + self.attention_flops(new_tokens, squares, sequences, cached_tokens)

    def mixed_bytes(self, batch: float, context_tokens: float, new_tokens: float) -> float:
        """A chunked prefill of *new_tokens* with *batch* sequences decoding over *context_tokens*: weights once
        (an untied input embedding: one row per new token and per decoding sequence), the decode's KV reads and
        the prefill's KV writes."""
        weights = self.weight_bytes + self.row_bytes * (new_tokens + batch)
        if not self.kv:
            return weights
        return weights + self.kv_bytes_per_token * (context_tokens + new_tokens)

    def mixed_flops(
        self, batch: float, context_tokens: float, new_tokens: float, squares: float, sequences: float
    ) -> float:
        """The prefill's FLOPs (no cached prefix) plus the decode's."""
        return self.prefill_flops(new_tokens, squares, sequences, 0) + self.decode_flops(batch, context_tokens)

    # ---- one step, as the step core reads it ------------------------------------------------------------
    def cost(
        self, phase: int, batch: int, context_tokens: int, lens_sum: int, lens_sq: int, lens_count: int
    ) -> tuple[float | None, float | None, int]:
        """``(bytes, FLOPs, tokens)`` of one step (a :class:`~perfsdk.records.StepRecord`'s sizes); bytes and
        FLOPs are None without a model.

        A step with no sizes (``context_tokens`` is :data:`~perfsdk.records.UNSIZED`: a bare ``@mon.decode``)
        costs nothing known: ``(None, None, 0)``. A mixed step's *batch* and *context_tokens* are its decoding
        sequences', its lens the prefill chunks'.
        """
        if context_tokens < 0:
            return None, None, 0
        if phase == DECODE:
            if not self.known:
                return None, None, batch
            return self.decode_bytes(batch, context_tokens), self.decode_flops(batch, context_tokens), batch
        if phase == PREFILL:
            if not self.known:
                return None, None, lens_sum
            return (
                self.prefill_bytes(lens_sum, context_tokens),
                self.prefill_flops(lens_sum, lens_sq, lens_count, context_tokens),
                lens_sum,
            )
        n = lens_sum + batch
        if not self.known:
            return None, None, n
        return (
            self.mixed_bytes(batch, context_tokens, lens_sum),
            self.mixed_flops(batch, context_tokens, lens_sum, lens_sq, lens_count),
            n,
        )
