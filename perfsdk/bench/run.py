"""Run a benchmark: :func:`run_benchmark` (async) and :func:`benchmark` (sync).

::

    from perfsdk.bench import BenchConfig, benchmark

    result = benchmark(BenchConfig(base_url="http://127.0.0.1:8000", model="tiny",
                                   num_prompts=50, request_rate=4.0, seed=0), progress=False)
    print(result.format())
    result.summary["tpot_ms"]["median"]

What happens:

1. Lengths and prompts are drawn from ``seed`` (one stream for lengths, one
   for arrivals), so two runs with the same seed send the same requests at the
   same offsets.
2. ``warmup`` extra requests are sent first, all at once (capped by
   ``max_concurrency``); they are kept in ``result.warmup_records`` and left
   out of every statistic.
3. The measured requests are sent on the arrival schedule (see
   ``arrivals.py``); with ``max_concurrency`` a request waits for a free slot
   and its wait shows up as ``send_lag_ms``. TTFT is timed from the actual send.
4. Every request ends as a success or a counted failure; only cancellation of
   the benchmark itself propagates.
5. With ``repeat`` N > 1 the measured load is sent N times, one after the
   other, each time with a new connection pool: the same requests on the same
   arrival schedule (the seed is the same), so that what differs between the
   repetitions is the server and the machine — the noise that
   ``perfsdk bench compare`` and ``perfsdk regress check`` must see past. The
   warm-up is sent once, before the first. Each repetition is summarised on
   its own (``result.repetitions``) and pooled into ``result.summary``; with
   progress on, a line per repetition goes to stderr.
6. ``config.save_result`` and ``config.plot``, when set, are written at the end.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import TYPE_CHECKING, Any

from perfsdk.bench.arrivals import arrival_offsets
from perfsdk.bench.client import build_payload, send_request
from perfsdk.bench.config import BenchConfig
from perfsdk.bench.prompts import synthetic_prompt
from perfsdk.bench.records import RequestRecord
from perfsdk.bench.report import summarize, summarize_repetitions
from perfsdk.bench.result import BenchResult, Repetition, environment

if TYPE_CHECKING:
    import aiohttp

__all__ = ["benchmark", "run_benchmark"]


async def run_benchmark(config: BenchConfig, *, progress: bool | None = None) -> BenchResult:
    """Run *config* against its server; *progress* overrides ``config.progress``."""
    import aiohttp  # optional dependency, imported at the point of use

    show_progress = config.progress if progress is None else progress
    env = environment()
    n_warm, n = config.warmup, config.num_prompts
    rng = random.Random(f"perfsdk.bench.lengths:{config.seed}")
    in_lens = config.input_spec.sample(rng, n_warm + n)
    out_lens = config.output_spec.sample(rng, n_warm + n)
    prompt_rng = random.Random(f"perfsdk.bench.prompts:{config.seed}")
    prompts = [synthetic_prompt(in_lens[i], prompt_rng, index=i) for i in range(n_warm + n)]
    offsets = arrival_offsets(n, rate=config.request_rate, burstiness=config.burstiness, seed=config.seed)

    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeout_s)

    async def one(i: int, rec: RequestRecord, t0: float, session: aiohttp.ClientSession) -> RequestRecord:
        payload = build_payload(
            config.endpoint,
            model=config.model,
            prompt=prompts[i],
            max_tokens=out_lens[i],
            ignore_eos=config.ignore_eos,
            temperature=config.temperature,
        )
        if slots is None:
            return await send_request(session, config.url, payload, rec, timeout_s=config.timeout_s, t0=t0)
        async with slots:
            return await send_request(session, config.url, payload, rec, timeout_s=config.timeout_s, t0=t0)

    def new_record(i: int, warm: bool, scheduled: float) -> RequestRecord:
        return RequestRecord(index=i, warmup=warm, prompt_len=in_lens[i], max_tokens=out_lens[i], scheduled=scheduled)

    async def repetition(k: int) -> Repetition:
        # a new pool per repetition: each starts from fresh connections, as a separate run would.
        # no connection cap beyond max_concurrency: the semaphore, not the pool, decides who waits
        connector = aiohttp.TCPConnector(limit=0)
        label = "bench" if config.repeat == 1 else f"bench {k + 1}/{config.repeat}"
        bar = _progress_bar(n, show_progress, label)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            warm_records = [new_record(i, True, 0.0) for i in range(n_warm)] if k == 0 else []
            if warm_records:
                t_warm = time.perf_counter()
                await asyncio.gather(*(one(r.index, r, t_warm, session) for r in warm_records))

            records = [new_record(n_warm + j, False, offsets[j]) for j in range(n)]
            tasks: list[asyncio.Task[RequestRecord]] = []
            failed = 0

            def on_done(task: asyncio.Task[RequestRecord]) -> None:
                nonlocal failed
                if bar is None or task.cancelled() or task.exception() is not None:
                    return
                if not task.result().ok:
                    failed += 1
                    bar.set_postfix(failed=failed, refresh=False)
                bar.update(1)

            t0 = time.perf_counter()
            try:
                for rec in records:
                    delay = t0 + rec.scheduled - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    task = asyncio.create_task(one(rec.index, rec, t0, session))
                    task.add_done_callback(on_done)
                    tasks.append(task)
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()  # no-op for finished tasks; frees connections if we are being cancelled
                if bar is not None:
                    bar.close()
            duration = time.perf_counter() - t0
        summary = summarize(records, duration_s=duration, percentiles=config.percentiles, goodput=config.goodput)
        where = "summary" if config.repeat == 1 else f"repetitions[{k}].summary"
        return Repetition(summary, records, warm_records, where=where)

    reps: list[Repetition] = []
    for k in range(config.repeat):
        rep = await repetition(k)
        reps.append(rep)
        if show_progress and config.repeat > 1:
            print(_repetition_line(k, config.repeat, rep.summary), file=sys.stderr, flush=True)

    if len(reps) == 1:
        result = BenchResult(config.to_dict(), reps[0].summary, reps[0].records, reps[0].warmup_records, env)
    else:
        pooled = summarize_repetitions(
            [r.records for r in reps], [r.summary for r in reps], percentiles=config.percentiles, goodput=config.goodput
        )
        records = [rec for r in reps for rec in r.records]
        result = BenchResult(config.to_dict(), pooled, records, reps[0].warmup_records, env, reps)
    if config.save_result:
        result.save(config.save_result)
        result.source = config.save_result
    if config.plot:
        from perfsdk.bench.plot import plot_result  # matplotlib only when asked

        plot_result(result, config.plot)
    return result


def benchmark(config: BenchConfig, *, progress: bool | None = None) -> BenchResult:
    """Blocking form of :func:`run_benchmark`, for scripts and tests (not inside a running loop)."""
    return asyncio.run(run_benchmark(config, progress=progress))


def _progress_bar(total: int, enabled: bool, label: str) -> Any:
    if not enabled:
        return None
    try:
        from tqdm import tqdm  # optional dependency
    except ImportError:
        return None
    return tqdm(total=total, unit="req", desc=label, file=sys.stderr, dynamic_ncols=True)


def _repetition_line(k: int, repeat: int, summary: dict[str, Any]) -> str:
    """``repetition 2/3: 100 ok, 0 failed in 12.3 s; median TTFT 45.1 ms, median TPOT 8.2 ms``."""

    def ms(key: str) -> str:
        v = (summary.get(key) or {}).get("median")
        return "n/a" if v is None else f"{v:,.1f} ms"

    return (
        f"repetition {k + 1}/{repeat}: {summary['completed']} ok, {summary['failed']} failed in "
        f"{summary['duration_s']:.1f} s; median TTFT {ms('ttft_ms')}, median TPOT {ms('tpot_ms')}"
    )
