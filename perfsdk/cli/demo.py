"""``perfsdk demo``: serve the demo model, load it, print one report.

::

    perfsdk demo                             # ~25 s on a 2-core CPU, then a report and exit 0
    perfsdk demo --duration 8 --json         # shorter, machine-readable
    perfsdk demo --serve --port 8000         # report, then keep serving until Ctrl-C
    perfsdk demo --device cuda --model-size 1b --request-rate 16
    perfsdk demo --device cuda --engine eager  # the naive engine (default on CUDA: the fastest rung)
    perfsdk demo --ladder                      # every rung under one load, perfsdk's verdict on each

``--engine`` picks a rung of :mod:`perfsdk.demo.rungs` (eager, graph, compile, int8); ``auto`` is the eager
engine on a CPU and the fastest rung on CUDA. ``--ladder`` runs :mod:`perfsdk.demo.ladder`: the seeds'
table and the loop's log (hypothesis, change, result) under ``--out``.

The load is :mod:`perfsdk.bench` (Poisson arrivals at ``--request-rate`` for ``--duration`` seconds,
so ``rate × duration`` requests unless ``--num-prompts`` says otherwise), sent over real HTTP to the
server on loopback. The report puts what the client saw beside the server's histograms, then the
step times, MBU/MFU and the floors for this model on this machine.

``--host`` other than loopback (``--host 0.0.0.0``) needs ``--token TOKEN`` (or ``PERFSDK_PROFILE_TOKEN``):
``POST`` and ``DELETE /debug/profile`` then need ``Authorization: Bearer TOKEN``, as the Monitor's own
``/profile`` does off loopback; without one the demo refuses to start (exit 2).

**Stopping.** SIGINT (Ctrl-C) and SIGTERM (``kill``, ``docker stop``, systemd) stop the demo the same
clean way: the load generator is stopped, the engine, server and monitor are shut down, and
``perfsdk demo: stopped (SIGTERM)`` goes to stderr. Exit codes: 0 when requests completed (1 when none
did), also for ``--serve`` stopped by either signal after its report; 128 + the signal's number (130 for
SIGINT, 143 for SIGTERM) when a signal stops it before the report: during the load, the report of what
the server measured so far is printed first (client columns empty, marked interrupted). A second signal
while it is stopping exits at once with the same code.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from perfsdk.cli._args import DAY_S, PORT, SEED, finite_float, positive_int
from perfsdk.errors import ConfigError

__all__ = ["register", "run", "run_demo", "run_ladder"]

log = logging.getLogger(__name__)

# per device kind: (duration s, request rate, output tokens, KV-cache slots). The rates stay well inside
# what the default model serves there (tiny on 2 CPU cores: ~8 running at ~10 ms a step; 1b on an H200:
# ~190 tokens/s under load with the eager engine, several thousand with the compiled one), so the report
# shows a healthy server, not a growing queue. --engine eager on CUDA keeps the old 3 requests/s.
_DEFAULTS: dict[str, tuple[float, float, str, int]] = {"cpu": (25.0, 4.0, "64", 8), "cuda": (30.0, 8.0, "128", 32)}
_EAGER_CUDA_RATE = 3.0
# what a demo on one machine can mean: beyond these the load is a typo (and rate × duration would be a
# billion prompts built before the first is sent)
MAX_RATE = 10_000.0
MAX_PROMPTS = 1_000_000
MAX_SLOTS = 4096


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="serve a tiny instrumented LLM, load it, and report TTFT/ITL/MBU/MFU against the floors",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--port", type=PORT, default=None, help="port to listen on (0: any free one; default 0, 8000 with --serve)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: loopback; any other needs --token)"
    )
    p.add_argument(
        "--token",
        default=None,
        help="bearer token for POST and DELETE /debug/profile (default: $PERFSDK_PROFILE_TOKEN); "
        "required with a --host other than loopback",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N] (default: auto)")
    p.add_argument("--model-size", default=None, help="tiny | small | 1b | 8b (default: tiny on CPU, 1b on CUDA)")
    p.add_argument(
        "--engine",
        default="auto",
        help="auto | eager | graph | compile | int8 (default auto: eager on CPU, the fastest rung on CUDA)",
    )
    p.add_argument(
        "--duration",
        type=finite_float(0, DAY_S, open_low=True, what="a number of seconds"),
        default=None,
        help="seconds of load, at most a day (default 25 on CPU, 30 on CUDA)",
    )
    p.add_argument(
        "--num-prompts",
        type=positive_int(MAX_PROMPTS),
        default=None,
        help="requests to send (default: rate × duration)",
    )
    p.add_argument(
        "--request-rate",
        type=finite_float(0, MAX_RATE, open_low=True, what="a number of requests/s"),
        default=None,
        help="requests/s, Poisson (default 4 CPU, 8 CUDA, 3 with --engine eager on CUDA)",
    )
    p.add_argument("--input-len", default="uniform:32-128", help="prompt tokens: N or uniform:A-B")
    p.add_argument("--output-len", default=None, help="output tokens: N or uniform:A-B (default 64 CPU, 128 CUDA)")
    p.add_argument(
        "--max-batch",
        type=positive_int(MAX_SLOTS),
        default=None,
        help="KV-cache slots: most requests decoded together (8 CPU, 32 CUDA)",
    )
    p.add_argument("--serve", action="store_true", help="keep serving after the report, until Ctrl-C")
    p.add_argument("--seed", type=SEED, default=0, help="weights, prompts and sampling seed")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-calibrate", action="store_true", help="on CPU, skip the quick calibration (MBU/MFU off)")
    g = p.add_argument_group("ladder")
    g.add_argument("--ladder", action="store_true", help="run every engine rung under one load; table, log and plot")
    g.add_argument("--rungs", default=None, help="comma-separated rungs (default: all this device runs)")
    g.add_argument("--out", default="perfsdk-ladder", help="where the ladder writes (default ./perfsdk-ladder)")
    g.add_argument(
        "--concurrency",
        type=positive_int(MAX_SLOTS),
        default=None,
        help="ladder load: requests in flight (16 CUDA, 4 CPU)",
    )
    p.set_defaults(func=run)


def run_ladder(args: argparse.Namespace) -> int:
    from perfsdk.demo.ladder import LadderConfig, format_table, run_ladder

    cfg = LadderConfig(
        device=args.device,
        size=args.model_size,
        rungs=tuple(r.strip() for r in args.rungs.split(",") if r.strip()) if args.rungs else None,
        out_dir=args.out,
        max_batch_slots=args.max_batch,
        num_prompts=args.num_prompts,
        concurrency=args.concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
        calibrate=not args.no_calibrate,
        progress=_say,
    )
    result = run_ladder(cfg)
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_table(result))
        files = result.get("files") or {}
        plot = files.get("plot", "(no matplotlib)")
        print(f"  log: {files.get('markdown')}; data: {files.get('json')}; plot: {plot}")
    ran = [r for r in result["rungs"] if not r.get("skipped")]
    return 0 if ran and all((r.get("load") or {}).get("completed") for r in ran) else 1


class _Signalled(BaseException):
    """SIGINT or SIGTERM, raised in the main thread (a BaseException: no ``except Exception`` swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.code = 128 + signum


class _Stopper:
    """SIGINT and SIGTERM as one clean stop (see the module docstring): the first raises :class:`_Signalled` in
    the main thread, or waits while the report is being printed (:meth:`held`); a second one while stopping
    exits at once. Installed only from the main thread (signal handlers live there)."""

    def __init__(self) -> None:
        self.stopping = False
        self._hold = False
        self._pending: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Stopper:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping:
            _say(f"perfsdk demo: {signal.Signals(signum).name} again while stopping: exiting now")
            os._exit(128 + signum)
        if self._hold and self._pending is None:
            self._pending = signum
            return
        if self._hold:  # a second one while held: as while stopping
            _say(f"perfsdk demo: {signal.Signals(signum).name} again: exiting now")
            os._exit(128 + signum)
        self.stopping = True
        raise _Signalled(signum)

    @contextmanager
    def held(self) -> Iterator[None]:
        """A signal that arrives in here is raised when it ends (the report is printed whole)."""
        self._hold = True
        try:
            yield
        finally:
            self._hold = False
            pending, self._pending = self._pending, None
            if pending is not None and not self.stopping:
                self.stopping = True
                raise _Signalled(pending)


def run(args: argparse.Namespace) -> int:
    """``perfsdk demo`` (``--ladder``: :func:`run_ladder`)."""
    return run_ladder(args) if args.ladder else run_demo(args)


def run_demo(args: argparse.Namespace) -> int:
    """The demo: serve, load, report (the module docstring)."""
    with _Stopper() as stopper:
        try:
            return _run_demo(args, stopper)
        except _Signalled as s:
            _say(f"perfsdk demo: stopped ({s.name}); exit code {s.code}")
            return s.code


def _run_demo(args: argparse.Namespace, stopper: _Stopper) -> int:
    from perfsdk.bench import BenchConfig
    from perfsdk.demo.report import build_report, format_report
    from perfsdk.demo.stack import resolve_device, run_load, start_demo
    from perfsdk.profiling.endpoint import check_bind

    token = args.token if args.token is not None else os.environ.get("PERFSDK_PROFILE_TOKEN")
    token = token or None  # an empty token is none
    # before torch is imported or a model built: a refused --host is an error at once
    check_bind(
        args.host,
        token,
        "--host",
        "the demo",
        "a token for POST and DELETE /debug/profile (the profiler trigger): pass --token or set "
        "PERFSDK_PROFILE_TOKEN, or bind 127.0.0.1",
    )
    device = resolve_device(args.device)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    d_duration, d_rate, d_output, d_slots = _DEFAULTS[kind]
    duration = d_duration if args.duration is None else args.duration
    if kind == "cuda" and args.engine.strip().lower() == "eager":
        d_rate = _EAGER_CUDA_RATE
    rate = d_rate if args.request_rate is None else args.request_rate
    num_prompts = args.num_prompts if args.num_prompts is not None else max(1, round(rate * duration))
    if num_prompts > MAX_PROMPTS:
        raise ConfigError(
            f"--request-rate × --duration is {num_prompts:,} requests, beyond the demo's "
            f"{MAX_PROMPTS:,}; lower one of them or pass --num-prompts"
        )
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
        engine=args.engine,
        profile_token=token,
    )
    try:
        base = stack.server.base_url
        _say(
            f"perfsdk demo: {stack.model_name} ({stack.rung} engine, built in {stack.build_seconds:.1f} s) serving at "
            f"{base} (metrics: {base}/metrics)"
        )
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
        interrupted: _Signalled | None = None
        result = None
        try:
            result = run_load(config)  # a signal here stops the load generator (run_load's finally) ...
        except _Signalled as s:
            interrupted = s  # ... and the report says what the server measured until then
            _say(f"perfsdk demo: {s.name}: load stopped; the report holds what the server measured so far")
        with stopper.held():
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
            if interrupted is not None:
                report["interrupted"] = (
                    f"{interrupted.name} during the load: it was stopped; the client columns "
                    "are empty, the server's hold the requests that finished before"
                )
            if args.json:
                print(json.dumps(report, indent=2, default=str))
            else:
                print(format_report(report, serving=args.serve and interrupted is None))
            sys.stdout.flush()
        if interrupted is not None:
            raise interrupted
        completed = int(result.summary.get("completed") or 0) if result is not None else 0
        if args.serve:
            _say(f"perfsdk demo: still serving at {base}; Ctrl-C (or SIGTERM) to stop")
            try:
                stack.server.serve_forever()
            except _Signalled as s:
                _say(f"perfsdk demo: stopped ({s.name})")
        return 0 if completed > 0 else 1
    finally:
        with stopper.held():  # a signal while shutting down waits for it (a second one exits at once)
            stack.close()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
