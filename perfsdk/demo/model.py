"""A small Llama-shaped transformer in plain torch, with random weights and a static KV cache.

The shape follows gpt-fast: RMSNorm, rotary embeddings, grouped-query attention
and a SwiGLU MLP. Weights are random (seeded), so the text is nonsense, but the
bytes moved and FLOPs done per step are those of a real model of that shape,
which is all a performance demo needs::

    import torch
    from perfsdk.demo.model import ModelArgs, Transformer

    args = ModelArgs.from_name("tiny")              # "tiny" | "small" | "1b"
    model = Transformer(args, max_batch_slots=8, max_seq=1024, seed=0)
    logits = model.prefill(torch.tensor([256, 104, 105]), slot=0)   # [vocab], next-token logits
    step = model.decode(tokens=torch.tensor([105]), slots=torch.tensor([0]),
                        positions=torch.tensor([3]))                 # [1, vocab]

The KV cache is allocated once, ``[max_batch_slots, max_seq, kv_heads, head_dim]``
per layer for keys and for values, and indexed by *slot*: the engine gives each
running request a slot and frees it when the request leaves. A decode step
reads only the first ``max(positions) + 1`` cache rows, so eager CPU runs stay
fast; the allocation itself never changes.

:func:`Transformer.forward` recomputes a whole sequence without the cache; the
tests use it to check that cached decoding gives the same logits.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from perfsdk.demo.tokenizer import VOCAB_SIZE
from perfsdk.errors import ConfigError, suggest

__all__ = ["MODEL_SIZES", "ModelArgs", "Transformer", "default_size"]

# scaled_dot_product_attention broadcasts grouped KV heads itself from torch 2.5 on
_SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2]) >= (2, 5)


@dataclass(frozen=True)
class ModelArgs:
    """Shape of the demo transformer."""

    dim: int
    n_layer: int
    n_head: int
    n_kv_head: int
    intermediate_size: int
    vocab_size: int = VOCAB_SIZE
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("dim", "n_layer", "n_head", "n_kv_head", "intermediate_size", "vocab_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ModelArgs.{name} must be positive, got {getattr(self, name)}")
        if self.dim % self.n_head:
            raise ConfigError(f"ModelArgs.dim ({self.dim}) must be a multiple of n_head ({self.n_head})")
        if self.n_head % self.n_kv_head:
            raise ConfigError(f"ModelArgs.n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @classmethod
    def from_name(cls, name: str) -> ModelArgs:
        try:
            return MODEL_SIZES[name]
        except KeyError:
            raise ConfigError(
                f"model size {name!r} is not one of {sorted(MODEL_SIZES)}.{suggest(name, MODEL_SIZES)}"
            ) from None

    def num_params(self) -> int:
        """Parameters including the untied embedding and output head."""
        kv_dim = self.n_kv_head * self.head_dim
        attn = self.dim * self.dim * 2 + self.dim * kv_dim * 2
        mlp = 3 * self.dim * self.intermediate_size
        per_layer = attn + mlp + 2 * self.dim
        return self.n_layer * per_layer + 2 * self.vocab_size * self.dim + self.dim


MODEL_SIZES: dict[str, ModelArgs] = {
    # ~14M parameters: a decode step is tens of MB of fp32 weights, which two
    # CPU cores stream in a few milliseconds, so answers come at interactive speed.
    "tiny": ModelArgs(dim=384, n_layer=8, n_head=6, n_kv_head=2, intermediate_size=1024),
    # ~90M parameters: GPT-2-small sized, still usable on a laptop CPU.
    "small": ModelArgs(dim=768, n_layer=12, n_head=12, n_kv_head=4, intermediate_size=2048),
    # TinyLlama-1.1B's shape (byte vocabulary, so ~1.0B parameters): the CUDA default.
    "1b": ModelArgs(dim=2048, n_layer=22, n_head=32, n_kv_head=4, intermediate_size=5632),
}


def default_size(device: str) -> str:
    """``"1b"`` on CUDA, ``"tiny"`` elsewhere."""
    return "1b" if device.startswith("cuda") else "tiny"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs of ``x [..., seq, heads, head_dim]`` by cos/sin ``[..., seq, 1, head_dim/2]``."""
    x1, x2 = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, max_batch_slots: int, max_seq: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_head = args.n_head
        self.n_kv_head = args.n_kv_head
        self.head_dim = args.head_dim
        kv_dim = args.n_kv_head * args.head_dim
        self.wqkv = nn.Linear(args.dim, args.dim + 2 * kv_dim, bias=False)
        self.wo = nn.Linear(args.dim, args.dim, bias=False)
        shape = (max_batch_slots, max_seq, args.n_kv_head, args.head_dim)
        # buffers, not parameters: ModelSpec.from_module counts weights, not the cache
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype), persistent=False)
        self.k_cache: Tensor
        self.v_cache: Tensor

    def _qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        kv_dim = self.n_kv_head * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_dim, kv_dim], dim=-1)
        q = apply_rope(q.unflatten(-1, (self.n_head, self.head_dim)), cos, sin)
        k = apply_rope(k.unflatten(-1, (self.n_kv_head, self.head_dim)), cos, sin)
        return q, k, v.unflatten(-1, (self.n_kv_head, self.head_dim))

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        # q [B, S, H, D], k/v [B, T, KV, D] -> [B, S, H*D]
        rep = self.n_head // self.n_kv_head
        qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if rep > 1 and _SDPA_GQA:  # the kernel broadcasts KV heads itself: no copy
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal, enable_gqa=True)
            return out.transpose(1, 2).flatten(-2)
        if rep > 1:
            kh = kh.repeat_interleave(rep, dim=1)
            vh = vh.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
        return out.transpose(1, 2).flatten(-2)

    def forward_full(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)
        out: Tensor = self.wo(self._attend(q, k, v, None, causal=True))
        return out

    def prefill(self, x: Tensor, cos: Tensor, sin: Tensor, slot: int) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # x [1, S, dim]
        n = x.shape[1]
        self.k_cache[slot, :n] = k[0]
        self.v_cache[slot, :n] = v[0]
        out: Tensor = self.wo(self._attend(q, k, v, None, causal=True))
        return out

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, slots: Tensor, positions: Tensor, length: int) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # x [B, 1, dim]
        self.k_cache[slots, positions] = k[:, 0]
        self.v_cache[slots, positions] = v[:, 0]
        keys = self.k_cache[slots, :length]
        values = self.v_cache[slots, :length]
        # each row sees its own prefix only: [B, 1, 1, T]
        mask = torch.arange(length, device=x.device)[None, :] <= positions[:, None]
        out: Tensor = self.wo(self._attend(q, keys, values, mask[:, None, None, :], causal=False))
        return out


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        out: Tensor = self.w2(F.silu(gate) * up)
        return out


class Block(nn.Module):
    def __init__(self, args: ModelArgs, max_batch_slots: int, max_seq: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.attention = Attention(args, max_batch_slots, max_seq, dtype)
        self.feed_forward = FeedForward(args)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def run(self, x: Tensor, attn: Callable[[Attention, Tensor], Tensor]) -> Tensor:
        h: Tensor = x + attn(self.attention, self.attention_norm(x))
        out: Tensor = h + self.feed_forward(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    """The demo model: ``prefill`` one sequence into a slot, ``decode`` one token for many slots."""

    def __init__(
        self,
        args: ModelArgs,
        *,
        max_batch_slots: int = 8,
        max_seq: int = 1024,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if max_batch_slots <= 0:
            raise ConfigError(f"max_batch_slots must be positive, got {max_batch_slots}")
        if max_seq <= 1:
            raise ConfigError(f"max_seq must be at least 2, got {max_seq}")
        self.args = args
        self.max_batch_slots = max_batch_slots
        self.max_seq = max_seq
        with torch.device(device):
            self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
            self.layers = nn.ModuleList(Block(args, max_batch_slots, max_seq, dtype) for _ in range(args.n_layer))
            self.norm = RMSNorm(args.dim, args.norm_eps)
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
            half = args.head_dim // 2
            freqs = 1.0 / (args.rope_base ** (torch.arange(half, dtype=torch.float32) * 2 / args.head_dim))
            angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), freqs)  # [max_seq, half]
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.rope_cos: Tensor
        self.rope_sin: Tensor
        self._init_weights(seed)
        self.to(dtype=dtype)
        self.eval()
        self.requires_grad_(False)

    def _init_weights(self, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                continue
            fan_in = p.shape[-1]
            # scaled so activations keep unit-ish variance through the residual stream
            std = 1.0 / math.sqrt(fan_in) if p.dim() > 1 and "embeddings" not in name else 1.0
            p.data.copy_(torch.randn(p.shape, generator=gen) * std)

    @property
    def device(self) -> torch.device:
        return self.output.weight.device

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope_cos[positions].unsqueeze(-2), self.rope_sin[positions].unsqueeze(-2)

    def _run(self, x: Tensor, attn: Callable[[Attention, Tensor], Tensor]) -> Tensor:
        for layer in self.layers:
            x = cast(Block, layer).run(x, attn)
        logits: Tensor = self.output(self.norm(x))
        return logits.float()

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits ``[B, S, vocab]`` for whole sequences ``[B, S]``, recomputed without the cache."""
        cos, sin = self._rope(torch.arange(tokens.shape[1], device=tokens.device))
        return self._run(self.tok_embeddings(tokens), lambda a, h: a.forward_full(h, cos, sin))

    @torch.inference_mode()
    def prefill(self, tokens: Tensor, slot: int) -> Tensor:
        """Write one prompt ``[S]`` into ``slot``'s cache rows ``0..S-1``; return next-token logits."""
        n = tokens.shape[0]
        if not 0 < n <= self.max_seq:
            raise ConfigError(f"prompt of {n} tokens does not fit max_seq={self.max_seq}")
        cos, sin = self._rope(torch.arange(n, device=tokens.device))
        x = self.tok_embeddings(tokens[None, :])
        return self._run(x, lambda a, h: a.prefill(h, cos, sin, slot))[0, -1]

    @torch.inference_mode()
    def decode(self, tokens: Tensor, slots: Tensor, positions: Tensor, max_position: int | None = None) -> Tensor:
        """One token per running sequence: ``tokens[b]`` into ``slots[b]`` at ``positions[b]``.

        Pass ``max_position`` (``max(positions)``, known on the host) to spare a device-to-host sync.
        """
        if max_position is None:
            max_position = int(positions.max().item())
        length = max_position + 1  # cache rows any sequence of this batch can see
        cos, sin = self._rope(positions[:, None])
        x = self.tok_embeddings(tokens[:, None])
        return self._run(x, lambda a, h: a.decode(h, cos, sin, slots, positions, length))[:, -1]

    def config_summary(self) -> dict[str, Any]:
        a = self.args
        return {
            **a.__dict__,
            "head_dim": a.head_dim,
            "params": a.num_params(),
            "max_seq": self.max_seq,
            "max_batch_slots": self.max_batch_slots,
        }
