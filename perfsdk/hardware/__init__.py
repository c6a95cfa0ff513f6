"""What the hardware could do: peak memory bandwidth and dense peak FLOP/s, per part.

Every floor and utilisation figure perfsdk reports divides by one of these numbers,
so they have to be right for the *exact* part: the dense (not "with sparsity") tensor
rate, the bandwidth of that SKU's memory. Look a part up by name, let perfsdk find the
GPU it runs on, or measure what is achievable::

    import perfsdk.hardware as hw

    spec = hw.get("H100 SXM")                 # case/space/underscore tolerant; "h200", "a100" are aliases
    spec.memory_bandwidth                     # 3.35e12 bytes/s (decimal: 1 TB/s = 1e12 B/s)
    spec.peak_flops("bfloat16")               # 9.89e14 FLOP/s dense; also "bf16", torch.bfloat16, "fp8"
    hw.names()                                # every row of the datasheet table

    spec = hw.detect()                        # the current CUDA/ROCm device, e.g. "NVIDIA H200" -> h200-sxm
    hw.device_info()                          # name, memory, driver, clocks, power limit, torch version

    cal = hw.calibrate()                      # achievable copy bandwidth (read + write) and GEMM rate
    cal.flops["bf16"], cal.spread["bf16"]     # the median of several rounds, and how much they varied
    cal.usable, cal.problems                  # a noisy or implausible calibration is neither cached nor used
    spec, note = hw.calibrated_spec()         # ...as a HardwareSpec, or what perfsdk falls back to, and which

    # a part that is not in the table: say what it can do
    spec = hw.HardwareSpec(name="my-gpu", memory_bandwidth=1.2e12, flops={"bf16": 400e12})
    spec = hw.get("h100-sxm").with_overrides(memory_bandwidth=3.0e12)   # e.g. clocks capped

Anything that accepts hardware (``perfsdk.Monitor(hardware=...)``) goes through :func:`resolve`:
``None``, ``"auto"`` (detect, or ``None`` when there is no GPU), ``"calibrate"``, a name, or a spec.

From the shell, ``perfsdk calibrate`` prints the measured ceilings with their spread (``--json`` for
machines).

Datasheet figures are peaks at boost clock; nothing reaches them. A well-tuned device copy
reaches ~85% of the bandwidth and a large bf16 GEMM ~75-80% of the tensor rate (on an H200:
``perfsdk calibrate`` measured 4.1 of 4.8 TB/s and 757-763 of 989 TFLOP/s,
torch 2.11), which is why :func:`calibrate` exists.

The package, by job: :mod:`~perfsdk.hardware.datasheets` (the table and lookups),
:mod:`~perfsdk.hardware.detection` (the running device), :mod:`~perfsdk.hardware.calibration` (a
calibration and the rules for using it), :mod:`~perfsdk.hardware.calibration_run` (measuring, and the
fallback), :mod:`~perfsdk.hardware.calibration_cache` (the cache file, its expiry),
:mod:`~perfsdk.hardware.calibration_timing` (the timed copies and GEMMs). torch is imported only
inside :func:`detect`, :func:`device_info` and :func:`calibrate`; the table and lookups are plain Python.
"""

from __future__ import annotations

import logging

from perfsdk.errors import ConfigError
from perfsdk.hardware.calibration import (
    DATASHEET_CEILING,
    DATASHEET_FLOOR,
    MAX_SPREAD,
    SCHEMA_VERSION,
    Calibration,
    Spread,
)
from perfsdk.hardware.calibration_cache import DEFAULT_MAX_AGE_DAYS, cache_path
from perfsdk.hardware.calibration_run import PROBE_MARGIN, calibrate, calibrated_spec
from perfsdk.hardware.datasheets import DTYPE_KEYS, HardwareSpec, get, match_device_name, names, normalize_dtype
from perfsdk.hardware.detection import cpu_name, detect, detect_torch, device_info, probed

__all__ = [
    "DATASHEET_CEILING",
    "DATASHEET_FLOOR",
    "DEFAULT_MAX_AGE_DAYS",
    "DTYPE_KEYS",
    "MAX_SPREAD",
    "PROBE_MARGIN",
    "SCHEMA_VERSION",
    "Calibration",
    "HardwareSpec",
    "Spread",
    "cache_path",
    "calibrate",
    "calibrated_spec",
    "cpu_name",
    "detect",
    "device_info",
    "get",
    "match_device_name",
    "names",
    "normalize_dtype",
    "resolve",
]

log = logging.getLogger(__name__)

# the names these had when perfsdk.hardware was one module (tests and scripts import them)
_cache_path = cache_path
_cpu_name = cpu_name


def resolve(value: HardwareSpec | str | None) -> HardwareSpec | None:
    """Turn whatever a caller passed as ``hardware=`` into a spec.

    ``None`` -> ``None``; ``"auto"`` -> :func:`detect`, or ``None`` when there is no GPU (the caller
    decides how to say that MBU/MFU are off; a GPU that is not in the table still raises, with the
    close names, because silently losing MBU/MFU there would hide a fixable mistake); ``"calibrate"`` ->
    :func:`calibrated_spec`'s spec: the measured ceilings, or when the measurement is not usable the GPU's
    datasheet row or ``None`` (one warning says which); any other string -> :func:`get`; a
    :class:`HardwareSpec` -> itself.
    """
    if value is None or isinstance(value, HardwareSpec):
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"hardware: expected None, 'auto', 'calibrate', a name or a HardwareSpec, got {type(value).__name__}"
        )
    key = value.strip().lower()
    if key == "auto":  # without importing torch where the driver or NVML can say (perfsdk.gpu_probe)
        answered, spec = probed()
        return spec if answered else detect_torch(None, missing_ok=True)
    if key == "calibrate":
        return calibrated_spec()[0]
    return get(value)
