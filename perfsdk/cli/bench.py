"""``perfsdk bench serve`` and ``perfsdk bench compare``.

::

    perfsdk bench serve --base-url http://127.0.0.1:8000 --model tiny \\
        --endpoint chat --num-prompts 200 --request-rate 8 --burstiness 1 \\
        --max-concurrency 32 --input-len uniform:64-256 --output-len 128 \\
        --seed 0 --warmup 8 --goodput ttft:500 tpot:50 --percentiles 90 99 \\
        --timeout 60 --repeat 3 --save-result run.json --plot run.png
    perfsdk bench serve ... --num-prompts 100000000 --request-rate 20 --duration 600
    perfsdk bench compare before.json after.json

``serve`` prints the summary table and exits 0, even when some requests
failed (failures are counted and shown with their reasons); it exits 1 only
when every request of a repetition failed, so that a script notices a dead
server. ``--repeat N`` sends the same load N times (same seed: the same
requests on the same schedule) and records every repetition; the table then
also shows their spread. Requests are built as they are sent, so a huge
``--num-prompts`` costs nothing up front; ``--duration S`` stops sending S
seconds after the first request (those in flight finish). A response may send
at most ``--max-chunks`` text chunks (default 4 x its max_tokens + 64); a
stream past that, or past ``--timeout``, fails as ``too_many_chunks`` or
``timeout`` and keeps a summary of its gaps, not every gap. ``compare`` prints the delta table, with a 95 %
interval per delta when the files hold repetitions ("within noise" when it
contains 0), and exits 0; a file that is missing or not a saved run exits 2.
"""

from __future__ import annotations

import argparse
import math

from perfsdk.cli import dispatch
from perfsdk.cli._args import DAY_S, SEED, finite_float, int_range, positive_int
from perfsdk.errors import ConfigError

__all__ = ["register", "run", "run_compare", "run_serve"]

# The flags' ranges: beyond them a value is a typo, and some would overflow (an arrival gap of 1e-300 s) or
# hold the run for centuries. --request-rate also takes "inf": every request at once.
MAX_PROMPTS = 10**9
MAX_RATE = 1e6
MAX_CONCURRENCY = 10**6
RATE = finite_float(0, MAX_RATE, open_low=True, allow_inf=True, what="a number of requests/s")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="load-test an OpenAI-compatible server and compare runs")
    bsub = bench.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    bench.set_defaults(func=run)

    s = bsub.add_parser(
        "serve",
        help="stream requests at a chosen rate and report TTFT, TPOT, ITL, throughput and goodput",
        description="Streaming load generator for any OpenAI-compatible server.",
    )
    s.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    s.add_argument("--model", required=True, help="model name as the server knows it")
    s.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    s.add_argument("--num-prompts", type=positive_int(MAX_PROMPTS), default=100, help="measured requests (default 100)")
    s.add_argument("--request-rate", type=RATE, default=math.inf, help="requests/s; 'inf' sends all at once")
    s.add_argument(
        "--burstiness", type=finite_float(1e-3, 1e3), default=1.0, help="1 = Poisson; <1 burstier; >1 more regular"
    )
    s.add_argument(
        "--max-concurrency", type=positive_int(MAX_CONCURRENCY), default=None, help="cap on requests in flight"
    )
    s.add_argument("--input-len", default="128", help="N, uniform:A-B or normal:MEAN,STD (tokens)")
    s.add_argument("--output-len", default="128", help="N, uniform:A-B or normal:MEAN,STD (tokens)")
    s.add_argument("--seed", type=SEED, default=0)
    s.add_argument(
        "--warmup",
        type=int_range(0, MAX_CONCURRENCY),
        default=0,
        help="extra requests sent first and left out of results",
    )
    s.add_argument("--ignore-eos", action="store_true", help="ask for exactly --output-len tokens")
    s.add_argument(
        "--goodput", nargs="+", metavar="NAME:MS", default=None, help="SLOs, e.g. ttft:500 tpot:50 e2el:5000"
    )
    s.add_argument(
        "--percentiles", nargs="+", type=finite_float(0, 100, open_low=True), default=[99.0], help="default: 99"
    )
    s.add_argument(
        "--timeout",
        type=finite_float(0, DAY_S, open_low=True, what="a number of seconds"),
        default=300.0,
        help="seconds per request, at most a day (default 300)",
    )
    s.add_argument("--temperature", type=finite_float(0, 100), default=0.0)
    s.add_argument("--api-key", default=None, help="sent as a Bearer token; never saved")
    s.add_argument(
        "--repeat",
        type=int_range(1, 1000),
        default=1,
        metavar="N",
        help="send the same load N times and record each (default 1; use 3 for `bench compare`/`regress`)",
    )
    s.add_argument(
        "--max-chunks",
        type=positive_int(10**9),
        default=None,
        metavar="N",
        help="text chunks one response may send before it is stopped and failed (default 4 x max_tokens + 64)",
    )
    s.add_argument(
        "--duration",
        type=finite_float(0, DAY_S, open_low=True, what="a number of seconds"),
        default=None,
        metavar="SECONDS",
        help="stop sending new requests this long after the first (per repetition); default: send all",
    )
    s.add_argument("--save-result", metavar="PATH", default=None, help="write config, records, summary as JSON")
    s.add_argument("--plot", metavar="PATH", default=None, help="write a PNG of latencies and tokens/s")
    s.add_argument("--no-progress", action="store_true", help="no progress bar")

    c = bsub.add_parser(
        "compare",
        help="print the deltas between two saved runs, with 95%% intervals when they hold repetitions",
        description="Deltas between two saved runs. With several repetitions per file (bench serve --repeat 3) "
        "each delta has a 95%% interval (Welch's t over the per-repetition values) and is called 'within noise' "
        "when the interval contains 0; with one repetition per file the noise is unknown, and the table says so. "
        "Exit 0; 2 when a file is missing or not a saved run.",
    )
    c.add_argument("a", metavar="A.json")
    c.add_argument("b", metavar="B.json")


def run(args: argparse.Namespace) -> int:
    return dispatch(args, "bench_command", {"serve": run_serve, "compare": run_compare}, "bench")


def run_serve(args: argparse.Namespace) -> int:
    from perfsdk.bench.config import BenchConfig, parse_goodput  # keeps `perfsdk` startup cheap
    from perfsdk.bench.run import benchmark

    config = BenchConfig(
        base_url=args.base_url,
        model=args.model,
        endpoint=args.endpoint,
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        max_concurrency=args.max_concurrency,
        input_len=args.input_len,
        output_len=args.output_len,
        seed=args.seed,
        warmup=args.warmup,
        ignore_eos=args.ignore_eos,
        goodput=parse_goodput(args.goodput),
        percentiles=tuple(args.percentiles),
        timeout_s=args.timeout,
        temperature=args.temperature,
        api_key=args.api_key,
        save_result=args.save_result,
        plot=args.plot,
        progress=not args.no_progress,
        repeat=args.repeat,
        max_chunks=args.max_chunks,
        duration_s=args.duration,
    )
    result = benchmark(config)
    print(result.format())
    if args.save_result:
        print(f"saved {args.save_result}")
    if args.plot:
        print(f"plotted {args.plot}")
    return 1 if any(rep.summary["completed"] == 0 for rep in result.repetitions) else 0


def run_compare(args: argparse.Namespace) -> int:
    from perfsdk.bench.compare import compare_results, config_diff, format_comparison
    from perfsdk.bench.result import BenchResult

    a, b = BenchResult.load(args.a), BenchResult.load(args.b)
    if not a.summary or not b.summary:
        raise ConfigError("compare: both files need a summary")
    print(format_comparison(compare_results(a, b), config_diff(a, b), names=("A", "B")))
    return 0
