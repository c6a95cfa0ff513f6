"""The profiler's own slowdown (perfsdk.profiling.observer): shares against the unprofiled step.

SYNTHETIC Kineto-shaped traces for the arithmetic (the real H200 trace is corrected in
tests/test_analyze_gpu_fixtures.py, and perfsdk's window end to end in tests/test_window.py), and the
per-(phase, batch) reference the window keeps.
"""

from __future__ import annotations

from typing import Any

import pytest

from perfsdk.errors import ConfigError
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.observer import REFERENCE_MIN_STEPS, StepReference, Unprofiled

HOST = {"pid": 100, "tid": 100}
GPU = {"pid": 0, "tid": 7}


def profiled_trace(steps: int = 3) -> list[dict[str, Any]]:
    """Each step: 10 kernels of 10 µs, each launched 40 µs after the previous one ended (the host, slowed by
    the profiler, cannot keep up): a 500 µs profiled step, 100 µs of it busy."""
    events: list[dict[str, Any]] = []
    corr = 0
    t = 0.0
    for _ in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": "perfsdk.decode", "ts": t, "dur": 500.0, **HOST})
        for _k in range(10):
            corr += 1
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "ts": t + 38.0,
                    "dur": 1.0,
                    **HOST,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "void gemv_kernel",
                    "ts": t + 40.0,
                    "dur": 10.0,
                    **GPU,
                    "args": {"correlation": corr, "stream": 7},
                }
            )
            t += 50.0
    return events


def test_shares_are_of_the_unprofiled_step_and_the_inflation_is_reported() -> None:
    measured = analyze_trace(profiled_trace())
    assert measured.gpu_busy_fraction == pytest.approx(0.2, abs=0.01)
    assert measured.findings[0].kind == "launch_bound"
    assert measured.findings[0].share == pytest.approx(0.8, abs=0.01)

    d = analyze_trace(profiled_trace(), unprofiled=Unprofiled(step_us=125.0, steps=64, batch=8, source="timer"))
    # the kernels' 100 µs are kept; the launch gaps shrink to the rest of the unprofiled 125 µs
    assert d.gpu_busy_fraction == pytest.approx(0.8, abs=0.01)
    launch = next(f for f in d.findings if f.kind == "launch_bound")
    assert launch.share == pytest.approx(0.2, abs=0.01)
    assert "GPU idle 20% of the unprofiled step" in launch.evidence
    assert d.findings[0].kind == "busy_unchecked"  # unprofiled, the kernels hold the step
    obs = d.observer["decode"]
    profiled = sum(s.gpu_window_us for s in measured.steps) / 3  # 500, 500 and the last step's 460 µs
    assert obs["inflation"] == pytest.approx(profiled / 125.0, abs=1e-3)
    assert obs["profiled_step_us"] == pytest.approx(profiled, abs=0.01) and obs["unprofiled_step_us"] == 125.0
    assert obs["reference"] == {"step_us": 125.0, "steps": 64, "batch": 8, "source": "timer", "bytes": None}
    assert d.corrected and d.basis_label == "the unprofiled step"
    assert d.to_dict()["basis"] == "the unprofiled step"
    # the steps themselves stay as measured (the timeline plot draws what the GPU did)
    assert [s.gpu_window_us for s in d.steps] == [s.gpu_window_us for s in measured.steps]
    assert d.summary()["profiled_step_time_us_mean"] == pytest.approx(profiled, abs=0.01)
    assert d.summary()["step_time_us_mean"] == pytest.approx(125.0)


def test_a_reference_shorter_than_the_kernels_is_clamped_and_called_out() -> None:
    d = analyze_trace(profiled_trace(), unprofiled=Unprofiled(step_us=50.0))
    assert d.gpu_busy_fraction == pytest.approx(1.0)
    note = d.observer["decode"]["note"]
    assert note is not None and "not the same step" in note
    assert "note: the kernels alone" in d.format_report()


def test_a_reference_for_another_phase_leaves_these_steps_as_measured() -> None:
    d = analyze_trace(profiled_trace(), unprofiled={"prefill": Unprofiled(step_us=125.0)})
    assert not d.observer and d.gpu_busy_fraction == pytest.approx(0.2, abs=0.01)
    assert "no unprofiled step time to compare with" in d.format_report()
    with pytest.raises(ConfigError, match="unprofiled"):
        analyze_trace(profiled_trace(), unprofiled={"decode": 125.0})  # type: ignore[dict-item]
    for bad in (0.0, -1.0, float("inf"), "2ms"):
        with pytest.raises(ConfigError, match="unprofiled"):
            Unprofiled(step_us=bad)  # type: ignore[arg-type]


def test_step_reference_is_a_median_per_phase_and_batch_of_recent_steps() -> None:
    ref = StepReference()
    assert ref.get("decode", None, 0.0) == (None, "no unprofiled decode step seen yet")
    for i in range(REFERENCE_MIN_STEPS - 1):
        ref.observe("decode", 8, 0.002, 1e9, now=float(i))
    got, why = ref.get("decode", 8, 10.0)
    assert got is None and f"{REFERENCE_MIN_STEPS - 1} unprofiled decode steps at batch 8" in why
    ref.observe("decode", 8, 0.050, 1e9, now=10.0)  # one stray slow step does not move the median
    got, _ = ref.get("decode", 8, 10.0)
    assert got is not None and got.step_us == pytest.approx(2000.0) and got.steps == REFERENCE_MIN_STEPS
    assert got.batch == 8 and got.bytes == 1e9 and "median of 8" in got.source
    assert ref.get("decode", 4, 10.0)[0] is None  # another batch has its own reference
    assert ref.get("decode", 8, 10.0 + 10_000)[0] is None  # stale steps are no reference
    for bad in (float("nan"), 0.0, -1.0):
        ref.observe("decode", 8, bad, None, now=11.0)
    got, _ = ref.get("decode", 8, 11.0)
    assert got is not None and got.steps == REFERENCE_MIN_STEPS
