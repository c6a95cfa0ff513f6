"""What one step must move and compute, and the peaks to measure its kernels against: :class:`StepCost`.

The input of the kernel check (:mod:`perfsdk.profiling.bandwidth`, which re-exports it): from a model and
a GPU through :mod:`perfsdk.budget`, or as figures directly::

    from perfsdk.hardware import get
    from perfsdk.model import ModelSpec
    from perfsdk.profiling.bandwidth import StepCost

    cost = StepCost.decode(ModelSpec.named("llama-3-8b"), get("h200"), batch=1, context_tokens=1024)
    cost.floors_us()                  # (memory floor, compute floor) in µs
    StepCost(bytes=313.5e6, peak_bandwidth=4.8e12, source="my model on an H200")
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfsdk.config import check_number
from perfsdk.errors import ConfigError

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec

__all__ = ["StepCost"]


def _check_figure(field_name: str, value: Any) -> float | None:
    return None if value is None else check_number(field_name, value, 0, open_low=True, what="a number or None")


@dataclass(frozen=True)
class StepCost:
    """What one step must move (bytes) and compute (FLOPs), and the peaks (per second) to measure its kernels
    against — per GPU. ``source`` says where the figures come from; ``missing`` why one is absent."""

    bytes: float | None = None
    flops: float | None = None
    peak_bandwidth: float | None = None
    peak_flops: float | None = None
    source: str = ""
    missing: str = ""

    def __post_init__(self) -> None:
        for name in ("bytes", "flops", "peak_bandwidth", "peak_flops"):
            object.__setattr__(self, name, _check_figure(name, getattr(self, name)))

    @classmethod
    def decode(
        cls,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        *,
        batch: int = 1,
        context_tokens: int = 0,
        compute_dtype: str | None = None,
    ) -> StepCost:
        """A decode step of *batch* sequences over *context_tokens* context tokens in all (:mod:`perfsdk.budget`)."""
        from perfsdk import budget

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(f"batch: must be a whole number >= 1, got {batch!r}")
        if context_tokens and not model.has_attention_shape:
            raise ConfigError("context: the KV-cache bytes need the model's layers, kv_heads and head_dim")
        nbytes = budget.decode_step_bytes(model, context_tokens, batch)
        flops = budget.decode_flops(model, batch, context_tokens)
        return cls._with_peaks(
            nbytes,
            flops,
            model,
            hardware,
            compute_dtype,
            f"decode, batch {batch}, context {context_tokens} tokens in all",
        )

    @classmethod
    def prefill(
        cls,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        seq_lens: Sequence[int],
        *,
        compute_dtype: str | None = None,
    ) -> StepCost:
        """A prefill of sequences of *seq_lens* new tokens."""
        from perfsdk import budget

        lens = list(seq_lens)
        if not lens or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lens):
            raise ConfigError(f"prompt tokens: every sequence needs a whole number >= 1 of tokens, got {seq_lens!r}")
        nbytes = budget.prefill_step_bytes(model, lens)
        flops = budget.prefill_flops(model, lens, attention=model.has_attention_shape)
        what = f"{lens[0]} tokens" if len(lens) == 1 else f"{len(lens)} sequences, {sum(lens)} tokens"
        return cls._with_peaks(nbytes, flops, model, hardware, compute_dtype, f"prefill, {what}")

    @classmethod
    def _with_peaks(
        cls,
        nbytes: float,
        flops: float,
        model: ModelSpec,
        hardware: HardwareSpec | None,
        compute_dtype: str | None,
        what: str,
    ) -> StepCost:
        from perfsdk.assembly import default_compute_dtype

        name = model.name or "model"
        if hardware is None:
            return cls(
                bytes=nbytes,
                flops=flops,
                source=f"{name} {what}",
                missing="no GPU peaks: give the GPU (--gpu, or Monitor(hardware=...))",
            )
        dtype = compute_dtype or default_compute_dtype(model)
        missing = ""
        try:
            peak: float | None = hardware.peak_flops(dtype)
        except ConfigError as e:
            peak, missing = None, str(e)
        where = hardware.source or "datasheet"
        return cls(
            bytes=nbytes,
            flops=flops,
            peak_bandwidth=hardware.memory_bandwidth,
            peak_flops=peak,
            source=f"{name} {what}; {hardware.display_name} ({where})",
            missing=missing,
        )

    @property
    def checkable(self) -> bool:
        """Whether a floor can be computed: bytes with a peak bandwidth, or FLOPs with a peak FLOP/s."""
        return (self.bytes is not None and self.peak_bandwidth is not None) or (
            self.flops is not None and self.peak_flops is not None
        )

    def floors_us(self) -> tuple[float | None, float | None]:
        """(memory floor, compute floor) in µs; None where a figure is missing."""
        mem = self.bytes / self.peak_bandwidth * 1e6 if self.bytes is not None and self.peak_bandwidth else None
        comp = self.flops / self.peak_flops * 1e6 if self.flops is not None and self.peak_flops else None
        return mem, comp

    def why_unchecked(self) -> str:
        if self.missing:
            return self.missing
        if self.peak_bandwidth is None and self.peak_flops is None:
            return "no GPU peaks: give the GPU (--gpu, or --bandwidth-tb-s / --tflops)"
        return "no bytes or FLOPs for the step: give the model (--model, or --step-bytes / --step-flops)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes": self.bytes,
            "flops": self.flops,
            "peak_bandwidth": self.peak_bandwidth,
            "peak_flops": self.peak_flops,
            "source": self.source,
            "missing": self.missing or None,
        }
