"""Fused decode attention in Triton: two kernels per layer read each row's keys and values straight from
the KV cache, for CUDA.

``decode_attention(q, k_cache, v_cache, slots, mask)`` computes, for every row ``b`` and query head ``h``,
``softmax(q[b, h] · K[slots[b], h // rep, :L]ᵀ / √D, masked by mask[b]) · V[slots[b], h // rep, :L]`` —
what :func:`perfsdk.demo.graph_engine.decode_attention` computes after gathering the rows' caches with
``k_cache[slots, :, :L]``. The torch version is five or six kernels per layer (two gathers that copy the
cache, two batched matrix products, the mask and the softmax); at batch 1 on a 1B model each is a few µs
of mostly fixed cost, and 22 layers of them are a tenth of the step. Here two kernels (flash-decoding):
one program per (row, KV head, chunk of positions) reads that chunk's keys and values once, straight
from the cache, and computes a partial softmax (fp32) for the ``rep`` query heads that share them (padded
to 16 rows for the tensor cores); a second kernel combines the chunks. No gather, no copy.

Used by :class:`perfsdk.demo.graph_engine.GraphEngine` (``attention="triton"``, the default of its
``compile`` rung on CUDA with Triton) through the custom op :func:`attention_op`, so that
``torch.compile`` treats it as one opaque call and CUDA graphs capture it. The engine checks it against the
torch version on its own shapes before using it (:func:`check`); a kernel that is wrong on this GPU is
never used. Imported only where Triton and a GPU are present.
"""

import math
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["attention_op", "check", "fused_decode_attention"]


# No `from __future__ import annotations` in this file: Triton reads the kernel's annotations (tl.constexpr).
@triton.jit
def _partial_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    slot_ptr,
    mask_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    L,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_kl,
    stride_vs,
    stride_vh,
    stride_vl,
    stride_mb,
    H,
    S,
    REP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    CHUNK: tl.constexpr,
    D: tl.constexpr,
):
    """One (row, KV head, chunk of CHUNK positions): the chunk's max score, sum of exponentials and weighted
    values for each of the KV head's query heads."""
    b = tl.program_id(0)
    g = tl.program_id(1)
    c = tl.program_id(2)
    slot = tl.load(slot_ptr + b)
    rr = tl.arange(0, BLOCK_R)
    dd = tl.arange(0, D)
    rows_ok = rr < REP
    q = tl.load(
        q_ptr + b * stride_qb + (g * REP + rr)[:, None] * stride_qh + dd[None, :], mask=rows_ok[:, None], other=0.0
    )
    ll = c * CHUNK + tl.arange(0, CHUNK)
    valid = tl.load(mask_ptr + b * stride_mb + ll, mask=ll < L, other=0) != 0
    k = tl.load(
        k_ptr + slot * stride_ks + g * stride_kh + ll[:, None] * stride_kl + dd[None, :], mask=valid[:, None], other=0.0
    )
    v = tl.load(
        v_ptr + slot * stride_vs + g * stride_vh + ll[:, None] * stride_vl + dd[None, :], mask=valid[:, None], other=0.0
    )
    s = tl.dot(q, tl.trans(k)) * sm_scale  # [BLOCK_R, CHUNK], fp32
    s = tl.where(valid[None, :], s, float("-inf"))
    m = tl.max(s, 1)
    m_ref = tl.where(m == float("-inf"), 0.0, m)  # no valid key in this chunk: p is all 0
    p = tl.exp(s - m_ref[:, None])
    acc = tl.dot(p.to(v.dtype), v)  # [BLOCK_R, D], fp32
    heads = g * REP + rr
    part = (b * H + heads) * S + c
    tl.store(m_ptr + part, m, mask=rows_ok)
    tl.store(l_ptr + part, tl.sum(p, 1), mask=rows_ok)
    tl.store(acc_ptr + part[:, None] * D + dd[None, :], acc, mask=rows_ok[:, None])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, stride_ob, stride_oh, H, S, BLOCK_S: tl.constexpr, D: tl.constexpr):
    """One (row, query head): the chunks' partial softmaxes combined (rescaled to the largest max)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    cc = tl.arange(0, BLOCK_S)
    dd = tl.arange(0, D)
    ok = cc < S
    base = (b * H + h) * S
    m = tl.load(m_ptr + base + cc, mask=ok, other=float("-inf"))
    top = tl.max(m, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # no valid key at all (a padding row): the output is 0
    w = tl.where(ok & (m > float("-inf")), tl.exp(m - top), 0.0)
    den = tl.sum(w * tl.load(l_ptr + base + cc, mask=ok, other=0.0), 0)
    acc = tl.load(acc_ptr + (base + cc)[:, None] * D + dd[None, :], mask=ok[:, None], other=0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + dd, out.to(o_ptr.dtype.element_ty))


def fused_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``q [B, 1, H, D]``, caches ``[S, KV, Lmax, D]``, ``slots [B]``, ``mask [B, L]`` (bool) → ``[B, 1, H·D]``.

    Split over the positions (flash-decoding): at batch 1 a 1B model has 4 KV heads, so one program per
    head would leave all but 4 multiprocessors idle and walk 1,024 positions one dependent tile at a time;
    here every chunk of ``CHUNK`` positions is a program of its own, and a second small kernel combines them.
    """
    b, _, h, d = q.shape
    kv = k_cache.shape[1]
    rep = h // kv
    length = mask.shape[-1]
    chunk = 64 if b * kv * triton.cdiv(length, 64) <= 1024 else 256  # enough programs, not too many partials
    n_chunks = triton.cdiv(length, chunk)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("fused_decode_attention: the KV cache's last dimension must be contiguous")
    q3 = q.reshape(b, h, d)
    if q3.stride(-1) != 1:
        q3 = q3.contiguous()
    m = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    if m.stride(-1) != 1:
        m = m.contiguous()
    part_m = torch.empty(b, h, n_chunks, dtype=torch.float32, device=q.device)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(b, h, n_chunks, d, dtype=torch.float32, device=q.device)
    _partial_kernel[(b, kv, n_chunks)](
        q3,
        k_cache,
        v_cache,
        slots,
        m,
        part_m,
        part_l,
        part_acc,
        length,
        1.0 / math.sqrt(d),
        q3.stride(0),
        q3.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        m.stride(0),
        h,
        n_chunks,
        REP=rep,
        BLOCK_R=max(16, triton.next_power_of_2(rep)),
        CHUNK=chunk,
        D=d,
        num_warps=4,
    )
    out = torch.empty(b, h, d, dtype=q.dtype, device=q.device)
    _combine_kernel[(b, h)](
        part_m,
        part_l,
        part_acc,
        out,
        out.stride(0),
        out.stride(1),
        h,
        n_chunks,
        BLOCK_S=max(2, triton.next_power_of_2(n_chunks)),
        D=d,
        num_warps=1 if n_chunks <= 32 else 4,
    )  # a [chunks, D] fp32 tile in registers
    return out.reshape(b, 1, h * d)


def _op_impl(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    return fused_decode_attention(q, k_cache, v_cache, slots, mask)


def _op_fake(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    b, _, h, d = q.shape
    return q.new_empty(b, 1, h * d)


def attention_op() -> Any:
    """``perfsdk_demo::decode_attention``, registered on first use (importing this module registers nothing)."""
    from perfsdk.demo.custom_ops import custom_op_once

    return custom_op_once("perfsdk_demo::decode_attention", lambda: (_op_impl, _op_fake))


def check(reference: Any, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: Any) -> str | None:
    """Compare the kernel with *reference* (the torch decode attention) on random data of the engine's
    head shape, with both chunk sizes the kernel picks: rows with different valid lengths, a padding row with
    none, a shuffled slot order. Returns None when it agrees (relative error under 1 %), else why not."""
    gen = torch.Generator(device=device).manual_seed(0)
    # (rows, attention length): a small case (64-position chunks), and one with more than 1,024 programs of
    # 64 positions, where the kernel takes 256-position chunks
    cases = [(4, 200), (8, 64 * (1024 // (8 * kv_heads) + 1) + 37)]
    try:
        for b, length in cases:
            slots_n = b + 2
            k = torch.randn(slots_n, kv_heads, length + 19, head_dim, generator=gen, device=device).to(dtype)
            v = torch.randn(slots_n, kv_heads, length + 19, head_dim, generator=gen, device=device).to(dtype)
            q = torch.randn(b, 1, heads, head_dim, generator=gen, device=device).to(dtype)
            slots = torch.randperm(slots_n, generator=gen, device=device)[:b]
            lengths = torch.randint(1, length + 1, (b,), generator=gen, device=device)
            lengths[0], lengths[1], lengths[-1] = length, 1, 0  # full, one key, a padding row with none
            mask = torch.arange(length, device=device)[None, :] < lengths[:, None]
            out = fused_decode_attention(q, k, v, slots, mask).float()
            got = out[:-1]
            ref = reference(q, k[slots, :, :length], v[slots, :, :length], mask).float()[:-1]
            err = float((got - ref).norm() / ref.norm().clamp(min=1e-30))
            if not err < 1e-2:  # NaN fails too
                return f"relative error {err:.3g} against the torch decode attention ({b} rows, length {length})"
            pad = float(out[-1].abs().max())
            if pad != 0:
                return f"a row with no valid key gave {pad}, not 0"
    except Exception as e:  # a Triton that cannot build it here: the torch version serves
        return f"{type(e).__name__}: {e}"
    return None
