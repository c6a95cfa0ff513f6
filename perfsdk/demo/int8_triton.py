"""A fused int8 weight-only matrix multiply (W8A16) in Triton, for decode-sized inputs on CUDA.

``out[m, n] = scale[n] × Σ_k x[m, k] × q[n, k]`` with ``x`` bf16/fp16 ``[M, K]`` (M ≤ 64), ``q`` int8
``[N, K]`` and one scale per output channel. Each program owns ``BLOCK_N`` output channels for every row:
it streams its int8 weight tiles once, converts them to the activations' dtype in registers, multiplies on
the tensor cores (rows padded to 16, 32 or 64: free when the weight read is the cost) and scales the fp32
accumulator at the end. So a decode step reads one byte per weight, not the three of an eager
dequantise-then-matmul (read int8, write bf16, read bf16).

Used through :func:`perfsdk.demo.quant.int8_linear`; imported only where Triton and a GPU are present.
The tile shape is picked once per (N, K, rows bucket) by timing a few candidates (outside any graph
capture: :meth:`perfsdk.demo.graph_engine.GraphEngine.warm_up` runs every shape first).
"""

import threading
from typing import Any

import torch
import triton
import triton.language as tl

__all__ = ["CONFIGS", "chosen_configs", "w8a16_mm"]

#: Candidate (BLOCK_N, BLOCK_K, num_warps, num_stages). Small BLOCK_N keeps the 132 SMs of an H200 busy
#: on 4096-wide outputs; larger ones cut per-program overhead on the wide MLP and vocabulary projections.
CONFIGS: tuple[tuple[int, int, int, int], ...] = (
    (16, 256, 4, 4),
    (32, 256, 4, 4),
    (32, 128, 4, 5),
    (64, 128, 4, 4),
    (64, 256, 8, 3),
    (128, 128, 8, 3),
)

_chosen: dict[tuple[int, int, int], tuple[int, int, int, int]] = {}
_lock = threading.Lock()


# No `from __future__ import annotations` in this file: Triton reads the kernel's annotations (tl.constexpr).
@triton.jit
def _w8a16_kernel(
    x_ptr, w_ptr, s_ptr, o_ptr, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
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
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_ptr + rn[None, :] * stride_wn + (k0 + rk)[:, None],
                    mask=n_ok[None, :] & k_ok[:, None], other=0)
        acc = tl.dot(x, w.to(x.dtype), acc)
    scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0).to(tl.float32)
    out = acc * scale[None, :]
    tl.store(o_ptr + rm[:, None] * stride_om + rn[None, :], out.to(o_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def _launch(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor, block_m: int,
            cfg: tuple[int, int, int, int]) -> None:
    m, k = x.shape
    n = w.shape[0]
    bn, bk, warps, stages = cfg
    _w8a16_kernel[(triton.cdiv(n, bn),)](
        x, w, s, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=stages,
    )


def _pick(x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, out: torch.Tensor, block_m: int
          ) -> tuple[int, int, int, int]:
    key = (int(w.shape[0]), int(w.shape[1]), block_m)
    cfg = _chosen.get(key)
    if cfg is not None:
        return cfg
    if torch.cuda.is_current_stream_capturing():  # no timing inside a capture: take the first candidate
        return CONFIGS[0]
    with _lock:
        best: tuple[float, tuple[int, int, int, int]] | None = None
        for cand in CONFIGS:
            try:
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
        cfg = best[1] if best is not None else CONFIGS[0]
        _chosen[key] = cfg
    return cfg


def chosen_configs() -> dict[str, Any]:
    """The tile shape picked for each ``N×K`` weight and rows bucket so far (for benchmark logs)."""
    return {f"{n}x{k}/m{m}": list(cfg) for (n, k, m), cfg in _chosen.items()}


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
