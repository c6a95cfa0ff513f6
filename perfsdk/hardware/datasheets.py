"""The datasheet table: peak memory bandwidth and dense peak FLOP/s of each part, and name lookups.

Every floor and utilisation figure perfsdk reports divides by one of these numbers, so they have to be
right for the *exact* part: the dense (not "with sparsity") tensor rate, the bandwidth of that SKU's
memory. Use it through :mod:`perfsdk.hardware` (``hw.get("H100 SXM")``, ``hw.names()``,
``hw.match_device_name("NVIDIA H200", 141e9)``, ``hw.HardwareSpec(...)``); this module is plain Python
and imports no torch.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from perfsdk.errors import ConfigError, UnknownHardwareError, suggest

__all__ = ["DTYPE_KEYS", "SPEC_HINT", "HardwareSpec", "get", "match_device_name", "names", "normalize_dtype"]

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

#: How to describe a part the table lacks; the lookup errors end with it.
SPEC_HINT = (
    "pass perfsdk.HardwareSpec(name=..., memory_bandwidth=..., flops={'bf16': ...}) or --bandwidth-tb-s/--tflops"
)


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
        f"For another part, {SPEC_HINT}."
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
                f"or {SPEC_HINT}."
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
            f"Known: {', '.join(names())}. Pass hardware=<name> if it is one of these, or {SPEC_HINT}."
        )
    return _TABLE[key]
