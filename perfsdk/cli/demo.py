"""``perfsdk demo``: serve the demo model, load it, print one report.

::

    perfsdk demo                             # ~25 s on a 2-core CPU, then a report and exit 0
    perfsdk demo --duration 8 --json         # shorter, machine-readable
    perfsdk demo --serve --port 8000         # report, then keep serving until Ctrl-C
    perfsdk demo --device cuda --model-size 1b --request-rate 16

The load is :mod:`perfsdk.bench` (Poisson arrivals at ``--request-rate`` for ``--duration`` seconds,
so ``rate × duration`` requests unless ``--num-prompts`` says otherwise), sent over real HTTP to the
server on loopback. The report puts what the client saw beside the server's histograms, then the
step times, MBU/MFU and the floors for this model on this machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["register", "run_demo"]

log = logging.getLogger(__name__)

# per device kind: (duration s, request rate, output tokens, KV-cache slots). The rates stay well inside
# what the default model serves there (tiny on 2 CPU cores: ~8 running at ~10 ms a step; 1b eager on an
# H200: ~500 tokens/s, its eager steps launch-bound and sharing the GIL with the HTTP threads), so the
# report shows a healthy server, not a growing queue.
_DEFAULTS: dict[str, tuple[float, float, str, int]] = {
    "cpu": (25.0, 4.0, "64", 8),
    "cuda": (30.0, 3.0, "128", 32),
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="serve a tiny instrumented LLM, load it, and report TTFT/ITL/MBU/MFU against the floors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--port",
        type=int,
        default=None,
        help="port to listen on (0: any free one; default 0, 8000 with --serve)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default: auto)")
    p.add_argument("--model-size", default=None, help="tiny | small | 1b (default: tiny on CPU, 1b on CUDA)")
    p.add_argument("--duration", type=float, default=None, help="seconds of load (default 25 on CPU, 30 on CUDA)")
    p.add_argument("--num-prompts", type=int, default=None, help="requests to send (default: rate × duration)")
    p.add_argument("--request-rate", type=float, default=None, help="requests/s, Poisson (default 4 CPU, 3 CUDA)")
    p.add_argument("--input-len", default="uniform:32-128", help="prompt tokens: N or uniform:A-B")
    p.add_argument("--output-len", default=None, help="output tokens: N or uniform:A-B (default 64 CPU, 128 CUDA)")
    p.add_argument(
        "--max-batch", type=int, default=None, help="KV-cache slots: most requests decoded together (8 CPU, 32 CUDA)"
    )
    p.add_argument("--serve", action="store_true", help="keep serving after the report, until Ctrl-C")
    p.add_argument("--seed", type=int, default=0, help="weights, prompts and sampling seed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-calibrate", action="store_true", help="on CPU, skip the quick calibration (MBU/MFU off)")
    p.set_defaults(func=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from perfsdk.bench import BenchConfig
    from perfsdk.demo.report import build_report, format_report
    from perfsdk.demo.stack import resolve_device, start_demo

    device = resolve_device(args.device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    d_duration, d_rate, d_output, d_slots = _DEFAULTS[kind]
    duration = d_duration if args.duration is None else args.duration
    rate = d_rate if args.request_rate is None else args.request_rate
    if duration <= 0:
        raise ConfigError(f"--duration must be positive, got {duration}")
    if rate <= 0:
        raise ConfigError(f"--request-rate must be positive, got {rate}")
    num_prompts = args.num_prompts if args.num_prompts is not None else max(1, round(rate * duration))
    if num_prompts < 1:
        raise ConfigError(f"--num-prompts must be at least 1, got {num_prompts}")
    port = args.port if args.port is not None else (8000 if args.serve else 0)
    output_len = args.output_len or d_output

    _say(f"perfsdk demo: building the {args.model_size or 'default'} model on {device}…")
    stack = start_demo(
        size=args.model_size,
        device=device,
        port=port,
        host=args.host,
        seed=args.seed,
        max_batch_slots=args.max_batch or d_slots,
        calibrate=not args.no_calibrate,
    )
    try:
        base = stack.server.base_url
        _say(f"perfsdk demo: {stack.model_name} serving at {base} (metrics: {base}/metrics)")
        _say(f"perfsdk demo: sending {num_prompts} requests at {rate:g}/s for about {duration:g} s…")
        config = BenchConfig(
            base_url=base,
            model=stack.model_name,
            endpoint="completions",
            num_prompts=num_prompts,
            request_rate=rate,
            input_len=args.input_len,
            output_len=output_len,
            ignore_eos=True,  # exact output lengths, so client and server counts can be compared
            seed=args.seed,
            # bounds the run at about twice --duration even when the server falls behind
            timeout_s=max(30.0, duration),
            progress=sys.stderr.isatty() and not args.json,
        )
        result = _run_load(config)
        stack.engine.wait_idle(timeout=10.0)
        monitor_stats: dict[str, Any] | None = None
        if stack.monitor is not None:
            stack.monitor.flush(timeout=5.0)
            monitor_stats = stack.monitor.stats()
        load = {
            "num_prompts": num_prompts,
            "request_rate": rate,
            "duration_target_s": duration,
            "input_len": args.input_len,
            "output_len": output_len,
        }
        report = build_report(stack=stack, bench=result, config=load, monitor_stats=monitor_stats)
        if args.json:
            print(json.dumps(report, indent=2, default=str))
        else:
            print(format_report(report, serving=args.serve))
        sys.stdout.flush()
        completed = int(result.summary.get("completed") or 0)
        if args.serve:
            _say(f"perfsdk demo: still serving at {base}; Ctrl-C to stop")
            try:
                stack.server.serve_forever()
            except KeyboardInterrupt:
                pass
        return 0 if completed > 0 else 1
    finally:
        stack.close()


def _load_child(config: Any, path: str) -> None:
    from perfsdk.bench import benchmark

    benchmark(config, progress=config.progress).save(path)


def _run_load(config: Any) -> Any:
    """Run the load generator in its own process, as a real client would be.

    In the server's process its asyncio loop would take the GIL from the engine thread between kernel
    launches and slow every step down; a separate process keeps the server's numbers honest.
    """
    import multiprocessing
    import tempfile
    from pathlib import Path

    from perfsdk.bench import BenchResult

    with tempfile.TemporaryDirectory(prefix="perfsdk-demo-") as tmp:
        path = str(Path(tmp) / "bench.json")
        proc = multiprocessing.get_context("spawn").Process(
            target=_load_child, args=(config, path), name="perfsdk-demo-load"
        )
        proc.start()
        try:
            proc.join()
        finally:
            if proc.is_alive():  # Ctrl-C reached us first
                proc.terminate()
                proc.join(5)
        if proc.exitcode != 0 or not Path(path).exists():
            raise RuntimeError(f"the load generator failed (exit code {proc.exitcode}); see its messages above")
        return BenchResult.load(path)


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
