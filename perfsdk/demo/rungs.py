"""The demo engine's rungs: one change each, from today's eager loop to int8 weights.

::

    from perfsdk.demo.rungs import RUNGS, build_engine, skip_reason

    for name, rung in RUNGS.items():
        print(name, "-", rung.change)
    engine = build_engine(model, "compile", monitor=mon)   # quantises the model first for "int8"
    engine.warm_up()                                         # compile and capture before serving

=========  ===========================================================================================
``eager``  today's engine (:class:`~perfsdk.demo.engine.Engine`): eager PyTorch, one kernel launch per
           op, prompts prefilled one at a time, every step's sampled ids read back before the next step
``graph``  :class:`~perfsdk.demo.graph_engine.GraphEngine`: decode captured as CUDA graphs per padded
           batch size and attention length, static buffers, sampling on the device, the host one step
           behind, prompts prefilled together
``compile``  the same, with each layer and the sampler through ``torch.compile`` before capture, and
           on CUDA the decode attention fused into two Triton kernels that read the KV cache in place
``int8``   the rung below it with weight-only int8 weights (:mod:`perfsdk.demo.quant`): half the bytes
=========  ===========================================================================================

On a CPU there are no CUDA graphs: ``graph`` runs the same static step without capture, and
``compile`` is skipped by the ladder unless asked for (inductor builds C++ for the CPU: minutes on two
cores, and the rung is about GPU kernel fusion).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfsdk.errors import ConfigError, suggest

if TYPE_CHECKING:
    from perfsdk.demo.engine import Engine
    from perfsdk.demo.model import Transformer

__all__ = [
    "DEFAULT_CUDA_ENGINE",
    "DEFAULT_CUDA_ENGINE_OTHERWISE",
    "RUNGS",
    "RUNG_NAMES",
    "Rung",
    "build_engine",
    "is_quantized",
    "prepare_model",
    "resolve_engine",
    "skip_reason",
]


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder: its name, the one change it makes, and why (the loop's hypothesis)."""

    name: str
    change: str
    why: str


RUNGS: dict[str, Rung] = {
    "eager": Rung(
        "eager",
        "today's engine: eager PyTorch, prompts prefilled one at a time, each step's ids read on the host",
        "the starting point: measure it, compare it with the floor",
    ),
    "graph": Rung(
        "graph",
        "decode as CUDA graphs per padded batch size, static buffers, sampling on the device, the host one "
        "step behind, prompts prefilled together",
        "a launch-bound step spends its time waiting for the host to launch kernels; one graph launch "
        "replaces them all",
    ),
    "compile": Rung(
        "compile",
        "each layer and the sampler through torch.compile (fused norms, rotary embedding, SwiGLU), then captured",
        "inside a graph every small elementwise kernel still costs a few microseconds; fusing them leaves "
        "the matrix-vector products",
    ),
    "int8": Rung(
        "int8",
        "weight-only int8 with per-channel scales (a fused Triton int8 matmul on CUDA)",
        "a memory-bound step is bytes over bandwidth; int8 weights are half the bytes of bf16",
    ),
}

RUNG_NAMES: tuple[str, ...] = tuple(RUNGS)

#: What plain ``perfsdk demo`` serves on CUDA, per model size: the rung measured fastest on an H200
#: (benchmarks/results/h200_ladder.json). For 1b the int8 kernel loses to bf16 on its small matrices.
DEFAULT_CUDA_ENGINE: dict[str, str] = {"8b": "int8"}
DEFAULT_CUDA_ENGINE_OTHERWISE = "compile"


def resolve_engine(name: str, device: str, size: str | None = None) -> str:
    """``"auto"``: eager on a CPU (the demo as it always was), the fastest rung for *size* on CUDA."""
    n = name.strip().lower()
    if n == "auto":
        if not device.startswith("cuda"):
            return "eager"
        return DEFAULT_CUDA_ENGINE.get(size or "", DEFAULT_CUDA_ENGINE_OTHERWISE)
    if n not in RUNGS:
        raise ConfigError(f"engine: expected auto or one of {', '.join(RUNGS)}, got {name!r}.{suggest(n, RUNGS)}")
    return n


def skip_reason(name: str, device: str) -> str | None:
    """Why the ladder skips rung *name* on *device* by default, or None when it runs there."""
    if name == "compile" and not device.startswith("cuda"):
        return (
            "torch.compile builds C++ kernels for a CPU (minutes on two cores) and this rung is about "
            "fusing GPU kernels; ask for it with --rungs to run it anyway"
        )
    return None


def is_quantized(model: Any) -> bool:
    from perfsdk.demo.quant import Int8Linear

    return any(isinstance(m, Int8Linear) for m in model.modules())


def prepare_model(model: Transformer, name: str, *, int8_kernel: str = "auto") -> None:
    """What rung *name* needs of the model before an engine is built: int8 weights for ``int8``."""
    if resolve_engine(name, str(model.device)) == "int8" and not is_quantized(model):
        from perfsdk.demo.quant import quantize_int8

        quantize_int8(model, kernel=int8_kernel)


def build_engine(
    model: Transformer,
    name: str,
    *,
    monitor: Any = None,
    seed: int = 0,
    compile_int8: bool | None = None,
    int8_kernel: str = "auto",
    attention: str = "auto",
) -> Engine:
    """The engine of rung *name* over *model*; for ``int8`` the model is quantised in place first.

    ``int8`` runs on top of ``compile`` on CUDA and of ``graph`` on a CPU unless *compile_int8* says.
    *attention* is :class:`~perfsdk.demo.graph_engine.GraphEngine`'s (``"auto"``: the fused Triton kernel
    under ``compile`` on CUDA).
    """
    from perfsdk.demo.engine import Engine
    from perfsdk.demo.graph_engine import GraphEngine

    name = resolve_engine(name, str(model.device))
    if name == "int8":
        prepare_model(model, name, int8_kernel=int8_kernel)
        compiled = model.device.type == "cuda" if compile_int8 is None else compile_int8
        return GraphEngine(
            model, monitor=monitor, seed=seed, compile=compiled, int8_kernel=int8_kernel, attention=attention
        )
    if is_quantized(model):
        raise ConfigError(f"engine {name!r}: the model is already int8; build a fresh model for a bf16 rung")
    if name == "eager":
        return Engine(model, monitor=monitor, seed=seed)
    return GraphEngine(model, monitor=monitor, seed=seed, compile=name == "compile", attention=attention)
