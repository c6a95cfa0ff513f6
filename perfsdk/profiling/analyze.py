"""Diagnose a torch.profiler chrome trace: where did the step's time go, and what to change next.

Works on any Kineto trace — perfsdk's profiler window, vLLM's or SGLang's ``--profile`` output,
a user's ``prof.export_chrome_trace("t.json.gz")``::

    $ perfsdk analyze decode.pt.trace.json.gz            # short human report
    $ perfsdk analyze decode.pt.trace.json.gz --json     # machine-readable
    $ perfsdk analyze decode.pt.trace.json.gz --plot step.png

    from perfsdk.profiling.analyze import analyze_trace

    diag = analyze_trace("decode.pt.trace.json.gz")      # or a list of trace-event dicts
    diag.gpu_busy_fraction                               # 0.23
    diag.findings[0].kind                                # "launch_bound"
    print(diag.format_report())
    json.dumps(diag.to_dict())        # {"findings": [...], "gpu_busy_fraction", "steps", ...}

**Steps.** perfsdk's own ``record_function`` ranges (``perfsdk.decode``, ``perfsdk.prefill``,
``perfsdk.mixed``) when present, else torch.profiler's ``ProfilerStep#N``, else the whole trace
as one step (``step_pattern=`` picks other range names, e.g. an engine's own). A step's GPU work
is what the host calls made inside its range enqueued (linked by correlation id), and its GPU
window runs from its first GPU op to the start of the next step's first op, so the idle time
between back-to-back steps is charged to the step that left the GPU idle.

**Per step.** GPU busy fraction (union of kernels, memcpys and memsets over all streams); idle
time split into *waiting for launch* — the op that ended the gap was launched by the host after
the GPU had run dry, so the GPU starved waiting for the host; HTA calls this host wait — (and,
within it, the part right after a host synchronisation returned), and *other*; kernels and their
median duration; kernel-time shares by category (see :mod:`perfsdk.profiling.categories`);
host synchronisations (stream, device and event synchronise, device-to-host copies);
host-to-device copies from pageable memory.

**Findings**, ranked by the share of step time at stake, each with its evidence and the next
change to try: ``launch_bound``, ``sync_bound``, ``copy_bound``, ``communication_bound``, and, for the
kernels' own time, :mod:`perfsdk.profiling.bandwidth`'s: the healthy ``memory_bound`` /
``compute_bound`` only when the bytes (FLOPs) the step must move over its kernels' time come near the
peak, ``slow_kernels`` (with the kernels that hold the time and the Nsight Compute command for them)
when they do not, ``utilisation_suspect`` when they would exceed the peak, and ``busy_unchecked`` when
no bytes or peak were given (``cost=``; ``perfsdk analyze --model/--gpu/--batch/--context``)::

    from perfsdk.profiling.bandwidth import StepCost
    diag = analyze_trace(path, cost=StepCost.decode(spec, hw, batch=1, context_tokens=1024))

The thresholds (``LAUNCH_BOUND_MIN_SHARE`` and the others below, each with its reason beside it; the
kernel check's in :mod:`perfsdk.profiling.bandwidth`): a finding needs a tenth of the step (launch gaps,
exposed collectives, slow kernels' lost time), a twentieth for copies (a cheap, certain fix), half a sync
per step. Healthy needs the GPU in kernels 80 % of the step *and* the kernels at 60 % of the datasheet
bandwidth (a tuned copy reaches ~85 %, a compiled decode's GEMVs 70-85 %) or 50 % of the dense peak FLOP/s
(a large GEMM reaches 75-80 %, a whole prefill 50-65 %); above 100 % is impossible and called suspect.

**The profiler's own slowdown.** A profiled step is slower than the same step unprofiled; its kernels
are not. Given the unprofiled step time (``unprofiled=Unprofiled(step_us=...)``, ``perfsdk analyze
--unprofiled-ms``; perfsdk's window supplies its own), every share is of the unprofiled step, and the
inflation (profiled / unprofiled) is reported: :mod:`perfsdk.profiling.observer`. ``diag.steps`` stay
as measured. Without one the report says the shares are of the profiled step.

**Phases.** A step's phase is its ``perfsdk.<phase>`` range, else *phase* (default ``"decode"``);
``cost`` and ``unprofiled`` may be given per phase, and ``diag.select("decode")`` diagnoses the
decode steps alone (perfsdk's window does: its verdict is about the decode steps it was asked for,
not the prefills it happened to catch).

A trace without GPU events (CPU-only profiling) still gets step times and host-side findings:
reads of tensor values (``aten::item``), which on a GPU each wait for the device, and the time
the step spent in collectives (gloo's ``gloo:all_reduce`` ranges, which run on gloo's own threads
and include the wait for the slowest rank).

**Communication share.** ``summary()["communication_share"]`` is the share of step time spent in
**Communication share.** ``summary()["communication_share"]`` is the share of step time spent in
collectives that nothing else overlapped: NCCL (and custom all-reduce) kernels on a GPU, gloo/NCCL
ranges on the host in a CPU-only trace. In tensor parallelism it includes the *wait* for the slowest
rank; comparing it across the ranks of one group separates waiting from transfer:
:mod:`perfsdk.profiling.ranks` (``perfsdk analyze rank0.json rank1.json``).

**The parts** (this module is the facade: each question has its own module, and :class:`Diagnosis`
asks each once). Which ranges are steps: :mod:`~perfsdk.profiling.steps`; what each step did on the
host and the GPU: :mod:`~perfsdk.profiling.timeline`; what the profiler did to them:
:mod:`~perfsdk.profiling.observer`; what they add up to, once: :mod:`~perfsdk.profiling.totals`
(``diag.totals``); are the kernels fast: :mod:`~perfsdk.profiling.bandwidth`; the findings:
:mod:`~perfsdk.profiling.timeline_findings` and :mod:`~perfsdk.profiling.kernel_findings`; the report
and the summary: :mod:`~perfsdk.profiling.diagnosis_report`. Every name this module exported before the
split is still importable from here.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.bandwidth import HEALTHY_BUSY_FRACTION, KernelCheck, StepCost, check_kernels
from perfsdk.profiling.diagnosis_report import report_lines, summary_of
from perfsdk.profiling.findings import Finding, findings_lines
from perfsdk.profiling.observer import Unprofiled, correct_steps
from perfsdk.profiling.steps import PERFSDK_STEP_NAMES, PHASES, Gap, StepStats, step_phase, step_spans
from perfsdk.profiling.timeline import SYNC_SLACK_US, measure_steps
from perfsdk.profiling.timeline_findings import (
    COMM_BOUND_MIN_SHARE,
    COMPUTE_KERNEL_MIN_US,
    COPY_BOUND_MIN_SHARE,
    LAUNCH_BOUND_MIN_SHARE,
    SYNC_BOUND_MIN_PER_STEP,
    decode_like,
    rank_findings,
)
from perfsdk.profiling.totals import StepTotals
from perfsdk.profiling.trace_events import DEFAULT_MAX_BYTES, Event, Trace, load_trace

__all__ = [
    "COMM_BOUND_MIN_SHARE",
    "COMPUTE_KERNEL_MIN_US",
    "COPY_BOUND_MIN_SHARE",
    "DEFAULT_MAX_BYTES",
    "HEALTHY_BUSY_FRACTION",
    "LAUNCH_BOUND_MIN_SHARE",
    "PERFSDK_STEP_NAMES",
    "PHASES",
    "SYNC_BOUND_MIN_PER_STEP",
    "SYNC_SLACK_US",
    "Diagnosis",
    "Event",
    "Finding",
    "Gap",
    "KernelCheck",
    "StepCost",
    "StepStats",
    "StepTotals",
    "Trace",
    "Unprofiled",
    "analyze_trace",
    "findings_lines",
    "load_trace",
    "step_phase",
]


@dataclass
class Diagnosis:
    """The result of :func:`analyze_trace`; ``to_dict()`` is what ``--json`` prints.

    ``steps`` are as measured under the profiler; every share, fraction and finding is computed over
    ``basis``: the same steps against the unprofiled step time where one was given (see
    :mod:`perfsdk.profiling.observer`), else the same list. What the basis steps add up to is taken once,
    when the diagnosis is made: :attr:`totals`, which the findings, ``summary()`` and the report all read.
    """

    source: str
    has_gpu: bool
    step_source: str  # "perfsdk", "ProfilerStep", "pattern" or "whole trace"
    steps: list[StepStats]
    findings: list[Finding]
    gaps: list[Gap] = field(default_factory=list, repr=False)
    trace: Trace | None = field(default=None, repr=False, compare=False)
    costs: dict[str, StepCost] = field(default_factory=dict, repr=False)
    unprofiled: dict[str, Unprofiled] = field(default_factory=dict, repr=False)
    phase: str = "decode"  # the phase of steps that are not perfsdk.<phase> ranges
    basis: list[StepStats] = field(default_factory=list, repr=False)
    observer: dict[str, dict[str, Any]] = field(default_factory=dict)  # per phase: the profiler's inflation
    unprofiled_note: str = ""  # why there is no unprofiled reference (perfsdk's window says)
    kernel_check: KernelCheck | None = None
    _totals: StepTotals | None = field(default=None, init=False, repr=False, compare=False)

    def phase_of(self, step: StepStats) -> str:
        """The phase of *step*: its ``perfsdk.<phase>`` range, else the diagnosis' default phase."""
        return step_phase(step.name, self.phase)

    def _finish(self) -> Diagnosis:
        """Correct for the profiler where a reference exists, add up the basis, check the kernels, rank the
        findings: each question asked once, in that order, of its own module."""
        phases = [self.phase_of(s) for s in self.steps]
        self.basis, self.observer = correct_steps(self.steps, phases, self.unprofiled, self.has_gpu)
        totals = self._totals = StepTotals.of(self.steps, self.basis, self.has_gpu)
        gpu = [(s, p) for s, p in zip(self.basis, phases, strict=True) if s.gpu_window_us > 0]
        self.kernel_check = None
        if self.has_gpu and gpu:
            self.kernel_check = check_kernels([s for s, _ in gpu], [p for _, p in gpu], self.costs, totals.window_us)
        like_decode = decode_like({p for _, p in gpu}, self.step_source, self.phase, totals.kernel_median_us)
        self.findings = rank_findings(totals, self.basis_label, self.kernel_check, decode_like=like_decode)
        return self

    def select(self, phase: str) -> Diagnosis | None:
        """The diagnosis of this trace's *phase* steps alone (None if it has none)."""
        steps = [s for s in self.steps if self.phase_of(s) == phase]
        if not steps:
            return None
        if len(steps) == len(self.steps):
            return self
        return Diagnosis(
            source=self.source,
            has_gpu=self.has_gpu,
            step_source=self.step_source,
            steps=steps,
            findings=[],
            gaps=self.gaps,
            trace=self.trace,
            costs=self.costs,
            unprofiled=self.unprofiled,
            phase=self.phase,
            unprofiled_note=self.unprofiled_note,
        )._finish()

    @property
    def totals(self) -> StepTotals:
        """What the basis steps add up to (sums and per-step means), taken once when the diagnosis was made."""
        if self._totals is None:  # a Diagnosis built by hand rather than by analyze_trace: take them now, once
            basis = self.basis if len(self.basis) == len(self.steps) else self.steps
            self._totals = StepTotals.of(self.steps, basis, self.has_gpu)
        return self._totals

    @property
    def corrected(self) -> bool:
        """Whether every step is measured against an unprofiled reference (shares of the unprofiled step)."""
        return bool(self.steps) and all(self.phase_of(s) in self.observer for s in self.steps)

    @property
    def basis_label(self) -> str:
        """What the shares are shares of, in words."""
        if self.corrected:
            return "the unprofiled step"
        return "step time (unprofiled where known)" if self.observer else "step time"

    @property
    def gpu_busy_fraction(self) -> float | None:
        """Share of step time the GPU was busy (kernels, copies, memsets on any stream); None without GPU steps."""
        return self.totals.busy_share

    @property
    def communication_share(self) -> float | None:
        """Share of step time in collectives nothing overlapped (GPU: kernels; CPU-only: host ranges)."""
        return self.totals.comm_share

    def summary(self) -> dict[str, Any]:
        """Aggregates over steps: idle split as shares of step time, per-step means, category shares."""
        return summary_of(self.totals)

    def to_dict(self) -> dict[str, Any]:
        """What ``perfsdk analyze --json`` prints: the verdict, the summary, the checks and every step."""
        busy = self.gpu_busy_fraction
        return {
            "trace": self.source,
            "has_gpu": self.has_gpu,
            "step_source": self.step_source,
            "step_count": len(self.steps),
            "gpu_busy_fraction": None if busy is None else round(busy, 4),
            "basis": self.basis_label,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
            "observer": dict(self.observer) or None,
            "unprofiled_note": self.unprofiled_note or None,
            "kernel_check": None if self.kernel_check is None else self.kernel_check.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
        }

    def format_report(self) -> str:
        """A short human report: one header, the profiler's inflation, the step picture, the ranked findings."""
        return "\n".join(
            report_lines(
                source=self.source,
                steps=len(self.steps),
                step_source=self.step_source,
                summary=self.summary(),
                observer=self.observer,
                unprofiled_note=self.unprofiled_note,
                has_gpu=self.has_gpu,
                corrected=self.corrected,
                basis=self.basis_label,
                busy=self.gpu_busy_fraction,
                kernel_check=self.kernel_check,
                findings=self.findings,
            )
        )


def analyze_trace(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | Trace,
    *,
    step_pattern: str | None = None,
    cost: StepCost | Mapping[str, StepCost] | None = None,
    unprofiled: Unprofiled | Mapping[str, Unprofiled] | None = None,
    phase: str = "decode",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> Diagnosis:
    """Diagnose a chrome trace (path to ``.json``/``.json.gz``, event dicts, or a loaded Trace).

    ``step_pattern`` is a regular expression matched against whole ``record_function`` names to
    pick the step ranges; by default perfsdk's ``perfsdk.*`` ranges, then ``ProfilerStep#N``.
    ``cost``: what a step must move and the peaks (:class:`~perfsdk.profiling.bandwidth.StepCost`),
    for every step or per phase; ``unprofiled``: the step time without the profiler
    (:class:`~perfsdk.profiling.observer.Unprofiled`), for every step or per phase; ``phase``: the
    phase of steps that are not ``perfsdk.<phase>`` ranges. ``max_bytes``: the most JSON read from a file,
    after decompression (2 GiB; None: no limit), as in :func:`~perfsdk.profiling.trace_events.load_trace`.
    """
    if phase not in PHASES:
        raise ConfigError(f"phase: expected one of {', '.join(PHASES)}, got {phase!r}")
    costs = _per_phase("cost", cost, StepCost)
    refs = _per_phase("unprofiled", unprofiled, Unprofiled)
    trace = source if isinstance(source, Trace) else load_trace(source, max_bytes=max_bytes)
    spans, step_source = step_spans(trace, step_pattern)
    if not spans:
        raise ConfigError(
            f"trace: {trace.source!r} holds no timed events (complete 'X' events of torch.profiler's "
            "categories: kernels, CUDA runtime calls, operators, record_function ranges): "
            "it is not a profiler trace with steps to analyse"
        )
    steps, gaps = measure_steps(trace, spans)
    return Diagnosis(
        source=trace.source,
        has_gpu=trace.has_gpu,
        step_source=step_source,
        steps=steps,
        findings=[],
        gaps=gaps,
        trace=trace,
        costs=costs,
        unprofiled=refs,
        phase=phase,
    )._finish()


def _per_phase(name: str, value: Any, kind: type) -> dict[str, Any]:
    """``{phase: value}`` from one value for every phase or a mapping by phase; checks the types."""
    if value is None:
        return {}
    if isinstance(value, kind):
        return dict.fromkeys(PHASES, value)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k not in PHASES:
                raise ConfigError(f"{name}: keys are phases ({', '.join(PHASES)}), got {k!r}")
            if not isinstance(v, kind):
                raise ConfigError(f"{name}[{k!r}]: expected a {kind.__name__}, got {v!r}")
            out[k] = v
        return out
    raise ConfigError(f"{name}: expected a {kind.__name__} or a mapping of phase to {kind.__name__}, got {value!r}")
