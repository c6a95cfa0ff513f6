"""The ladder, rendered: the table ``perfsdk demo --ladder`` prints, ``ladder.md`` (the table and the loop's
log) and ``ladder.png``, from what ``ladder.json`` holds (this version's or an older one's)::

    from perfsdk.demo.ladder import format_markdown, format_table, short_advice

    result = json.load(open("perfsdk-ladder/ladder.json"))
    print(format_table(result))
    short_advice(result["rungs"][0])     # "CUDA graphs": the next change, from the rung's finding

The "next" column is the change the rung's finding asks for (:func:`short_advice`), whatever the rung is
called; a utilisation above 100 % (which no step can reach) is shown as ``suspect``, not as a result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perfsdk.demo.ladder_rows import EngineInfo, LoadRun, Profile, RungRow, ServedB1, Settings, Standalone

__all__ = ["format_markdown", "format_table", "one_line", "plot", "short_advice"]

_COLUMNS = (
    "rung",
    "step ms b1",
    "tok/s b1",
    "tok/s served b1",
    "tok/s load",
    "MBU b1",
    "MBU b1 cal",
    "MBU load",
    "srv/solo",
    "verdict",
    "next",
)
_SUSPECT_NOTE = (
    "suspect: a utilisation above 100 %, which no step can reach: the peak in use (datasheet or "
    "calibrated bandwidth) or the measurement is wrong"
)


def _rows(result: Mapping[str, Any]) -> list[RungRow]:
    return [RungRow.from_dict(r) for r in result["rungs"]]


def _row(row: RungRow | Mapping[str, Any]) -> RungRow:
    return row if isinstance(row, RungRow) else RungRow.from_dict(row)


def _f(x: Any, fmt: str = "{:.2f}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x)


def _util(x: Any) -> str:
    """A utilisation (MBU, MFU): above 1 no step can be, so it is shown as suspect, not as a result."""
    if x is None:
        return "-"
    return f"suspect ({x * 100:.0f}%)" if x > 1 else f"{x * 100:.1f}%"


def short_advice(row: RungRow | Mapping[str, Any]) -> str:
    """The next change in a few words, from the rung's finding and its evidence — never from the rung's name
    (the log carries perfsdk's full text)."""
    r = _row(row)
    p = r.profile or Profile()
    kind = p.kind
    graphs = (p.graph_launches_per_step or 0) >= 1  # the captured decode steps replay a CUDA graph
    int8 = r.spec is not None and r.spec.dtype == "int8"
    advice = {
        "sync_bound": "no host reads in the step",
        "copy_bound": "pinned, non-blocking copies",
        "communication_bound": "overlap communication",
        "utilisation_suspect": "check the peak and bytes",
        "busy_unchecked": "give model and GPU",
        "compute_bound": "lower precision, fewer FLOPs",
    }
    if kind == "launch_bound":
        return "overlap host work, batch more" if graphs else "CUDA graphs"
    if kind == "slow_kernels":
        util = p.kernel_utilisation
        of = f" ({util * 100:.0f}% of peak)" if isinstance(util, (int, float)) else ""
        return f"faster kernels{of}: ncu"
    if kind == "memory_bound":
        return "fewer bytes: int4 / fp8 KV, batch more" if int8 else "fewer bytes: int8 weights"
    if kind in advice:
        return advice[kind]
    if p.captured and p.gpu_busy is None:
        return "profile on a GPU"
    return "-"


def _suspects(rows: Sequence[RungRow]) -> list[str]:
    """'rung: column' for every utilisation above 100 % in the table."""
    out = []
    for r in rows:
        if r.skipped:
            continue
        b1, ld = r.standalone_b1 or Standalone(), r.load or LoadRun()
        for label, v in (("MBU b1", b1.mbu), ("MBU b1 cal", b1.mbu_calibrated), ("MBU load", ld.mbu)):
            if isinstance(v, (int, float)) and v > 1:
                out.append(f"{r.rung} {label}")
    return out


def _verdict(row: RungRow) -> str:
    p = row.profile or Profile()
    if not p.captured:
        return "not captured"
    if p.kind is None:
        return "no finding" + (" (CPU trace)" if p.gpu_busy is None else "")
    return f"{p.kind} {p.share * 100:.0f}%" if p.share is not None else str(p.kind)


def _cells(row: RungRow) -> list[str]:
    if row.skipped:
        return [row.rung, *["-"] * 9, "skipped"]
    sb, ld, sv = row.standalone_b1 or Standalone(), row.load or LoadRun(), row.served_b1 or ServedB1()
    return [
        row.rung,
        _f(sb.step_ms_p50),
        _f(sb.tokens_per_s, "{:.1f}"),
        _f(sv.tokens_per_s, "{:.1f}"),
        _f(ld.output_tokens_per_s, "{:.0f}"),
        _util(sb.mbu),
        _util(sb.mbu_calibrated),
        _util(ld.mbu),
        _f(row.served_over_standalone, "{:.2f}x"),
        _verdict(row),
        short_advice(row),
    ]


def format_table(result: Mapping[str, Any]) -> str:
    """The seeds' table, as text."""
    s = Settings.from_dict(result["settings"])
    rows = _rows(result)
    lines = [
        f"perfsdk demo --ladder: demo-{s.size} ({result['model']['params'] / 1e9:.2f}B params) on {s.device}; "
        f"{result['hardware']['note']}",
        f"  batch 1: standalone loop at context {s.context}; load: {s.num_prompts} requests at concurrency "
        f"{s.concurrency}, prompt {s.input_len}, output {s.output_len} tokens",
    ]
    table = [list(_COLUMNS), *[_cells(r) for r in rows]]
    widths = [max(len(r[i]) for r in table) + 2 for i in range(len(_COLUMNS))]
    for cells in table:
        lines.append("  " + "".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    for row in rows:
        if row.skipped:
            lines.append(f"  {row.rung}: skipped: {row.skipped}")
    lines.append(
        "  step ms b1 and MBU b1: perfsdk's device step time and MBU of the standalone loop (MBU against the "
        "datasheet, 'cal' against this machine's measured copy bandwidth); MBU load: the served steps'; "
        "srv/solo: the served decode step over the standalone loop at the load's mean batch and context; "
        "verdict and next: perfsdk's finding on the profiled decode steps, against the unprofiled step"
    )
    suspects = _suspects(rows)
    if suspects:
        lines.append(f"  {_SUSPECT_NOTE} ({', '.join(suspects)})")
    errors = [r.rung for r in rows if r.monitor is not None and r.monitor.internal_errors]
    if errors:
        lines.append(f"  note: perfsdk internal errors in {', '.join(errors)} (see ladder.json)")
    return "\n".join(lines)


def format_markdown(result: Mapping[str, Any]) -> str:
    """``ladder.md``: the table, then the loop's log, rung by rung."""
    s, env = Settings.from_dict(result["settings"]), result.get("environment") or {}
    rows = _rows(result)
    lines = [f"# perfsdk ladder: demo-{s.size} on {env.get('gpu') or s.device}", ""]
    lines.append(
        f"{result['hardware']['note']}; torch {env.get('torch')}; perfsdk {env.get('perfsdk')}; {env.get('date_utc')}."
    )
    lines.append(
        f"Batch 1: the engine's own step in a loop at context {s.context}. Load: {s.num_prompts} "
        f"streaming requests at concurrency {s.concurrency}, prompt {s.input_len} tokens, "
        f"output {s.output_len} tokens, over HTTP."
    )
    lines += ["", "| " + " | ".join(_COLUMNS) + " |", "|" + " --- |" * len(_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(_cells(row)) + " |")
    suspects = _suspects(rows)
    if suspects:
        lines += ["", f"{_SUSPECT_NOTE[:1].upper()}{_SUSPECT_NOTE[1:]}: {', '.join(suspects)}."]
    lines += ["", "## The loop: hypothesis → change → result", ""]
    n = 0
    for row in rows:
        if row.skipped:
            lines += [f"### {row.rung}: skipped", "", row.skipped, ""]
            continue
        n += 1
        lines += [f"### {n}. {row.rung}", ""]
        lines += _rung_log(row, rows)
        lines.append("")
    return "\n".join(lines)


def _rung_log(row: RungRow, rows: Sequence[RungRow]) -> list[str]:
    """One rung's entry in the loop's log: hypothesis, change, result, measurements, verdict, comparisons."""
    eng = row.engine or EngineInfo()
    lines = [f"- **Hypothesis.** {row.hypothesis}"]
    lines.append(
        f"- **Change.** {row.change} (built in {eng.build_s} s: {eng.graphs} "
        f"CUDA graphs, capture {eng.capture_s} s, compile {eng.compile_s} s)."
    )
    lines.append(f"- **Result.** {row.result}.")
    sb, sl = row.standalone_b1 or Standalone(), row.standalone_load
    lines.append(
        f"- **Batch 1** (standalone, context {sb.context}): {_f(sb.step_ms_p50)} ms "
        f"per step on the device, {_f(sb.tokens_per_s, '{:.1f}')} tokens/s, MBU "
        f"{_util(sb.mbu)} ({_util(sb.mbu_calibrated)} of the calibrated copy bandwidth)."
    )
    if sl is not None:
        lines.append(
            f"- **Served vs standalone** at batch {sl.batch}, context {sl.context}: "
            f"{_f((row.load or LoadRun()).step_ms_p50)} ms served, {_f(sl.step_ms_p50)} "
            f"ms standalone ({_f(row.served_over_standalone, '{:.2f}x')})."
        )
    p = row.profile or Profile()
    if p.verdict:
        lines.append(f"- **perfsdk's verdict.** `{p.verdict}`")
    if p.suggestion:
        lines.append(f"- **Next, says perfsdk.** {p.suggestion}")
    mon = row.monitor
    lines.append(
        f"- perfsdk internal errors: {mon.internal_errors if mon else None}; dropped records: "
        f"{mon.dropped_records if mon else None}."
    )
    if p.report:  # the window's diagnosis (its decode steps, against the unprofiled step and the peak)
        name = Path(p.trace or "").name
        lines += ["", "```text", f"$ perfsdk analyze {name}  # as the window diagnosed it", p.report, "```"]
    if row.compare:
        lines += [
            "",
            "```text",
            f"$ perfsdk bench compare bench-{_prev_name(rows, row)}.json bench-{row.rung}.json",
            row.compare,
            "```",
        ]
    if row.regress is not None:
        lines += ["", row.regress.markdown]
    return lines


def _prev_name(rows: Sequence[RungRow], row: RungRow) -> str:
    ran = [r.rung for r in rows if not r.skipped]
    i = ran.index(row.rung)
    return ran[i - 1] if i > 0 else ran[i]


def one_line(row: RungRow) -> str:
    """The rung's progress line: batch-1 step and MBU, load throughput, verdict."""
    sb, ld = row.standalone_b1 or Standalone(), row.load or LoadRun()
    return (
        f"batch-1 step {_f(sb.step_ms_p50)} ms (MBU {_util(sb.mbu)}), load "
        f"{_f(ld.output_tokens_per_s, '{:.0f}')} tokens/s, verdict {_verdict(row)}"
    )


def plot(result: Mapping[str, Any], path: Path) -> bool:
    """``ladder.png``: step time and MBU per rung; False where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in _rows(result) if not r.skipped]
    names = [r.rung for r in rows]
    b1 = [(r.standalone_b1 or Standalone()).step_ms_p50 or 0.0 for r in rows]
    served = [(r.load or LoadRun()).step_ms_p50 or 0.0 for r in rows]
    mbu_b1 = [100 * ((r.standalone_b1 or Standalone()).mbu or 0.0) for r in rows]
    mbu_ld = [100 * ((r.load or LoadRun()).mbu or 0.0) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = list(range(len(names)))
    ax1.bar([i - 0.2 for i in x], b1, width=0.4, label="batch 1 (standalone)")
    ax1.bar([i + 0.2 for i in x], served, width=0.4, label="served load")
    ax1.set_xticks(x, names)
    ax1.set_ylabel("decode step, ms (device time)")
    ax1.set_title("step time per rung")
    ax1.legend()
    ax2.plot(x, mbu_b1, marker="o", label="batch 1 (standalone)")
    ax2.plot(x, mbu_ld, marker="s", label="served load")
    ax2.set_xticks(x, names)
    ax2.set_ylabel("MBU, % of datasheet bandwidth")
    ax2.set_ylim(0, 100)
    ax2.set_title("MBU per rung")
    ax2.legend()
    s = result["settings"]
    fig.suptitle(f"perfsdk ladder: demo-{s['size']} on {(result.get('environment') or {}).get('gpu') or s['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
