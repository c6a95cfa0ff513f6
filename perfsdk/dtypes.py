"""Bytes per element of the dtypes model weights and KV caches are stored in, and what a quantized
checkpoint's ``quantization_config`` says its weights are stored as::

    dtype_bytes("bfloat16")                                      # 2
    dtype_bytes("torch.float8_e4m3fn")                           # 1
    quantized_weight_dtype({"quant_method": "awq", "bits": 4})   # "int4"
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from perfsdk.errors import ConfigError, suggest

__all__ = ["dtype_bytes", "quantized_weight_dtype"]

# bytes per element by dtype name; torch spellings ("torch.bfloat16") are accepted too
_DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "tf32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "int4": 0.5,
    "fp4": 0.5,
    "nvfp4": 0.5,
    "mxfp4": 0.5,
}


def quantized_weight_dtype(quantization_config: Mapping[str, Any] | Any | None) -> str | None:
    """The stored weight dtype a Hugging Face ``quantization_config`` describes, or None (not quantized,
    or a scheme not recognised). FP8 (``fp8``, ``fbgemm_fp8``, ModelOpt FP8), GPTQ/AWQ/Marlin with their
    ``bits``, compressed-tensors' weight groups, bitsandbytes, MXFP4 and NVFP4."""
    q = _as_mapping(quantization_config) if quantization_config is not None else {}
    if not q:
        return None
    method = str(q.get("quant_method") or q.get("quantization") or "").lower()
    algo = str(q.get("quant_algo") or "").lower()
    if method in ("fp8", "fbgemm_fp8", "ptpc_fp8") or algo == "fp8":
        return "fp8"
    if method in ("mxfp4",) or "mxfp4" in algo:
        return "mxfp4"
    if method in ("nvfp4", "modelopt_fp4") or "nvfp4" in algo:
        return "nvfp4"
    if method in ("gptq", "awq", "gptq_marlin", "awq_marlin", "marlin", "exl2", "hqq", "quark") or "bits" in q:
        bits = q.get("bits") or q.get("w_bit")
        return {4: "int4", 8: "int8"}.get(int(bits)) if bits else None
    if method == "bitsandbytes":
        return "int4" if q.get("load_in_4bit") else ("int8" if q.get("load_in_8bit") else None)
    if method == "compressed-tensors":
        for group in (q.get("config_groups") or {}).values():
            w = (group or {}).get("weights") or {}
            bits, kind = w.get("num_bits"), str(w.get("type") or "int")
            if bits in (4, 8):
                return ("fp8" if bits == 8 else "fp4") if kind == "float" else f"int{bits}"
    return None


def dtype_bytes(dtype: str | Any) -> float:
    """Bytes per element of a dtype name or torch dtype (``"bfloat16"`` → 2, ``"int4"`` → 0.5)."""
    key = str(dtype).removeprefix("torch.").lower()
    try:
        return _DTYPE_BYTES[key]
    except KeyError:
        raise ConfigError(f"dtype: unknown dtype {dtype!r}.{suggest(key, _DTYPE_BYTES)}") from None


def _as_mapping(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    d = to_dict() if callable(to_dict) else vars(config) if hasattr(config, "__dict__") else None
    if not isinstance(d, Mapping):
        raise ConfigError(f"quantization_config: expected a dict or a config object, got {type(config).__name__}")
    return dict(d)
