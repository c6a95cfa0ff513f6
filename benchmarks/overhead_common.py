"""What every part of ``benchmarks/overhead.py`` shares: the environment record, a Monitor with every sink
on, a device sync, another thread's CPU time. Imported by the parts (``overhead_*.py``) with ``benchmarks/``
on ``sys.path``, as ``overhead.py`` sets it up."""

from __future__ import annotations

import os
import platform
import subprocess
import threading
import time
from typing import Any

import torch

import perfsdk
from perfsdk.model import ModelSpec
from perfsdk.monitor import load_native


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "perfsdk": perfsdk.__version__,
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "perfsdk_c_extension_built": load_native() is not None,
    }
    if device == "cuda":
        env["gpu"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
        try:
            q = "name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu"
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            ).stdout.strip()
            env["nvidia_smi"] = dict(zip(q.split(","), [s.strip() for s in out.split(",")], strict=False))
        except Exception as e:
            env["nvidia_smi_error"] = str(e)
    try:
        env["device_info"] = perfsdk.hardware.device_info()
    except Exception as e:
        env["device_info_error"] = str(e)
    return env


def make_monitor(spec: ModelSpec, hw: Any, nvtx: bool | str = True, **kw: Any) -> perfsdk.Monitor:
    """A Monitor with every sink on: Prometheus (own registry), NVTX, OTel SDK + BatchSpanProcessor.

    *nvtx*: True forces the ranges on (the default here: "every sink on"); "auto" is the production
    default, which pushes them only when an NVTX tool (Nsight) is attached.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry

    # the provider (and its exporter) lives on after the Monitor closes: its atexit handler holds it, as the
    # benchmark's numbers always assumed (span processors of earlier parts keep running beside later parts)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return perfsdk.Monitor(
        model=spec,
        hardware=hw,
        registry=CollectorRegistry(),
        tracer_provider=provider,
        nvtx=nvtx,
        step_span_rate=0.01,
        model_name="bench-1b",
        **kw,
    )


def thread_cpu_ns(thread: threading.Thread | None) -> int:
    """CPU time another thread has used so far (Linux: its CPU-time clock), 0 where unavailable."""
    if thread is None or thread.ident is None:
        return 0
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError):
        return 0
