"""perfsdk in vLLM (V1 engine, ``vllm>=0.33,<0.34``): nothing to change in the server.

Installed next to vLLM, perfsdk is loaded by vLLM itself through two entry points (pyproject.toml):

* ``vllm.general_plugins`` → ``perfsdk_worker`` (:mod:`perfsdk.engines.vllm.worker`): in every GPU
  worker, each step's **device time** from CUDA events at ``Worker.execute_model`` entry and
  ``Worker.sample_tokens`` exit, its exact batch composition from the ``SchedulerOutput``
  (:mod:`perfsdk.engines.vllm.batch`), MBU and MFU per rank against the GPU's datasheet, NVTX ranges
  under Nsight, the profiler window per rank — under vLLM's default settings (async scheduling on).
  Also offered as ``--worker-extension-cls perfsdk.engines.vllm.worker.PerfsdkWorkerExtension``.
* ``vllm.stat_logger_plugins`` → ``perfsdk`` (:mod:`perfsdk.engines.vllm.stats`): in the API server, the
  request latencies vLLM measures (TTFT, inter-token latency, time per output token, queue time,
  duration) and one OpenTelemetry span per request. It records no steps while the worker hook runs.

To see it (the worker metrics reach vLLM's ``/metrics`` through the multi-process directory)::

    pip install perfsdk                      # into vLLM's environment
    export PROMETHEUS_MULTIPROC_DIR=$(mktemp -d) PERFSDK_HARDWARE=h200
    vllm serve meta-llama/Llama-3.1-8B-Instruct
    curl -s localhost:8000/metrics | grep -E 'perfsdk_step_(seconds|bandwidth_utilization)_(count|sum)'

The full guide, with what is measured and what is estimated: ``docs/vllm.md``. Names here load their
module on first use, so that importing this package imports nothing from vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PerfsdkStatLogger", "PerfsdkWorkerExtension", "StepShape", "WorkerHook", "step_shape"]

_WHERE = {
    "PerfsdkStatLogger": "perfsdk.engines.vllm.stats",
    "PerfsdkWorkerExtension": "perfsdk.engines.vllm.worker",
    "WorkerHook": "perfsdk.engines.vllm.worker",
    "StepShape": "perfsdk.engines.vllm.batch",
    "step_shape": "perfsdk.engines.vllm.batch",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'perfsdk.engines.vllm' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
