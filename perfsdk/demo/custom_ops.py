"""The demo's Triton kernels as torch custom ops, registered once, lazily.

``torch.compile`` and CUDA-graph capture see a custom op as one opaque call with a known output shape (its
"fake" implementation), so a Triton kernel inside a compiled layer is traced once and launched as is.
Registering happens on first use, not at import: importing the demo registers nothing, and a machine
without Triton never imports the kernels::

    op = custom_op_once("perfsdk_demo::my_kernel", lambda: (impl, fake))   # build() runs once
    out = op(x, w)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["custom_op_once"]

_ops: dict[str, Any] = {}
_lock = threading.Lock()


def custom_op_once(name: str, build: Callable[[], tuple[Callable[..., Any], Callable[..., Any]]]) -> Any:
    """The custom op *name*; the first call registers it from ``build() -> (impl, fake)`` (no mutated args)."""
    op = _ops.get(name)
    if op is not None:
        return op
    with _lock:
        op = _ops.get(name)
        if op is None:
            impl, fake = build()
            op = torch.library.custom_op(name, mutates_args=())(impl)
            op.register_fake(fake)
            _ops[name] = op
    return op
