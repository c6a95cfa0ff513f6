"""Are the kernels fast? The bytes and FLOPs a step must move, over the time its kernels ran, against the peaks.

A GPU that is busy is not necessarily doing well: it may be busy running slow kernels. The seeds name
three zoom levels — the request (TTFT, TPOT), the timeline (:mod:`perfsdk.profiling.analyze`: where
the step's time goes) and one kernel (Nsight Compute: how close it gets to the chip's limits). This
module decides whether the third is needed, and for which kernels::

    from perfsdk.hardware import get
    from perfsdk.model import ModelSpec
    from perfsdk.profiling.analyze import analyze_trace
    from perfsdk.profiling.bandwidth import StepCost

    cost = StepCost.decode(ModelSpec.named("llama-3-8b"), get("h200"), batch=1, context_tokens=1024)
    diag = analyze_trace("decode.pt.trace.json.gz", cost=cost)   # or cost={"decode": c1, "prefill": c2}
    diag.kernel_check.utilisation      # 0.34: the kernels moved the step's bytes at 34 % of the peak
    diag.findings[0].kind              # "slow_kernels"
    diag.kernel_check.ncu              # ncu --set full -k regex:'nvjet_sm90_tst_256x8_64x6_2x1_v_bz_TNT|...' -c 5 ...

    StepCost(bytes=313.5e6, peak_bandwidth=4.8e12, source="my model on an H200")   # figures directly

**The check.** Per step, *kernel time* is the GPU's busy time less copies and exposed collectives
(those have findings of their own); the *floor* is the least time the step's work allows,
``max(bytes / peak bandwidth, FLOPs / peak FLOP/s)``; the larger term says whether the step is
memory- or compute-bound, from the figures, never from the step's name. ``utilisation = floor /
kernel time``: how close the kernels came to the chip's limit while they ran (MBU or MFU over the busy
time only, so launch gaps do not count against the kernels). Then:

* ``memory_bound`` / ``compute_bound`` — healthy: the GPU is kept busy (:data:`HEALTHY_BUSY_FRACTION`
  of the step in kernels) *and* the kernels reach :data:`HEALTHY_BANDWIDTH_FRACTION` of the peak
  bandwidth (memory-bound) or :data:`HEALTHY_FLOPS_FRACTION` of the peak FLOP/s (compute-bound);
* ``slow_kernels`` — the kernels run below that, and the time they take beyond the floor is at least
  :data:`SLOW_KERNELS_MIN_SHARE` of the step: the finding names the kernels that hold the time (share of
  the step, and their own bandwidth or FLOP rate where the trace recorded their operators' input shapes:
  ``record_shapes=True``, which perfsdk's window sets) and the Nsight Compute command for them;
* ``utilisation_suspect`` — the floor is *longer* than the kernel time: the step moved its bytes faster
  than the chip can, which is impossible, so the peak (wrong part, sparse figure) or the step's bytes
  (model, batch, context) is wrong. No verdict on the kernels is given;
* ``busy_unchecked`` — busy, but no bytes/FLOPs or peak were given (``perfsdk analyze`` on a bare
  trace): the check could not be made, and the report says so rather than calling the step healthy.

**Thresholds** (shares of the datasheet peak, which nothing reaches):

* :data:`HEALTHY_BANDWIDTH_FRACTION` = 0.60. A tuned device copy reaches ~85 % of the datasheet bandwidth
  (an H200: 4.1 of 4.8 TB/s, ``perfsdk calibrate``) and the weight-reading GEMV kernels of a compiled
  decode 70-85 % (the seeds' healthy decode is ~80 % MBU *including* its gaps). Below 60 % a third or
  more of the kernel time is more than a tuned kernel needs for those bytes: a kernel question.
* :data:`HEALTHY_FLOPS_FRACTION` = 0.50. A large bf16 GEMM reaches 75-80 % of the dense peak (an H200:
  757-763 of 989 TFLOP/s); a whole prefill step, with attention, norms and elementwise kernels, 50-65 %.
* :data:`SLOW_KERNELS_MIN_SHARE` = 0.10, the same tenth as ``launch_bound``: below it the kernels' lost
  time is not where the step's time is, and the seeds' rule is to zoom in only where the time is.
* :data:`SUSPECT_UTILISATION` = 1.0: above the peak is impossible, whatever the tolerance of a clock.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.findings import Finding
from perfsdk.profiling.trace_events import Event, Trace

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec

__all__ = [
    "HEALTHY_BANDWIDTH_FRACTION",
    "HEALTHY_BUSY_FRACTION",
    "HEALTHY_FLOPS_FRACTION",
    "NCU_LAUNCHES",
    "SLOW_KERNELS_MIN_SHARE",
    "SUSPECT_UTILISATION",
    "TOP_KERNELS",
    "KernelCheck",
    "KernelRow",
    "KernelTally",
    "ShapeIndex",
    "StepCost",
    "check_kernels",
    "gemm_work",
    "kernel_findings",
    "kernel_lines",
    "ncu_base_name",
    "ncu_command",
    "rate_text",
    "top_kernels",
]

# Share of step time the GPU spends running kernels (busy, less copies and exposed collectives)
# from which a step can be called healthy: the remaining idle is launch latency and step boundaries
# that no host-side change removes.
HEALTHY_BUSY_FRACTION = 0.80
HEALTHY_BANDWIDTH_FRACTION = 0.60  # why: the module docstring
HEALTHY_FLOPS_FRACTION = 0.50
SLOW_KERNELS_MIN_SHARE = 0.10
SUSPECT_UTILISATION = 1.0
TOP_KERNELS = 5  # kernels named in a finding: the seeds' "zoom in where the time is", not a full table
NCU_LAUNCHES = 5  # ncu -c: each profiled launch is replayed dozens of times; five is minutes, not hours

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


def _check_figure(field_name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field_name}: must be a positive, finite number or None, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class StepCost:
    """What one step must move (bytes) and compute (FLOPs), and the peaks (per second) to measure its kernels
    against — per GPU. ``source`` says where the figures come from; ``missing`` why one is absent."""

    bytes: float | None = None
    flops: float | None = None
    peak_bandwidth: float | None = None
    peak_flops: float | None = None
    source: str = ""
    missing: str = ""

    def __post_init__(self) -> None:
        for name in ("bytes", "flops", "peak_bandwidth", "peak_flops"):
            object.__setattr__(self, name, _check_figure(name, getattr(self, name)))

    @classmethod
    def decode(
        cls,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        *,
        batch: int = 1,
        context_tokens: int = 0,
        compute_dtype: str | None = None,
    ) -> StepCost:
        """A decode step of *batch* sequences over *context_tokens* context tokens in all (:mod:`perfsdk.budget`)."""
        from perfsdk import budget

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch: must be a whole number >= 1, got {batch!r}")
        if context_tokens and not model.has_attention_shape:
            raise ConfigError("context: the KV-cache bytes need the model's layers, kv_heads and head_dim")
        nbytes = budget.decode_step_bytes(model, context_tokens, batch)
        flops = budget.decode_flops(model, batch, context_tokens)
        return cls._with_peaks(
            nbytes,
            flops,
            model,
            hardware,
            compute_dtype,
            f"decode, batch {batch}, context {context_tokens} tokens in all",
        )

    @classmethod
    def prefill(
        cls,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        seq_lens: Sequence[int],
        *,
        compute_dtype: str | None = None,
    ) -> StepCost:
        """A prefill of sequences of *seq_lens* new tokens."""
        from perfsdk import budget

        lens = list(seq_lens)
        if not lens or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lens):
            raise ConfigError(f"prompt tokens: every sequence needs a whole number >= 1 of tokens, got {seq_lens!r}")
        nbytes = budget.prefill_step_bytes(model, lens)
        flops = budget.prefill_flops(model, lens, attention=model.has_attention_shape)
        what = f"{lens[0]} tokens" if len(lens) == 1 else f"{len(lens)} sequences, {sum(lens)} tokens"
        return cls._with_peaks(nbytes, flops, model, hardware, compute_dtype, f"prefill, {what}")

    @classmethod
    def _with_peaks(
        cls,
        nbytes: float,
        flops: float,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        compute_dtype: str | None,
        what: str,
    ) -> StepCost:
        from perfsdk.assembly import default_compute_dtype

        name = model.name or "model"
        if hardware is None:
            return cls(
                bytes=nbytes,
                flops=flops,
                source=f"{name} {what}",
                missing="no GPU peaks: give the GPU (--gpu, or Monitor(hardware=...))",
            )
        dtype = compute_dtype or default_compute_dtype(model)
        missing = ""
        try:
            peak: float | None = hardware.peak_flops(dtype)
        except ConfigError as e:
            peak, missing = None, str(e)
        where = hardware.source or "datasheet"
        return cls(
            bytes=nbytes,
            flops=flops,
            peak_bandwidth=hardware.memory_bandwidth,
            peak_flops=peak,
            source=f"{name} {what}; {hardware.display_name} ({where})",
            missing=missing,
        )

    @property
    def checkable(self) -> bool:
        """Whether a floor can be computed: bytes with a peak bandwidth, or FLOPs with a peak FLOP/s."""
        return (self.bytes is not None and self.peak_bandwidth is not None) or (
            self.flops is not None and self.peak_flops is not None
        )

    def floors_us(self) -> tuple[float | None, float | None]:
        """(memory floor, compute floor) in µs; None where a figure is missing."""
        mem = self.bytes / self.peak_bandwidth * 1e6 if self.bytes is not None and self.peak_bandwidth else None
        comp = self.flops / self.peak_flops * 1e6 if self.flops is not None and self.peak_flops else None
        return mem, comp

    def why_unchecked(self) -> str:
        if self.missing:
            return self.missing
        if self.peak_bandwidth is None and self.peak_flops is None:
            return "no GPU peaks: give the GPU (--gpu, or --bandwidth-tb-s / --tflops)"
        return "no bytes or FLOPs for the step: give the model (--model, or --step-bytes / --step-flops)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "flops": self.flops,
            "peak_bandwidth": self.peak_bandwidth,
            "peak_flops": self.peak_flops,
            "source": self.source,
            "missing": self.missing or None,
        }


# ---- per-kernel tallies -------------------------------------------------------------------------------


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


# ---- the step-level check -----------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelRow:
    """One kernel name over the steps checked: its time per step, share of the step, achieved rates."""

    name: str
    us_per_step: float
    calls_per_step: float
    share: float
    bandwidth: float | None = None  # bytes/s over the launches with recorded shapes
    flop_rate: float | None = None
    bandwidth_fraction: float | None = None  # of the peak
    flops_fraction: float | None = None

    @property
    def suspect(self) -> bool:
        return any(f is not None and f > SUSPECT_UTILISATION for f in (self.bandwidth_fraction, self.flops_fraction))

    def describe(self, basis: str) -> str:
        rate = ""
        if self.bandwidth is not None and self.flop_rate is not None:
            parts = [f"{self.bandwidth / 1e12:.2f} TB/s"]
            if self.bandwidth_fraction is not None:
                parts[0] += f" = {self.bandwidth_fraction:.0%} of peak"
            parts.append(f"{self.flop_rate / 1e12:.1f} TFLOP/s")
            if self.flops_fraction is not None:
                parts[1] += f" = {self.flops_fraction:.0%} of peak"
            rate = "; " + ", ".join(parts)
            if self.suspect:
                rate += " (above the peak: suspect shapes or peak)"
        return (
            f"{_short(self.name)} {self.share:.0%} of {basis} ({self.us_per_step:.1f} µs per step, "
            f"×{self.calls_per_step:g}{rate})"
        )

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "name": self.name,
            "ncu_name": ncu_base_name(self.name),
            "us_per_step": r(self.us_per_step, 2),
            "calls_per_step": r(self.calls_per_step, 2),
            "share": r(self.share),
            "bandwidth": self.bandwidth,
            "flop_rate": self.flop_rate,
            "bandwidth_fraction": r(self.bandwidth_fraction),
            "flops_fraction": r(self.flops_fraction),
            "suspect": self.suspect,
        }


@dataclass(frozen=True)
class KernelCheck:
    """The bytes/FLOPs check over the steps diagnosed (per-step means); see the module docstring.

    ``utilisation`` is ``floor / kernel time``; None when the check could not be made (``missing``
    says why). ``suspect`` when it is above 1: impossible, so a figure is wrong.
    """

    steps: int
    kernel_us: float
    bytes: float | None = None
    flops: float | None = None
    floor_us: float | None = None
    bound: str | None = None
    utilisation: float | None = None
    peak_bandwidth: float | None = None
    peak_flops: float | None = None
    source: str = ""
    missing: str | None = None
    top: list[KernelRow] = field(default_factory=list)
    ncu: str | None = None

    @property
    def checked(self) -> bool:
        return self.utilisation is not None

    @property
    def suspect(self) -> bool:
        return self.utilisation is not None and self.utilisation > SUSPECT_UTILISATION

    @property
    def healthy_fraction(self) -> float | None:
        if self.bound is None:
            return None
        return HEALTHY_BANDWIDTH_FRACTION if self.bound == "memory" else HEALTHY_FLOPS_FRACTION

    @property
    def achieved_bandwidth(self) -> float | None:
        return self.bytes / (self.kernel_us * 1e-6) if self.bytes is not None and self.kernel_us > 0 else None

    @property
    def achieved_flops(self) -> float | None:
        return self.flops / (self.kernel_us * 1e-6) if self.flops is not None and self.kernel_us > 0 else None

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        return {
            "steps": self.steps,
            "kernel_us": round(self.kernel_us, 2),
            "bytes": self.bytes,
            "flops": self.flops,
            "floor_us": r(self.floor_us, 2),
            "bound": self.bound,
            "utilisation": r(self.utilisation),
            "suspect": self.suspect,
            "healthy_fraction": self.healthy_fraction,
            "achieved_bandwidth": self.achieved_bandwidth,
            "achieved_flops": self.achieved_flops,
            "peak_bandwidth": self.peak_bandwidth,
            "peak_flops": self.peak_flops,
            "source": self.source,
            "missing": self.missing,
            "top_kernels": [k.to_dict() for k in self.top],
            "ncu": self.ncu,
        }


def _kernel_us(s: Any) -> float:
    """A step's time in kernels: GPU busy less copies and exposed collectives (they have their own findings)."""
    return float(max(s.gpu_busy_us - s.copy_us - s.exposed_comm_us, 0.0))


def check_kernels(
    steps: Sequence[Any], phases: Sequence[str], costs: Mapping[str, StepCost], window_us: float
) -> KernelCheck:
    """The check over *steps* (``StepStats`` with a GPU window; *phases* theirs), priced by *costs* per phase.

    *window_us* is the steps' total window the kernel shares are of (the unprofiled one when corrected).
    """
    n = len(steps)
    kernel_total = sum(_kernel_us(s) for s in steps)
    rows = top_kernels(steps, window_us, costs.get(phases[0]) if phases else None)
    ncu = ncu_command([r.name for r in rows]) if rows else None
    base = KernelCheck(steps=n, kernel_us=kernel_total / n if n else 0.0, top=rows, ncu=ncu)
    if not n:
        return base
    mem_total = comp_total = floor_total = 0.0
    bytes_total = flops_total = 0.0
    have_bytes = have_flops = True
    sources: list[str] = []
    peak_bw = peak_fl = None
    for ph in phases:
        c = costs.get(ph)
        if c is None:
            return _missing(base, f"no bytes or FLOPs for the {ph} steps")
        if not c.checkable:
            return _missing(base, c.why_unchecked())
        mem, comp = c.floors_us()
        mem_total += mem or 0.0
        comp_total += comp or 0.0
        floor_total += max(mem or 0.0, comp or 0.0)
        have_bytes = have_bytes and c.bytes is not None
        have_flops = have_flops and c.flops is not None
        bytes_total += c.bytes or 0.0
        flops_total += c.flops or 0.0
        peak_bw = c.peak_bandwidth if peak_bw is None else peak_bw
        peak_fl = c.peak_flops if peak_fl is None else peak_fl
        if c.source and c.source not in sources:
            sources.append(c.source)
    if kernel_total <= 0:
        return _missing(base, "no kernel time in these steps")
    return KernelCheck(
        steps=n,
        kernel_us=kernel_total / n,
        bytes=bytes_total / n if have_bytes else None,
        flops=flops_total / n if have_flops else None,
        floor_us=floor_total / n,
        bound="memory" if mem_total >= comp_total else "compute",
        utilisation=floor_total / kernel_total,
        peak_bandwidth=peak_bw,
        peak_flops=peak_fl,
        source="; ".join(sources),
        top=rows,
        ncu=ncu,
    )


def _missing(base: KernelCheck, why: str) -> KernelCheck:
    return KernelCheck(steps=base.steps, kernel_us=base.kernel_us, missing=why, top=base.top, ncu=base.ncu)


def top_kernels(steps: Sequence[Any], window_us: float, cost: StepCost | None, n: int = TOP_KERNELS) -> list[KernelRow]:
    """The *n* kernel names that hold the most time over *steps*, with their share of the step and rates."""
    agg: dict[str, KernelTally] = {}
    for s in steps:
        for name, t in s.kernel_tally.items():
            a = agg.get(name)
            if a is None:
                a = agg[name] = KernelTally()
            a.us += t.us
            a.calls += t.calls
            a.shaped_us += t.shaped_us
            a.bytes += t.bytes
            a.flops += t.flops
    count = len(steps) or 1
    rows = []
    for name, a in sorted(agg.items(), key=lambda kv: -kv[1].us)[:n]:
        bw = fl = None
        if a.shaped_us > 0:
            bw, fl = a.bytes / (a.shaped_us * 1e-6), a.flops / (a.shaped_us * 1e-6)
        peak_bw = cost.peak_bandwidth if cost is not None else None
        peak_fl = cost.peak_flops if cost is not None else None
        rows.append(
            KernelRow(
                name=name,
                us_per_step=a.us / count,
                calls_per_step=a.calls / count,
                share=a.us / window_us if window_us > 0 else 0.0,
                bandwidth=bw,
                flop_rate=fl,
                bandwidth_fraction=bw / peak_bw if bw is not None and peak_bw else None,
                flops_fraction=fl / peak_fl if fl is not None and peak_fl else None,
            )
        )
    return rows


# ---- Nsight Compute -----------------------------------------------------------------------------------

_ANON = re.compile(r"\(anonymous namespace\)::")


def ncu_base_name(name: str) -> str:
    """The kernel's function name as Nsight Compute matches it by default (``--kernel-name-base function``):
    no return type, namespace, template arguments or parameters."""
    s = _ANON.sub("", name).strip()
    if s.startswith("void "):
        s = s[5:]
    cut = min((i for i in (s.find("<"), s.find("(")) if i >= 0), default=len(s))
    s = s[:cut].split("::")[-1].strip()
    return s or name


def ncu_command(names: Sequence[str], launches: int = NCU_LAUNCHES) -> str:
    """``ncu --set full -k regex:'a|b' -c 5 -o perfsdk-kernels <command>`` for the kernels *names*."""
    bases: list[str] = []
    for n in names:
        b = re.escape(ncu_base_name(n))
        if b not in bases:
            bases.append(b)
    return (
        f"ncu --set full -k regex:'{'|'.join(bases)}' -c {launches} -o perfsdk-kernels "
        "<the command that starts your server>"
    )


def _short(name: str, limit: int = 72) -> str:
    return name if len(name) <= limit else name[: limit - 3] + "..."


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e9:.2f} GB" if b >= 1e8 else f"{b / 1e6:.1f} MB"


# ---- findings -----------------------------------------------------------------------------------------


def kernel_findings(
    check: KernelCheck, working: float, window_us_per_step: float, basis: str, decode_like: bool
) -> list[Finding]:
    """The kernels' finding (at most one): healthy, slow, suspect or unchecked; see the module docstring.

    *working*: the share of the step the GPU spent in kernels; *window_us_per_step*: the (basis) step;
    *basis*: what shares are of, for the text; *decode_like*: the steps read weights per token (names the
    unchecked bound in words).
    """
    top = "; ".join(r.describe(basis) for r in check.top[:3])
    where = f" Where the kernel time is: {top}." if top else ""
    if not check.checked:
        if working < HEALTHY_BUSY_FRACTION:
            return []
        limit = "peak memory bandwidth" if decode_like else "peak FLOP/s"
        return [
            Finding(
                "busy_unchecked",
                working,
                f"GPU busy running kernels {working:.0%} of {basis}, but whether they run near the {limit} could "
                f"not be checked: {check.missing}.{where}",
                "Give the step's bytes and the GPU (perfsdk analyze TRACE --model NAME --gpu NAME --batch N "
                "--context N, or --step-bytes B --bandwidth-tb-s X) so the kernels' time can be compared with "
                "the floor; a busy GPU is not yet a fast one."
                + (f" To look at the kernels themselves: {check.ncu}" if check.ncu else ""),
            )
        ]
    assert check.utilisation is not None
    assert check.floor_us is not None
    util = check.utilisation
    rate = rate_text(check)
    if check.suspect:
        return [
            Finding(
                "utilisation_suspect",
                working,
                f"the step's kernels would move {rate}: {util:.0%} of the peak, which is impossible, so the peak or "
                f"the step's bytes/FLOPs are wrong ({check.source}); no verdict on the kernels",
                "Check the peak (the exact part and its dense figure; perfsdk calibrate measures this machine) and "
                "the step's bytes and FLOPs (model, dtype, batch, context) before trusting any utilisation.",
            )
        ]
    healthy = check.healthy_fraction or 0.0
    if util >= healthy:
        if working < HEALTHY_BUSY_FRACTION:
            return []
        if check.bound == "compute":
            return [
                Finding(
                    "compute_bound",
                    working,
                    f"GPU busy running kernels {working:.0%} of {basis}; they do {rate}: {util:.0%} of the peak "
                    f"(healthy from {healthy:.0%}; {check.source})",
                    "Healthy prefill: the GPU is busy doing math near its peak. Next: lower precision (FP8), fused "
                    "attention kernels, or fewer FLOPs (prefix caching, shorter prompts).",
                )
            ]
        return [
            Finding(
                "memory_bound",
                working,
                f"GPU busy running kernels {working:.0%} of {basis}; they read {rate}: {util:.0%} of the peak "
                f"(healthy from {healthy:.0%}; {check.source})",
                "Healthy decode: the kernels read the weights and KV cache near the peak bandwidth. Next: read "
                "fewer bytes per token (quantised weights or KV cache) or batch more requests per step.",
            )
        ]
    lost = max(check.kernel_us - check.floor_us, 0.0)
    share = lost / window_us_per_step if window_us_per_step > 0 else 0.0
    if share < SLOW_KERNELS_MIN_SHARE:
        return []
    verb = "read" if check.bound == "memory" else "do"
    return [
        Finding(
            "slow_kernels",
            share,
            f"the kernels ({working:.0%} of {basis}) {verb} {rate}: {util:.0%} of the peak, below the "
            f"{healthy:.0%} a healthy step reaches; at the peak they would take {check.floor_us / 1000:.3f} ms "
            f"({check.source}).{where}",
            f"Zoom in on these kernels with Nsight Compute (it replays each kernel to read its counters: use it to "
            f"understand them, never to time the server): {check.ncu}. Low DRAM throughput with low occupancy "
            "points at launch configuration or tiny shapes (batch more); high memory stalls at access patterns; "
            "a fused or better-tuned kernel (torch.compile, a Triton or CUTLASS kernel) moves the same bytes faster.",
        )
    ]


def rate_text(check: KernelCheck) -> str:
    """'0.31 GB per step in 0.193 ms of kernels = 1.63 of 4.80 TB/s' (FLOPs for a compute-bound step)."""
    secs = check.kernel_us / 1000
    if check.bound == "compute" and check.flops is not None and check.peak_flops:
        done = check.achieved_flops or 0.0
        return (
            f"{check.flops / 1e12:.2f} TFLOP per step in {secs:.3f} ms of kernels = {done / 1e12:.0f} of "
            f"{check.peak_flops / 1e12:.0f} TFLOP/s"
        )
    if check.bytes is not None and check.peak_bandwidth:
        done = check.achieved_bandwidth or 0.0
        return (
            f"{_fmt_bytes(check.bytes)} per step in {secs:.3f} ms of kernels = {done / 1e12:.2f} of "
            f"{check.peak_bandwidth / 1e12:.2f} TB/s"
        )
    return f"its work in {secs:.3f} ms of kernels"


def kernel_lines(check: KernelCheck, basis: str, show_top: bool = True) -> list[str]:
    """The report's lines on the kernels against the peak, and (*show_top*) the kernels that hold the time."""
    if check.utilisation is None:
        lines = [f"  kernels against the peak: not checked ({check.missing})"]
    else:
        verdict = (
            "above the peak: impossible, a figure is wrong"
            if check.suspect
            else f"{check.bound}-bound; healthy from {check.healthy_fraction:.0%}"
        )
        lines = [f"  kernels: {rate_text(check)}: {check.utilisation:.0%} of the peak ({verdict})"]
    if check.top and show_top:
        lines.append("  top kernels: " + "; ".join(r.describe(basis) for r in check.top[:3]))
    return lines
