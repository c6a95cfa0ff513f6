"""The device perfsdk runs on: its datasheet row (:func:`detect`) and what machine it is (:func:`device_info`).

Used through :mod:`perfsdk.hardware`::

    hw.detect()          # the current CUDA/ROCm device's row, e.g. "NVIDIA H200" -> h200-sxm
    hw.device_info()     # name, memory, driver, clocks, power limit, torch version; never raises

torch is imported only inside the functions that need it: :func:`device_info`, and :func:`detect` only when
:mod:`perfsdk.gpu_probe` cannot name the device (an AMD GPU, a MIG slice, mixed GPU models); ``"auto"`` on a
host without a GPU is plain Python.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

from perfsdk.errors import ConfigError, UnknownHardwareError
from perfsdk.hardware.datasheets import SPEC_HINT, HardwareSpec, match_device_name

__all__ = ["cpu_name", "cuda_index", "detect", "detect_torch", "device_info", "memory_bytes", "probed"]

log = logging.getLogger(__name__)


def cuda_index(torch: Any, device: int | str | None) -> int:
    """The CUDA ordinal of *device* (``None``: the current one; ``"cuda:1"``, ``1``)."""
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"device: expected a CUDA device such as 'cuda:0', got {device!r}")
    return int(dev.index) if dev.index is not None else int(torch.cuda.current_device())


def probed() -> tuple[bool, HardwareSpec | None]:
    """``(answered, spec)``: this process's GPU as found without importing torch (:mod:`perfsdk.gpu_probe`).

    ``(True, spec)``: its datasheet row; ``(True, None)``: no GPU; ``(False, None)``: only torch can tell.
    Raises :class:`UnknownHardwareError` for a GPU that is not in the table.
    """
    from perfsdk import gpu_probe

    found = gpu_probe.probe()
    if found.present is False:
        log.debug("hardware='auto': no GPU (%s)", found.how)
        return True, None
    if found.device is None:
        log.debug("hardware='auto': %s; asking torch", found.how)
        return False, None
    try:
        return True, match_device_name(found.device.name, found.device.memory_bytes)
    except UnknownHardwareError:
        if found.device.memory_bytes is not None:
            raise
        log.debug("hardware='auto': %s needs its memory size to pick a row; asking torch", found.device.name)
        return False, None


def detect_torch(device: int | str | None, missing_ok: bool) -> HardwareSpec | None:
    """The device's row through torch; with *missing_ok*, None (not an error) without torch or a GPU."""
    try:
        import torch  # optional and heavy; only a device the probe cannot name needs it
    except ImportError:
        if missing_ok:
            return None
        raise UnknownHardwareError(
            f"hardware: cannot detect the GPU because torch is not installed; name the part "
            f"(hardware='h100-sxm') or {SPEC_HINT}."
        ) from None
    if not torch.cuda.is_available():
        if missing_ok:
            return None
        raise UnknownHardwareError(
            f"hardware: no GPU found (torch {torch.__version__}: torch.cuda.is_available() is False), so "
            f"'auto' has nothing to detect; name the part (hardware='h100-sxm') or {SPEC_HINT}."
        )
    props = torch.cuda.get_device_properties(cuda_index(torch, device))
    return match_device_name(str(props.name), int(props.total_memory))


def detect(device: int | str | None = None) -> HardwareSpec:
    """The datasheet row of the current (or given) CUDA/ROCm device.

    The current device is found without importing torch where NVML, the NVIDIA driver or an already
    imported torch can say which it is (:mod:`perfsdk.gpu_probe`); torch is imported only for a *device*
    argument, an AMD GPU, or a device the others cannot tell apart. Raises :class:`UnknownHardwareError`
    when there is no GPU (or no torch where it is needed) and when the device's name maps to no row; both
    messages say how to pass a spec instead.
    """
    if device is None:
        answered, spec = probed()
        if answered and spec is None:
            raise UnknownHardwareError(
                f"hardware: no GPU found, so 'auto' has nothing to detect; name the part (hardware='h100-sxm') "
                f"or {SPEC_HINT}."
            )
        if spec is not None:
            return spec
    spec = detect_torch(device, missing_ok=False)
    assert spec is not None
    return spec


def _nvml_info(props: Any, index: int) -> dict[str, Any]:
    try:
        import pynvml  # optional (nvidia-ml-py)
    except ImportError:
        return {}
    info: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no permission: NVML is a nice-to-have
        return {}
    try:
        handle = None
        uuid = getattr(props, "uuid", None)
        if uuid is not None:  # the NVML index differs from torch's under CUDA_VISIBLE_DEVICES
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            except Exception:
                handle = None
        if handle is None:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        readers: dict[str, Callable[[], Any]] = {
            "driver": pynvml.nvmlSystemGetDriverVersion,
            "sm_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "mem_clock_mhz": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "max_sm_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
            "max_mem_clock_mhz": lambda: pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM),
            "power_limit_w": lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
        }
        for key, read in readers.items():
            try:
                value = read()
                info[key] = value.decode() if isinstance(value, bytes) else value
            except Exception:
                info[key] = None
    except Exception:
        pass
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what :mod:`platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def device_info(device: int | str | None = None) -> dict[str, Any]:
    """What machine this is, for benchmark records: never raises; unknown pieces are ``None``.

    Keys: ``backend`` (cuda/rocm/cpu), ``name``, ``memory_bytes``, ``driver``, ``sm_clock_mhz``,
    ``mem_clock_mhz``, ``max_sm_clock_mhz``, ``max_mem_clock_mhz``, ``power_limit_w`` (NVML, when
    ``pynvml`` is importable), ``torch_version``, ``cuda_version``, ``hip_version``, ``device_index``,
    ``cpu``, ``cpu_count``, ``python``.
    """
    info: dict[str, Any] = dict.fromkeys(
        ("backend", "name", "memory_bytes", "driver", "sm_clock_mhz", "mem_clock_mhz", "max_sm_clock_mhz",
         "max_mem_clock_mhz", "power_limit_w", "torch_version", "cuda_version", "hip_version",
         "device_index"),
    )  # fmt: skip
    info.update(cpu=cpu_name(), cpu_count=os.cpu_count(), python=platform.python_version())
    try:
        import torch  # optional and heavy
    except ImportError:
        info.update(backend="cpu", name=info["cpu"])
        return info
    info["torch_version"] = str(torch.__version__)
    info["cuda_version"] = getattr(torch.version, "cuda", None)
    info["hip_version"] = getattr(torch.version, "hip", None)
    try:
        if not torch.cuda.is_available():
            info.update(backend="cpu", name=info["cpu"])
            return info
        index = cuda_index(torch, device)
        props = torch.cuda.get_device_properties(index)
        info.update(
            backend="rocm" if info["hip_version"] else "cuda",
            name=str(props.name),
            memory_bytes=int(props.total_memory),
            device_index=index,
        )
        info.update(_nvml_info(props, index))
    except Exception as e:  # a broken driver must not break a benchmark's bookkeeping
        log.debug("device_info: %s", e)
    return info


def memory_bytes(torch: Any, dev: Any) -> int | None:
    """Total memory of *dev* (physical RAM for the CPU), or None where the platform does not say."""
    try:
        if dev.type == "cuda":
            return int(torch.cuda.get_device_properties(dev).total_memory)
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError, RuntimeError):
        return None
