"""SGLang's process layout with two tensor-parallel scheduler processes and its ``/metrics`` endpoint; run by
``test_sglang.py`` in a fresh process (prometheus_client must see ``PROMETHEUS_MULTIPROC_DIR`` first).

    python tests/engines/sglang_server.py MODEL_DIR

As ``sglang serve ... --tp-size 2 --enable-metrics`` does: SGLang's ``set_prometheus_multiproc_dir()`` in
the main process, then one spawned process per rank that calls SGLang's ``load_plugins()`` (which runs
perfsdk's entry point and applies its ``HookRegistry`` hook), publishes the server arguments, joins the
rank group (gloo) and runs ``sglang_cpu_runner.workload()`` through ``ModelRunner.forward``. The main
process serves SGLang's own ``/metrics`` app (``add_prometheus_middleware``) on loopback and prints one
JSON line with its URL and the ranks' pids; it serves until its stdin closes.
"""

from __future__ import annotations

import json
import multiprocessing
import socket
import sys
from pathlib import Path
from typing import Any

TP = 2


def scheduler(model_dir: str, rank: int, dist_port: int, ready: Any, stop: Any) -> None:
    import sglang_cpu_runner as cpu  # the torchvision placeholder first
    import torch.distributed as dist
    from sglang.srt.plugins import load_plugins

    load_plugins()  # as run_scheduler_process does, first thing
    args = cpu.scheduler_context(Path(model_dir), tp_size=TP, tp_rank=rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{dist_port}", world_size=TP, rank=rank)
    runner = cpu.CpuModelRunner(args)
    for fb in cpu.workload():
        runner.forward(fb)
    hook = runner.__dict__.get("_perfsdk_hook")
    if hook is not None:
        hook.monitor.flush(30)
    ready.put(rank)
    stop.wait()


def main() -> None:
    from sglang.srt.utils.common import set_prometheus_multiproc_dir

    set_prometheus_multiproc_dir()  # --enable-metrics, before anything imports prometheus_client
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dist_port = s.getsockname()[1]
    procs = [
        ctx.Process(target=scheduler, args=(sys.argv[1], r, dist_port, ready, stop), daemon=True) for r in range(TP)
    ]
    for p in procs:
        p.start()
    ranks = sorted(ready.get(timeout=300) for _ in procs)

    from engine_process import serve_on_loopback
    from fastapi import FastAPI
    from sglang.srt.utils.common import add_prometheus_middleware

    app = FastAPI()
    add_prometheus_middleware(app)
    server, thread, url = serve_on_loopback(app)
    print(json.dumps({"metrics": url, "ranks": ranks, "schedulers": [p.pid for p in procs]}), flush=True)
    sys.stdin.read()
    stop.set()
    server.should_exit = True
    thread.join(10)
    for p in procs:
        p.join(10)


if __name__ == "__main__":
    main()
