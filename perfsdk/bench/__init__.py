"""perfsdk's streaming load generator for OpenAI-compatible servers.

Measure what users feel — TTFT, TPOT, ITL, end-to-end latency, throughput and
goodput — from the client side, with exact per-request records::

    from perfsdk.bench import BenchConfig, benchmark

    result = benchmark(BenchConfig(
        base_url="http://127.0.0.1:8000", model="tiny",
        num_prompts=100, request_rate=8.0, input_len=128, output_len="uniform:32-128",
        goodput={"ttft": 500, "tpot": 50}, seed=0,
    ), progress=False)
    print(result.format())
    result.summary["ttft_ms"]["p99"], result.summary["failures"]
    result.records[0].ttft, result.records[0].itl

or from a shell: ``perfsdk bench serve --base-url ... --model ...`` and
``perfsdk bench compare A.json B.json``.

Modules: ``config`` (BenchConfig), ``distributions`` (LengthSpec),
``arrivals`` (Poisson/gamma schedule, same meaning as ``vllm bench serve``),
``prompts``, ``workload`` (the requests of a run, built as they are sent),
``client`` (one SSE request, failure classification, the chunk limit),
``records`` (RequestRecord, failure reasons), ``run``, ``report`` (summary
keys are documented there), ``result`` (BenchResult, JSON, repetitions),
``plot``, ``compare``, ``noise`` (the 95 % interval of a difference across
repetitions, ``repeat=3``), ``cli``. aiohttp, tqdm and matplotlib are imported only when a
benchmark runs or a plot is drawn.
"""

from __future__ import annotations

from perfsdk.bench.config import BenchConfig
from perfsdk.bench.distributions import LengthSpec
from perfsdk.bench.records import RequestRecord
from perfsdk.bench.result import BenchResult
from perfsdk.bench.run import benchmark, run_benchmark

__all__ = ["BenchConfig", "BenchResult", "LengthSpec", "RequestRecord", "benchmark", "run_benchmark"]
