"""What each kernel of a step took, and the bytes and FLOPs of its launching operator where Kineto
recorded the operator's input shapes (``record_shapes=True``): :class:`KernelTally` per kernel name,
:func:`gemm_work` for the matrix products, :class:`ShapeIndex` to find a launch's operator::

    from perfsdk.profiling.kernel_shapes import ShapeIndex, gemm_work, tally_kernels

    gemm_work("aten::mm", [[8, 4096], [4096, 4096]], ["c10::BFloat16"] * 2)   # (bytes, FLOPs)
    tallies = tally_kernels(trace, step_kernels, ShapeIndex(trace))          # {kernel name: KernelTally}
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from perfsdk.profiling.trace_model import Event, Trace

__all__ = ["KernelTally", "ShapeIndex", "gemm_work", "tally_kernels"]

# element sizes of the type names Kineto records ("Input type")
_ELEMENT_BYTES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "signed char": 1,
    "unsigned char": 1,
    "short int": 2,
    "int": 4,
    "long int": 8,
    "bool": 1,
    "c10::complex<float>": 8,
}


@dataclass(slots=True)
class KernelTally:
    """One kernel name within one step: time, launches, and the bytes and FLOPs of the launches whose
    operator's input shapes were recorded (``shaped_us`` is their time)."""

    us: float = 0.0
    calls: int = 0
    shaped_us: float = 0.0
    bytes: float = 0.0
    flops: float = 0.0


def _elem(t: str) -> int | None:
    return _ELEMENT_BYTES.get(t)


def _numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def gemm_work(name: str, dims: Sequence[Sequence[int]], types: Sequence[str]) -> tuple[float, float] | None:
    """(bytes, FLOPs) of one matrix-product operator from its recorded input dims and types.

    Bytes are the operands read once and the result written once (what a kernel must move at least);
    FLOPs are ``2·M·K·N`` per product. None when the op or its shapes are not ones this understands.
    """
    try:
        if name in ("aten::addmm", "aten::baddbmm", "aten::addmv"):
            bias, a, b = dims[0], dims[1], dims[2]
            ta, tb, tbias = types[1], types[2], types[0]
        elif name == "aten::linear":
            a, w = dims[0], dims[1]
            if len(w) != 2:
                return None
            b = (w[1], w[0])  # weight [N, K] is used transposed
            ta, tb = types[0], types[1]
            bias, tbias = (dims[2], types[2]) if len(dims) > 2 and dims[2] else ((), types[0])
        else:
            if name not in ("aten::mm", "aten::bmm", "aten::matmul", "aten::mv", "aten::_scaled_mm"):
                return None
            a, b = dims[0], dims[1]
            ta, tb = types[0], types[1]
            bias, tbias = (), types[0]
    except IndexError:
        return None
    ea, eb, ebias = _elem(ta), _elem(tb), _elem(tbias)
    if ea is None or eb is None or ebias is None or not a:
        return None
    out_elem = 2 if name == "aten::_scaled_mm" else ea  # fp8 products write bf16 (most often)
    a = tuple(a)
    b = tuple(b) if b else ()
    if len(b) == 1:  # matrix-vector
        b = (b[0], 1)
    if len(a) == 1:
        a = (1, a[0])
    k = a[-1]
    if len(b) < 2 or b[-2] != k:
        return None
    n = b[-1]
    if len(b) == 2:  # [.., M, K] x [K, N]: the leading dims of a are rows
        m, batches, b_reads = _numel(a[:-1]), 1, k * n
    else:  # batched: [B, M, K] x [B, K, N]
        batches, m = _numel(a[:-2]), a[-2]
        b_reads = _numel(b[:-2]) * k * n
    flops = 2.0 * batches * m * k * n
    bias_bytes = ebias * _numel(bias) if bias else 0
    nbytes = float(ea * batches * m * k + eb * b_reads + out_elem * batches * m * n + bias_bytes)
    return nbytes, flops


class ShapeIndex:
    """The matrix products with recorded shapes, by host thread: which one launched a given kernel."""

    def __init__(self, trace: Trace) -> None:
        by_thread: dict[tuple[str, str], list[tuple[Event, float, float]]] = {}
        for op in trace.cpu_ops:
            if op.input_dims is None or op.input_types is None:
                continue
            work = gemm_work(op.name, op.input_dims, op.input_types)
            if work is not None:
                by_thread.setdefault(op.thread, []).append((op, work[0], work[1]))
        self._ops = by_thread
        self._starts = {t: [o[0].ts for o in ops] for t, ops in by_thread.items()}

    def __bool__(self) -> bool:
        return bool(self._ops)

    def op_of(self, call: Event) -> tuple[Event, float, float] | None:
        """The innermost priced operator that encloses the host call *call* (on its thread), if any."""
        ops = self._ops.get(call.thread)
        if not ops:
            return None
        i = bisect.bisect_right(self._starts[call.thread], call.ts) - 1
        # operators nest (aten::linear > aten::addmm): walk back to the latest one still open at the call
        for j in range(i, max(i - 8, -1), -1):
            op = ops[j]
            if op[0].ts <= call.ts <= op[0].end:
                return op
        return None


def tally_kernels(trace: Trace, kernels: Iterable[Event], shapes: ShapeIndex | None) -> dict[str, KernelTally]:
    """Per kernel name: time, launches, and the bytes/FLOPs of its launching operator (split between the
    kernels one operator launched in proportion to their time: a split-K GEMM and its reduction)."""
    out: dict[str, KernelTally] = {}
    by_op: dict[int, tuple[tuple[Event, float, float], list[Event]]] = {}
    for k in kernels:
        t = out.get(k.name)
        if t is None:
            t = out[k.name] = KernelTally()
        t.us += k.dur
        t.calls += 1
        if shapes:
            call = trace.launch_of(k)
            op = shapes.op_of(call) if call is not None else None
            if op is not None:
                entry = by_op.setdefault(id(op[0]), (op, []))
                entry[1].append(k)
    for (_, nbytes, flops), ks in by_op.values():
        total = sum(k.dur for k in ks)
        for k in ks:
            part = k.dur / total if total > 0 else 1.0 / len(ks)
            t = out[k.name]
            t.shaped_us += k.dur
            t.bytes += nbytes * part
            t.flops += flops * part
    return out
