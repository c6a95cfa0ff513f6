"""vLLM with two tensor-parallel CPU workers, as ``vllm serve --tensor-parallel-size 2`` runs them, and its
``/metrics`` endpoint; run by ``test_vllm.py`` in a fresh process (prometheus_client must see
``PROMETHEUS_MULTIPROC_DIR`` before it is first imported, as in ``vllm serve``).

    python tests/engines/vllm_tp_server.py MODEL_DIR

vLLM's ``EngineCore`` starts its ``MultiprocExecutor``, which forks two worker processes (vLLM's default
start method): each runs vLLM's ``WorkerWrapperBase.init_worker`` / ``init_device`` — wrapped, in this
parent, by perfsdk's general plugin, so the children inherit the wrapping — and a ``CpuWorker``
(``vllm_cpu_worker.py``). The three requests of ``vllm_cpu_worker.run_requests`` then run to the end.
vLLM's own ``/metrics`` app (``vllm.entrypoints.serve.instrumentator.metrics.attach_router``, the one
``vllm serve`` mounts) is served on loopback; one JSON line on stdout gives its URL; the process serves
until its stdin closes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import vllm_cpu_worker as cpu
from engine_process import serve_on_loopback
from fastapi import FastAPI
from vllm.entrypoints.serve.instrumentator.metrics import attach_router
from vllm.v1.engine.core import EngineCore
from vllm.v1.executor.multiproc_executor import MultiprocExecutor


def main() -> None:
    core = EngineCore(cpu.engine_config(Path(sys.argv[1]), tp=2, backend="mp"), MultiprocExecutor, log_stats=False)
    steps = cpu.run_requests(core)
    app = FastAPI()
    attach_router(app)
    server, thread, url = serve_on_loopback(app)
    print(
        json.dumps(
            {"metrics": url, "engine_steps": steps, "workers": [p.proc.pid for p in core.model_executor.workers]}
        ),
        flush=True,
    )
    sys.stdin.read()
    server.should_exit = True
    thread.join(10)
    try:
        core.shutdown()
    except RuntimeError as e:  # its last act, emptying the GPU's cache, needs a GPU
        if "accelerator" not in str(e):
            raise


if __name__ == "__main__":
    main()
