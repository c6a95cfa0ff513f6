"""What one step had to move and compute: bytes, FLOPs and tokens, as a few multiply-adds.

The step core prices every step with these coefficients, precomputed once from the Monitor's
:class:`~perfsdk.model.ModelSpec` — the same formulas as :mod:`perfsdk.budget`, in the same order of
floating-point operations, so the Python core, the C core (``perfsdk/_native/stepcore.c``, which reads
these fields) and ``budget`` agree to the last bit (``tests/test_stepcost.py``)::

    costs = StepCosts.of(ModelSpec.named("llama-3-8b"), bandwidth=4.8e12, peak_flops=989e12)
    costs.cost(DECODE, batch=8, tokens=-1, context_tokens=8192, lens_sum=0, lens_sq=0, lens_count=0)
    # (bytes, FLOPs, tokens) = (weights + 8192 x KV bytes per token, 2 x params x 8 + attention, 8)

Decode reads every weight plus the KV cache of every context token; prefill multiplies every weight with
every new token and attends causally within each sequence (``Σ n²``) and over a cached prefix; a mixed
(chunked-prefill) step is both. Without the model's attention shape (layers, KV heads, head dim) the KV
and attention terms are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfsdk.model import ModelSpec
from perfsdk.records import DECODE, PREFILL

__all__ = ["StepCosts"]


@dataclass(frozen=True)
class StepCosts:
    """Per-step cost coefficients of one model on one GPU (zeros where unknown)."""

    known: bool                  # a model is set: bytes and FLOPs can be priced
    kv: bool                     # the model's attention shape is known
    weight_bytes: float          # read whole by every step (ModelSpec.step_weight_bytes)
    row_bytes: float             # per looked-up token of an untied input embedding (ModelSpec.embedding_row_bytes)
    kv_bytes_per_token: float
    two_params: float            # 2 x params: FLOPs per token through the weights
    attn_decode: float           # 4 x layers x heads x head_dim: decode attention FLOPs per context token
    attn_causal: float           # 2 x layers x heads x head_dim: prefill attention FLOPs per n^2
    attn_prefix: float           # 4 x layers x heads x head_dim: per new token per cached prefix token
    bandwidth: float             # bytes/s MBU divides by (0: none)
    peak_flops: float            # FLOP/s MFU divides by (0: none)

    @classmethod
    def of(cls, model: ModelSpec | None, bandwidth: float | None, peak_flops: float | None) -> StepCosts:
        bw, peak = float(bandwidth or 0.0), float(peak_flops or 0.0)
        if model is None:
            return cls(False, False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, bw, peak)
        kv = model.has_attention_shape
        per_token = 0
        attn_decode = 0.0
        if kv:
            assert model.layers is not None
            assert model.heads is not None
            assert model.head_dim is not None
            per_token = model.layers * (model.heads // model.tp) * model.head_dim
            attn_decode = 4.0 * model.layers * (model.heads // model.tp) * model.head_dim
        return cls(
            known=True, kv=kv, weight_bytes=float(model.step_weight_bytes),
            row_bytes=float(model.embedding_row_bytes),
            kv_bytes_per_token=float(model.kv_bytes_per_token) if kv else 0.0,
            two_params=2.0 * model.params, attn_decode=attn_decode,
            attn_causal=2.0 * per_token, attn_prefix=4.0 * per_token, bandwidth=bw, peak_flops=peak,
        )

    def cost(self, phase: int, batch: int, context_tokens: int, lens_sum: int, lens_sq: int,
             lens_count: int) -> tuple[float | None, float | None, int]:
        """``(bytes, FLOPs, tokens)`` of one step; bytes and FLOPs are None without a model.

        A step with no sizes (``context_tokens`` is :data:`~perfsdk.records.UNSIZED`: a bare ``@mon.decode``)
        costs nothing known: ``(None, None, 0)``.
        """
        if context_tokens < 0:
            return None, None, 0
        if phase == DECODE:
            if not self.known:
                return None, None, batch
            return (self.weight_bytes + self.row_bytes * batch + self.kv_bytes_per_token * context_tokens,
                    self.two_params * batch + self.attn_decode * context_tokens, batch)
        if phase == PREFILL:
            if not self.known:
                return None, None, lens_sum
            linear = self.two_params * lens_sum
            weights = self.weight_bytes + self.row_bytes * lens_sum
            if not self.kv:
                return weights, linear, lens_sum
            prefix = (self.attn_prefix * context_tokens * lens_sum / lens_count
                      if context_tokens and lens_count else 0.0)
            return (weights + self.kv_bytes_per_token * (lens_sum + context_tokens),
                    linear + (self.attn_causal * lens_sq + prefix), lens_sum)
        # mixed: lens are the prefill chunks, batch the decoding sequences, context_tokens their context
        n = lens_sum + batch
        if not self.known:
            return None, None, n
        decode_flops = self.two_params * batch + self.attn_decode * context_tokens
        weights = self.weight_bytes + self.row_bytes * n
        if not self.kv:
            return weights, self.two_params * lens_sum + decode_flops, n
        nbytes = weights + self.kv_bytes_per_token * (context_tokens + lens_sum)
        prefill_flops = self.two_params * lens_sum + (self.attn_causal * lens_sq + 0.0)
        return nbytes, prefill_flops + decode_flops, n
