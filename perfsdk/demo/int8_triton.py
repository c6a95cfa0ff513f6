"""A fused int8 weight-only matrix multiply (W8A16) in Triton, for decode-sized inputs on CUDA.

``out[m, n] = scale[n] × Σ_k x[m, k] × q[n, k]`` with ``x`` bf16/fp16 ``[M, K]`` (M ≤ 64), ``q`` int8
``[N, K]`` and one scale per output channel. Two kernels, both reading each weight once, as int8:

- ``mma``: each program owns ``BLOCK_N`` output channels for every row: it streams its int8 weight
  tiles, converts them to the activations' dtype in registers, multiplies on the tensor cores (rows
  padded to 16, 32 or 64: free when the weight read is the cost) and scales the fp32 accumulator;
- ``gemv`` (one row, batch-1 decode): no tensor cores, so no shared-memory round trip for the
  converted tile: each program multiplies its ``[BLOCK_N, BLOCK_K]`` int8 tiles by the row in fp32
  registers and reduces once at the end, a plain streaming read.

So a decode step reads one byte per weight, not the three of an eager dequantise-then-matmul (read int8,
write bf16, read bf16). Used through :func:`perfsdk.demo.quant.int8_linear`; imported only where Triton
and a GPU are present. The kernel and tile shape are picked once per (N, K, rows bucket) by timing the
candidates, after checking each against a float32 reference (a candidate that is wrong on this GPU is
never used); outside any graph capture: :meth:`perfsdk.demo.graph_engine.GraphEngine.warm_up` runs
every shape first.
"""

import threading
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["CONFIGS", "chosen_configs", "w8a16_mm"]

#: Candidate (kernel, BLOCK_N, BLOCK_K, num_warps, num_stages). Small BLOCK_N keeps the 132 SMs of an H200
#: busy on 4096-wide outputs; larger ones cut per-program overhead on the wide MLP and vocabulary projections.
CONFIGS: tuple[tuple[str, int, int, int, int], ...] = (
    ("mma", 16, 256, 4, 4),
    ("mma", 32, 256, 4, 4),
    ("mma", 32, 128, 4, 5),
    ("mma", 64, 128, 4, 4),
    ("mma", 64, 256, 8, 3),
    ("mma", 128, 128, 8, 3),
)
#: The one-row kernel's candidates (tried for M == 1 only, beside the tensor-core ones).
GEMV_CONFIGS: tuple[tuple[str, int, int, int, int], ...] = (
    ("gemv", 16, 256, 4, 3),
    ("gemv", 8, 512, 4, 3),
    ("gemv", 32, 128, 4, 4),
    ("gemv", 4, 1024, 4, 2),
)

_chosen: dict[tuple[int, int, int], tuple[str, int, int, int, int]] = {}
_rejected: list[str] = []
_lock = threading.Lock()


# No `from __future__ import annotations` in this file: Triton reads the kernel's annotations (tl.constexpr).
@triton.jit
def _w8a16_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    o_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + (k0 + rk)[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0)
        acc = tl.dot(x, w.to(x.dtype), acc)
    scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    out = acc * scale[None, :]
    tl.store(
        o_ptr + rm[:, None] * stride_om + rn[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=m_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _w8a16_gemv_kernel(x_ptr, w_ptr, s_ptr, o_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    n_ok = rn < N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = (k0 + rk) < K
        w = tl.load(w_ptr + rn[:, None] * K + (k0 + rk)[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
        x = tl.load(x_ptr + k0 + rk, mask=k_ok, other=0.0)
        acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
    scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    out = tl.sum(acc, axis=1) * scale
    tl.store(o_ptr + rn, out.to(o_ptr.dtype.element_ty), mask=n_ok)


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    s: torch.Tensor,
    out: torch.Tensor,
    block_m: int,
    cfg: tuple[str, int, int, int, int],
) -> None:
    m, k = x.shape
    n = w.shape[0]
    kind, bn, bk, warps, stages = cfg
    if kind == "gemv":  # one row; weight, row and output contiguous
        _w8a16_gemv_kernel[(triton.cdiv(n, bn),)](
            x, w, s, out, n, k, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages
        )
        return
    _w8a16_kernel[(triton.cdiv(n, bn),)](
        x,
        w,
        s,
        out,
        m,
        n,
        k,
        x.stride(0),
        w.stride(0),
        out.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=bn,
        BLOCK_K=bk,
        num_warps=warps,
        num_stages=stages,
    )


def _pick(
    x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor, block_m: int
) -> tuple[str, int, int, int, int]:
    m = int(x.shape[0])
    key = (int(w.shape[0]), int(w.shape[1]), 1 if m == 1 else block_m)
    cfg = _chosen.get(key)
    if cfg is not None:
        return cfg
    if torch.cuda.is_current_stream_capturing():  # no timing inside a capture: take the first candidate
        return CONFIGS[0]
    with _lock:
        ref = (x.float() @ w.float().T) * s.float()  # once per shape: every candidate is checked against it
        best: tuple[float, tuple[str, int, int, int, int]] | None = None
        for cand in (GEMV_CONFIGS + CONFIGS) if m == 1 and w.is_contiguous() else CONFIGS:
            try:
                out.fill_(float("nan"))
                _launch(x, w, s, out, block_m, cand)
                err = float((out.float() - ref).norm() / ref.norm().clamp(min=1e-30))
                if not err < 1e-2:  # NaN fails too: an output element left unwritten
                    _rejected.append(f"{cand} on {key}: relative error {err:.3g}")
                    continue
                for _ in range(2):
                    _launch(x, w, s, out, block_m, cand)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    _launch(x, w, s, out, block_m, cand)
                end.record()
                end.synchronize()
                ms = start.elapsed_time(end) / 5
            except Exception:  # a candidate that does not fit this GPU (shared memory): skip it
                continue
            if best is None or ms < best[0]:
                best = (ms, cand)
        del ref
        if best is None:
            raise RuntimeError(f"w8a16_mm: no kernel candidate is correct for {key} on this GPU: {_rejected[-3:]}")
        cfg = best[1]
        _chosen[key] = cfg
    return cfg


def chosen_configs() -> dict[str, Any]:
    """The kernel and tile shape picked for each ``N×K`` weight and rows bucket so far, and any rejected."""
    out: dict[str, Any] = {f"{n}x{k}/m{m}": list(cfg) for (n, k, m), cfg in _chosen.items()}
    if _rejected:
        out["rejected"] = list(_rejected)
    return out


def w8a16_mm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x [M, K] @ (weight int8 [N, K] × scale [N])ᵀ`` → ``[M, N]`` in x's dtype, for M ≤ 64."""
    m = x.shape[0]
    if m > 64:
        raise ValueError(f"w8a16_mm: at most 64 rows, got {m}")
    x = x.contiguous()
    out = torch.empty((m, weight.shape[0]), dtype=x.dtype, device=x.device)
    block_m = 16 if m <= 16 else 32 if m <= 32 else 64
    _launch(x, weight, scale, out, block_m, _pick(x, weight, scale, out, block_m))
    return out
