"""The demo engine's fast rungs: static buffers, batched prefill, sampling on the device, CUDA graphs.

:class:`GraphEngine` schedules exactly like :class:`~perfsdk.demo.engine.Engine` (continuous batching
over KV-cache slots, requests join and leave between steps) and changes how a step runs, as vLLM's and
SGLang's model runners do:

- **Everything a step touches is allocated once.** The KV cache already is (the model's slots); here
  also each slot's next input token, position, temperature and seed live in device tables, and a
  decode step reads them through a static ``batch_slots`` buffer. Nothing is allocated or copied from
  the host per step, except the slot list when the batch's membership changes.
- **Sampling on the device, for the whole batch.** Greedy or temperature sampling by the Gumbel-max
  trick, with noise from a counter-based hash of ``(seed, position, token)``: repeatable per request
  whatever batch it shares, and no per-request host read. The step writes each slot's next token and
  position itself, so the next step's inputs never leave the GPU.
- **The host reads the tokens one step late.** The sampled ids are copied into a pinned buffer after
  each step; the engine launches step N+1 before it waits for step N's ids, so the GPU always has the
  next step queued while the host streams tokens out. A request that hit EOS at step N has had one
  extra token computed at N+1, which is dropped.
- **Prompts prefilled together**, right-padded into one ``[batch, longest]`` forward.
- **Decode as CUDA graphs** (``cuda_graphs=True``, the default on CUDA): one graph per padded batch
  size (1, 2, 4, 8, ...) and attention length (128, 256, ... ``max_seq``), captured at
  :meth:`GraphEngine.warm_up` (or lazily), replayed with one launch per step. Padded rows read and
  write the model's scratch slot.
- **torch.compile** (``compile=True``): each layer's decode and the final norm, output projection and
  sampler go through ``torch.compile`` (inductor fuses the norms, rotary embedding, SwiGLU and the
  sampler's elementwise work) before capture. One compiled function serves every layer: the weights
  are its arguments, so inductor compiles a layer once (twice: batch 1 is specialised).
- **Fused decode attention** (``attention="triton"``, the default under ``compile`` on CUDA with Triton):
  two Triton kernels per layer read each row's keys and values from the KV cache in place
  (:mod:`perfsdk.demo.attention_triton`), where the torch version gathers the rows' caches and runs five
  kernels more — the fusion inductor cannot do, since the gather is by slot. Checked against the torch
  version on the engine's head shape first; never used where it disagrees.
- **int8 weights** come from :func:`perfsdk.demo.quant.quantize_int8` on the model; this engine runs
  whatever linear layers the model has.

::

    from perfsdk.demo.graph_engine import GraphEngine

    engine = GraphEngine(model, monitor=mon, compile=True)   # model: a Transformer on CUDA
    engine.warm_up()                                          # compile and capture before serving
    with engine:
        ...                                                   # the same API as Engine

On a CPU there are no CUDA graphs: ``cuda_graphs`` is off and the same static step runs eagerly (every
other change above still applies). perfsdk's ``decode`` phase wraps each graph replay, never the
capture (a capture runs no kernels).

Why this module is over 500 lines: one engine whose step is captured as CUDA graphs per batch bucket; the
static buffers, the capture and the replay must agree on every tensor's shape and address, which reads best
in one place (the fused kernels it calls live in :mod:`perfsdk.demo.attention_triton` and
:mod:`perfsdk.demo.int8_triton`).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from perfsdk.demo.engine import Engine, GenerationHandle, _null_phase
from perfsdk.demo.model import Transformer, apply_rope, rms_norm
from perfsdk.demo.quant import Int8Linear, int8_linear
from perfsdk.demo.tokenizer import EOS_ID, printable_token_ids
from perfsdk.errors import ConfigError

__all__ = ["GraphEngine", "sample_tokens"]

log = logging.getLogger(__name__)

_M32 = 0xFFFFFFFF
# multipliers below 2**31, so that a 32-bit value times one stays inside int64 on every backend
_K1, _K2, _K3, _K4 = 0x7FEB352D, 0x5BD1E995, 0x27D4EB2D, 0x165667B1


def _mix32(h: Tensor) -> Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) on int64 tensors holding values in [0, 2**32)."""
    h = h ^ (h >> 16)
    h = (h * _K1) & _M32
    h = h ^ (h >> 15)
    h = (h * _K2) & _M32
    return h ^ (h >> 16)


def _uniform(seed: Tensor, position: Tensor, n: int) -> Tensor:
    """Uniform noise in (0, 1), ``[B, n]``, a pure function of each row's seed and position."""
    s = (seed & _M32) ^ ((seed >> 32) & _M32)
    row = _mix32((_mix32(s) + position * _K3) & _M32)
    col = torch.arange(n, device=seed.device, dtype=torch.int64)
    h = _mix32((row[:, None] + col[None, :] * _K4) & _M32)
    return ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def sample_tokens(
    logits: Tensor,
    allowed: Tensor,
    eos_column: int,
    temperature: Tensor,
    seed: Tensor,
    position: Tensor,
    no_eos: Tensor,
) -> Tensor:
    """Pick one token per row of ``logits [B, vocab]`` among the ids in ``allowed``, on the device.

    ``temperature[b] == 0`` is greedy; otherwise the Gumbel-max trick (argmax of logits / t plus
    Gumbel noise) draws from ``softmax(logits / t)`` over the allowed ids, with noise that depends only
    on ``(seed[b], position[b])``. ``no_eos[b]`` forbids EOS (its column in ``allowed`` is
    *eos_column*). No host synchronisation, no data-dependent shapes: CUDA-graph and compile safe.
    """
    z = logits.index_select(1, allowed).float()
    cols = torch.arange(z.shape[1], device=z.device)
    z = z.masked_fill(no_eos[:, None] & (cols == eos_column)[None, :], float("-inf"))
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    gumbel = -torch.log(-torch.log(_uniform(seed, position, z.shape[1])))
    choice = torch.where(greedy, z.argmax(dim=-1), (z / t[:, None] + gumbel).argmax(dim=-1))
    return allowed[choice]


class _LayerWeights(NamedTuple):
    """One layer's tensors, passed to the (compiled) layer function as arguments."""

    attn_norm: Tensor
    wqkv: Tensor
    wqkv_scale: Tensor | None
    wo: Tensor
    wo_scale: Tensor | None
    ffn_norm: Tensor
    w13: Tensor
    w13_scale: Tensor | None
    w2: Tensor
    w2_scale: Tensor | None
    k_cache: Tensor
    v_cache: Tensor


class _Shape(NamedTuple):
    n_head: int
    n_kv_head: int
    head_dim: int
    eps: float
    int8_kernel: str
    attention: str = "torch"


def _linear(x: Tensor, w: Tensor, scale: Tensor | None, kernel: str) -> Tensor:
    return F.linear(x, w) if scale is None else int8_linear(x, w, scale, kernel=kernel)


def _weights(mod: Any) -> tuple[Tensor, Tensor | None]:
    if isinstance(mod, Int8Linear):
        return mod.weight, mod.scale
    w: Tensor = mod.weight
    return w, None


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """One query per row over its own keys: ``q [B, 1, H, D]``, ``keys/values [B, KV, L, D]``, ``mask [B, L]``.

    Grouped-query attention as two batched matrix products per KV head, ``[rep, D] @ [D, L]``: the keys
    are read once, never expanded to every query head (SDPA's math fallback under a per-row mask
    repeats them ``H / KV`` times).
    """
    b, _, h, d = q.shape
    kv = keys.shape[1]
    qg = q.reshape(b, kv, h // kv, d)  # query head i uses KV head i // rep, as repeat_interleave does
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * (1.0 / math.sqrt(d))  # [B, KV, rep, L]
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).reshape(b, 1, h * d)


def decode_layer(
    x: Tensor, lw: _LayerWeights, cos: Tensor, sin: Tensor, slots: Tensor, pos: Tensor, mask: Tensor, shape: _Shape
) -> Tensor:
    """One transformer layer for one new token per row: ``x [B, 1, dim]``; writes this token's K/V."""
    hd, nh, nkv = shape.head_dim, shape.n_head, shape.n_kv_head
    h = rms_norm(x, lw.attn_norm, shape.eps)
    qkv = _linear(h, lw.wqkv, lw.wqkv_scale, shape.int8_kernel)
    q, k, v = torch.split(qkv, [nh * hd, nkv * hd, nkv * hd], dim=-1)
    b = x.shape[0]
    q = apply_rope(q.view(b, 1, nh, hd), cos, sin)
    k = apply_rope(k.view(b, 1, nkv, hd), cos, sin)
    v = v.view(b, 1, nkv, hd)
    lw.k_cache[slots, :, pos] = k[:, 0]
    lw.v_cache[slots, :, pos] = v[:, 0]
    if shape.attention == "triton":
        from perfsdk.demo.attention_triton import attention_op

        a = attention_op()(q, lw.k_cache, lw.v_cache, slots, mask)
    else:
        length = mask.shape[-1]
        keys, values = lw.k_cache[slots, :, :length], lw.v_cache[slots, :, :length]  # [B, KV, L, D]
        a = decode_attention(q, keys, values, mask)
    x = x + _linear(a, lw.wo, lw.wo_scale, shape.int8_kernel)
    h = rms_norm(x, lw.ffn_norm, shape.eps)
    gate, up = _linear(h, lw.w13, lw.w13_scale, shape.int8_kernel).chunk(2, dim=-1)
    return x + _linear(F.silu(gate) * up, lw.w2, lw.w2_scale, shape.int8_kernel)


def head_and_sample(
    x: Tensor,
    norm: Tensor,
    out_w: Tensor,
    out_scale: Tensor | None,
    allowed: Tensor,
    temperature: Tensor,
    seed: Tensor,
    position: Tensor,
    no_eos: Tensor,
    shape: _Shape,
) -> Tensor:
    """Final norm, output projection and :func:`sample_tokens` for ``x [B, 1, dim]``."""
    logits = _linear(rms_norm(x, norm, shape.eps), out_w, out_scale, shape.int8_kernel)[:, 0]
    return sample_tokens(logits, allowed, len(allowed) - 1, temperature, seed, position, no_eos)


def _raise_recompile_limit(n: int) -> None:
    """Let dynamo keep *n* compiled versions of the step (bf16 and int8, several model sizes, batch 1).

    Past its limit (8 by default) dynamo silently runs the function eagerly: a ladder of two model
    sizes reaches that, and the compiled rungs would quietly measure eager steps.
    """
    import torch._dynamo.config as dc

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(dc, name) and getattr(dc, name) < n:
            setattr(dc, name, n)
            break


@dataclass
class _Pending:
    """Tokens of one enqueued step on their way to the host."""

    handles: list[GenerationHandle]
    host: Tensor
    event: Any  # torch.cuda.Event, or None on a CPU (the copy is already done)

    def wait(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        out: list[int] = self.host.tolist()
        return out


def _pow2_buckets(low: int, high: int) -> list[int]:
    out, b = [], low
    while b < high:
        out.append(b)
        b *= 2
    return [*out, high]


class GraphEngine(Engine):
    """Continuous batching with static buffers, device sampling and (on CUDA) CUDA-graph decode steps.

    Args:
        model: the :class:`~perfsdk.demo.model.Transformer` (int8-quantised or not).
        cuda_graphs: capture decode steps as CUDA graphs (default: on CUDA). Needs a CUDA model.
        compile: run each layer and the sampler through ``torch.compile`` (inductor, default mode).
        int8_kernel: for int8 models on CUDA, ``"triton"`` (a fused int8 weight-only matmul for up to 64
            rows) or ``"torch"`` (dequantise then ``F.linear``; inductor fuses it under ``compile``);
            ``"auto"`` picks Triton where it is installed.
        attention: ``"triton"`` (fused decode attention, two kernels per layer reading the KV cache in place),
            ``"torch"`` (gather the rows' caches, then batched matmuls and a softmax), or ``"auto"``: Triton
            under ``compile`` on CUDA where Triton is installed and its kernel agrees with the torch version
            here (``attention_rejected`` says why not, when it does not).
        batch_sizes: padded batch sizes to capture (default 1, 2, 4, ... up to the slots).
        max_prefill_tokens: padded prompt tokens per prefill forward (longer admissions are split).
    """

    name = "graph"

    def __init__(
        self,
        model: Transformer,
        *,
        monitor: Any = None,
        seed: int = 0,
        max_batch_slots: int | None = None,
        idle_wait_s: float = 0.5,
        cuda_graphs: bool | None = None,
        compile: bool = False,
        int8_kernel: str = "auto",
        attention: str = "auto",
        batch_sizes: Sequence[int] | None = None,
        max_prefill_tokens: int = 8192,
    ) -> None:
        super().__init__(model, monitor=monitor, seed=seed, max_batch_slots=max_batch_slots, idle_wait_s=idle_wait_s)
        device = model.device
        self._cuda = device.type == "cuda"
        if cuda_graphs is None:
            cuda_graphs = self._cuda
        if cuda_graphs and not self._cuda:
            raise ConfigError("cuda_graphs: CUDA graphs need a model on a CUDA device")
        if int8_kernel not in ("auto", "triton", "torch"):
            raise ConfigError(f"int8_kernel: expected 'auto', 'triton' or 'torch', got {int8_kernel!r}")
        if max_prefill_tokens < model.max_seq:
            raise ConfigError(
                f"max_prefill_tokens must be at least max_seq ({model.max_seq}), got {max_prefill_tokens}"
            )
        self.cuda_graphs = cuda_graphs
        self.compiled = compile
        self.name = "compile" if compile else "graph"
        self._max_prefill_tokens = max_prefill_tokens
        if int8_kernel == "auto":
            from perfsdk.demo.quant import triton_available

            int8_kernel = "triton" if self._cuda and triton_available() else "torch"
        self.int8_kernel = int8_kernel
        args = model.args
        self._layers = [self._layer_weights(layer) for layer in model.layers]
        self.attention, self.attention_rejected = self._pick_attention(attention, compile, model)
        self._shape = _Shape(args.n_head, args.n_kv_head, args.head_dim, args.norm_eps, int8_kernel, self.attention)
        self._out_w, self._out_scale = _weights(model.output)
        self.quantized = self._out_scale is not None or any(lw.wqkv_scale is not None for lw in self._layers)
        if self.quantized:
            self.name = "int8"
            if int8_kernel == "triton" and self._cuda:
                from perfsdk.demo.quant import triton_op

                triton_op()  # registered now, not while torch.compile traces the first call

        rows = model.max_batch_slots + 1
        self._scratch = model.scratch_slot
        i64 = torch.int64
        self._slot_token = torch.zeros(rows, dtype=i64, device=device)
        self._slot_pos = torch.zeros(rows, dtype=i64, device=device)
        self._slot_seed = torch.zeros(rows, dtype=i64, device=device)
        self._slot_temp = torch.zeros(rows, dtype=torch.float32, device=device)
        self._slot_no_eos = torch.zeros(rows, dtype=torch.bool, device=device)
        # the sampler's vocabulary: printable ids, EOS last (sample_tokens masks its column)
        ids = [i for i in printable_token_ids() if i != EOS_ID] + [EOS_ID]
        self._allowed = torch.tensor(ids, dtype=torch.int64, device=device)

        if batch_sizes is None:
            batch_sizes = _pow2_buckets(1, self.max_batch_slots)
        sizes = sorted({int(b) for b in batch_sizes})
        if not sizes or sizes[0] < 1 or sizes[-1] < self.max_batch_slots:
            raise ConfigError(f"batch_sizes must cover 1..{self.max_batch_slots}, got {list(batch_sizes)}")
        self.batch_sizes = sizes
        self.lengths = _pow2_buckets(min(128, model.max_seq), model.max_seq)
        self._batch_slots = torch.full((sizes[-1],), self._scratch, dtype=i64, device=device)
        self._sampled = torch.zeros(sizes[-1], dtype=i64, device=device)
        self._last_slots: list[int] | None = None
        self._graphs: dict[tuple[int, int], Any] = {}
        self._pool: Any = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self._pending: deque[_Pending] = deque()
        self.capture_seconds = 0.0
        self.compile_seconds = 0.0  # first calls of the compiled functions (compilation), measured in warm_up

        shape = self._shape

        # the model's sizes reach the step as closure constants, so that inductor specialises on them;
        # only the batch and the attention length are dynamic
        def layer(
            x: Tensor, lw: _LayerWeights, cos: Tensor, sin: Tensor, slots: Tensor, pos: Tensor, mask: Tensor
        ) -> Tensor:
            return decode_layer(x, lw, cos, sin, slots, pos, mask, shape)

        def head(
            x: Tensor,
            norm: Tensor,
            out_w: Tensor,
            out_scale: Tensor | None,
            allowed: Tensor,
            temperature: Tensor,
            seed: Tensor,
            position: Tensor,
            no_eos: Tensor,
        ) -> Tensor:
            return head_and_sample(x, norm, out_w, out_scale, allowed, temperature, seed, position, no_eos, shape)

        self._layer_fn: Callable[..., Tensor] = layer
        self._head_fn: Callable[..., Tensor] = head
        if compile:
            _raise_recompile_limit(64)
            # dynamic: one compiled layer for every padded batch and attention length (batch 1 is
            # specialised once more); the weights are arguments, so all layers share it
            self._layer_fn = torch.compile(layer, dynamic=True)
            self._head_fn = torch.compile(head, dynamic=True)

    def _pick_attention(self, attention: str, compiled: bool, model: Transformer) -> tuple[str, str | None]:
        """The decode attention to use, and why the fused one is not used when it is not."""
        if attention not in ("auto", "triton", "torch"):
            raise ConfigError(f"attention: expected 'auto', 'triton' or 'torch', got {attention!r}")
        if attention == "torch" or (attention == "auto" and not compiled):
            return "torch", None
        from perfsdk.demo.quant import triton_available

        if not (self._cuda and triton_available()):
            why = "needs CUDA and Triton"
            if attention == "triton":
                raise ConfigError(f"attention='triton' {why}")
            return "torch", why
        from perfsdk.demo.attention_triton import attention_op, check

        args = model.args
        dtype = self._layers[0].k_cache.dtype if self._layers else torch.bfloat16
        wrong = check(decode_attention, args.n_head, args.n_kv_head, args.head_dim, dtype, model.device)
        if wrong is not None:
            if attention == "triton":
                raise ConfigError(f"attention='triton': the fused kernel is wrong on this GPU: {wrong}")
            log.warning("perfsdk demo: fused decode attention not used: %s", wrong)
            return "torch", wrong
        attention_op()  # registered now, not while torch.compile traces the first call
        return "triton", None

    @staticmethod
    def _layer_weights(layer: Any) -> _LayerWeights:
        att, ffn = layer.attention, layer.feed_forward
        wqkv, sqkv = _weights(att.wqkv)
        wo, so = _weights(att.wo)
        w13, s13 = _weights(ffn.w13)
        w2, s2 = _weights(ffn.w2)
        return _LayerWeights(
            layer.attention_norm.weight,
            wqkv,
            sqkv,
            wo,
            so,
            layer.ffn_norm.weight,
            w13,
            s13,
            w2,
            s2,
            att.k_cache,
            att.v_cache,
        )

    # ---- the step functions ----------------------------------------------------------------------

    def _decode_fn(self, b: int, length: int) -> None:
        """One decode step for ``batch_slots[:b]`` over ``length`` cache rows, all on the device."""
        m = self.model
        slots = self._batch_slots[:b]
        pos = self._slot_pos[slots]
        x = F.embedding(self._slot_token[slots], m.tok_embeddings.weight)[:, None]
        cos = m.rope_cos[pos][:, None, None, :]
        sin = m.rope_sin[pos][:, None, None, :]
        mask = torch.arange(length, device=pos.device)[None, :] <= pos[:, None]
        for lw in self._layers:
            x = self._layer_fn(x, lw, cos, sin, slots, pos, mask)
        nxt = self._head_fn(
            x,
            m.norm.weight,
            self._out_w,
            self._out_scale,
            self._allowed,
            self._slot_temp[slots],
            self._slot_seed[slots],
            pos + 1,
            self._slot_no_eos[slots],
        )
        self._slot_token[slots] = nxt
        # the scratch slot stays at position 0 however many padded steps it takes
        self._slot_pos[slots] = torch.where(slots == self._scratch, torch.zeros_like(pos), pos + 1)
        self._sampled[:b] = nxt

    def _bucket(self, n: int, buckets: list[int]) -> int:
        for b in buckets:
            if b >= n:
                return b
        raise ConfigError(f"{n} exceeds the largest bucket {buckets[-1]}")

    def _runner(self, b: int, length: int) -> Callable[[], None]:
        """The replay of the captured (b, length) graph, capturing it first if needed; eager without graphs."""
        if not self.cuda_graphs:
            return lambda: self._decode_fn(b, length)
        g = self._graphs.get((b, length))
        if g is None:
            g = self._capture(b, length)
        replay: Callable[[], None] = g.replay
        return replay

    def _capture(self, b: int, length: int) -> Any:
        t0 = time.perf_counter()
        self._batch_slots[:b].fill_(self._scratch)  # warm-up and capture touch only the scratch slot
        self._last_slots = None
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up off the capture: cuBLAS handles, autotuning, compilation
            for _ in range(2):
                self._decode_fn(b, length)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        # thread_local: perfsdk's collector and the HTTP threads keep making CUDA calls meanwhile
        with torch.cuda.graph(g, pool=self._pool, capture_error_mode="thread_local"):
            self._decode_fn(b, length)
        self._graphs[(b, length)] = g
        self.capture_seconds += time.perf_counter() - t0
        return g

    @property
    def graph_count(self) -> int:
        """CUDA graphs captured so far: one per (padded batch, attention length) replayed; 0 without graphs."""
        return len(self._graphs)

    @torch.inference_mode()
    def warm_up(self, max_length: int | None = None) -> None:
        """Compile and capture every (padded batch, attention length) step up to *max_length* rows.

        Without it the first step of each shape compiles or captures when it first occurs (a stall
        of that one step, outside perfsdk's timed phase). Call it before serving, from any thread.
        """
        lengths = [n for n in self.lengths if max_length is None or n <= self._bucket(max_length, self.lengths)]
        t0 = time.perf_counter()
        if self.compiled:  # compilation happens at the first call of each specialisation; count it apart
            for b in sorted({self.batch_sizes[0], self.batch_sizes[-1]}):
                self._batch_slots[:b].fill_(self._scratch)
                self._decode_fn(b, lengths[0])
            if self._cuda:
                torch.cuda.synchronize()
            self.compile_seconds = time.perf_counter() - t0
        self._warm_prefill()
        if self.cuda_graphs:
            for b in self.batch_sizes:
                for n in lengths:
                    if (b, n) not in self._graphs:
                        self._capture(b, n)
            torch.cuda.synchronize()
        self._last_slots = None

    def _warm_prefill(self) -> None:
        """A one-token prefill into the scratch slot: first-call costs out of the first request's TTFT."""
        m = self.model
        dev = m.device
        slots = torch.tensor([self._scratch], device=dev)
        m.prefill_batch(
            torch.zeros(1, 1, dtype=torch.long, device=dev), torch.ones(1, dtype=torch.long, device=dev), slots
        )
        self._slot_pos[self._scratch] = 0

    # ---- the engine loop -------------------------------------------------------------------------

    def _step(self) -> None:
        self._reap_cancelled()
        admitted = self._admit()
        if admitted:
            for group in self._prefill_groups(admitted):
                self._isolated(self._prefill, group)
        batch = [h for h in self._running if not h.engine_done and h.scheduled < h.params.max_tokens]
        if batch:
            self._isolated(self._decode, batch)
        # keep the step just launched in flight; emit what is older (all of it when nothing was launched)
        self._drain(keep=1 if batch else 0)

    def _prefill_groups(self, admitted: list[GenerationHandle]) -> list[list[GenerationHandle]]:
        groups: list[list[GenerationHandle]] = []
        for h in sorted(admitted, key=lambda h: h.prompt_tokens):
            if groups and (len(groups[-1]) + 1) * h.prompt_tokens <= self._max_prefill_tokens:
                groups[-1].append(h)
            else:
                groups.append([h])
        return groups

    def _to_device(self, values: list[int] | list[float] | list[bool], dtype: torch.dtype) -> Tensor:
        cpu = torch.tensor(values, dtype=dtype, pin_memory=self._cuda)
        return cpu.to(self.model.device, non_blocking=True)

    def _to_host(self, src: Tensor, n: int, handles: list[GenerationHandle]) -> _Pending:
        if not self._cuda:
            return _Pending(handles, src[:n].clone(), None)
        host = torch.empty(n, dtype=src.dtype, pin_memory=True)
        host.copy_(src[:n], non_blocking=True)
        ev = torch.cuda.Event()  # type: ignore[no-untyped-call]
        ev.record()
        return _Pending(handles, host, ev)

    def _prefill(self, group: list[GenerationHandle]) -> None:
        lens = [h.prompt_tokens for h in group]
        width = max(lens)
        rows = [h.prompt_ids + [0] * (width - len(h.prompt_ids)) for h in group]
        slots_list = [h.slot for h in group]
        assert all(s is not None for s in slots_list)
        tokens = self._to_device(rows, torch.long)  # type: ignore[arg-type]
        lengths = self._to_device(lens, torch.long)
        slots = self._to_device(slots_list, torch.long)  # type: ignore[arg-type]
        temps = self._to_device([float(h.params.temperature) for h in group], torch.float32)
        seeds = self._to_device([self._seed_for(h) for h in group], torch.int64)
        no_eos = self._to_device([h.params.ignore_eos for h in group], torch.bool)
        t0 = time.perf_counter()
        with self._prefill_phase(tokens=sum(lens), batch=len(group), seq_lens=lens):
            logits = self.model.prefill_batch(tokens, lengths, slots)
            first = sample_tokens(logits, self._allowed, len(self._allowed) - 1, temps, seeds, lengths, no_eos)
            self._slot_token[slots] = first
            self._slot_pos[slots] = lengths
            self._slot_temp[slots] = temps
            self._slot_seed[slots] = seeds
            self._slot_no_eos[slots] = no_eos
        self.stats.prefill_seconds += time.perf_counter() - t0
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(lens)
        for h in group:
            h.cache_len = h.prompt_tokens
            h.scheduled = 1
        self._pending.append(self._to_host(first, len(group), list(group)))

    def _seed_for(self, h: GenerationHandle) -> int:
        seed = h.params.seed if h.params.seed is not None else self._seed * 1_000_003 + int(h.request_id)
        return ((seed + 2**63) % 2**64) - 2**63  # torch's seeds run to 2**64 - 1; int64 holds the same bits

    def _decode(self, batch: list[GenerationHandle]) -> None:
        b = len(batch)
        positions = [h.cache_len for h in batch]
        if self.cuda_graphs:
            bp, length = self._bucket(b, self.batch_sizes), self._bucket(max(positions) + 1, self.lengths)
        else:  # no graphs, no padding: the exact shapes
            bp, length = b, max(positions) + 1
        run = self._runner(bp, length)  # may capture, which borrows batch_slots: before the copy below
        slots = [h.slot for h in batch] + [self._scratch] * (bp - b)
        if slots != self._last_slots:
            self._batch_slots[:bp].copy_(self._to_device(slots, torch.long))  # type: ignore[arg-type]
            self._last_slots = slots  # type: ignore[assignment]
        context = sum(positions) + b
        t0 = time.perf_counter()
        with self._decode_phase(batch=b, context_tokens=context):
            run()
        self.stats.decode_seconds += time.perf_counter() - t0
        self.stats.decode_steps += 1
        self.stats.decode_context_tokens += context
        self.stats.batch_sizes.append(b)
        for h in batch:
            h.cache_len += 1
            h.scheduled += 1
        self._pending.append(self._to_host(self._sampled, b, list(batch)))

    def _drain(self, keep: int) -> None:
        while len(self._pending) > keep:
            p = self._pending.popleft()
            for h, token in zip(p.handles, p.wait(), strict=True):
                if not h.engine_done:  # finished (EOS, cancel) while this step was in flight: dropped
                    self._emit(h, token)

    def _abort_all(self) -> None:
        self._pending.clear()
        super()._abort_all()

    # ---- outside serving -------------------------------------------------------------------------

    @torch.inference_mode()
    def time_decode(self, batch: int, context: int, steps: int = 32, phase: Callable[..., Any] | None = None) -> float:
        """Run *steps* decode steps as the serving loop does (see :meth:`Engine.time_decode`)."""
        b, p0 = self._timing_shape(batch, context, steps)
        phase = phase or _null_phase
        if self.cuda_graphs:
            bp, length = self._bucket(b, self.batch_sizes), self._bucket(p0 + steps, self.lengths)
        else:
            bp, length = b, p0 + steps
        run = self._runner(bp, length)
        slots = [*range(b), *[self._scratch] * (bp - b)]
        self._batch_slots[:bp].copy_(self._to_device(slots, torch.long))
        self._last_slots = None
        self._slot_pos[:b] = p0
        self._slot_token[:b] = ord("a")
        self._slot_temp[:b] = 0.0
        pending: deque[_Pending] = deque()
        t0 = time.perf_counter()
        for i in range(steps):
            with phase(batch=b, context_tokens=b * (p0 + i + 1)):
                run()
            pending.append(self._to_host(self._sampled, b, []))
            while len(pending) > 1:
                pending.popleft().wait()
        while pending:
            pending.popleft().wait()
        return (time.perf_counter() - t0) / steps
