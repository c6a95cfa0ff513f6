"""``perfsdk demo --ladder``: climb the demo engine's optimisation ladder, and let perfsdk explain each rung.

The seeds' loop, in one command: measure one clean number, compare it with the floor, locate the gap,
change one thing, measure again, write it down::

    perfsdk demo --ladder                                   # CPU: eager, graph (no capture), int8
    perfsdk demo --ladder --device cuda --model-size 8b     # eager -> graph -> compile -> int8
    perfsdk demo --ladder --rungs eager,graph --out my-ladder

    from perfsdk.demo.ladder import LadderConfig, run_ladder, format_table
    result = run_ladder(LadderConfig(device="cpu", size="tiny"))
    print(format_table(result))

Every rung (:mod:`perfsdk.demo.rungs`, one change each) runs the same measurements on the same model:

1. **standalone, batch 1**: the engine's own decode step in a loop at context ``context`` (1024 on
   CUDA), timed on the device by a :class:`perfsdk.Monitor` of its own: step time, tokens/s, and
   perfsdk's MBU against the datasheet and against this machine's calibrated copy bandwidth;
2. **served load**: the instrumented HTTP server under ``num_prompts`` streaming requests at
   ``concurrency`` in flight (:mod:`perfsdk.bench`, in its own process); once the load runs at about full
   batch, perfsdk's profiler window (``Monitor.profile``) captures a few steady steps and
   :func:`perfsdk.profiling.analyze.analyze_trace` (``perfsdk analyze``) gives the verdict on the captured
   *decode* steps, against the unprofiled step time (the profiler slows what it measures) and, for the
   kernels, against the peak bandwidth: launch-, sync-, copy-bound, slow kernels (with the Nsight Compute
   command for them) or healthy memory-bound;
3. **served batch 1**: three requests one after the other: the tokens/s one user sees;
4. **standalone at the load's shape** (its mean batch and context): the in-server step over the bare
   loop's, which says what serving costs on top of the kernels;
5. ``perfsdk bench compare`` and ``perfsdk regress check`` of the load against the rung before.

Then the loop's log: for each rung the hypothesis the previous verdict suggests, the change, a predicted
step time, the result, and whether the prediction held. The table's "next" column is the change the
finding asks for (:func:`short_advice`), whatever the rung is called; a utilisation above 100 % (which no
step can reach) is shown as ``suspect``, not as a result. Written under ``out_dir``: ``ladder.json``
(everything), ``ladder.md`` (the table and the log), ``ladder.png`` (step time and MBU per rung, where
matplotlib is installed), ``bench-<rung>.json`` (each load, for ``perfsdk bench compare``) and
``traces/`` (each profiler window's trace and diagnosis).

On a CPU, ``graph`` runs the same static step without CUDA graphs and ``compile`` is skipped (the
table says why); the bf16 rungs share one model, and ``int8`` quantises it in place, so it runs last.

**The parts.** This module runs the ladder (:func:`run_ladder`) and writes its files; running one rung is
:mod:`~perfsdk.demo.ladder_rung`, the rows it fills :mod:`~perfsdk.demo.ladder_rows` (dataclasses;
``ladder.json`` is their ``to_dict()``), the loop's log :mod:`~perfsdk.demo.ladder_log`, and the table,
``ladder.md`` and the plot :mod:`~perfsdk.demo.ladder_table` (re-exported here: :func:`format_table`,
:func:`format_markdown`, :func:`short_advice`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfsdk.demo.ladder_log import explain
from perfsdk.demo.ladder_rows import RungRow, Settings
from perfsdk.demo.ladder_rung import compare, run_rung
from perfsdk.demo.ladder_table import format_markdown, format_table, one_line, plot, short_advice
from perfsdk.errors import ConfigError

__all__ = ["LadderConfig", "format_markdown", "format_table", "run_ladder", "short_advice"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Defaults:
    """A device kind's defaults: batch slots, concurrency, prompts, output tokens, standalone steps, batch-1
    context, longest sequence."""

    slots: int
    concurrency: int
    prompts: int
    output: str
    steps: int
    context: int
    max_seq: int


_DEFAULTS = {
    "cpu": _Defaults(slots=4, concurrency=4, prompts=8, output="48", steps=16, context=256, max_seq=512),
    "cuda": _Defaults(slots=32, concurrency=16, prompts=64, output="128", steps=64, context=1024, max_seq=1024),
}


@dataclass(frozen=True)
class LadderConfig:
    """What ``perfsdk demo --ladder`` runs; ``None`` fields take the device's defaults (see ``_DEFAULTS``)."""

    device: str = "auto"
    size: str | None = None
    rungs: tuple[str, ...] | None = None
    out_dir: str = "perfsdk-ladder"
    max_batch_slots: int | None = None
    max_seq: int | None = None
    context: int | None = None
    steps: int | None = None
    num_prompts: int | None = None
    concurrency: int | None = None
    input_len: str = "uniform:32-128"
    output_len: str | None = None
    seed: int = 0
    calibrate: bool = True
    int8_kernel: str = "auto"
    attention: str = "auto"
    profile_steps: int = 4
    progress: Callable[[str], None] | None = field(default=None, repr=False, compare=False)


def _say(cfg: LadderConfig, msg: str) -> None:
    if cfg.progress is not None:
        cfg.progress(msg)


def _plan(names: Sequence[str] | None, device: str) -> list[tuple[str, str | None]]:
    """(rung, skip reason) in ladder order; rungs asked for by name run even where skipped by default."""
    from perfsdk.demo.rungs import RUNG_NAMES, skip_reason

    if names is None:
        return [(n, skip_reason(n, device)) for n in RUNG_NAMES]
    unknown = [n for n in names if n not in RUNG_NAMES]
    if unknown:
        raise ConfigError(f"--rungs: unknown rung {unknown[0]!r}; the rungs are {', '.join(RUNG_NAMES)}")
    wanted = set(names)
    return [(n, None) for n in RUNG_NAMES if n in wanted]  # int8 quantises the shared model: it goes last


def run_ladder(cfg: LadderConfig) -> dict[str, Any]:
    """Run every rung of the ladder (see the module docstring); returns what ``ladder.json`` holds."""
    from perfsdk.demo.model import ModelArgs, default_size
    from perfsdk.demo.stack import build_model, resolve_device

    dev = resolve_device(cfg.device)
    d = _DEFAULTS["cuda" if dev.startswith("cuda") else "cpu"]
    size = cfg.size or default_size(dev)
    ModelArgs.from_name(size)  # a bad size fails before anything is built
    plan = _plan(cfg.rungs, dev)
    slots = cfg.max_batch_slots or d.slots
    max_seq = cfg.max_seq or d.max_seq
    settings = Settings(
        device=dev,
        size=size,
        max_batch_slots=slots,
        max_seq=max_seq,
        context=min(cfg.context or d.context, max_seq),
        steps=cfg.steps or d.steps,
        num_prompts=cfg.num_prompts or d.prompts,
        concurrency=cfg.concurrency or min(d.concurrency, slots),
        input_len=cfg.input_len,
        output_len=cfg.output_len or d.output,
        seed=cfg.seed,
        int8_kernel=cfg.int8_kernel,
        attention=cfg.attention,
    )
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _say(cfg, f"perfsdk ladder: {size} on {dev}: rungs {', '.join(n for n, r in plan if r is None)}")
    hw, hw_note, cal_bw = _peaks(dev, cfg.calibrate)
    t0 = time.perf_counter()
    model = build_model(size=size, device=dev, max_batch_slots=slots, max_seq=max_seq, seed=cfg.seed)
    build_model_s = time.perf_counter() - t0
    compile_int8 = any(n == "compile" and r is None for n, r in plan)
    rows: list[RungRow] = []
    prev: RungRow | None = None
    for name, reason in plan:
        if reason is not None:
            _say(cfg, f"perfsdk ladder: {name}: skipped ({reason})")
            rows.append(RungRow(rung=name, skipped=reason))
            continue
        try:
            row = run_rung(
                name,
                model,
                settings,
                hw,
                cal_bw,
                out,
                compile_int8=compile_int8,
                calibrate=cfg.calibrate,
                profile_steps=cfg.profile_steps,
                say=lambda msg: _say(cfg, msg),
            )
        except Exception as e:  # one broken rung is a row that says why, not a lost ladder
            log.exception("perfsdk ladder: rung %s failed", name)
            rows.append(RungRow(rung=name, skipped=f"failed: {type(e).__name__}: {e}", error=traceback.format_exc()))
            if name == "compile":
                compile_int8 = False  # int8 then builds on the last rung that ran
            continue
        explain(row, prev)
        if prev is not None:
            compare(row, prev, out)
        rows.append(row)
        prev = row
        _say(cfg, f"perfsdk ladder: {name}: {one_line(row)}")
    result = {
        "settings": settings.to_dict(),
        "model": {"size": size, "params": model.args.num_params(), "build_s": round(build_model_s, 2)},
        "hardware": {
            "note": hw_note,
            "datasheet_bandwidth": getattr(hw, "memory_bandwidth", None) if hw_note.startswith("datasheet") else None,
            "calibrated_bandwidth": cal_bw,
        },
        "environment": _environment(dev),
        "rungs": [r.to_dict() for r in rows],
    }
    _write(result, out)
    return result


def _peaks(device: str, calibrate: bool) -> tuple[Any, str, float | None]:
    """The Monitor's hardware (datasheet on CUDA, calibrated on a CPU) and the calibrated copy bandwidth."""
    from perfsdk import hardware
    from perfsdk.demo.stack import _hardware

    hw, note = _hardware(device, calibrate)
    cal_bw: float | None = None
    if calibrate:
        try:
            cal = hardware.calibrate(device="cuda" if device.startswith("cuda") else "cpu", quick=True)
            cal_bw = cal.copy_bandwidth if cal.usable else None  # a noisy measurement is not a ceiling
        except Exception as e:  # no calibration: the "calibrated" column stays empty
            log.warning("perfsdk ladder: calibration failed: %s", e)
    return hw, note, cal_bw


def _write(result: dict[str, Any], out: Path) -> None:
    result["files"] = {"json": str(out / "ladder.json"), "markdown": str(out / "ladder.md")}
    if plot(result, out / "ladder.png"):
        result["files"]["plot"] = str(out / "ladder.png")
    (out / "ladder.md").write_text(format_markdown(result) + "\n")
    (out / "ladder.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


def _environment(device: str) -> dict[str, Any]:
    import platform

    import torch

    import perfsdk
    from perfsdk import hardware

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "perfsdk": perfsdk.__version__,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu_count": os.cpu_count(),
    }
    if device.startswith("cuda"):
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    try:
        env["device_info"] = hardware.device_info()
    except Exception as e:
        env["device_info_error"] = str(e)
    return env
