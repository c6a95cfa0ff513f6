"""A diagnosis adds its steps up once (``Diagnosis.totals``) and everything it reports reads that: the
findings, ``summary()``, the GPU busy fraction, the communication share and the report.

Before, the findings re-derived from the steps what the diagnosis' own properties computed (busy, copy and
collective shares, per-step counts), so the two could drift apart; now the findings are a function of the
totals alone (:func:`~perfsdk.profiling.timeline_findings.rank_findings`), checked here on the real H200
traces and on a CPU-only trace.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from perfsdk.hardware import get
from perfsdk.model import ModelSpec
from perfsdk.profiling.analyze import Diagnosis, analyze_trace
from perfsdk.profiling.bandwidth import StepCost
from perfsdk.profiling.observer import Unprofiled
from perfsdk.profiling.timeline_findings import LAUNCH_BOUND_MIN_SHARE, decode_like, rank_findings
from perfsdk.profiling.totals import StepTotals

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("h200_*.pt.trace.json.gz"))
EAGER = DATA / "h200_eager.pt.trace.json.gz"  # launch-bound: GPU idle most of the step


def cpu_trace(steps: int = 3) -> list[dict[str, Any]]:
    """ProfilerStep ranges with two host reads of a tensor value each (``.item()``): a host-side sync_bound."""
    out: list[dict[str, Any]] = []
    for i in range(steps):
        t0 = i * 1000.0
        out.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i}",
                "ts": t0,
                "dur": 900.0,
                "pid": 1,
                "tid": 1,
            }
        )
        for k in range(2):
            out.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": "aten::_local_scalar_dense",
                    "ts": t0 + 100 + 300 * k,
                    "dur": 50.0,
                    "pid": 1,
                    "tid": 1,
                }
            )
    return out


def diagnoses() -> list[tuple[str, Any]]:
    cost = StepCost.decode(ModelSpec.named("llama-3-8b"), get("h200"), batch=1, context_tokens=1024)
    cases: list[tuple[str, Any]] = [(p.name.split(".")[0], (p, {})) for p in FIXTURES]
    if EAGER.exists():  # corrected for the profiler and priced: the basis is no longer the measured steps
        cases.append(("eager-corrected", (EAGER, {"cost": cost, "unprofiled": Unprofiled(step_us=2000.0)})))
    cases.append(("cpu-only", (cpu_trace(), {"unprofiled": Unprofiled(step_us=800.0)})))
    return cases


CASES = diagnoses()


@pytest.mark.parametrize(("source", "kwargs"), [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_a_diagnosis_adds_its_steps_up_once(
    source: Any, kwargs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    real = StepTotals.of

    def counting(cls: type[StepTotals], *args: Any) -> StepTotals:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(StepTotals, "of", classmethod(counting))
    diag = analyze_trace(source, **kwargs)
    assert len(calls) == 1  # made with the diagnosis ...
    for _ in range(2):  # ... and read, never re-derived, by everything it reports
        diag.summary()
        diag.to_dict()
        diag.format_report()
        _ = diag.gpu_busy_fraction, diag.communication_share, diag.findings
    assert len(calls) == 1
    decode = diag.select("decode")
    assert decode is diag or len(calls) == 2  # another set of steps is added up once more, on its own


@pytest.mark.parametrize(("source", "kwargs"), [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_the_findings_are_a_function_of_the_totals(source: Any, kwargs: dict[str, Any]) -> None:
    diag = analyze_trace(source, **kwargs)
    t = diag.totals
    gpu_phases = {diag.phase_of(s) for s in diag.basis if s.gpu_window_us > 0}
    like = decode_like(gpu_phases, diag.step_source, diag.phase, t.kernel_median_us)
    assert diag.findings == rank_findings(t, diag.basis_label, diag.kernel_check, decode_like=like)
    # what the report says and what the findings say are the same numbers
    assert diag.gpu_busy_fraction == t.busy_share
    assert diag.communication_share == t.comm_share
    assert diag.summary()["kernels_per_step"] == round(t.per_step.kernels, 2)
    for f in diag.findings:
        if f.kind == "launch_bound":
            assert f.share == pytest.approx(t.launch_wait_us / t.window_us)
            assert f"GPU busy {diag.gpu_busy_fraction:.0%}" in f.evidence
        if f.kind == "communication_bound":
            assert f.share == diag.communication_share


def test_a_finding_follows_the_totals_it_is_given() -> None:
    """No step is read again: change the totals alone and the finding moves with them."""
    if not EAGER.exists():
        pytest.skip("no GPU fixture")
    t = analyze_trace(EAGER).totals
    quiet = dataclasses.replace(t, launch_wait_us=0.0)
    assert "launch_bound" not in [f.kind for f in rank_findings(quiet, "step time", None, decode_like=True)]
    half = dataclasses.replace(t, launch_wait_us=0.5 * t.window_us)
    launch = [f for f in rank_findings(half, "step time", None, decode_like=True) if f.kind == "launch_bound"]
    assert len(launch) == 1 and launch[0].share == 0.5 >= LAUNCH_BOUND_MIN_SHARE


def test_a_diagnosis_built_by_hand_still_adds_up() -> None:
    """Without analyze_trace (no basis yet): the totals are taken from the steps as given, once."""
    made = analyze_trace(cpu_trace())
    by_hand = Diagnosis(source="by hand", has_gpu=False, step_source="ProfilerStep", steps=made.steps, findings=[])
    assert by_hand.summary() == made.summary()
    assert by_hand.totals is by_hand.totals
