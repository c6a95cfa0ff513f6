"""A Llama-shaped decode model for the benchmarks: random bf16 weights, a static KV cache, CUDA-graph capture.

Shared by ``overhead.py`` and ``core_overhead.py``. Shapes: ``1b`` (TinyLlama-1.1B's) on a GPU, ``cpu``
(small enough for a 2-core CPU to step in tens of ms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "LOOPS",
    "SHAPES",
    "Cfg",
    "Model",
    "capture_decode_graph",
    "capture_graph",
    "capture_with_step",
    "decode_loop",
]


class Cfg:
    def __init__(self, dim: int, layers: int, heads: int, kv_heads: int, inter: int, vocab: int) -> None:
        self.dim, self.layers, self.heads, self.kv_heads, self.inter, self.vocab = (
            dim,
            layers,
            heads,
            kv_heads,
            inter,
            vocab,
        )
        self.head_dim = dim // heads


SHAPES = {
    # TinyLlama-1.1B's shape
    "1b": Cfg(2048, 22, 32, 4, 5632, 32000),
    # small enough for a 2-core CPU to step in tens of ms
    "cpu": Cfg(512, 8, 8, 4, 1408, 32000),
}


class Layer(nn.Module):
    def __init__(self, c: Cfg) -> None:
        super().__init__()
        kv = c.kv_heads * c.head_dim
        self.c = c
        self.wqkv = nn.Linear(c.dim, c.dim + 2 * kv, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)
        self.w13 = nn.Linear(c.dim, 2 * c.inter, bias=False)
        self.w2 = nn.Linear(c.inter, c.dim, bias=False)
        self.n1 = nn.RMSNorm(c.dim)
        self.n2 = nn.RMSNorm(c.dim)

    def attend(self, x: Tensor, kc: Tensor, vc: Tensor, pos: Tensor | None) -> Tensor:
        c = self.c
        b, t, _ = x.shape
        kvd = c.kv_heads * c.head_dim
        q, k, v = self.wqkv(self.n1(x)).split([c.dim, kvd, kvd], dim=-1)
        q = q.view(b, t, c.heads, c.head_dim).transpose(1, 2)
        k = k.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(b, t, c.kv_heads, c.head_dim).transpose(1, 2)
        if pos is None:  # prefill: write the prompt's K/V, causal attention over it
            kc[:b, :, :t] = k
            vc[:b, :, :t] = v
            rep = c.heads // c.kv_heads  # expanded, so that torch.utils.flop_counter can count SDPA
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # decode: write one position, attend over the whole (static) context
            kc[:b].index_copy_(2, pos, k)
            vc[:b].index_copy_(2, pos, v)
            o = F.scaled_dot_product_attention(q, kc[:b], vc[:b], enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, t, c.dim))
        g, u = self.w13(self.n2(x)).chunk(2, dim=-1)
        return x + self.w2(F.silu(g) * u)


class Model(nn.Module):
    def __init__(self, c: Cfg, max_batch: int, ctx: int, dtype: torch.dtype, device: str) -> None:
        super().__init__()
        self.c = c
        self.emb = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = nn.RMSNorm(c.dim)
        self.head = nn.Linear(c.dim, c.vocab, bias=False)
        self.to(device=device, dtype=dtype)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0, 0.02)
        shape = (max_batch, c.kv_heads, ctx, c.head_dim)
        self.kc = [torch.randn(shape, device=device, dtype=dtype) for _ in range(c.layers)]
        self.vc = [torch.randn(shape, device=device, dtype=dtype) for _ in range(c.layers)]
        self.ctx = ctx

    @torch.no_grad()
    def decode(self, tokens: Tensor, pos: Tensor) -> Tensor:
        x = self.emb(tokens)
        for layer, kc, vc in zip(self.layers, self.kc, self.vc, strict=True):
            x = layer.attend(x, kc, vc, pos)
        return self.head(self.norm(x)).argmax(-1)  # stays on the device: no host read

    @torch.no_grad()
    def prefill(self, tokens: Tensor) -> Tensor:
        x = self.emb(tokens)
        for layer, kc, vc in zip(self.layers, self.kc, self.vc, strict=True):
            x = layer.attend(x, kc, vc, None)
        return self.head(self.norm(x))  # logits for every position, as 2·params·tokens assumes


def capture_graph(fn: Callable[[], Any], warmups: int = 3, around: Any = None) -> tuple[Any, Any]:
    """``(graph, fn's output)``: *fn* warmed up *warmups* times on a side stream (as torch requires), then
    captured, inside the context manager *around* if one is given."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), around if around is not None else contextlib.nullcontext():
        out = fn()
    return g, out


def capture_decode_graph(model: Model, tokens: Tensor, pos: Tensor, with_output: bool = False) -> Any:
    """A CUDA graph of one decode step. *with_output*: return ``(graph, next_token_ids)``, the graph's
    static output tensor."""
    g, out = capture_graph(lambda: model.decode(tokens, pos))
    return (g, out) if with_output else g


def capture_with_step(model: Model, tokens: Tensor, pos: Tensor, mon: Any, context_tokens: int) -> Any:
    """A CUDA graph of one decode step captured with ``mon.decode()`` around the captured work (which must
    do nothing during a capture)."""
    g, _ = capture_graph(
        lambda: model.decode(tokens, pos), warmups=1, around=mon.decode(batch=1, context_tokens=context_tokens)
    )
    return g


LOOPS = ("graph", "graph_synced", "eager")


def decode_loop(
    loop: str,
    model: Model,
    tokens: Tensor,
    pos: Tensor,
    graph: Any = None,
    graph_out: Tensor | None = None,
    batch: int = 1,
    device: str = "cuda",
) -> tuple[Callable[[], None], int]:
    """One serving loop's step and how many steps to time it for (the overhead benchmarks share these).

    ``graph``: replay back to back; ``graph_synced``: replay, then read the sampled ids back (one D2H copy
    and sync a step, as a streaming server does); ``eager``: the model's forward, kernel by kernel.
    """
    if loop == "graph":

        def replay() -> None:
            graph.replay()

        return replay, 1500 if batch == 1 else 800
    if loop == "graph_synced":

        def replay_and_read() -> None:
            graph.replay()
            graph_out.cpu()  # type: ignore[union-attr]

        return replay_and_read, 1000 if batch == 1 else 800
    if loop == "eager":

        def forward() -> None:
            model.decode(tokens, pos)

        return forward, (300 if batch == 1 else 200) if device == "cuda" else 40
    raise ValueError(f"unknown loop {loop!r} (one of {', '.join(LOOPS)})")
