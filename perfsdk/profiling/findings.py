"""What a diagnosis concludes: :class:`Finding` (kind, share of the step at stake, evidence, next change)
and the report's findings block.

Every question a trace is asked (:mod:`perfsdk.profiling.analyze` for the timeline,
:mod:`perfsdk.profiling.bandwidth` for the kernels, :mod:`perfsdk.profiling.ranks` across ranks) answers
with these, ranked by the share of step time at stake::

    from perfsdk.profiling.findings import Finding, findings_lines

    f = Finding("launch_bound", 0.48, "GPU idle 48% of step time waiting for ...", "Capture the step ...")
    print("\\n".join(findings_lines([f], "none above thresholds")))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Finding", "findings_lines"]


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what kind of limit, how much step time is at stake, why, and what to try."""

    kind: str
    share: float
    evidence: str
    suggestion: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "share": round(self.share, 4),
            "evidence": self.evidence,
            "suggestion": self.suggestion,
        }


def findings_lines(findings: list[Finding], if_none: str, basis: str = "step time") -> list[str]:
    """The report's findings block (``perfsdk analyze`` for one trace and for ranks): numbered, biggest first.

    *basis*: what the shares are shares of (``"step time"``, or ``"the unprofiled step"`` when the
    diagnosis was corrected for the profiler's own slowdown).
    """
    if not findings:
        return [f"findings: {if_none}"]
    lines = ["findings (by time at stake):"]
    for i, f in enumerate(findings, 1):
        lines.append(f"  {i}. {f.kind} ({f.share:.0%} of {basis}): {f.evidence}")
        lines.append(f"     -> {f.suggestion}")
    return lines
