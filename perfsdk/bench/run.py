"""Run a benchmark: :func:`run_benchmark` (async) and :func:`benchmark` (sync).

::

    from perfsdk.bench import BenchConfig, benchmark

    result = benchmark(BenchConfig(base_url="http://127.0.0.1:8000", model="tiny",
                                   num_prompts=50, request_rate=4.0, seed=0), progress=False)
    print(result.format())
    result.summary["tpot_ms"]["median"]

What happens:

1. The requests are built one at a time, as they are sent, from ``seed``
   (``workload.py``: one stream for lengths, one for prompt words, one for
   arrivals), so two runs with the same seed send the same requests at the
   same offsets and memory does not grow with ``num_prompts``. The first
   requests (up to 1,024, or 64 MiB of prompts) are built before the clock
   starts, so that a burst goes out without waiting on prompt building.
2. ``warmup`` extra requests are sent first, all at once (capped by
   ``max_concurrency``); they are kept in ``result.warmup_records`` and left
   out of every statistic.
3. The measured requests are sent on the arrival schedule (see
   ``arrivals.py``); with ``max_concurrency`` a request waits for a free slot
   and its wait shows up as ``send_lag_ms``. TTFT is timed from the actual send.
   With ``duration_s`` no request is sent once that many seconds have passed
   since the first (requests in flight finish): the summary counts the
   requests sent, and the rest are never built.
4. Every request ends as a success or a counted failure; only cancellation of
   the benchmark itself propagates. Each response may send at most
   ``max_chunks`` text chunks (by default 4 x its ``max_tokens`` + 64, see
   ``client.py``); a stream past that limit or past ``timeout_s`` is stopped,
   fails (``too_many_chunks``, ``timeout``) and keeps a summary of its gaps,
   not every gap, so an endless stream costs bounded memory and result size.
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
import itertools
import sys
import time
from typing import TYPE_CHECKING, Any

from perfsdk.bench.client import build_payload, send_request
from perfsdk.bench.config import BenchConfig
from perfsdk.bench.records import RequestRecord
from perfsdk.bench.report import summarize, summarize_repetitions
from perfsdk.bench.result import BenchResult, Repetition, environment
from perfsdk.bench.workload import PlannedRequest, build_ahead, planned_requests

if TYPE_CHECKING:
    import aiohttp

__all__ = ["benchmark", "run_benchmark"]


async def run_benchmark(config: BenchConfig, *, progress: bool | None = None) -> BenchResult:
    """Run *config* against its server; *progress* overrides ``config.progress``."""
    import aiohttp  # optional dependency, imported at the point of use

    show_progress = config.progress if progress is None else progress
    env = environment()
    n_warm, n = config.warmup, config.num_prompts

    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeout_s)

    async def send(req: PlannedRequest, rec: RequestRecord, t0: float, session: aiohttp.ClientSession) -> RequestRecord:
        payload = build_payload(
            config.endpoint,
            model=config.model,
            prompt=req.prompt,
            max_tokens=req.max_tokens,
            ignore_eos=config.ignore_eos,
            temperature=config.temperature,
        )
        return await send_request(
            session, config.url, payload, rec, timeout_s=config.timeout_s, t0=t0, max_chunks=config.max_chunks
        )

    async def send_in_slot(
        req: PlannedRequest, rec: RequestRecord, t0: float, session: aiohttp.ClientSession
    ) -> RequestRecord:
        if slots is None:
            return await send(req, rec, t0, session)
        async with slots:
            return await send(req, rec, t0, session)

    async def send_holding_slot(
        req: PlannedRequest, rec: RequestRecord, t0: float, session: aiohttp.ClientSession
    ) -> RequestRecord:
        try:
            return await send(req, rec, t0, session)
        finally:
            if slots is not None:
                slots.release()  # taken by the sending loop before this task was made

    def new_record(req: PlannedRequest) -> RequestRecord:
        return RequestRecord(
            index=req.index,
            warmup=req.warmup,
            prompt_len=req.prompt_len,
            max_tokens=req.max_tokens,
            scheduled=req.scheduled,
        )

    async def repetition(k: int) -> Repetition:
        # a new pool per repetition: each starts from fresh connections, as a separate run would.
        # no connection cap beyond max_concurrency: the semaphore, not the pool, decides who waits
        connector = aiohttp.TCPConnector(limit=0)
        label = "bench" if config.repeat == 1 else f"bench {k + 1}/{config.repeat}"
        bar = _progress_bar(None if config.duration_s is not None else n, show_progress, label)
        # the same seed each time: every repetition sends the same requests; the warm-up goes once
        plan = planned_requests(config, warmup=k == 0)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
            warm_records: list[RequestRecord] = []
            if k == 0 and n_warm:
                warm = list(itertools.islice(plan, n_warm))
                warm_records = [new_record(req) for req in warm]
                t_warm = time.perf_counter()
                await asyncio.gather(
                    *(send_in_slot(req, rec, t_warm, session) for req, rec in zip(warm, warm_records, strict=True))
                )
                del warm  # their prompts are no longer needed

            records: list[RequestRecord] = []
            in_flight: set[asyncio.Task[RequestRecord]] = set()
            failed = 0

            def on_done(task: asyncio.Task[RequestRecord]) -> None:
                nonlocal failed
                in_flight.discard(task)  # a finished task is not kept: its record is in `records`
                if bar is None or task.cancelled() or task.exception() is not None:
                    return
                if not task.result().ok:
                    failed += 1
                    bar.set_postfix(failed=failed, refresh=False)
                bar.update(1)

            measured = build_ahead(plan)
            limit = config.duration_s
            t0 = time.perf_counter()
            try:
                for req in measured:
                    if limit is not None and req.scheduled >= limit:
                        break
                    delay = t0 + req.scheduled - time.perf_counter()
                    # always yield: with no gap to wait (rate inf) the requests already sent start running,
                    # and the duration below is checked against a clock that moves
                    await asyncio.sleep(delay if delay > 0 else 0)
                    if slots is not None:
                        await slots.acquire()  # here, not in the task: waiting requests are not built ahead
                    if limit is not None and time.perf_counter() - t0 >= limit:
                        if slots is not None:
                            slots.release()
                        break
                    rec = new_record(req)
                    records.append(rec)
                    task = asyncio.create_task(send_holding_slot(req, rec, t0, session))
                    in_flight.add(task)
                    task.add_done_callback(on_done)
                while in_flight:
                    await asyncio.gather(*in_flight)
            finally:
                for task in list(in_flight):
                    task.cancel()  # frees connections if we are being cancelled
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


def _progress_bar(total: int | None, enabled: bool, label: str) -> Any:
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
