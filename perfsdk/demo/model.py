"""A small Llama-shaped transformer in plain torch, with random weights and a static KV cache.

The shape follows gpt-fast: RMSNorm, rotary embeddings, grouped-query attention
and a SwiGLU MLP. Weights are random (seeded), so the text is nonsense, but the
bytes moved and FLOPs done per step are those of a real model of that shape,
which is all a performance demo needs::

    import torch
    from perfsdk.demo.model import ModelArgs, Transformer

    args = ModelArgs.from_name("tiny")              # "tiny" | "small" | "1b" | "8b"
    model = Transformer(args, max_batch_slots=8, max_seq=1024, seed=0)
    logits = model.prefill(torch.tensor([256, 104, 105]), slot=0)   # [vocab], next-token logits
    step = model.decode(tokens=torch.tensor([105]), slots=torch.tensor([0]),
                        positions=torch.tensor([3]))                 # [1, vocab]

The KV cache is allocated once, ``[max_batch_slots + 1, kv_heads, max_seq, head_dim]``
per layer for keys and for values (heads before positions: a batch's keys gathered
by slot are already in the ``[batch, heads, tokens, head_dim]`` layout attention
reads), and indexed by *slot*: the engine gives each running request a slot and
frees it when the request leaves. The extra slot, :attr:`Transformer.scratch_slot`,
is where the padded rows of a CUDA-graph batch write; no request reads it. A decode
step reads only the first ``max(positions) + 1`` cache rows, so eager CPU runs stay
fast; the allocation itself never changes.

Weights are made on the model's device in its dtype (an 8B model's 16 GB never
pass through host memory), from a generator seeded with ``seed`` on that device:
the same seed gives the same weights on the same kind of device.

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
    # Llama-3-8B's shape, vocabulary included (8.03B parameters, 16.06 GB in bf16), so that a decode
    # step reads the bytes the seeds' 7-8B budgets count. The byte tokenizer uses ids below 260 and the
    # sampler picks among printable ones; the other 128k rows are still read by the output projection.
    "8b": ModelArgs(
        dim=4096, n_layer=32, n_head=32, n_kv_head=8, intermediate_size=14336, vocab_size=128256, rope_base=500000.0
    ),
}


def default_size(device: str) -> str:
    """``"1b"`` on CUDA, ``"tiny"`` elsewhere."""
    return "1b" if device.startswith("cuda") else "tiny"


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate channel pairs of ``x [..., seq, heads, head_dim]`` by cos/sin ``[..., seq, 1, head_dim/2]``."""
    x1, x2 = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, cache_rows: int, max_seq: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.n_head = args.n_head
        self.n_kv_head = args.n_kv_head
        self.head_dim = args.head_dim
        kv_dim = args.n_kv_head * args.head_dim
        self.wqkv = nn.Linear(args.dim, args.dim + 2 * kv_dim, bias=False, dtype=dtype)
        self.wo = nn.Linear(args.dim, args.dim, bias=False, dtype=dtype)
        shape = (cache_rows, args.n_kv_head, max_seq, args.head_dim)
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
        # q [B, S, H, D]; k/v [B, KV, T, D]
        return attend(q, k, v, mask, causal=causal, rep=self.n_head // self.n_kv_head)

    def forward_full(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)
        out: Tensor = self.wo(self._attend(q, k.transpose(1, 2), v.transpose(1, 2), None, causal=True))
        return out

    def prefill(self, x: Tensor, cos: Tensor, sin: Tensor, slot: int) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # x [1, S, dim]
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [1, KV, S, D]
        n = x.shape[1]
        self.k_cache[slot, :, :n] = k[0]
        self.v_cache[slot, :, :n] = v[0]
        out: Tensor = self.wo(self._attend(q, k, v, None, causal=True))
        return out

    def prefill_batch(self, x: Tensor, cos: Tensor, sin: Tensor, slots: Tensor) -> Tensor:
        # x [B, S, dim], prompts right-padded to S: causal attention keeps every real token's view to
        # real tokens. The padding's keys land in cache rows past each prompt; a decode step writes its
        # own row before it reads it and masks the rest, so they are never read.
        q, k, v = self._qkv(x, cos, sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [B, KV, S, D]
        n = x.shape[1]
        self.k_cache[slots, :, :n] = k
        self.v_cache[slots, :, :n] = v
        out: Tensor = self.wo(self._attend(q, k, v, None, causal=True))
        return out

    def decode(self, x: Tensor, cos: Tensor, sin: Tensor, slots: Tensor, positions: Tensor, length: int) -> Tensor:
        q, k, v = self._qkv(x, cos, sin)  # x [B, 1, dim]
        self.k_cache[slots, :, positions] = k[:, 0]
        self.v_cache[slots, :, positions] = v[:, 0]
        keys = self.k_cache[slots, :, :length]  # [B, KV, T, D]
        values = self.v_cache[slots, :, :length]
        # each row sees its own prefix only: [B, 1, 1, T]
        mask = torch.arange(length, device=x.device)[None, :] <= positions[:, None]
        out: Tensor = self.wo(self._attend(q, keys, values, mask[:, None, None, :], causal=False))
        return out


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, causal: bool, rep: int) -> Tensor:
    """Scaled dot-product attention of ``q [B, S, H, D]`` over ``k/v [B, KV, T, D]`` -> ``[B, S, H*D]``."""
    qh, kh, vh = q.transpose(1, 2), k, v
    if rep > 1 and _SDPA_GQA:  # the kernel broadcasts KV heads itself: no copy
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal, enable_gqa=True)
        return out.transpose(1, 2).flatten(-2)
    if rep > 1:
        kh = kh.repeat_interleave(rep, dim=1)
        vh = vh.repeat_interleave(rep, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=causal)
    return out.transpose(1, 2).flatten(-2)


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs, dtype: torch.dtype) -> None:
        super().__init__()
        self.w13 = nn.Linear(args.dim, 2 * args.intermediate_size, bias=False, dtype=dtype)
        self.w2 = nn.Linear(args.intermediate_size, args.dim, bias=False, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        out: Tensor = self.w2(F.silu(gate) * up)
        return out


class Block(nn.Module):
    def __init__(self, args: ModelArgs, cache_rows: int, max_seq: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.attention = Attention(args, cache_rows, max_seq, dtype)
        self.feed_forward = FeedForward(args, dtype)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, dtype)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, dtype)

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
        rows = max_batch_slots + 1  # + the scratch slot
        with torch.device(device):
            self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim, dtype=dtype)
            self.layers = nn.ModuleList(Block(args, rows, max_seq, dtype) for _ in range(args.n_layer))
            self.norm = RMSNorm(args.dim, args.norm_eps, dtype)
            self.output = nn.Linear(args.dim, args.vocab_size, bias=False, dtype=dtype)
            half = args.head_dim // 2
            freqs = 1.0 / (args.rope_base ** (torch.arange(half, dtype=torch.float32) * 2 / args.head_dim))
            angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), freqs)  # [max_seq, half]
            # float32 whatever the weights' dtype: positions past a few hundred lose their angle in bf16
            self.register_buffer("rope_cos", angles.cos(), persistent=False)
            self.register_buffer("rope_sin", angles.sin(), persistent=False)
        self.rope_cos: Tensor
        self.rope_sin: Tensor
        self._init_weights(seed)
        self.eval()
        self.requires_grad_(False)

    def _init_weights(self, seed: int) -> None:
        device = self.output.weight.device
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    continue
                fan_in = p.shape[-1]
                # scaled so activations keep unit-ish variance through the residual stream
                std = 1.0 / math.sqrt(fan_in) if p.dim() > 1 and "embeddings" not in name else 1.0
                # float32 draws on the model's device, one tensor at a time: the largest transient is one
                # weight matrix in float32, on the GPU for a GPU model
                p.copy_(torch.randn(p.shape, generator=gen, device=device).mul_(std))

    @property
    def device(self) -> torch.device:
        return self.tok_embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.tok_embeddings.weight.dtype

    @property
    def scratch_slot(self) -> int:
        """The cache slot no request owns: padded rows of a fixed-size batch read and write there."""
        return self.max_batch_slots

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.rope_cos[positions].unsqueeze(-2), self.rope_sin[positions].unsqueeze(-2)

    def _run(self, x: Tensor, attn: Callable[[Attention, Tensor], Tensor], last: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = cast(Block, layer).run(x, attn)
        if last is not None:  # only the rows whose next token is wanted reach the output projection
            x = x[torch.arange(x.shape[0], device=x.device), last][:, None]
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
        last = torch.full((1,), n - 1, dtype=torch.long, device=tokens.device)
        return self._run(x, lambda a, h: a.prefill(h, cos, sin, slot), last)[0, -1]

    @torch.inference_mode()
    def prefill_batch(self, tokens: Tensor, lengths: Tensor, slots: Tensor) -> Tensor:
        """Prefill several prompts in one forward: ``tokens [B, S]`` right-padded, ``lengths [B]``.

        Each prompt's keys and values go to its slot's cache rows ``0..S-1``; returns the logits
        ``[B, vocab]`` of the token after each prompt's last real one.
        """
        n = tokens.shape[1]
        if not 0 < n <= self.max_seq:
            raise ConfigError(f"prompts of {n} tokens do not fit max_seq={self.max_seq}")
        cos, sin = self._rope(torch.arange(n, device=tokens.device))
        x = self.tok_embeddings(tokens)
        return self._run(x, lambda a, h: a.prefill_batch(h, cos, sin, slots), lengths - 1)[:, -1]

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
