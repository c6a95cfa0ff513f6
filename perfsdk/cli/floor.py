"""``perfsdk floor``: the seeds' "start with a budget", as one command.

::

    perfsdk floor --model llama-3-8b --gpu h100-sxm --ctx 4096
    perfsdk floor --params 7B --bytes-per-param 2 --bandwidth-tb-s 2 --measured-ms 39.2
    perfsdk floor --params 8e9 --layers 32 --heads 32 --kv-heads 8 --head-dim 128 \\
                  --ctx 4096 --prompt-tokens 2048 --gpu h100-sxm --json

A named model supplies every size; explicit flags override it. A named GPU
supplies the peaks; ``--bandwidth-tb-s`` and ``--tflops`` override them. With
``--measured-ms`` (a measured decode step) it also prints the MBU — or, for a
step faster than its floor, says that the measurement or the peak is wrong.

Bytes a decode step reads: every weight once, except an *untied* input
embedding, of which it reads one row per sequence (a tied one is the LM head,
read whole). The seeds round this to ``params × bytes``; ``--params`` gives
that convention (no table is known then). The output says which was used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
from typing import Any

from perfsdk import budget
from perfsdk.cli._args import finite_float, int_range, positive_int
from perfsdk.errors import ConfigError
from perfsdk.model import ModelSpec, dtype_bytes

__all__ = ["compute", "parse_count", "register", "run"]

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
# The ranges of the flags: wide enough for any real model or part, narrow enough that no figure overflows a
# float or prints hundreds of digits (a 1e300 TB/s peak made the floor 0 and its tokens/s a division by zero).
MAX_PARAMS = 1e15
MAX_SHAPE = 10**5  # layers, heads, KV heads, head dim
MAX_SIZE = 10**7  # batch, tensor-parallel size
MAX_TOKENS = 10**9  # context and prompt lengths
TB_S = (1e-6, 1e4)  # peak bandwidth, TB/s: 1 MB/s .. 10 PB/s
TFLOPS = (1e-6, 1e7)  # dense peak, TFLOP/s
MEASURED_MS = (1e-6, 1e9)


def parse_count(text: str) -> float:
    """``"8e9"``, ``"8B"``, ``"6.74b"``, ``"500M"`` → a number of parameters."""
    m = re.fullmatch(r"[ \t]*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)[ \t]*([kmbgt]?)[ \t]*", str(text), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 8e9, 8B, 6.74B, 500M)")
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if not math.isfinite(value) or not 1 <= value <= MAX_PARAMS:
        raise argparse.ArgumentTypeError(f"must be a count within [1, {MAX_PARAMS:g}], got {text!r}")
    return value


def _model_from_args(a: argparse.Namespace) -> ModelSpec:
    if a.model:
        spec = ModelSpec.named(a.model)
        # the stored parameters a decode step reads (active ones for a mixture of experts)
        stored = spec.weight_bytes / dtype_bytes(spec.dtype)
        params = a.params if a.params is not None else stored
        bpp = a.bytes_per_param if a.bytes_per_param is not None else dtype_bytes(spec.dtype)
        changes: dict[str, Any] = {}
        if a.params is not None:
            changes["params"] = params
            # a parameter count replaces the model's composition: which part is a lookup table is unknown
            changes["embedding_bytes"] = changes["embedding_row_bytes"] = 0.0
        elif a.bytes_per_param is not None:
            scale = bpp / dtype_bytes(spec.dtype)
            changes["embedding_bytes"] = spec.embedding_bytes * scale
            changes["embedding_row_bytes"] = spec.embedding_row_bytes * scale
        if a.params is not None or a.bytes_per_param is not None:
            changes["weight_bytes"] = params * bpp
        for field in ("layers", "heads", "kv_heads", "head_dim", "kv_bytes"):
            if getattr(a, field) is not None:
                changes[field] = getattr(a, field)
        spec = dataclasses.replace(spec, **changes) if changes else spec
    else:
        if a.params is None:
            raise ConfigError("params: give --model NAME or --params (e.g. --params 8B)")
        spec = ModelSpec.from_params(
            a.params,
            a.bytes_per_param if a.bytes_per_param is not None else 2.0,
            layers=a.layers,
            heads=a.heads,
            kv_heads=a.kv_heads,
            head_dim=a.head_dim,
            kv_bytes=a.kv_bytes if a.kv_bytes is not None else 2.0,
            name="custom",
        )
    return spec.with_tp(a.tp) if a.tp != 1 else spec


def _peak(flag: str, value: float) -> float:
    # a peak divides every floor: zero, negative, NaN or infinite would print nonsense (or divide by zero)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{flag}: must be a positive, finite number, got {value!r}")
    return value


def _peaks(a: argparse.Namespace) -> tuple[float, float | None, str, str]:
    """``(bandwidth, dense bf16 FLOP/s, GPU name, where the bandwidth comes from)``."""
    bandwidth = flops = None
    name = "custom"
    source = ""
    if a.gpu:
        from perfsdk import hardware

        hw = hardware.get(a.gpu)
        name = hw.name
        bandwidth = hw.memory_bandwidth
        flops = hw.peak_flops("bf16")
        source = f"{hw.name} datasheet"
    if a.bandwidth_tb_s is not None:
        bandwidth = _peak("bandwidth-tb-s", a.bandwidth_tb_s) * 1e12
        source = "--bandwidth-tb-s"
    if a.tflops is not None:
        flops = _peak("tflops", a.tflops) * 1e12
    if bandwidth is None:
        raise ConfigError("gpu: give --gpu NAME (e.g. --gpu h100-sxm) or --bandwidth-tb-s")
    return bandwidth, flops, name, source


def compute(a: argparse.Namespace) -> dict[str, Any]:
    """Every figure ``perfsdk floor`` prints, as one JSON-ready dict."""
    for field in ("ctx", "prompt_tokens"):
        if getattr(a, field) < 0:
            raise ConfigError(f"{field.replace('_', '-')}: must be >= 0, got {getattr(a, field)}")
    if a.batch < 1:
        raise ConfigError(f"batch: must be >= 1, got {a.batch}")
    if a.measured_ms is not None and not (math.isfinite(a.measured_ms) and a.measured_ms > 0):
        raise ConfigError(f"measured-ms: must be a positive, finite number of milliseconds, got {a.measured_ms!r}")
    model = _model_from_args(a)
    bandwidth, flops, gpu, source = _peaks(a)
    try:
        out = _figures(a, model, bandwidth, flops, gpu, source)
    except OverflowError:  # int x float beyond 1e308: --ctx, --batch or --prompt-tokens absurdly large
        out = None
    bad = [k for k, v in (out or {}).items() if isinstance(v, float) and not math.isfinite(v)]
    if out is None or bad:
        raise ConfigError(
            f"the figures overflow a float ({', '.join(bad) or 'step size'}): --ctx, --batch, --prompt-tokens "
            "or a peak (--bandwidth-tb-s, --tflops) is beyond any real model or GPU"
        )
    return out


def _figures(
    a: argparse.Namespace, model: ModelSpec, bandwidth: float, flops: float | None, gpu: str, source: str
) -> dict[str, Any]:
    context_tokens = a.ctx * a.batch
    if context_tokens and not model.has_attention_shape:
        raise ConfigError("ctx: the KV-cache term needs --layers, --kv-heads and --head-dim (or --model)")
    step_bytes = budget.decode_step_bytes(model, context_tokens, a.batch)
    floor_s = step_bytes / bandwidth
    out: dict[str, Any] = {
        "model": model.name,
        "gpu": gpu,
        "tp": model.tp,
        "batch": a.batch,
        "ctx": a.ctx,
        "prompt_tokens": a.prompt_tokens,
        "peak_bandwidth_bytes_per_s": bandwidth,
        "peak_bandwidth_source": source,
        "peak_flops": flops,
        "weight_bytes": model.weight_bytes,
        "step_weight_bytes": model.step_weight_bytes,
        "embedding_bytes": model.embedding_bytes,
        "bytes_convention": (
            f"every weight once, except the untied input embedding ({model.embedding_bytes:.4g} B): one row "
            "per sequence"
            if model.embedding_bytes
            else "every weight once (params x bytes; no untied input-embedding table is known)"
        ),
        "kv_bytes_per_token": model.kv_bytes_per_token if model.has_attention_shape else None,
        "decode_step_bytes": step_bytes,
        "decode_floor_ms": floor_s * 1e3,
        "decode_tokens_per_s": a.batch / floor_s,
    }
    # batch identical sequences: one sequence's FLOPs times the batch (a list of --batch lengths
    # would cost memory and time linear in a batch that may be absurd)
    linear = budget.prefill_flops(model, [a.prompt_tokens], attention=False) * a.batch
    total = budget.prefill_flops(model, [a.prompt_tokens]) * a.batch if model.has_attention_shape else linear
    out.update(
        prefill_flops=total,
        prefill_flops_no_attention=linear,
        prefill_floor_ms=total / flops * 1e3 if flops else None,
        prefill_floor_no_attention_ms=linear / flops * 1e3 if flops else None,
    )
    out["warnings"] = []
    if a.measured_ms is not None:
        out["measured_ms"] = a.measured_ms
        out["measured_tokens_per_s"] = a.batch / (a.measured_ms / 1e3)
        out["mbu"] = budget.mbu(step_bytes, a.measured_ms / 1e3, bandwidth)
        out["mbu_suspect"] = out["mbu"] > 1  # a script reading "mbu" gets the flag beside it, as stats() has
        if out["mbu"] > 1:
            # faster than the floor is impossible: one of the two numbers is wrong, and we cannot tell which
            out["warnings"].append(
                f"MBU {_fig(out['mbu'] * 100, '.1f')}% is impossible: the measured {a.measured_ms:g} ms step is "
                f"faster than its "
                f"{floor_s * 1e3:.3g} ms floor. The measurement or the peak ({bandwidth / 1e12:.3g} TB/s, "
                f"{source}) is wrong: check that the step was timed on the device (CUDA events or a synchronize) "
                "and that the GPU and model sizes are the ones that ran."
            )
    return out


def _fig(x: float, spec: str) -> str:
    """*x* formatted by *spec* where that reads well; in 3 significant digits when tiny or huge (in range
    flags can still combine into 1e36 ms, which ``.2f`` would print as 37 digits)."""
    return format(x, spec) if x == 0 or 0.01 <= abs(x) < 1e12 else f"{x:.3g}"


def _fmt_bytes(b: float) -> str:
    for unit, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if b >= div:
            return f"{_fig(b / div, ',.2f')} {unit}"
    return f"{_fig(b, ',.0f')} B"


def format_table(r: dict[str, Any]) -> str:
    rows = [
        ("model", f"{r['model']} (tp={r['tp']})" if r["tp"] > 1 else r["model"]),
        (
            "gpu",
            f"{r['gpu']}: {_fig(r['peak_bandwidth_bytes_per_s'] / 1e12, '.2f')} TB/s"
            + (f", {_fig(r['peak_flops'] / 1e12, ',.0f')} TFLOP/s dense" if r["peak_flops"] else ""),
        ),
        (
            "weights read per step",
            _fmt_bytes(r["step_weight_bytes"])
            + (
                f" + one embedding row per sequence (the untied input table, {_fmt_bytes(r['embedding_bytes'])}, "
                "is not read whole)"
                if r["embedding_bytes"]
                else " (every weight once)"
            ),
        ),
    ]
    if r["kv_bytes_per_token"] is not None:
        rows.append(("KV cache per token", f"{_fig(r['kv_bytes_per_token'], ',.0f')} B"))
    rows += [
        (f"decode step bytes (batch {r['batch']}, ctx {r['ctx']})", _fmt_bytes(r["decode_step_bytes"])),
        (
            "decode floor",
            f"{_fig(r['decode_floor_ms'], '.2f')} ms/step = {_fig(r['decode_tokens_per_s'], ',.0f')} tokens/s",
        ),
    ]
    if r["prefill_floor_ms"] is not None:
        label = f"prefill floor ({r['batch']} × {r['prompt_tokens']} tokens)"
        value = f"{_fig(r['prefill_floor_ms'], '.2f')} ms"
        if r["prefill_floor_no_attention_ms"] != r["prefill_floor_ms"]:
            value += f" ({_fig(r['prefill_floor_no_attention_ms'], '.2f')} ms without attention)"
        rows.append((label, value))
    if "mbu" in r:
        rows.append(
            (
                "measured decode step",
                f"{_fig(r['measured_ms'], '.2f')} ms = {_fig(r['measured_tokens_per_s'], ',.1f')} tokens/s",
            )
        )
        rows.append(("MBU", f"{r['mbu']:.1%}" if r["mbu"] <= 1 else "suspect (above 100%: see the warning below)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"warning: {w}" for w in r.get("warnings", ())]
    return "\n".join(lines)


def run(a: argparse.Namespace) -> int:
    result = compute(a)
    print(json.dumps(result, indent=2) if a.json else format_table(result))
    for w in result["warnings"]:
        if a.json:  # the table prints them; JSON readers get them on stderr too
            print(f"perfsdk floor: warning: {w}", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "floor",
        help="decode and prefill floors (and MBU) for a model on a GPU",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", help="a known model name, e.g. llama-3-8b (see perfsdk.model.KNOWN_MODELS)")
    p.add_argument("--params", type=parse_count, help="parameter count: 8e9, 8B, 6.74B")
    p.add_argument(
        "--bytes-per-param",
        type=finite_float(0, 64, open_low=True),
        help="2 for bf16/fp16, 1 for int8/fp8, 0.5 for int4",
    )
    p.add_argument("--layers", type=positive_int(MAX_SHAPE))
    p.add_argument("--heads", type=positive_int(MAX_SHAPE), help="attention (query) heads")
    p.add_argument(
        "--kv-heads", type=positive_int(MAX_SHAPE), help="KV heads (grouped-query attention); default: --heads"
    )
    p.add_argument("--head-dim", type=positive_int(MAX_SHAPE))
    p.add_argument("--kv-bytes", type=finite_float(0, 64, open_low=True), help="bytes per KV-cache element (default 2)")
    p.add_argument(
        "--ctx",
        type=int_range(0, MAX_TOKENS),
        default=0,
        help="context length of each sequence (default 0: weights only)",
    )
    p.add_argument("--batch", type=positive_int(MAX_SIZE), default=1, help="sequences per step (default 1)")
    p.add_argument(
        "--prompt-tokens",
        type=int_range(0, MAX_TOKENS),
        default=2048,
        help="prompt length for the prefill floor (default 2048)",
    )
    p.add_argument("--gpu", help="a GPU from the datasheet table, e.g. h100-sxm, h200, a100-sxm-80gb")
    p.add_argument("--bandwidth-tb-s", type=finite_float(*TB_S), help="peak memory bandwidth in TB/s (overrides --gpu)")
    p.add_argument(
        "--tflops", type=finite_float(*TFLOPS), help="dense peak TFLOP/s (overrides --gpu; default its bf16 figure)"
    )
    p.add_argument("--tp", type=positive_int(MAX_SIZE), default=1, help="tensor-parallel size: figures per GPU")
    p.add_argument("--measured-ms", type=finite_float(*MEASURED_MS), help="a measured decode step in ms: prints MBU")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
