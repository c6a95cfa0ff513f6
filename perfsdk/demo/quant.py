"""Weight-only int8 for the demo model: int8 weights with one scale per output channel.

A decode step at small batch is a read of every weight; int8 halves the bytes of bf16, so the floor
(bytes / bandwidth) halves, *if* the matrix-vector products read the int8 bytes and nothing more::

    from perfsdk.demo.quant import quantize_int8

    before, after = quantize_int8(model)     # every nn.Linear -> Int8Linear, in place
    print(f"{before / 1e9:.2f} GB -> {after / 1e9:.2f} GB of linear weights")

``W ≈ scale[n] × q[n, k]`` with ``q`` in [-127, 127] and ``scale[n] = max_k |W[n, k]| / 127`` (symmetric,
per output channel, as gpt-fast's int8 mode). The embedding stays in its dtype: a lookup reads one row.

:func:`int8_linear` computes ``x @ (q × scale)ᵀ`` with one of two kernels:

- ``"torch"``: dequantise then ``F.linear``, i.e. ``F.linear(x, q.to(x.dtype)) * scale``. Eagerly that
  reads the int8 weight, writes a bf16 copy and reads it again: more bytes than bf16 alone. Under
  ``torch.compile`` inductor can fuse the conversion into a batch-1 matrix-vector reduction.
- ``"triton"`` (CUDA with Triton installed, up to 64 rows): one fused kernel that loads int8 tiles,
  converts them in registers, multiplies on the tensor cores and scales the fp32 accumulator: the weight
  is read once, as int8. Registered as the custom op ``perfsdk_demo::w8a16_mm`` so ``torch.compile``
  treats it as one opaque call and CUDA graphs capture it. Larger inputs (prefill) use ``"torch"``.

perfsdk's MBU follows the bytes: the demo's :class:`~perfsdk.ModelSpec` for a quantised model counts the
int8 weights and their scales (see :func:`perfsdk.demo.stack.demo_model_spec`).
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "TRITON_MAX_ROWS",
    "Int8Linear",
    "int8_linear",
    "quantize_int8",
    "quantize_weight",
    "triton_available",
    "triton_op",
]

#: Rows (tokens) up to which the Triton kernel runs; a decode batch is at most the KV-cache slots.
TRITON_MAX_ROWS = 64


def triton_available() -> bool:
    """True when Triton is importable and a CUDA device is visible."""
    return importlib.util.find_spec("triton") is not None and torch.cuda.is_available()


def quantize_weight(w: Tensor) -> tuple[Tensor, Tensor]:
    """``(q int8 [N, K], scale [N] in w's dtype)`` with ``w ≈ q × scale[:, None]``."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    q = torch.round(wf / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale.to(w.dtype)


class Int8Linear(nn.Module):
    """A bias-free linear layer with int8 weights (buffers: ``weight`` int8 ``[N, K]``, ``scale`` ``[N]``)."""

    def __init__(self, weight: Tensor, scale: Tensor, *, kernel: str = "auto") -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.weight: Tensor
        self.scale: Tensor
        self.kernel = kernel
        self.in_features = int(weight.shape[1])
        self.out_features = int(weight.shape[0])

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, kernel: str = "auto") -> Int8Linear:
        q, scale = quantize_weight(linear.weight.detach())
        return cls(q, scale, kernel=kernel)

    def forward(self, x: Tensor) -> Tensor:
        return int8_linear(x, self.weight, self.scale, kernel=self.kernel)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, kernel={self.kernel}"


def quantize_int8(model: nn.Module, *, kernel: str = "auto") -> tuple[int, int]:
    """Replace every ``nn.Linear`` of *model* by an :class:`Int8Linear`, in place.

    Returns the linear weights' bytes before and after (scales included). Each bf16 weight is freed
    as soon as its int8 copy exists, so the peak is one matrix more than the model.
    """
    before = after = 0
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    for parent, name in targets:
        child = getattr(parent, name)
        before += child.weight.numel() * child.weight.element_size()
        q = Int8Linear.from_linear(child, kernel=kernel)
        after += q.weight.numel() * q.weight.element_size() + q.scale.numel() * q.scale.element_size()
        setattr(parent, name, q)  # the last reference to the bf16 weight goes with the old module
        del child
    return before, after


def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, *, kernel: str = "auto") -> Tensor:
    """``x @ (weight × scale[:, None])ᵀ`` for int8 ``weight [N, K]``; see the module docstring for *kernel*."""
    rows = x.numel() // x.shape[-1]
    if kernel != "torch" and x.is_cuda and rows <= TRITON_MAX_ROWS and (kernel == "triton" or triton_available()):
        op = triton_op()
        out: Tensor = op(x.reshape(rows, x.shape[-1]), weight, scale)
        return out.reshape(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight.to(x.dtype)) * scale


def triton_op() -> Any:
    """``perfsdk_demo::w8a16_mm``, registered on first use (importing this module registers nothing)."""
    from perfsdk.demo.custom_ops import custom_op_once

    def build() -> tuple[Any, Any]:
        from perfsdk.demo.int8_triton import w8a16_mm

        def op(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
            return w8a16_mm(x, weight, scale)

        def fake(x: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
            return x.new_empty(x.shape[0], weight.shape[0])

        return op, fake

    return custom_op_once("perfsdk_demo::w8a16_mm", build)
