"""``perfsdk sglang``: SGLang's forward-pass metrics feed into a Monitor, served on /metrics.

See :mod:`perfsdk.engines.sglang` for what it reads and how each forward becomes a step.
"""

from __future__ import annotations

import argparse
import threading
import time

from perfsdk.cli._args import PORT, finite_float, positive_int

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "sglang",
        help="MBU/MFU of an SGLang server's forward passes, on /metrics",
        description=_engine_doc(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--fpm",
        required=True,
        metavar="ENDPOINT",
        help="SGLang's --forward-pass-metrics-ipc-name (e.g. ipc:///tmp/sglang-fpm)",
    )
    p.add_argument(
        "--dp-size", type=positive_int(4096), default=1, help="SGLang's data-parallel size (one feed per rank)"
    )
    p.add_argument(
        "--model", required=True, help="a known model name, or a Hugging Face model directory or config.json"
    )
    p.add_argument(
        "--tp", type=positive_int(4096), default=1, help="SGLang's tensor-parallel size (MBU/MFU are per GPU)"
    )
    p.add_argument("--hardware", default="auto", help="a datasheet name (h200, h100-sxm, ...), default: detect")
    p.add_argument("--model-name", default=None, help="the model label (default: the model's name)")
    p.add_argument("--port", type=PORT, default=9400, help="serve /metrics here (default 9400)")
    p.add_argument("--addr", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument(
        "--duration",
        type=finite_float(0, 1e8, open_low=True, what="a number of seconds"),
        default=None,
        help="stop after this many seconds (default: run)",
    )
    p.set_defaults(func=run)


def _engine_doc() -> str:
    from perfsdk.engines import sglang

    return sglang.__doc__ or ""


def run(args: argparse.Namespace) -> int:
    import signal

    import perfsdk
    from perfsdk.engines.sglang import FpmSubscriber, load_model

    spec = load_model(args.model, args.tp)
    mon = perfsdk.Monitor(
        model=spec, hardware=args.hardware, model_name=args.model_name or spec.name, service="sglang", timing="host"
    )
    server = mon.serve_metrics(port=args.port, addr=args.addr)
    sub = FpmSubscriber(mon, args.fpm, args.dp_size)
    print(
        f"perfsdk sglang: {', '.join(sub.endpoints)} -> http://{args.addr}:{server.port}/metrics "
        f"(model {mon.model_name}, hardware {mon.hardware.name if mon.hardware else 'unknown: MBU/MFU off'})",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    deadline = None if args.duration is None else time.monotonic() + args.duration
    try:
        while not stop.wait(1.0):
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        sub.close()
        mon.close()
    print(
        f"perfsdk sglang: {sub.steps} steps from {sub.received} messages ({sub.lost} lost on the wire, "
        f"{sub.skipped} with nothing to cost; ranks heard: {len(sub._last_seq)} of {args.dp_size})"
    )
    return 0
