"""perfsdk.hardware: the datasheet table, lookups, device-name mapping, calibration and its CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import perfsdk.hardware as hw
from perfsdk.cli import main
from perfsdk.errors import ConfigError, UnknownHardwareError

REQUIRED_ROWS = [
    "h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm", "h200-nvl", "a100-sxm-40gb", "a100-sxm-80gb",
    "a100-pcie-40gb", "a100-pcie-80gb", "l4", "l40s", "a10", "a10g", "b200", "mi300x", "rtx-4090",
]  # fmt: skip


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PERFSDK_CACHE_DIR", str(tmp_path))
    return tmp_path


# ---------------------------------------------------------------- the table


def test_table_has_every_required_part() -> None:
    assert set(REQUIRED_ROWS) <= set(hw.names())
    assert hw.names() == sorted(hw.names())


@pytest.mark.parametrize("name", REQUIRED_ROWS)
def test_every_row_is_complete_and_dense(name: str) -> None:
    spec = hw.get(name)
    assert spec.name == name
    assert spec.source.startswith("datasheet: ")
    assert spec.memory_bytes is not None
    assert spec.memory_bytes >= 24 * 10**9
    assert 0.2e12 <= spec.memory_bandwidth <= 10e12
    for dtype in ("fp32", "tf32", "bf16", "fp16"):
        assert math.isfinite(spec.peak_flops(dtype))
        assert spec.peak_flops(dtype) > 0
    # tensor rates sit above the plain fp32 rate, and 8-bit rates at or above the 16-bit ones
    assert spec.flops["bf16"] >= spec.flops["tf32"] >= spec.flops["fp32"] * 0.99
    for eight_bit in ("fp8", "int8"):
        if eight_bit in spec.flops:
            assert spec.flops[eight_bit] >= spec.flops["bf16"]


@pytest.mark.parametrize(
    ("name", "bandwidth", "bf16", "fp8"),
    [
        ("h100-sxm", 3.35e12, 989e12, 1979e12),  # 1,979 / 3,958 "with sparsity" on the sheet
        ("h200-sxm", 4.8e12, 989e12, 1979e12),
        ("h100-pcie", 2.0e12, 756.5e12, 1513e12),
        ("h100-nvl", 3.9e12, 835.5e12, 1670.5e12),
        ("h200-nvl", 4.8e12, 835.5e12, 1670.5e12),
        ("a100-sxm-80gb", 2.039e12, 312e12, None),
        ("a100-sxm-40gb", 1.555e12, 312e12, None),
        ("a100-pcie-80gb", 1.935e12, 312e12, None),
        ("l4", 0.3e12, 121e12, 242.5e12),
        ("l40s", 0.864e12, 362.05e12, 733e12),
        ("b200", 7.7e12, 2250e12, 4500e12),
        ("mi300x", 5.3e12, 1307.4e12, 2614.9e12),
        ("rtx-4090", 1.008e12, 165.2e12, 330.3e12),
    ],
)
def test_datasheet_anchors(name: str, bandwidth: float, bf16: float, fp8: float | None) -> None:
    spec = hw.get(name)
    assert spec.memory_bandwidth == pytest.approx(bandwidth)
    assert spec.peak_flops("bf16") == pytest.approx(bf16)
    if fp8 is None:
        assert "fp8" not in spec.flops
    else:
        assert spec.peak_flops("fp8") == pytest.approx(fp8)


def test_sparsity_is_not_double_counted() -> None:
    assert hw.get("h100-sxm").peak_flops("bf16") < 1.0e15
    assert hw.get("h200-sxm").peak_flops("bf16") < 1.0e15
    assert hw.get("a100").peak_flops("bf16") < 400e12
    assert hw.get("b200").peak_flops("bf16") < 3.0e15


def test_table_rows_cannot_be_edited_and_are_hashable() -> None:
    spec = hw.get("h100-sxm")
    with pytest.raises(TypeError):
        spec.flops["bf16"] = 1.0  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.memory_bandwidth = 1.0  # type: ignore[misc]
    assert {spec: 1}[hw.get("H100 SXM")] == 1


# ---------------------------------------------------------------- lookups


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h100-sxm", "h100-sxm"),
        ("H100 SXM", "h100-sxm"),
        ("h100_sxm", "h100-sxm"),
        ("  H100   SXM ", "h100-sxm"),
        ("NVIDIA H100 SXM5", "h100-sxm"),
        ("H100", "h100-sxm"),
        ("H200", "h200-sxm"),
        ("h200 nvl", "h200-nvl"),
        ("a100", "a100-sxm-80gb"),
        ("A100 40GB", "a100-sxm-40gb"),
        ("A100 80GB PCIe", "a100-pcie-80gb"),
        ("a100_pcie_40gb", "a100-pcie-40gb"),
        ("L40S", "l40s"),
        ("RTX 4090", "rtx-4090"),
        ("AMD Instinct MI300X", "mi300x"),
    ],
)
def test_get_is_tolerant(text: str, expected: str) -> None:
    assert hw.get(text).name == expected


def test_unknown_name_suggests_and_says_how_to_pass_a_spec() -> None:
    with pytest.raises(UnknownHardwareError) as info:
        hw.get("h100-sxn")
    message = str(info.value)
    assert "Did you mean" in message
    assert "h100-sxm" in message
    assert "HardwareSpec(name=" in message
    assert "--bandwidth-tb-s" in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("spelling", ["bf16", "bfloat16", "torch.bfloat16", torch.bfloat16, "BF16"])
def test_peak_flops_accepts_dtype_spellings(spelling: object) -> None:
    assert hw.get("h100-sxm").peak_flops(spelling) == 989e12


@pytest.mark.parametrize(
    ("spelling", "key"),
    [
        ("float16", "fp16"), ("half", "fp16"), (torch.float16, "fp16"), ("float32", "fp32"),
        (torch.float32, "fp32"), ("fp8", "fp8"), ("float8_e4m3fn", "fp8"), (torch.float8_e5m2, "fp8"),
        ("int8", "int8"), (torch.int8, "int8"), ("tf32", "tf32"),
    ],
)  # fmt: skip
def test_normalize_dtype(spelling: object, key: str) -> None:
    assert hw.normalize_dtype(spelling) == key


def test_unpublished_dtype_names_dtype_and_part() -> None:
    with pytest.raises(ConfigError, match=r"dtype: .*a100-sxm-80gb.*fp8"):
        hw.get("a100").peak_flops("float8_e4m3fn")
    with pytest.raises(ConfigError, match="dtype: 'fp64'"):
        hw.get("h100-sxm").peak_flops("fp64")


# ---------------------------------------------------------------- validation and overrides


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "   "}, "name"),
        ({"memory_bandwidth": 0}, "memory_bandwidth"),
        ({"memory_bandwidth": -1e12}, "memory_bandwidth"),
        ({"memory_bandwidth": float("nan")}, "memory_bandwidth"),
        ({"memory_bandwidth": float("inf")}, "memory_bandwidth"),
        ({"flops": {}}, "flops"),
        ({"flops": {"bf16": 0.0}}, "flops['bf16']"),
        ({"flops": {"bf16": float("inf")}}, "flops['bf16']"),
        ({"flops": {"fp64": 1e12}}, "dtype"),
        ({"memory_bytes": 0}, "memory_bytes"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"name": "my-gpu", "memory_bandwidth": 1.2e12, "flops": {"bf16": 400e12}}
    args.update(kwargs)
    with pytest.raises(ConfigError) as info:
        hw.HardwareSpec(**args)  # type: ignore[arg-type]
    assert str(info.value).startswith(field)


def test_custom_spec_normalises_dtype_keys() -> None:
    spec = hw.HardwareSpec(name="my-gpu", memory_bandwidth=1e12, flops={"bfloat16": 4e14, "torch.float16": 4e14})
    assert dict(spec.flops) == {"bf16": 4e14, "fp16": 4e14}
    assert spec.display_name == "my-gpu"


def test_with_overrides_merges_and_leaves_the_row_alone() -> None:
    base = hw.get("h100-sxm")
    capped = base.with_overrides(memory_bandwidth=3.0e12, flops={"bfloat16": 800e12}, name="h100-capped")
    assert capped.name == "h100-capped"
    assert capped.memory_bandwidth == 3.0e12
    assert capped.peak_flops("bf16") == 800e12
    assert capped.peak_flops("fp8") == base.peak_flops("fp8")
    assert "overridden" in capped.source
    assert hw.get("h100-sxm").memory_bandwidth == 3.35e12
    with pytest.raises(ConfigError, match="memory_bandwidth"):
        base.with_overrides(memory_bandwidth=-1.0)


# ---------------------------------------------------------------- device names


@pytest.mark.parametrize(
    ("device_name", "memory_gib", "expected"),
    [
        ("NVIDIA H200", 139.8, "h200-sxm"),
        ("NVIDIA H200 NVL", 139.8, "h200-nvl"),
        ("NVIDIA H100 80GB HBM3", 79.1, "h100-sxm"),
        ("NVIDIA H100 PCIe", 79.1, "h100-pcie"),
        ("NVIDIA H100 NVL", 93.1, "h100-nvl"),
        ("NVIDIA H100", 93.1, "h100-nvl"),
        ("NVIDIA H100", 79.1, "h100-sxm"),
        ("NVIDIA A100-SXM4-40GB", 39.4, "a100-sxm-40gb"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "a100-sxm-80gb"),
        ("NVIDIA A100-PCIE-40GB", 39.4, "a100-pcie-40gb"),
        ("NVIDIA A100 80GB PCIe", 79.2, "a100-pcie-80gb"),
        ("NVIDIA A100-SXM", 79.2, "a100-sxm-80gb"),
        ("NVIDIA L4", 22.5, "l4"),
        ("NVIDIA L40S", 44.4, "l40s"),
        ("NVIDIA A10", 22.1, "a10"),
        ("NVIDIA A10G", 22.1, "a10g"),
        ("NVIDIA B200", 178.4, "b200"),
        ("AMD Instinct MI300X", 191.5, "mi300x"),
        ("NVIDIA GeForce RTX 4090", 23.6, "rtx-4090"),
    ],
)
def test_match_device_name(device_name: str, memory_gib: float, expected: str) -> None:
    assert hw.match_device_name(device_name, int(memory_gib * 2**30)).name == expected


@pytest.mark.parametrize(
    "device_name", ["NVIDIA GH200 480GB", "NVIDIA GeForce RTX 4090 D", "Tesla V100-SXM2-16GB", "NVIDIA T4"]
)
def test_unknown_device_is_a_clear_error(device_name: str) -> None:
    with pytest.raises(UnknownHardwareError) as info:
        hw.match_device_name(device_name, 16 * 2**30)
    message = str(info.value)
    assert device_name in message
    assert "h100-sxm" in message
    assert "HardwareSpec(name=" in message


def test_a100_without_size_or_memory_is_ambiguous() -> None:
    with pytest.raises(UnknownHardwareError, match="40GB or 80GB"):
        hw.match_device_name("NVIDIA A100-SXM", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_detect_without_gpu_says_so_and_how_to_pass_a_spec() -> None:
    with pytest.raises(UnknownHardwareError) as info:
        hw.detect()
    assert "no GPU" in str(info.value)
    assert "HardwareSpec(name=" in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_resolve() -> None:
    spec = hw.get("l4")
    assert hw.resolve(None) is None
    assert hw.resolve(spec) is spec
    assert hw.resolve("H100 SXM") is hw.get("h100-sxm")
    assert hw.resolve("auto") is None  # no GPU here: no raise
    with pytest.raises(UnknownHardwareError):
        hw.resolve("h100-sxn")
    with pytest.raises(ConfigError, match="hardware"):
        hw.resolve(3.35e12)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_device_info_on_cpu() -> None:
    info = hw.device_info()
    assert info["backend"] == "cpu"
    assert info["torch_version"] == torch.__version__
    assert info["name"]
    assert info["cpu_count"]
    assert info["sm_clock_mhz"] is None
    assert info["power_limit_w"] is None
    json.dumps(info)  # benchmarks store it as JSON


def test_importing_hardware_does_not_import_torch() -> None:
    code = "import sys, perfsdk.hardware as hw; hw.get('h100'); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- calibration (more in tests/test_calibration.py)


def test_no_cache_measures_and_writes_nothing(cache_dir: Path) -> None:
    cal = hw.calibrate("cpu", quick=True, cache=False)
    assert cal.copy_bandwidth > 0
    assert not list(cache_dir.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"device": "tpu"}, "device"), ({"device": "cpu", "size_mb": 0}, "size_mb")]
)
def test_calibrate_validates(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{field}"):
        hw.calibrate(**kwargs)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_calibrate_cuda_without_gpu() -> None:
    with pytest.raises(ConfigError, match="no GPU"):
        hw.calibrate("cuda", cache=False)


# ---------------------------------------------------------------- CLI


def test_cli_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in REQUIRED_ROWS)
    assert main(["hardware", "H200", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["name"] == "h200-sxm"
    assert row["memory_bandwidth"] == 4.8e12
    assert main(["hardware", "h100-sxn"]) == 2
    assert "h100-sxm" in capsys.readouterr().err


def test_cli_calibrate_refuses_a_buffer_larger_than_the_device(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 1 EiB: refused by the check, before any allocation (it was a raw RuntimeError traceback from torch)
    assert main(["calibrate", "--device", "cpu", "--no-cache", "--size-mb", str(2**40)]) == 2
    assert "size_mb: the copy needs" in capsys.readouterr().err
    assert not list(cache_dir.iterdir())


def test_cli_hardware_empty_name_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hardware", ""]) == 2  # printed the whole table, exit 0
    assert "unknown part" in capsys.readouterr().err
