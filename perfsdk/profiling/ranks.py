"""Compare the ranks of one tensor-parallel group: who is the straggler, and who waits for it.

In tensor parallelism every rank meets the others at an all-reduce in every layer, so every rank's
step takes the same time: a slow rank does not show in per-rank step time (or in MBU). It shows in
how the time splits. A rank that arrives late at an all-reduce waits for nobody; the others wait for
it *inside* the collective — an NCCL kernel spins on the GPU until the last peer arrives, a gloo
all-reduce blocks its thread. So, per rank, over the same captured steps:

* **in collectives**: the step time spent in collectives that nothing overlapped (NCCL kernels on a
  GPU, gloo/NCCL ranges on the host in a CPU-only trace; see
  :attr:`perfsdk.profiling.analyze.Diagnosis.communication_share`);
* **transfer**: the smallest of those over the ranks — the straggler's, which waited for no one;
* **wait**: each rank's time in collectives minus the transfer — time lost to the slowest rank;
* **the straggler**: the rank that waits least, named when another rank waits at least
  :data:`STRAGGLER_MIN_WAIT_SHARE` of a step for it and — when the traces hold the same steps — it
  arrived last in at least :data:`STRAGGLER_MIN_STEP_SHARE` of them.

::

    $ perfsdk analyze rank0.pt.trace.json.gz rank1.pt.trace.json.gz
    ...
    ranks: 2 traces, 4 steps each
      rank   step ms  outside coll. ms  in coll. ms  share   waits ms
         0    12.410             5.100        7.310    59%  6.890 (56%)
         1    12.380            11.960        0.420     3%  -  <- straggler
    findings (by time at stake):
      1. straggler (56% of step time): rank 1 spends 11.960 ms per step outside collectives against ...

    from perfsdk.profiling.ranks import analyze_ranks

    diagnoses, cmp = analyze_ranks(["rank0.json.gz", "rank1.json.gz"])
    cmp.straggler                    # 1
    cmp.ranks[0].wait_share          # 0.56
    cmp.to_dict()                    # what --json prints under "ranks"

The traces should cover the same steps on every rank: capture them with
``mon.profile(steps=N, steady=False)`` called at the same step on every rank (the profiler then
starts at the next step everywhere). Rank ids come from the trace's ``distributedInfo`` (torch.profiler
writes it when a process group is up), else from ``rank<N>`` in the file name (perfsdk's trace
names), else from the order given. Timestamps are never compared across ranks (their clocks differ);
only durations are.
"""

from __future__ import annotations

import os
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError
from perfsdk.profiling.analyze import COMM_BOUND_MIN_SHARE, Diagnosis, Finding, StepStats, analyze_trace, findings_lines
from perfsdk.profiling.trace_events import DEFAULT_MAX_BYTES

__all__ = [
    "STRAGGLER_MIN_STEP_SHARE",
    "STRAGGLER_MIN_WAIT_SHARE",
    "RankComparison",
    "RankStats",
    "analyze_ranks",
    "compare_ranks",
]

# The largest wait of any rank for the slowest one, as a share of step time, from which the slowest
# rank is named a straggler. Ranks of a healthy group reach each collective within launch jitter of
# one another (a few % of a decode step); a rank that holds the others a tenth of every step costs
# the whole group that tenth, which is more than most single-GPU fixes win.
STRAGGLER_MIN_WAIT_SHARE = 0.10
# Share of the captured steps in which that rank must have arrived last. A rank slowed once (a page fault,
# another process on its core, a GC pause) arrives last in one step and not the next, and a few such
# hiccups can still average to a tenth of a step over a short capture (seen on a shared 2-core CPU); a
# straggler arrives last in nearly every step. Three of four steps, the default capture.
STRAGGLER_MIN_STEP_SHARE = 0.75

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)


@dataclass(frozen=True)
class RankStats:
    """One rank's step, split into time in collectives and outside them (µs, means per step)."""

    rank: int
    source: str
    steps: int
    step_us: float
    comm_us: float
    wait_us: float
    straggler_steps: int = 0  # steps in which this rank waited least (when step counts agree)

    @property
    def outside_us(self) -> float:
        """Step time outside collectives: compute, launches and everything else this rank did."""
        return max(self.step_us - self.comm_us, 0.0)

    @property
    def comm_share(self) -> float:
        return self.comm_us / self.step_us if self.step_us > 0 else 0.0

    @property
    def wait_share(self) -> float:
        return self.wait_us / self.step_us if self.step_us > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "trace": self.source,
            "steps": self.steps,
            "step_us": round(self.step_us, 2),
            "outside_collectives_us": round(self.outside_us, 2),
            "collectives_us": round(self.comm_us, 2),
            "collectives_share": round(self.comm_share, 4),
            "wait_us": round(self.wait_us, 2),
            "wait_share": round(self.wait_share, 4),
            "straggler_steps": self.straggler_steps,
        }


@dataclass
class RankComparison:
    """The result of :func:`compare_ranks`; ``to_dict()`` is what ``perfsdk analyze --json`` prints under ``ranks``."""

    ranks: list[RankStats]
    straggler: int | None
    transfer_us: float
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    def rank(self, r: int) -> RankStats:
        for s in self.ranks:
            if s.rank == r:
                return s
        raise KeyError(r)

    def to_dict(self) -> dict[str, Any]:
        return {
            "straggler": self.straggler,
            "transfer_us": round(self.transfer_us, 2),
            "ranks": [r.to_dict() for r in self.ranks],
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    def format_report(self) -> str:
        steps = {r.steps for r in self.ranks}
        count = (
            f"{steps.pop()} steps each" if len(steps) == 1 else "steps " + "/".join(str(r.steps) for r in self.ranks)
        )
        lines = [
            f"ranks: {len(self.ranks)} traces, {count}",
            "  rank   step ms  outside coll. ms  in coll. ms  share   waits ms",
        ]
        for r in self.ranks:
            waiting = r.rank != self.straggler and r.wait_us > 0
            waits = f"{r.wait_us / 1000:.3f} ({r.wait_share:.0%})" if waiting else "-"
            mark = "  <- straggler" if r.rank == self.straggler else ""
            lines.append(
                f"  {r.rank:>4}  {r.step_us / 1000:8.3f}  {r.outside_us / 1000:16.3f}  "
                f"{r.comm_us / 1000:11.3f}  {r.comm_share:5.0%}  {waits}{mark}"
            )
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.extend(
            findings_lines(
                self.findings,
                "none above thresholds (no straggler; collectives below "
                f"{COMM_BOUND_MIN_SHARE:.0%} of a step on the least-waiting rank)",
            )
        )
        return "\n".join(lines)


def _steps_of(d: Diagnosis) -> list[StepStats]:
    return [s for s in d.steps if s.gpu_window_us > 0] if d.has_gpu else list(d.steps)


def _step_us(d: Diagnosis, s: StepStats) -> float:
    return s.gpu_window_us if d.has_gpu else s.host_dur_us


def _comm_us(d: Diagnosis, s: StepStats) -> float:
    return s.exposed_comm_us if d.has_gpu else s.host_comm_us


def _rank_ids(diagnoses: Sequence[Diagnosis], ranks: Sequence[int] | None) -> list[int]:
    if ranks is not None:
        if len(ranks) != len(diagnoses):
            raise ConfigError(f"ranks: {len(ranks)} rank ids for {len(diagnoses)} traces")
        ids = [int(r) for r in ranks]
    else:
        ids = []
        for i, d in enumerate(diagnoses):
            r = d.trace.rank if d.trace is not None else None
            if r is None:
                m = _RANK_IN_NAME.findall(os.path.basename(d.source))
                r = int(m[-1]) if m else i
            ids.append(r)
    dup = sorted({r for r in ids if ids.count(r) > 1})
    if dup:
        raise ConfigError(
            f"traces: more than one trace of rank {dup[0]} "
            f"({', '.join(d.source for d, r in zip(diagnoses, ids, strict=True) if r == dup[0])})"
        )
    return ids


def compare_ranks(diagnoses: Sequence[Diagnosis], ranks: Sequence[int] | None = None) -> RankComparison:
    """Compare the diagnoses of one step window captured on each rank of a group (see the module docstring)."""
    if len(diagnoses) < 2:
        raise ConfigError(f"traces: comparing ranks needs two or more traces, got {len(diagnoses)}")
    kinds = {d.has_gpu for d in diagnoses}
    if len(kinds) > 1:
        raise ConfigError("traces: some traces have GPU events and some do not; compare traces of one kind")
    ids = _rank_ids(diagnoses, ranks)
    per_rank = [_steps_of(d) for d in diagnoses]
    for d, steps, r in zip(diagnoses, per_rank, ids, strict=True):
        if not steps:
            raise ConfigError(f"traces: rank {r} ({d.source}) has no steps with timings to compare")
    notes: list[str] = []
    counts = [len(s) for s in per_rank]
    aligned = len(set(counts)) == 1
    if not aligned:
        notes.append(
            "the traces hold different numbers of steps; comparing means over each trace's steps "
            "(capture the same steps on every rank: mon.profile(steps=N, steady=False) at the same step)"
        )
    means = [
        (statistics.fmean(_step_us(d, s) for s in steps), statistics.fmean(_comm_us(d, s) for s in steps))
        for d, steps in zip(diagnoses, per_rank, strict=True)
    ]
    transfer = min(c for _, c in means)
    least = [0] * len(diagnoses)
    if aligned:  # step by step: who waited least in each step (a tie credits nobody: nobody waited)
        for k in range(counts[0]):
            comms = [_comm_us(d, steps[k]) for d, steps in zip(diagnoses, per_rank, strict=True)]
            low = min(comms)
            if comms.count(low) == 1:
                least[comms.index(low)] += 1
    stats = [
        RankStats(
            rank=r,
            source=d.source,
            steps=len(steps),
            step_us=step,
            comm_us=comm,
            wait_us=comm - transfer,
            straggler_steps=n,
        )
        for d, steps, r, (step, comm), n in zip(diagnoses, per_rank, ids, means, least, strict=True)
    ]
    order = sorted(range(len(stats)), key=lambda i: stats[i].rank)
    stats = [stats[i] for i in order]
    group_step = statistics.fmean(s.step_us for s in stats)
    slowest = min(stats, key=lambda s: s.comm_us)
    worst_wait = max(s.wait_us for s in stats)
    findings: list[Finding] = []
    straggler = None
    consistent = not aligned or slowest.straggler_steps >= STRAGGLER_MIN_STEP_SHARE * slowest.steps
    if group_step > 0 and worst_wait / group_step >= STRAGGLER_MIN_WAIT_SHARE and not consistent:
        notes.append(
            f"ranks wait up to {worst_wait / group_step:.0%} of a step for each other, but no rank arrived "
            f"last in {STRAGGLER_MIN_STEP_SHARE:.0%} of the steps (rank {slowest.rank}: "
            f"{slowest.straggler_steps} of {slowest.steps}): one-off hiccups, not a straggler"
        )
    if group_step > 0 and worst_wait / group_step >= STRAGGLER_MIN_WAIT_SHARE and consistent:
        straggler = slowest.rank
        others = [s for s in stats if s.rank != straggler]
        outside = statistics.fmean(s.outside_us for s in others)
        waits = ", ".join(f"rank {s.rank} {s.wait_us / 1000:.3f} ms ({s.wait_share:.0%})" for s in others)
        consistency = f"; it arrived last in {slowest.straggler_steps} of {slowest.steps} steps" if aligned else ""
        findings.append(
            Finding(
                "straggler",
                worst_wait / group_step,
                f"rank {straggler} spends {slowest.outside_us / 1000:.3f} ms per step outside collectives against "
                f"{outside / 1000:.3f} ms on the other ranks, which wait for it in collectives: {waits} per step"
                f"{consistency}",
                f"Find what rank {straggler} does that the others do not: extra host work on that rank (sampling, "
                "scheduling, logging, a host sync), a slower or throttled GPU (nvidia-smi -q -d CLOCK,PERFORMANCE,"
                "TEMPERATURE; compare its clocks and power with the others'), or an uneven shard. The other ranks' "
                "time in collectives is waiting, not transfer: a faster interconnect would not win it back.",
            )
        )
    transfer_share = transfer / group_step if group_step > 0 else 0.0
    if transfer_share >= COMM_BOUND_MIN_SHARE:
        findings.append(
            Finding(
                "communication_bound",
                transfer_share,
                f"even the rank that waits least spends {transfer_share:.0%} of its step ({transfer / 1000:.3f} ms) "
                "in collectives: that is transfer, not waiting for a straggler",
                "Overlap communication with compute (async collectives, a separate stream), send fewer and larger "
                "all-reduces (fuse them), use the engine's custom all-reduce for small messages, or lower the "
                "tensor-parallel degree.",
            )
        )
    findings.sort(key=lambda f: -f.share)
    return RankComparison(ranks=stats, straggler=straggler, transfer_us=transfer, findings=findings, notes=notes)


def analyze_ranks(
    sources: Sequence[str | os.PathLike[str]],
    *,
    step_pattern: str | None = None,
    ranks: Sequence[int] | None = None,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
) -> tuple[list[Diagnosis], RankComparison]:
    """Diagnose one trace per rank (:func:`~perfsdk.profiling.analyze.analyze_trace`) and compare them."""
    diagnoses = [analyze_trace(s, step_pattern=step_pattern, max_bytes=max_bytes) for s in sources]
    return diagnoses, compare_ranks(diagnoses, ranks)
