"""Is there a GPU, and which? — answered without importing torch.

``hardware="auto"`` (the Monitor's default) has to know whether this process sees a GPU, and its name, to
pick a datasheet row. Importing torch for that costs a server that does not use it over a second of
start-up and a few hundred MiB, so :func:`probe` asks, in order:

1. torch, only if it is **already imported** (it knows best: ROCm, ``CUDA_VISIBLE_DEVICES``, the current
   device);
2. ``CUDA_VISIBLE_DEVICES``: set to nothing (``""``, ``-1``) means no GPU is visible;
3. NVML, through ``pynvml`` (the ``nvidia-ml-py`` package) if it is installed: names and memory sizes;
4. ``/proc/driver/nvidia/gpus/*/information``, which the NVIDIA kernel driver writes (names, no sizes);
5. the CUDA driver through :mod:`ctypes` (``libcuda.so.1``: ``cuInit``, ``cuDeviceGetName``,
   ``cuDeviceTotalMem``) — last, because initialising the driver in a process that later forks (a pre-fork
   server) leaves the children unable to use CUDA, which NVML and procfs do not.

::

    from perfsdk import gpu_probe

    found = gpu_probe.probe()
    found.present         # True, False, or None: cannot tell without torch (an AMD GPU, a MIG slice...)
    found.device          # Device(name="NVIDIA H100 80GB HBM3", memory_bytes=85520809984, source="nvml")

Which device: CUDA's device 0 — the first entry of ``CUDA_VISIBLE_DEVICES`` (an index or a ``GPU-`` UUID)
or the first GPU. NVML and procfs list GPUs in PCI order, which is CUDA's only with
``CUDA_DEVICE_ORDER=PCI_BUS_ID``; when the visible GPUs are not all the same model and the order or UUID
does not settle which one is device 0, the answer is "cannot tell" and the caller falls back to torch.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PROC_GPUS", "Device", "Probe", "probe"]

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
_CUDA_ERROR_NO_DEVICE = 100


@dataclass(frozen=True)
class Device:
    """A GPU as a probe saw it: its name, total memory (None where the source does not say), the source."""

    name: str
    memory_bytes: int | None
    source: str  # "torch", "nvml", "procfs" or "driver"
    uuid: str | None = None


@dataclass(frozen=True)
class Probe:
    """What :func:`probe` found: ``present`` True (``device`` says which), False, or None (cannot tell)."""

    present: bool | None
    device: Device | None
    how: str  # one line: what answered, for logs and error messages


def probe(environ: Mapping[str, str] | None = None, proc: Path | None = None) -> Probe:
    """Whether this process sees a GPU and which is its device 0 (see the module docstring); never raises."""
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules:
        found = _from_torch()
        if found is not None:
            return found
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    first = None if visible is None else visible.split(",")[0].strip()
    if first is not None and (not first or first.startswith("-")):
        return Probe(False, None, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU")
    pci_order = environ.get("CUDA_DEVICE_ORDER", "").strip().upper() == "PCI_BUS_ID"
    root = PROC_GPUS if proc is None else proc
    for source, lister in (("NVML", _nvml_devices), ("/proc/driver/nvidia", lambda: _proc_devices(root))):
        devices = lister()
        if devices is not None:
            return _choose(devices, first, pci_order, source)
    if os.path.exists("/dev/kfd"):  # an AMD GPU (ROCm): only torch names it
        return Probe(None, None, "an AMD GPU (/dev/kfd) that only torch can name")
    return _from_driver()


def _choose(devices: Sequence[Device], first: str | None, pci_order: bool, source: str) -> Probe:
    """CUDA's device 0 among *devices* (PCI order), given ``CUDA_VISIBLE_DEVICES``'s first entry."""
    if not devices:
        return Probe(False, None, f"{source} lists no GPU")
    by_uuid = False
    if first is None:
        dev = devices[0]
    elif first.isascii() and first.isdigit():
        if int(first) >= len(devices):  # CUDA ignores the list from an invalid entry on
            return Probe(False, None, f"CUDA_VISIBLE_DEVICES starts with {first}, beyond the {len(devices)} GPUs")
        dev = devices[int(first)]
    elif first.startswith("GPU-"):
        matches = [d for d in devices if d.uuid is not None and d.uuid.startswith(first)]
        if len(matches) != 1:
            return Probe(None, None, f"CUDA_VISIBLE_DEVICES names {first!r}, which {source} does not list once")
        dev, by_uuid = matches[0], True
    else:  # a MIG slice ("MIG-..."), or something only CUDA interprets
        return Probe(None, None, f"CUDA_VISIBLE_DEVICES={first!r}, which only CUDA interprets")
    if not (by_uuid or pci_order) and any(d.name != dev.name for d in devices):
        return Probe(None, None, f"{source} lists different GPU models and CUDA's order is not PCI_BUS_ID")
    return Probe(True, dev, f"{source}: {dev.name}")


def _from_torch() -> Probe | None:
    try:
        torch: Any = sys.modules["torch"]
        if not torch.cuda.is_available():
            return Probe(False, None, "torch.cuda.is_available() is False")
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return Probe(True, Device(str(props.name), int(props.total_memory), "torch"), f"torch: {props.name}")
    except Exception:  # a half-imported or broken torch: ask the others
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_devices() -> list[Device] | None:
    """Every GPU NVML lists, in its (PCI) order; None where pynvml or the driver is missing."""
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no NVIDIA driver (or no permission): NVML cannot tell
        return None
    try:
        out = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            out.append(
                Device(
                    _text(pynvml.nvmlDeviceGetName(h)),
                    int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    "nvml",
                    _text(pynvml.nvmlDeviceGetUUID(h)),
                )
            )
        return out
    except Exception:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _proc_devices(root: Path) -> list[Device] | None:
    """Every GPU the NVIDIA kernel driver lists under *root* (one directory per PCI address, read in PCI
    order); None where the driver is not loaded."""
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return None
    out = []
    for entry in entries:
        fields: dict[str, str] = {}
        try:
            for line in (entry / "information").read_text(errors="replace").splitlines():
                key, sep, value = line.partition(":")
                if sep:
                    fields[key.strip()] = value.strip()
        except OSError:
            return None
        if not fields.get("Model"):
            return None
        out.append(Device(fields["Model"], None, "procfs", fields.get("GPU UUID")))
    return out


def _from_driver() -> Probe:
    """Device 0 through libcuda (which honours ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER`` itself)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return Probe(False, None, "no NVIDIA driver (no NVML, /proc/driver/nvidia or libcuda.so.1)")
    try:
        c_int = ctypes.c_int
        code = lib.cuInit(0)
        if code == _CUDA_ERROR_NO_DEVICE:
            return Probe(False, None, "the CUDA driver finds no device")
        count, dev = c_int(0), c_int(0)
        if code != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return Probe(None, None, f"the CUDA driver did not initialise (error {code})")
        if count.value == 0:
            return Probe(False, None, "the CUDA driver finds no device")
        name = ctypes.create_string_buffer(256)
        mem = ctypes.c_size_t(0)
        total = getattr(lib, "cuDeviceTotalMem_v2", None) or lib.cuDeviceTotalMem
        total.argtypes = [ctypes.POINTER(ctypes.c_size_t), c_int]
        if (
            lib.cuDeviceGet(ctypes.byref(dev), 0) != 0
            or lib.cuDeviceGetName(name, 256, dev) != 0
            or total(ctypes.byref(mem), dev) != 0
        ):
            return Probe(None, None, "the CUDA driver did not name device 0")
        text = name.value.decode(errors="replace")
        return Probe(True, Device(text, int(mem.value), "driver"), f"the CUDA driver: {text}")
    except Exception as e:  # a broken driver install: cannot tell
        return Probe(None, None, f"the CUDA driver failed ({e})")
