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

    cal = hw.calibrate()                      # achievable copy bandwidth (read + write) and GEMM rate, cached
    cal.as_spec()                             # ...as a HardwareSpec: MBU/MFU against measured ceilings

    # a part that is not in the table: say what it can do
    spec = hw.HardwareSpec(name="my-gpu", memory_bandwidth=1.2e12, flops={"bf16": 400e12})
    spec = hw.get("h100-sxm").with_overrides(memory_bandwidth=3.0e12)   # e.g. clocks capped

Anything that accepts hardware (``perfsdk.Monitor(hardware=...)``) goes through :func:`resolve`:
``None``, ``"auto"`` (detect, or ``None`` when there is no GPU), ``"calibrate"``, a name, or a spec.
``"auto"`` finds the GPU without importing torch (:mod:`perfsdk.gpu_probe`: NVML, the NVIDIA driver, or a
torch the caller already imported).

From the shell, ``perfsdk calibrate`` prints the measured ceilings (``--json`` for machines).

Datasheet figures are peaks at boost clock; nothing reaches them. A well-tuned device copy
reaches ~85% of the bandwidth and a large bf16 GEMM ~75-80% of the tensor rate (on an H200:
``perfsdk calibrate`` measured 4.1 of 4.8 TB/s and 757-763 of 989 TFLOP/s,
torch 2.11), which is why :func:`calibrate` exists.

torch is imported only inside :func:`device_info`, :func:`calibrate` and :func:`detect` (there only
when :mod:`perfsdk.gpu_probe` cannot name the device: an AMD GPU, a MIG slice, mixed GPU models); the
table, lookups and ``"auto"`` on a host without a GPU are plain Python.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

from perfsdk.errors import ConfigError, UnknownHardwareError, suggest

__all__ = [
    "DTYPE_KEYS",
    "Calibration",
    "HardwareSpec",
    "calibrate",
    "detect",
    "device_info",
    "get",
    "match_device_name",
    "names",
    "normalize_dtype",
    "resolve",
]

log = logging.getLogger(__name__)

#: The dtype keys a spec's ``flops`` mapping may hold.
DTYPE_KEYS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# Every spelling people (and torch's str(dtype)) use, mapped to a DTYPE_KEYS entry.
_DTYPE_ALIASES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "f32": "fp32",
    "tf32": "tf32", "tensorfloat32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8", "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "int8": "int8", "i8": "int8", "qint8": "int8",
}  # fmt: skip

_HINT = "pass perfsdk.HardwareSpec(name=..., memory_bandwidth=..., flops={'bf16': ...}) or --bandwidth-tb-s/--tflops"


def normalize_dtype(dtype: object) -> str:
    """Map a dtype spelling (``"bfloat16"``, ``torch.float16``, ``"half"``, ``"float8_e4m3fn"``) to a key.

    Raises :class:`ConfigError` naming the value when it is not a dtype perfsdk knows.
    """
    text = str(dtype).strip().lower().removeprefix("torch.").replace("-", "_")
    key = _DTYPE_ALIASES.get(text) or _DTYPE_ALIASES.get(text.replace("_", ""))
    if key is None:
        raise ConfigError(f"dtype: {dtype!r} is not one of {', '.join(DTYPE_KEYS)} (or a spelling of one)")
    return key


@dataclasses.dataclass(frozen=True, slots=True)
class HardwareSpec:
    """Peak memory bandwidth and dense peak FLOP/s of one part.

    ``memory_bandwidth`` is bytes/s; ``flops`` maps a dtype key (see :data:`DTYPE_KEYS`, other
    spellings are accepted and normalised) to dense FLOP/s (int8: OP/s). ``source`` says where
    the numbers come from: ``"datasheet: <doc>"`` or ``"calibrated on <device> at <date>"``.
    """

    name: str
    memory_bandwidth: float
    flops: Mapping[str, float]
    display_name: str = ""
    memory_bytes: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"name: a HardwareSpec needs a non-empty name, got {self.name!r}")
        _check_rate("memory_bandwidth", self.memory_bandwidth, self.name)
        if not isinstance(self.flops, Mapping) or not self.flops:
            raise ConfigError(
                f"flops: HardwareSpec {self.name!r} needs at least one dense peak, e.g. flops={{'bf16': 989e12}}"
            )
        flops: dict[str, float] = {}
        for dtype, value in self.flops.items():
            key = normalize_dtype(dtype)
            _check_rate(f"flops[{dtype!r}]", value, self.name)
            flops[key] = float(value)
        if self.memory_bytes is not None and (
            isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0
        ):
            raise ConfigError(f"memory_bytes: must be a positive int or None, got {self.memory_bytes!r}")
        # frozen: a read-only view so a shared table row cannot be edited in place
        object.__setattr__(self, "memory_bandwidth", float(self.memory_bandwidth))
        object.__setattr__(self, "flops", MappingProxyType(flops))
        if not self.display_name:
            object.__setattr__(self, "display_name", self.name)

    def __hash__(self) -> int:
        # the generated hash would fail on the mapping; specs are used as cache keys by callers
        return hash((self.name, self.memory_bandwidth, tuple(sorted(self.flops.items())), self.memory_bytes))

    def peak_flops(self, dtype: object) -> float:
        """Dense peak FLOP/s for *dtype* (``"bf16"``, ``"bfloat16"``, ``torch.bfloat16``, ``"fp8"``...).

        Raises :class:`ConfigError` naming the dtype and the part when no figure is published.
        """
        key = normalize_dtype(dtype)
        try:
            return self.flops[key]
        except KeyError:
            have = ", ".join(sorted(self.flops))
            raise ConfigError(
                f"dtype: {self.display_name} ({self.name}) has no published dense {key} peak "
                f"(it has: {have}); "
                f"pass flops={{'{key}': ...}} via HardwareSpec.with_overrides"
            ) from None

    def with_overrides(
        self,
        *,
        memory_bandwidth: float | None = None,
        flops: Mapping[str, float] | None = None,
        name: str | None = None,
    ) -> HardwareSpec:
        """A copy with another bandwidth, some FLOP/s figures replaced (merged per dtype), or a new name."""
        merged = dict(self.flops)
        for dtype, value in (flops or {}).items():
            merged[normalize_dtype(dtype)] = value
        changed = memory_bandwidth is not None or flops is not None
        return HardwareSpec(
            name=name if name is not None else self.name,
            memory_bandwidth=memory_bandwidth if memory_bandwidth is not None else self.memory_bandwidth,
            flops=merged,
            display_name=self.display_name if name is None else name,
            memory_bytes=self.memory_bytes,
            source=f"{self.source} (overridden)" if changed and self.source else self.source,
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (benchmark results, ``--json`` output)."""
        return {
            "name": self.name,
            "display_name": self.display_name,
            "memory_bandwidth": self.memory_bandwidth,
            "flops": dict(self.flops),
            "memory_bytes": self.memory_bytes,
            "source": self.source,
        }


def _check_rate(field: str, value: object, spec_name: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(
            f"{field}: must be a positive finite number per second (HardwareSpec {spec_name!r}), got {value!r}"
        )


# --------------------------------------------------------------------------------------------
# The datasheet table. Figures in TB/s and TFLOPS as printed, dense. Where a datasheet prints
# only "with sparsity" figures (marked * on NVIDIA sheets), the figure here is that number halved.
# fp32 is the non-tensor rate; tf32 and below are tensor-core rates with fp32 accumulate where the
# sheet distinguishes (that is what torch's matmul uses).
# --------------------------------------------------------------------------------------------

_T = 1e12
_GB = 10**9


def _row(
    name: str,
    display_name: str,
    *,
    tb_s: float,
    memory_gb: float,
    source: str,
    fp32: float,
    tf32: float,
    bf16: float,
    fp16: float,
    fp8: float | None = None,
    int8: float | None = None,
) -> HardwareSpec:
    flops = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8, "int8": int8}
    return HardwareSpec(
        name=name,
        memory_bandwidth=tb_s * _T,
        flops={k: v * _T for k, v in flops.items() if v is not None},
        display_name=display_name,
        memory_bytes=int(memory_gb * _GB),
        source=f"datasheet: {source}",
    )


_TABLE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column): 3.35 TB/s, FP32 67, sparse TF32 989,
        # BF16/FP16 1,979, FP8 3,958, INT8 3,958. Dense BF16 989 as in the H100 whitepaper (989.4).
        _row("h100-sxm", "NVIDIA H100 SXM5 80GB", tb_s=3.35, memory_gb=80,
             source="NVIDIA H100 Tensor Core GPU datasheet, H100 SXM",
             fp32=67, tf32=494.5, bf16=989, fp16=989, fp8=1979, int8=1979),
        # same datasheet, H100 PCIe column: 2 TB/s, FP32 51, sparse TF32 756, BF16/FP16 1,513, FP8/INT8 3,026
        _row("h100-pcie", "NVIDIA H100 PCIe 80GB", tb_s=2.0, memory_gb=80,
             source="NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe",
             fp32=51, tf32=378, bf16=756.5, fp16=756.5, fp8=1513, int8=1513),
        # same datasheet, H100 NVL column (per GPU, 94 GB): 3.9 TB/s, FP32 60, sparse TF32 835,
        # BF16/FP16 1,671, FP8/INT8 3,341
        _row("h100-nvl", "NVIDIA H100 NVL 94GB", tb_s=3.9, memory_gb=94,
             source="NVIDIA H100 Tensor Core GPU datasheet, H100 NVL",
             fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5),
        # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 141 GB HBM3e, 4.8 TB/s, compute as H100 SXM
        _row("h200-sxm", "NVIDIA H200 SXM 141GB", tb_s=4.8, memory_gb=141,
             source="NVIDIA H200 Tensor Core GPU datasheet, H200 SXM",
             fp32=67, tf32=494.5, bf16=989, fp16=989, fp8=1979, int8=1979),
        # same datasheet, H200 NVL: 141 GB, 4.8 TB/s, compute as H100 NVL (sparse BF16 1,671, FP8 3,341)
        _row("h200-nvl", "NVIDIA H200 NVL 141GB", tb_s=4.8, memory_gb=141,
             source="NVIDIA H200 Tensor Core GPU datasheet, H200 NVL",
             fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5),
        # NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 dense
        # (sparse 312/624/1,248) for all four SKUs; bandwidth 1,555 GB/s (40GB SXM and PCIe),
        # 2,039 GB/s (80GB SXM), 1,935 GB/s (80GB PCIe). No FP8 on Ampere.
        _row("a100-sxm-40gb", "NVIDIA A100 SXM4 40GB", tb_s=1.555, memory_gb=40,
             source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB SXM",
             fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
        _row("a100-sxm-80gb", "NVIDIA A100 SXM4 80GB", tb_s=2.039, memory_gb=80,
             source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM",
             fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
        _row("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", tb_s=1.555, memory_gb=40,
             source="NVIDIA A100 Tensor Core GPU datasheet, A100 40GB PCIe",
             fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
        _row("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", tb_s=1.935, memory_gb=80,
             source="NVIDIA A100 Tensor Core GPU datasheet, A100 80GB PCIe",
             fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
        # NVIDIA L4 Tensor Core GPU datasheet: 24 GB GDDR6, 300 GB/s, FP32 30.3, sparse TF32 120,
        # BF16/FP16 242, FP8 485, INT8 485
        _row("l4", "NVIDIA L4 24GB", tb_s=0.3, memory_gb=24,
             source="NVIDIA L4 Tensor Core GPU datasheet",
             fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
        # NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, FP32 91.6; dense | sparse printed side by side:
        # TF32 183 | 366, BF16/FP16 362.05 | 733, FP8 733 | 1,466, INT8 733 | 1,466
        _row("l40s", "NVIDIA L40S 48GB", tb_s=0.864, memory_gb=48,
             source="NVIDIA L40S GPU datasheet",
             fp32=91.6, tf32=183, bf16=362.05, fp16=362.05, fp8=733, int8=733),
        # NVIDIA A10 Tensor Core GPU datasheet: 24 GB GDDR6, 600 GB/s, FP32 31.2; TF32 62.5 | 125,
        # BF16/FP16 125 | 250, INT8 250 | 500
        _row("a10", "NVIDIA A10 24GB", tb_s=0.6, memory_gb=24,
             source="NVIDIA A10 Tensor Core GPU datasheet",
             fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
        # A10G (AWS G5 only; NVIDIA publishes no datasheet): 24 GB GDDR6, 600 GB/s; FP32 35, TF32 35,
        # BF16/FP16 70, INT8 140 dense, as tabulated in Baseten's "NVIDIA A10 vs A10G for ML model inference"
        _row("a10g", "NVIDIA A10G 24GB (AWS)", tb_s=0.6, memory_gb=24,
             source="AWS G5 / Baseten 'NVIDIA A10 vs A10G for ML model inference' (no NVIDIA datasheet)",
             fp32=35, tf32=35, bf16=70, fp16=70, int8=140),
        # NVIDIA HGX B200 specifications, per-GPU row: 180 GB HBM3e, 7.7 TB/s (first announced as 8 TB/s),
        # FP32 75; sparse TF32 2.2, BF16/FP16 4.5, FP8 9, INT8 9 PFLOPS ("dense is one-half")
        _row("b200", "NVIDIA B200 180GB (HGX)", tb_s=7.7, memory_gb=180,
             source="NVIDIA HGX B200 specifications, per GPU",
             fp32=75, tf32=1100, bf16=2250, fp16=2250, fp8=4500, int8=4500),
        # AMD Instinct MI300X data sheet: 192 GB HBM3, 5.3 TB/s; FP32 matrix 163.4, TF32 653.7,
        # BF16/FP16 1,307.4, FP8 2,614.9, INT8 2,614.9 dense (sparsity figures printed separately, x2)
        _row("mi300x", "AMD Instinct MI300X 192GB", tb_s=5.3, memory_gb=192,
             source="AMD Instinct MI300X accelerator data sheet",
             fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9),
        # NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090: 24 GB GDDR6X, 1,008 GB/s, FP32 82.6;
        # dense tensor rates with FP32 accumulate (GeForce runs these at half the FP16-accumulate rate):
        # TF32 82.6, BF16/FP16 165.2, FP8 330.3; INT8 660.6
        _row("rtx-4090", "NVIDIA GeForce RTX 4090 24GB", tb_s=1.008, memory_gb=24,
             source="NVIDIA Ada GPU architecture whitepaper, GeForce RTX 4090",
             fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3, int8=660.6),
    )
}  # fmt: skip

# Short names people type, mapped to the part they almost always mean.
_ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm", "h100-80gb-hbm3": "h100-sxm",
    "h200": "h200-sxm", "h200-sxm5": "h200-sxm",
    "a100": "a100-sxm-80gb", "a100-80gb": "a100-sxm-80gb", "a100-40gb": "a100-sxm-40gb",
    "a100-sxm": "a100-sxm-80gb", "a100-sxm4": "a100-sxm-80gb", "a100-pcie": "a100-pcie-80gb",
    "b200-hgx": "b200", "instinct-mi300x": "mi300x", "4090": "rtx-4090", "geforce-rtx-4090": "rtx-4090",
}  # fmt: skip


def _normalize_name(name: str) -> str:
    text = re.sub(r"[\s_/]+", "-", name.strip().lower())
    text = re.sub(r"-+", "-", text).strip("-")
    for prefix in ("nvidia-", "amd-"):
        text = text.removeprefix(prefix)
    return text.replace("sxm5", "sxm").replace("sxm4", "sxm")


def _token_key(text: str) -> frozenset[str]:
    return frozenset(t for t in text.split("-") if t)


# "a100 80gb sxm" and "sxm a100-80gb" name the same row: also look up by the set of tokens
_BY_TOKENS: dict[frozenset[str], str] = {
    **{_token_key(alias): target for alias, target in _ALIASES.items()},
    **{_token_key(name): name for name in _TABLE},
}


def names() -> list[str]:
    """Canonical names of every row of the datasheet table, sorted."""
    return sorted(_TABLE)


def get(name: str) -> HardwareSpec:
    """The datasheet row for *name* (``"H100 SXM"``, ``"h100_sxm"``, ``"h200"``, ``"A100 40GB"``...).

    Raises :class:`UnknownHardwareError` with the close matches and how to pass a spec.
    """
    if not isinstance(name, str):
        raise ConfigError(f"hardware: expected a name such as 'h100-sxm', got {type(name).__name__}")
    key = _normalize_name(name)
    key = _ALIASES.get(key, key)
    if key in _TABLE:
        return _TABLE[key]
    by_tokens = _BY_TOKENS.get(_token_key(key))
    if by_tokens is not None:
        return _TABLE[by_tokens]
    choices = [*_TABLE, *_ALIASES]
    raise UnknownHardwareError(
        f"hardware: unknown part {name!r}.{suggest(key, choices)} Known: {', '.join(names())}. "
        f"For another part, {_HINT}."
    )


def match_device_name(name: str, memory_bytes: int | None = None) -> HardwareSpec:
    """Map a device name as torch reports it (plus its total memory) to a datasheet row.

    ``"NVIDIA H200"`` -> h200-sxm, ``"NVIDIA H100 80GB HBM3"`` -> h100-sxm, ``"NVIDIA A100-SXM4-40GB"``
    -> a100-sxm-40gb, ``"NVIDIA A100 80GB PCIe"`` -> a100-pcie-80gb, ``"AMD Instinct MI300X"`` -> mi300x.
    Memory decides where the name does not (an A100 without a size in its name; a bare "H100").
    """
    text = name.strip().lower()

    def has(pattern: str) -> bool:
        return re.search(pattern, text) is not None

    key: str | None = None
    if has(r"mi300x"):
        key = "mi300x"
    elif has(r"\bb200\b"):
        key = "b200"
    elif has(r"\bh200\b"):  # \b keeps "GH200" (Grace Hopper, not in the table) out
        key = "h200-nvl" if has(r"\bnvl\b") else "h200-sxm"
    elif has(r"\bh100\b"):
        if has(r"pcie"):
            key = "h100-pcie"
        elif has(r"\bnvl\b"):
            key = "h100-nvl"
        elif has(r"sxm|hbm3|80gb"):
            key = "h100-sxm"
        else:  # a bare "H100": the 94 GB part is the NVL, the 80 GB one the SXM
            key = "h100-nvl" if memory_bytes is not None and memory_bytes > 90 * _GB else "h100-sxm"
    elif has(r"\ba100\b"):
        form = "pcie" if has(r"pcie") else "sxm"
        if has(r"80gb"):
            size = "80gb"
        elif has(r"40gb"):
            size = "40gb"
        elif memory_bytes is not None:
            size = "80gb" if memory_bytes > 60 * _GB else "40gb"
        else:
            raise UnknownHardwareError(
                f"hardware: {name!r} is an A100 but neither its name nor a memory size says 40GB or 80GB "
                f"(their bandwidths differ); use get('a100-{form}-40gb') or get('a100-{form}-80gb'), "
                f"or {_HINT}."
            )
        key = f"a100-{form}-{size}"
    elif has(r"\bl40s\b"):
        key = "l40s"
    elif has(r"\bl4\b"):
        key = "l4"
    elif has(r"\ba10g\b"):
        key = "a10g"
    elif has(r"\ba10\b"):
        key = "a10"
    elif has(r"\b4090\b") and not has(r"4090\s*d\b"):  # the 4090 D is a cut-down China part
        key = "rtx-4090"
    if key is None:
        mem = f" with {memory_bytes / _GB:.0f} GB" if memory_bytes else ""
        raise UnknownHardwareError(
            f"hardware: the device {name!r}{mem} is not in the datasheet table."
            f"{suggest(_normalize_name(name), names())} "
            f"Known: {', '.join(names())}. Pass hardware=<name> if it is one of these, or {_HINT}."
        )
    return _TABLE[key]


# --------------------------------------------------------------------------------------------
# The running device
# --------------------------------------------------------------------------------------------


def _cuda_index(torch: Any, device: int | str | None) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ConfigError(f"device: expected a CUDA device such as 'cuda:0', got {device!r}")
    return int(dev.index) if dev.index is not None else int(torch.cuda.current_device())


def _probed() -> tuple[bool, HardwareSpec | None]:
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


def _detect_torch(device: int | str | None, missing_ok: bool) -> HardwareSpec | None:
    """The device's row through torch; with *missing_ok*, None (not an error) without torch or a GPU."""
    try:
        import torch  # optional and heavy; only a device the probe cannot name needs it
    except ImportError:
        if missing_ok:
            return None
        raise UnknownHardwareError(
            f"hardware: cannot detect the GPU because torch is not installed; name the part "
            f"(hardware='h100-sxm') or {_HINT}."
        ) from None
    if not torch.cuda.is_available():
        if missing_ok:
            return None
        raise UnknownHardwareError(
            f"hardware: no GPU found (torch {torch.__version__}: torch.cuda.is_available() is False), so "
            f"'auto' has nothing to detect; name the part (hardware='h100-sxm') or {_HINT}."
        )
    props = torch.cuda.get_device_properties(_cuda_index(torch, device))
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
        answered, spec = _probed()
        if answered and spec is None:
            raise UnknownHardwareError(
                f"hardware: no GPU found, so 'auto' has nothing to detect; name the part (hardware='h100-sxm') "
                f"or {_HINT}."
            )
        if spec is not None:
            return spec
    spec = _detect_torch(device, missing_ok=False)
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


def _cpu_name() -> str:
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
    info.update(cpu=_cpu_name(), cpu_count=os.cpu_count(), python=platform.python_version())
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
        index = _cuda_index(torch, device)
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


# --------------------------------------------------------------------------------------------
# Calibration: achievable ceilings, measured
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured ceilings of one device: copy bandwidth (bytes read + written per second) and GEMM FLOP/s."""

    device: str
    copy_bandwidth: float
    flops: dict[str, float]
    measured_at: str
    torch_version: str = ""
    backend: str = ""
    quick: bool = False
    details: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_spec(self, name: str | None = None) -> HardwareSpec:
        """This measurement as a :class:`HardwareSpec`, to compute MBU/MFU against achievable ceilings."""
        return HardwareSpec(
            name=name or f"{_slug(self.device)}-calibrated",
            memory_bandwidth=self.copy_bandwidth,
            flops=self.flops,
            display_name=f"{self.device} (calibrated)",
            source=f"calibrated on {self.device} at {self.measured_at}",
        )

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def _cache_dir() -> Path:
    env = os.environ.get("PERFSDK_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "perfsdk"


def _cache_path(device_name: str) -> Path:
    return _cache_dir() / f"calibration-{_slug(device_name)}.json"


def _load_cached(path: Path, device_name: str, torch_version: str, quick: bool, threads: int) -> Calibration | None:
    try:
        data = json.loads(path.read_text())
        cal = Calibration(**data)
    except (OSError, ValueError, TypeError) as e:
        if path.exists():
            log.debug("ignoring unreadable calibration cache %s: %s", path, e)
        return None
    same = (
        cal.device == device_name
        and cal.torch_version == torch_version
        and cal.details.get("threads") == threads
        and (quick or not cal.quick)  # a full run serves a quick request, not the other way round
    )
    return cal if same else None


def _store(path: Path, cal: Calibration) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(cal.as_dict(), indent=2, sort_keys=True))
        os.replace(tmp, path)  # atomic: a concurrent reader never sees half a file
    except OSError as e:
        log.warning("could not write the calibration cache %s: %s", path, e)


class _Progress:
    """A tqdm bar on an interactive terminal, nothing otherwise."""

    def __init__(self, total: int) -> None:
        self._bar: Any = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # optional, only for people watching

                self._bar = tqdm(total=total, desc="calibrate", leave=False)
            except ImportError:
                pass

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(what)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _median_time(run: Callable[[], float], repeats: int) -> float:
    return statistics.median(run() for _ in range(repeats))


def _copier(src: Any) -> Callable[[], object]:
    """``dst.copy_(src)`` as a callable; the buffers are freed with it."""
    dst = src.new_empty(src.shape)

    def copy() -> object:
        return dst.copy_(src)

    return copy


def _multiplier(a: Any, b: Any, out: Any = None) -> Callable[[], object]:
    """``a @ b`` as a callable (into *out* when given, so no allocation is timed on a GPU)."""
    import torch  # only reached from calibrate(), which imported it

    def multiply() -> object:
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)

    return multiply


def _measure_cuda(
    torch: Any, dev: Any, *, size_mb: int, quick: bool, progress: _Progress
) -> tuple[float, dict[str, float], dict[str, Any]]:
    # Warm up by time, not by count: an idle GPU sits at a low clock (345 MHz on an idle H200) and
    # the copy, which runs first, brings it to its boost clock. The GEMMs then get a short warm-up
    # only: seconds of back-to-back 8192³ GEMMs hit the power limit and measure a throttled rate
    # (~680 instead of ~750 TFLOP/s on an H200), lower than what a prefill burst sees.
    repeats = 10 if quick else 20

    def timed(fn: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    def bench(fn: Callable[[], object], warmup_s: float) -> float:
        spent, runs = 0.0, 0
        while spent < warmup_s or runs < 3:
            spent += timed(fn)
            runs += 1
        return _median_time(lambda: timed(fn), repeats)

    with torch.cuda.device(dev):
        n_bytes = size_mb * 2**20
        buffer = torch.empty(n_bytes, dtype=torch.uint8, device=dev).random_()
        seconds = bench(_copier(buffer), warmup_s=0.1 if quick else 0.5)
        copy_bw = 2 * n_bytes / seconds  # each byte is read once and written once
        del buffer
        progress.step("copy")

        n = 4096 if quick else 8192
        flops: dict[str, float] = {}
        gen = torch.Generator(device=dev).manual_seed(0)
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here, not tf32
        try:
            for key, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
                a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
                b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
                out = torch.empty(n, n, device=dev, dtype=dtype)
                seconds = bench(_multiplier(a, b, out), warmup_s=0.02)
                flops[key] = 2 * n**3 / seconds
                del a, b, out
                progress.step(key)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return copy_bw, flops, {"copy_bytes": n_bytes, "gemm_n": n, "repeats": repeats}


def _measure_cpu(
    torch: Any, *, size_mb: int, quick: bool, progress: _Progress
) -> tuple[float, dict[str, float], dict[str, Any]]:
    repeats = 3 if quick else 7
    gemm_budget_s = 0.05 if quick else 0.3  # per multiply; sizes adapt so slow CPUs still finish fast

    def bench(fn: Callable[[], object]) -> float:
        fn()  # warm-up: first-touch page faults and thread-pool start-up

        def once() -> float:
            t0 = time.perf_counter_ns()
            fn()
            return (time.perf_counter_ns() - t0) / 1e9

        return _median_time(once, repeats)

    gen = torch.Generator().manual_seed(0)
    n_elems = size_mb * 2**20 // 4
    copy_bw = 2 * n_elems * 4 / bench(_copier(torch.randn(n_elems, dtype=torch.float32, generator=gen)))
    progress.step("copy")

    flops: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for key, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        try:
            # probe a small multiply, then pick the size the time budget allows (a CPU without
            # native bf16 may be 50x slower than with it)
            probe_n = 256
            a = torch.randn(probe_n, probe_n, generator=gen).to(dtype)
            rate = 2 * probe_n**3 / max(bench(_multiplier(a, a)), 1e-9)
            n = int((gemm_budget_s * rate / 2) ** (1 / 3)) // 128 * 128
            n = max(probe_n, min(n, 2048 if quick else 4096))
            a = torch.randn(n, n, generator=gen).to(dtype)
            b = torch.randn(n, n, generator=gen).to(dtype)
            flops[key] = 2 * n**3 / bench(_multiplier(a, b))
            sizes[key] = n
        except RuntimeError as e:  # a build without bf16 matmul on this CPU
            log.debug("calibrate: %s matmul on CPU failed: %s", key, e)
        progress.step(key)
    return copy_bw, flops, {"copy_bytes": n_elems * 4, "gemm_n": sizes, "repeats": repeats}


def _memory_bytes(torch: Any, dev: Any) -> int | None:
    """Total memory of *dev* (physical RAM for the CPU), or None where the platform does not say."""
    try:
        if dev.type == "cuda":
            return int(torch.cuda.get_device_properties(dev).total_memory)
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, OSError, ValueError, RuntimeError):
        return None


def calibrate(
    device: str = "auto",
    *,
    cache: bool = True,
    size_mb: int | None = None,
    quick: bool = False,
) -> Calibration:
    """Measure the achievable copy bandwidth and GEMM rate of ``"auto"``, ``"cuda[:N]"`` or ``"cpu"``.

    CUDA/ROCm: a device-to-device copy of *size_mb* MiB (default 1024, ``quick`` 256) timed with CUDA
    events, and 8192³ (``quick``: 4096³) matmuls of random bf16, fp16 and fp32 (TF32 off), each the
    median of repeats after warm-up. CPU: a copy of a 256 MiB (``quick``: 64 MiB) float32 tensor and
    fp32 (and bf16, where it runs) matmuls sized to finish in well under a second each.

    The copy figure counts bytes read plus bytes written, the convention of the datasheet peak. The
    result is cached per device (and torch version, and CPU thread count) in
    ``$PERFSDK_CACHE_DIR`` or ``~/.cache/perfsdk/calibration-<device>.json``; ``cache=False`` re-measures.
    """
    try:
        import torch  # calibration is the only part of this module that needs torch
    except ImportError:
        from perfsdk.errors import MissingDependencyError  # only on this error path

        raise MissingDependencyError("torch", "perfsdk.hardware.calibrate", extra="torch") from None
    if size_mb is not None and (isinstance(size_mb, bool) or not isinstance(size_mb, int) or size_mb <= 0):
        raise ConfigError(f"size_mb: must be a positive int (MiB), got {size_mb!r}")
    requested = device.strip().lower() if isinstance(device, str) else device
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {device!r} asked for, but torch {torch.__version__} sees no GPU")
        dev = torch.device("cuda", _cuda_index(torch, str(dev)))
        device_name = str(torch.cuda.get_device_name(dev))
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    elif dev.type == "cpu":
        device_name = _cpu_name()
        backend = "cpu"
    else:
        raise ConfigError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}")

    if size_mb is not None:
        # the copy needs the buffer twice (source and destination): refuse what cannot fit rather than
        # fail mid-allocation with a raw RuntimeError (or push a shared host into swap)
        memory = _memory_bytes(torch, dev)
        if memory is not None and 2 * size_mb * 2**20 > memory:
            raise ConfigError(
                f"size_mb: the copy needs 2 x {size_mb:,} MiB, more than the {memory / 2**20:,.0f} MiB "
                f"of {device_name}"
            )

    torch_version = str(torch.__version__)
    threads = int(torch.get_num_threads()) if backend == "cpu" else 0
    path = _cache_path(device_name)
    if cache:
        cached = _load_cached(path, device_name, torch_version, quick, threads)
        if cached is not None:
            log.debug("calibration of %s read from %s", device_name, path)
            return cached

    progress = _Progress(total=4 if backend != "cpu" else 3)
    try:
        if backend == "cpu":
            copy_bw, flops, details = _measure_cpu(
                torch, size_mb=size_mb or (64 if quick else 256), quick=quick, progress=progress
            )
        else:
            copy_bw, flops, details = _measure_cuda(
                torch, dev, size_mb=size_mb or (256 if quick else 1024), quick=quick, progress=progress
            )
    finally:
        progress.close()
    details["threads"] = threads
    cal = Calibration(
        device=device_name,
        copy_bandwidth=copy_bw,
        flops=flops,
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch_version=torch_version,
        backend=backend,
        quick=quick,
        details=details,
    )
    if cache:
        _store(path, cal)
    return cal


def resolve(value: HardwareSpec | str | None) -> HardwareSpec | None:
    """Turn whatever a caller passed as ``hardware=`` into a spec.

    ``None`` -> ``None``; ``"auto"`` -> :func:`detect`, or ``None`` when there is no GPU (the caller
    decides how to say that MBU/MFU are off; a GPU that is not in the table still raises, with the
    close names, because silently losing MBU/MFU there would hide a fixable mistake); ``"calibrate"`` ->
    ``calibrate().as_spec()``; any other string -> :func:`get`; a :class:`HardwareSpec` -> itself.
    """
    if value is None or isinstance(value, HardwareSpec):
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"hardware: expected None, 'auto', 'calibrate', a name or a HardwareSpec, got {type(value).__name__}"
        )
    key = value.strip().lower()
    if key == "auto":
        answered, spec = _probed()
        return spec if answered else _detect_torch(None, missing_ok=True)
    if key == "calibrate":
        return calibrate().as_spec()
    return get(value)
