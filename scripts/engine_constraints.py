"""Write constraints/vllm-VERSION-cpu.txt from a vLLM wheel's METADATA (what scripts/test_engine.sh installs).

    pip download vllm==0.26.0 --no-deps -d /tmp/w      # ~300 MB
    python scripts/engine_constraints.py /tmp/w/vllm-0.26.0-*.whl > constraints/vllm-0.26.0-cpu.txt

Every ``Requires-Dist`` of the wheel without an extra, in its order, less the packages that exist only to run
models on a GPU (:data:`GPU_ONLY`): vLLM's Python code then imports and runs on a CPU box; no model does.
The argument may also be a ``METADATA`` file (an installed ``vllm-*.dist-info/METADATA``).
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

# torch is pinned by constraints/ci.txt to the CPU build instead; the rest are CUDA kernels and codecs
GPU_ONLY = (
    "torch",
    "torchaudio",
    "torchvision",
    "torchcodec",
    "PyNvVideoCodec",
    "flashinfer-python",
    "apache-tvm-ffi",
    "tilelang",
    "nvidia-*",
    "quack-kernels",
    "tokenspeed-mla",
    "humming-kernels",
    "fastsafetensors",
    "instanttensor",
)


def metadata(path: Path) -> str:
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as whl:
            name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
            return whl.read(name).decode()
    return path.read_text()


def gpu_only(requirement: str) -> bool:
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    n = name.group(0).lower() if name else ""
    return any(n.startswith(g[:-1].lower()) if g.endswith("*") else n == g.lower() for g in GPU_ONLY)


def constraints(text: str) -> tuple[str, list[str]]:
    version = re.search(r"^Version: (.+)$", text, re.MULTILINE)
    reqs = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("Requires-Dist: ")]
    kept = [r for r in reqs if "extra ==" not in r and not gpu_only(r)]
    return (version.group(1).strip() if version else "?"), kept


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    version, kept = constraints(metadata(Path(sys.argv[1])))
    print(f"""# What vllm {version} requires (its wheel's Requires-Dist, extras left out), less the packages that exist
# only to run models on a GPU: torch (pinned by ci.txt to the CPU build instead), torchaudio, torchvision,
# torchcodec, PyNvVideoCodec, flashinfer-python, apache-tvm-ffi, tilelang, nvidia-*, quack-kernels,
# tokenspeed-mla, humming-kernels, fastsafetensors, instanttensor. scripts/test_engine.sh vllm installs these,
# then vllm itself with --no-deps: vLLM's Python code imports and runs; no model does (no GPU in CI).
# Regenerate for another vLLM release: python scripts/engine_constraints.py vllm-VERSION-*.whl""")
    print("\n".join(kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
