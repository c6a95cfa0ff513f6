"""What perfsdk's vLLM integration reads from vLLM and the environment, in one place.

* :func:`model_of`: the per-GPU :class:`~perfsdk.model.ModelSpec` and served name of a ``VllmConfig``
  (the Hugging Face config vLLM loaded, at the quantized width of a quantized checkpoint, the KV cache
  at ``--kv-cache-dtype``, split over ``--tensor-parallel-size``).
* :func:`hardware_of`: ``PERFSDK_HARDWARE``, else the GPU as vLLM's platform names it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from perfsdk.config import env

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec

__all__ = ["hardware_of", "model_of"]

log = logging.getLogger("perfsdk")


def model_of(vllm_config: Any) -> tuple[ModelSpec | None, str | None]:
    """(the per-GPU ModelSpec or None, the served model name) of a ``VllmConfig``."""
    from perfsdk.model import ModelSpec, quantized_weight_dtype

    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return None, None
    served = getattr(mc, "served_model_name", None)
    name = served[0] if isinstance(served, (list, tuple)) and served else served
    try:
        act = str(getattr(mc, "dtype", "") or "").replace("torch.", "") or None  # what the model computes in
        quant = quantized_weight_dtype(getattr(mc.hf_config, "quantization_config", None))
        cache_dtype = str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto") or "auto")
        kv_dtype = act if cache_dtype == "auto" else ("fp8" if cache_dtype.startswith("fp8") else cache_dtype)
        spec = ModelSpec.from_hf_config(mc.hf_config, dtype=quant or act, kv_dtype=kv_dtype)
        if name:
            spec = dataclasses.replace(spec, name=str(name))
        tp = int(getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1) or 1)
        return (spec.with_tp(tp) if tp > 1 else spec), (str(name) if name else None)
    except Exception as e:  # an architecture perfsdk cannot size: latency metrics and step times only
        log.warning("perfsdk: cannot size model %s from its config (%s): MBU/MFU off", name, e)
        return None, (str(name) if name else None)


def hardware_of(device: int = 0) -> HardwareSpec | None:
    """``PERFSDK_HARDWARE`` if set, else GPU *device* as vLLM's platform reports it (through NVML: no
    CUDA context is made), else None (MBU/MFU off, with the Monitor's warning)."""
    from perfsdk import hardware

    named = env("PERFSDK_HARDWARE")
    if named:
        return hardware.resolve(named)
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda_alike():
            return None
        return hardware.match_device_name(
            current_platform.get_device_name(device), int(current_platform.get_device_total_memory(device))
        )
    except Exception as e:
        log.warning("perfsdk: could not tell which GPU vLLM runs on (%s); set PERFSDK_HARDWARE", e)
        return None
