"""``hardware="auto"`` without importing torch: perfsdk.gpu_probe (issue 20, item 8).

The CPU suite has no GPU, so the "a GPU is there" paths read a driver listing written in the format the
NVIDIA kernel driver uses for ``/proc/driver/nvidia/gpus/<pci address>/information``. Each check that has
to see whether torch was imported runs in a fresh interpreter (the suite itself imports torch).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfsdk import gpu_probe
from perfsdk.gpu_probe import Device

# what the 570-series driver writes for an H100 SXM (the values vary per board; the keys do not)
_INFORMATION = """Model: \t\t {model}
IRQ:   \t\t 0
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.99.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""


def driver_listing(root: Path, *models: str) -> Path:
    for i, model in enumerate(models):
        bus = f"0000:{0x18 + i:02x}:00.0"
        d = root / bus
        d.mkdir(parents=True)
        uuid = f"GPU-{i:08x}-1111-2222-3333-444455556666"
        (d / "information").write_text(_INFORMATION.format(model=model, uuid=uuid, bus=bus, minor=i))
    return root


def run_fresh(code: str, env: dict[str, str] | None = None) -> str:
    """Run *code* in a new interpreter (no torch imported yet, no NVML); return its stdout."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")}
    full_env.update(env or {})
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env=full_env,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_monitor_with_default_hardware_does_not_import_torch() -> None:
    """``perfsdk.Monitor()`` imported torch to ask whether there is a GPU (0.14 -> 1.37 s, 27 -> 258 MiB)."""
    out = run_fresh("""
        import sys
        import perfsdk
        m = perfsdk.Monitor()
        m.close()
        m = perfsdk.Monitor(hardware="auto", model="llama-3-8b")
        m.close()
        print("torch" in sys.modules, m.hardware)
    """)
    assert out.split() == ["False", "None"]  # no GPU here: no spec, as before


def test_auto_names_the_gpu_from_the_driver_listing_without_torch(tmp_path: Path) -> None:
    if _nvml_answers():
        pytest.skip("NVML answers before the driver listing on this machine")
    root = driver_listing(tmp_path / "gpus", "NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")
    out = run_fresh(f"""
        import sys
        from pathlib import Path
        from perfsdk import gpu_probe, hardware
        gpu_probe.PROC_GPUS = Path({str(root)!r})
        print(hardware.resolve("auto").name, hardware.detect().name, "torch" in sys.modules)
    """)
    assert out.split() == ["h100-sxm", "h100-sxm", "False"]


def test_cuda_visible_devices_empty_hides_the_listed_gpus(tmp_path: Path) -> None:
    root = driver_listing(tmp_path / "gpus", "NVIDIA H100 80GB HBM3")
    for hidden in ("", "-1", " -1,0"):
        out = run_fresh(
            f"""
            from pathlib import Path
            from perfsdk import gpu_probe, hardware
            gpu_probe.PROC_GPUS = Path({str(root)!r})
            print(hardware.resolve("auto"))
        """,
            {"CUDA_VISIBLE_DEVICES": hidden},
        )
        assert out.strip() == "None"


def test_driver_listing_is_read_in_pci_order(tmp_path: Path) -> None:
    root = driver_listing(tmp_path / "gpus", "NVIDIA A100-SXM4-80GB", "NVIDIA L4")
    devices = gpu_probe._proc_devices(root)
    assert devices is not None
    assert [d.name for d in devices] == ["NVIDIA A100-SXM4-80GB", "NVIDIA L4"]
    assert devices[1].uuid == "GPU-00000001-1111-2222-3333-444455556666"
    assert gpu_probe._proc_devices(tmp_path / "absent") is None  # no driver: cannot tell
    (tmp_path / "empty").mkdir()
    assert gpu_probe._proc_devices(tmp_path / "empty") == []


_A100 = Device("NVIDIA A100-SXM4-80GB", None, "procfs", "GPU-aaaa")
_L4 = Device("NVIDIA L4", None, "procfs", "GPU-bbbb")


@pytest.mark.parametrize(
    ("devices", "first", "pci_order", "present", "name"),
    [
        ([_A100, _A100], None, False, True, _A100.name),
        ([], None, False, False, None),
        ([_A100], "3", False, False, None),  # CUDA ignores the list from an invalid index on
        ([_A100, _L4], "1", True, True, _L4.name),  # PCI order: index 1 is the L4
        ([_A100, _L4], "1", False, None, None),  # CUDA's default order may differ from NVML's: cannot tell
        ([_A100, _L4], "GPU-bb", False, True, _L4.name),  # a UUID prefix names one GPU in any order
        ([_A100, _L4], "GPU-cc", False, None, None),
        ([_A100], "MIG-1234", False, None, None),  # a MIG slice: only torch or the driver names it
    ],
)
def test_choosing_cudas_device_zero(
    devices: list[Device], first: str | None, pci_order: bool, present: bool | None, name: str | None
) -> None:
    found = gpu_probe._choose(devices, first, pci_order, "test")
    assert found.present is present
    assert (found.device.name if found.device else None) == name


def _nvml_answers() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return False
    return gpu_probe._nvml_devices() is not None
