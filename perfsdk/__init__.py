"""perfsdk: how fast is your LLM server against what the hardware allows?

Wrap the request lifecycle and the prefill/decode steps of any serving loop;
perfsdk records on the serving thread (a timestamp, a pooled CUDA event, an
NVTX range) and computes everything else — TTFT, inter-token latency, step
time, MBU and MFU against the floors of the exact GPU — on a collector thread,
exporting to Prometheus and OpenTelemetry::

    import perfsdk

    mon = perfsdk.Monitor(model=perfsdk.ModelSpec.named("llama-3-8b"), hardware="auto", service="my-llm")
    mon.serve_metrics(port=9400)

    with mon.request(prompt_tokens=512) as req:
        req.scheduled()
        for tok in generate():
            req.tokens(1)

    with mon.decode(batch=8, context_tokens=8 * 1024):
        graph.replay()

Importing perfsdk is cheap and has no side effects: torch, OpenTelemetry and
NVTX are imported when a Monitor is built, and only if present.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from perfsdk._version import __version__
from perfsdk.errors import (
    ConfigError,
    MissingDependencyError,
    MonitorClosedError,
    PerfsdkError,
    UnknownHardwareError,
    UnknownModelError,
)
from perfsdk.model import ModelSpec

if TYPE_CHECKING:
    from perfsdk import budget, hardware
    from perfsdk.hardware import HardwareSpec
    from perfsdk.monitor import Monitor, Phase, Request, Step

__all__ = [
    "ConfigError",
    "HardwareSpec",
    "MissingDependencyError",
    "ModelSpec",
    "Monitor",
    "MonitorClosedError",
    "PerfsdkError",
    "Phase",
    "Request",
    "Step",
    "UnknownHardwareError",
    "UnknownModelError",
    "__version__",
    "budget",
    "hardware",
]

# name -> module that defines it; imported on first access (PEP 562) so that
# `import perfsdk` stays fast and starts no thread.
_LAZY = {
    "Monitor": "perfsdk.monitor",
    "Request": "perfsdk.monitor",
    "Phase": "perfsdk.monitor",
    "Step": "perfsdk.monitor",
    "HardwareSpec": "perfsdk.hardware",
    "hardware": "perfsdk.hardware",
    "budget": "perfsdk.budget",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'perfsdk' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if module.endswith("." + name) else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
