"""The ladder's rows, typed: one :class:`RungRow` per rung, with what each measurement of it found.

``ladder.json`` is these rows as JSON (:meth:`RungRow.to_dict`, the keys in the order the ladder has always
written them); :meth:`RungRow.from_dict` reads a row back, from this version's file or an older one (a key
it lacks is ``None``), which is what the table and the log are rendered from::

    from perfsdk.demo.ladder_rows import RungRow

    row = RungRow.from_dict(json.load(open("perfsdk-ladder/ladder.json"))["rungs"][1])
    row.rung, row.load.step_ms_p50, row.profile.kind, row.standalone_b1.mbu
    row.to_dict()                     # the row as ladder.json holds it

A rung skipped (or failed) is a row with ``skipped`` set and nothing measured.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = [
    "DecodeSteps",
    "EngineInfo",
    "FindingShare",
    "Health",
    "LoadRun",
    "Profile",
    "RegressCheck",
    "RungRow",
    "ServedB1",
    "Settings",
    "SpecInfo",
    "Standalone",
]

T = TypeVar("T")


def _flat(cls: type[T], d: Mapping[str, Any] | None) -> T | None:
    """A record of *cls* from the keys of *d* that are its fields (others ignored, missing ones default)."""
    if d is None:
        return None
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in d.items() if k in names})


def _plain(obj: Any) -> dict[str, Any]:
    """A flat record as a dict, its fields in declaration order (the JSON's key order)."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


@dataclass
class Settings:
    """What the ladder ran with, every default resolved (``ladder.json``'s ``settings``)."""

    device: str = ""
    size: str = ""
    max_batch_slots: int = 0
    max_seq: int = 0
    context: int = 0
    steps: int = 0
    num_prompts: int = 0
    concurrency: int = 0
    input_len: str = ""
    output_len: str = ""
    seed: int = 0
    int8_kernel: str | None = None
    attention: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Settings:
        s = _flat(cls, d)
        assert s is not None
        return s

    def to_dict(self) -> dict[str, Any]:
        return _plain(self)


@dataclass
class EngineInfo:
    """How the rung's engine was built (``"class"`` in JSON is ``class_name`` here)."""

    class_name: str | None = None
    name: str | None = None
    build_s: float | None = None
    cuda_graphs: bool = False
    compiled: bool = False
    graphs: int = 0
    capture_s: float | None = None
    compile_s: float | None = None
    int8_kernel: str | None = None
    attention: str | None = None
    attention_rejected: str | None = None
    failed_requests: int | None = None

    @classmethod
    def of(cls, eng: Any, build_s: float) -> EngineInfo:
        """From an engine's public attributes (the eager engine has none of the graph engine's: defaults)."""
        return cls(
            class_name=type(eng).__name__,
            name=eng.name,
            build_s=round(build_s, 2),
            cuda_graphs=getattr(eng, "cuda_graphs", False),
            compiled=getattr(eng, "compiled", False),
            graphs=getattr(eng, "graph_count", 0),
            capture_s=round(getattr(eng, "capture_seconds", 0.0), 2),
            compile_s=round(getattr(eng, "compile_seconds", 0.0), 2),
            int8_kernel=getattr(eng, "int8_kernel", None) if getattr(eng, "quantized", False) else None,
            attention=getattr(eng, "attention", None),
            attention_rejected=getattr(eng, "attention_rejected", None),
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> EngineInfo | None:
        if d is None:
            return None
        return _flat(cls, {("class_name" if k == "class" else k): v for k, v in d.items()})

    def to_dict(self) -> dict[str, Any]:
        return {("class" if k == "class_name" else k): v for k, v in _plain(self).items()}


@dataclass
class SpecInfo:
    """The model as perfsdk prices it (bytes per step, per token)."""

    params: float | None = None
    weight_bytes: float | None = None
    dtype: str | None = None
    kv_bytes_per_token: float | None = None
    step_weight_bytes: float | None = None
    embedding_row_bytes: float | None = None


@dataclass
class Standalone:
    """The engine's own decode step in a loop, timed by a Monitor of its own."""

    batch: int | None = None
    context: int | None = None
    steps: int | None = None
    wall_ms: float | None = None
    tokens_per_s: float | None = None
    step_ms_p50: float | None = None
    step_ms_mean: float | None = None
    mbu: float | None = None
    mbu_calibrated: float | None = None  # against this machine's measured copy bandwidth


@dataclass
class LoadRun:
    """The served load: the bench's summary and perfsdk's view of the served decode steps."""

    bench: str | None = None
    completed: int | None = None
    failed: int | None = None
    output_tokens_per_s: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    itl_ms_p99: float | None = None
    decode_steps: int | None = None
    batch_mean: float | None = None
    context_mean: float | None = None
    step_ms_p50: float | None = None
    step_ms_mean: float | None = None
    mbu: float | None = None
    prefill_mfu: float | None = None
    mbu_calibrated: float | None = None


@dataclass
class ServedB1:
    """Requests one at a time over HTTP: the tokens/s one user sees."""

    tpot_ms_p50: float | None = None
    tokens_per_s: float | None = None
    completed: int | None = None


@dataclass
class Health:
    """perfsdk's own health over the rung."""

    internal_errors: int | None = None
    dropped_records: int | None = None


@dataclass
class RegressCheck:
    """``perfsdk regress check`` of this rung's load against the previous rung's."""

    passed: bool = False
    regressions: list[str] = field(default_factory=list)
    markdown: str = ""


@dataclass
class FindingShare:
    kind: str | None = None
    share: float | None = None


@dataclass
class DecodeSteps:
    """The profiled decode steps alone (means per step; category shares weighted by busy time)."""

    steps: int = 0
    gpu_window_us: float = 0.0
    gpu_busy_us: float = 0.0
    kernels: float = 0.0
    graph_launches: float = 0.0
    category_shares: dict[str, float] = field(default_factory=dict)


@dataclass
class Profile:
    """What the table and the log need of the rung's profiler capture: the window's verdict on its decode
    steps. ``missing`` is set (and nothing else) when the window never captured."""

    captured: bool = False
    error: str | None = None
    steady: bool | None = None
    trace: str | None = None
    verdict: str | None = None
    kind: str | None = None
    share: float | None = None
    suggestion: str | None = None
    findings: list[FindingShare] = field(default_factory=list)
    gpu_busy: float | None = None
    step_us: float | None = None
    kernels_per_step: float | None = None
    kernel_median_us: float | None = None
    graph_launches_per_step: float | None = None
    host_syncs_per_step: float | None = None
    category_shares: dict[str, float] | None = None
    decode: DecodeSteps | None = None
    kernel_utilisation: float | None = None
    kernel_bound: str | None = None
    ncu: str | None = None
    inflation: float | None = None
    unprofiled_step_us: float | None = None
    report: str | None = None
    missing: str | None = None  # why there is no capture ("reason" in JSON)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Profile | None:
        if d is None:
            return None
        p = _flat(cls, {("missing" if k == "reason" else k): v for k, v in d.items()})
        assert p is not None
        p.findings = [FindingShare(f.get("kind"), f.get("share")) for f in d.get("findings") or []]
        p.decode = _flat(DecodeSteps, d.get("decode"))
        return p

    def to_dict(self) -> dict[str, Any]:
        if self.missing is not None:
            return {"captured": False, "verdict": None, "kind": None, "reason": self.missing}
        out = _plain(self)
        del out["missing"]
        out["findings"] = [_plain(f) for f in self.findings]
        out["decode"] = None if self.decode is None else _plain(self.decode)
        return out


@dataclass
class RungRow:
    """One rung of the ladder: the change, how its engine was built, every measurement, the loop's log."""

    rung: str
    skipped: str | None = None  # why the rung did not run (or failed); then nothing below is set
    error: str | None = None  # the traceback of a rung that failed
    change: str = ""
    why: str = ""
    engine: EngineInfo | None = None
    spec: SpecInfo | None = None
    standalone_b1: Standalone | None = None
    load: LoadRun | None = None
    profile: Profile | None = None
    served_b1: ServedB1 | None = None
    standalone_load: Standalone | None = None  # at the load's mean batch and context (when it decoded)
    served_over_standalone: float | None = None
    monitor: Health | None = None
    hypothesis: str | None = None
    predicted_step_ms: float | None = None
    prediction_held: bool | None = None
    result: str | None = None
    compare: str | None = None  # perfsdk bench compare against the previous rung's load
    regress: RegressCheck | None = None

    @property
    def ran(self) -> bool:
        return not self.skipped

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RungRow:
        return cls(
            rung=str(d.get("rung")),
            skipped=d.get("skipped"),
            error=d.get("error"),
            change=d.get("change") or "",
            why=d.get("why") or "",
            engine=EngineInfo.from_dict(d.get("engine")),
            spec=_flat(SpecInfo, d.get("spec")),
            standalone_b1=_flat(Standalone, d.get("standalone_b1")),
            load=_flat(LoadRun, d.get("load")),
            profile=Profile.from_dict(d.get("profile")),
            served_b1=_flat(ServedB1, d.get("served_b1")),
            standalone_load=_flat(Standalone, d.get("standalone_load")),
            served_over_standalone=d.get("served_over_standalone"),
            monitor=_flat(Health, d.get("monitor")),
            hypothesis=d.get("hypothesis"),
            predicted_step_ms=d.get("predicted_step_ms"),
            prediction_held=d.get("prediction_held"),
            result=d.get("result"),
            compare=d.get("compare"),
            regress=_flat(RegressCheck, d.get("regress")),
        )

    def to_dict(self) -> dict[str, Any]:
        """The row as ``ladder.json`` holds it: the keys the ladder writes, in its order."""
        if self.skipped:
            out: dict[str, Any] = {"rung": self.rung, "skipped": self.skipped}
            if self.error is not None:
                out["error"] = self.error
            return out

        def rec(x: Any) -> Any:
            return None if x is None else x.to_dict() if hasattr(x, "to_dict") else _plain(x)

        out = {
            "rung": self.rung,
            "change": self.change,
            "why": self.why,
            "skipped": self.skipped,
            "engine": rec(self.engine),
            "spec": rec(self.spec),
            "standalone_b1": rec(self.standalone_b1),
            "load": rec(self.load),
            "profile": rec(self.profile),
            "served_b1": rec(self.served_b1),
        }
        if self.standalone_load is not None:
            out["standalone_load"] = rec(self.standalone_load)
            out["served_over_standalone"] = self.served_over_standalone
        out.update(
            monitor=rec(self.monitor),
            hypothesis=self.hypothesis,
            predicted_step_ms=self.predicted_step_ms,
            prediction_held=self.prediction_held,
            result=self.result,
        )
        if self.compare is not None:
            out["compare"] = self.compare
        if self.regress is not None:
            out["regress"] = rec(self.regress)
        return out
