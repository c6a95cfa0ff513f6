"""What the profiler window does with a written trace: diagnose its decode steps against the unprofiled
step and the peak bandwidth, write ``<trace>.diagnosis.json``, and word the verdict.

:class:`~perfsdk.profiling.window.ProfilerWindow` calls these from its writer thread (and from
``ProfilerWindow.diagnose`` for a trace diagnosed on demand)::

    cost = decode_cost(model, hardware, ref, compute_dtype)   # what a decode step at ref's batch must read
    d, path, line, diagnosis = diagnose_capture(trace, cost=cost, ref=ref, note="", steady=True, capture={})
    d["findings"][0]["kind"]       # the verdict on the window's decode steps; d["report"], d["capture"]

The verdict is about the window's decode steps (``Diagnosis.select("decode")``); prefills caught in the
window are kept under ``"other_steps"``, not mixed into it. The step's bytes are the core's own, recovered
from the unprofiled steps' MBU (MBU × time × bandwidth); the context recovered from them prices the FLOPs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from perfsdk.profiling.capture import diagnosis_path, verdict, write_json_atomic
from perfsdk.profiling.observer import Unprofiled
from perfsdk.profiling.step_cost import StepCost

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec
    from perfsdk.profiling.analyze import Diagnosis

__all__ = ["decode_cost", "diagnose_capture"]


def diagnose_capture(
    trace: str, *, cost: StepCost, ref: Unprofiled | None, note: str, steady: bool, capture: dict[str, Any]
) -> tuple[dict[str, Any], str, str, Diagnosis]:
    """Diagnose *trace*'s decode steps priced by *cost* and against *ref* (*note*: why there is none), write
    ``<trace>.diagnosis.json`` (with *capture* and *steady* under ``"capture"``); returns (the diagnosis as
    written, its path, the verdict line, the decode steps' Diagnosis)."""
    from perfsdk.profiling.analyze import analyze_trace

    full = analyze_trace(trace, cost={"decode": cost}, unprofiled=None if ref is None else {"decode": ref})
    full.unprofiled_note = note
    # the window is about its decode steps: prefills that fell inside it are recorded, not diagnosed with them
    diagnosis = full.select("decode") or full
    d = diagnosis.to_dict()
    if diagnosis is not full:
        d["phase"] = "decode"
        d["other_steps"] = [s.to_dict() for s in full.steps if full.phase_of(s) != "decode"]
    d["report"] = diagnosis.format_report()
    d["capture"] = dict(capture, steady=steady)
    dpath = diagnosis_path(trace)
    write_json_atomic(dpath, d)
    return d, dpath, verdict(d, trace, steady), diagnosis


def decode_cost(
    model: ModelSpec | None, hw: HardwareSpec | None, ref: Unprofiled | None, compute_dtype: str | None
) -> StepCost:
    """What a decode step at the reference's batch must read (its context recovered from the unprofiled
    steps' bytes), against *hw*; a cost with ``missing`` set where that is not known."""
    if model is None:
        return StepCost(missing="the Monitor has no model (Monitor(model=...)), so a step's bytes are unknown")
    if hw is None:
        return StepCost(missing="the Monitor has no hardware (Monitor(hardware=...)), so there is no peak")
    if ref is None or ref.bytes is None or ref.batch is None:
        return StepCost(
            peak_bandwidth=hw.memory_bandwidth,
            missing="no unprofiled decode steps at this batch were priced before the window, so "
            "the step's bytes are unknown",
        )
    from perfsdk import budget

    # the bytes are the core's own (what MBU divided); the context, recovered from them, prices the FLOPs
    context = 0
    if model.has_attention_shape:
        weights = budget.decode_step_bytes(model, 0, ref.batch)  # weights and the batch's embedding rows
        context = max(round((ref.bytes - weights) / model.kv_bytes_per_token), 0)
    cost = StepCost.decode(model, hw, batch=ref.batch, context_tokens=context, compute_dtype=compute_dtype)
    return StepCost(
        bytes=ref.bytes,
        flops=cost.flops,
        peak_bandwidth=cost.peak_bandwidth,
        peak_flops=cost.peak_flops,
        missing=cost.missing,
        source=f"{cost.source}, as the unprofiled steps before the window",
    )
