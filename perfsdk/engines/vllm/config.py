"""What perfsdk's vLLM integration reads from vLLM and the environment, in one place.

* :data:`SUPPORTED` / :func:`version_problem`: the vLLM releases this integration was written and
  tested against (it reads vLLM's worker and scheduler classes, which change between minor releases).
* :func:`model_of`: the per-GPU :class:`~perfsdk.model.ModelSpec` and served name of a ``VllmConfig``
  (the Hugging Face config vLLM loaded, at the quantized width of a quantized checkpoint, the KV cache
  at ``--kv-cache-dtype``, split over ``--tensor-parallel-size``).
* :func:`hardware_of`: ``PERFSDK_HARDWARE``, else the GPU as vLLM's platform names it.
* :func:`metrics_export`: where a worker's metrics can go (``PROMETHEUS_MULTIPROC_DIR``, a port).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec
    from perfsdk.monitor import Monitor

__all__ = ["SUPPORTED", "enabled", "hardware_of", "metrics_export", "model_of", "version_problem"]

log = logging.getLogger("perfsdk")

SUPPORTED = ((0, 33), (0, 34))  # vLLM >= 0.33, < 0.34: the range the CI suite runs (0.33.0)
SUPPORTED_TEXT = "vllm>=0.33,<0.34"


def version_problem(version: str | None = None) -> str | None:
    """None when *version* (default: the installed vLLM's) is in :data:`SUPPORTED`, else why not."""
    if version is None:
        import vllm

        version = str(getattr(vllm, "__version__", ""))
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        return f"cannot read vLLM's version ({version!r}); perfsdk supports {SUPPORTED_TEXT}"
    v = (int(m.group(1)), int(m.group(2)))
    if not SUPPORTED[0] <= v < SUPPORTED[1]:
        return f"vLLM {version} is outside the range perfsdk's vLLM integration supports ({SUPPORTED_TEXT})"
    return None


def enabled() -> bool:
    """``PERFSDK_ENABLED`` (default on), as :class:`perfsdk.Monitor` reads it."""
    return os.environ.get("PERFSDK_ENABLED", "1").strip().lower() not in ("0", "false", "no", "off")


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

    named = os.environ.get("PERFSDK_HARDWARE")
    if named:
        return hardware.resolve(named)
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda_alike():
            return None
        return hardware.match_device_name(current_platform.get_device_name(device),
                                          int(current_platform.get_device_total_memory(device)))
    except Exception as e:
        log.warning("perfsdk: could not tell which GPU vLLM runs on (%s); set PERFSDK_HARDWARE", e)
        return None


def metrics_export() -> tuple[bool, int | None]:
    """(whether this process writes to ``PROMETHEUS_MULTIPROC_DIR``, ``PERFSDK_METRICS_PORT`` or None).

    prometheus_client picks its value store when it is first imported: a directory set later (or
    only in another process) leaves this process's metrics in memory, where vLLM's ``/metrics`` does
    not read them.
    """
    multiproc = False
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import values

        multiproc = values.ValueClass is not values.MutexValue
    port = os.environ.get("PERFSDK_METRICS_PORT", "").strip()
    return multiproc, (int(port) if port else None)


@contextlib.contextmanager
def env_without(name: str) -> Iterator[None]:
    """*name* unset while the block runs (a Monitor reads ``PERFSDK_METRICS_PORT`` and would bind it
    in every worker; the worker hook serves each rank on its own port instead)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


def count_error(mon: Monitor | None, exc: BaseException, where: str) -> None:
    """Count *exc* in *mon*'s ``perfsdk_internal_errors_total`` and log it once per site (never raises).

    (The Monitor's error guard is not public API yet; this is the integration's one use of it.)
    """
    try:
        guard = getattr(mon, "_errors", None)
        if guard is not None:
            guard.record(exc, where)
        else:
            log.error("perfsdk: %s: %s", where, exc)
    except Exception:
        pass
