"""The host cost per call of each hot-path piece, and the collector's throughput and drops under overload
(``benchmarks/overhead.py``, parts 1 and 4; ``--only call-costs`` runs :func:`host_costs` alone)."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from measure import median_ns
from overhead_common import make_monitor, sync

import perfsdk
from perfsdk.model import ModelSpec
from perfsdk.monitor import load_native
from perfsdk.testing import probe


def host_costs(spec: ModelSpec, hw: Any, device: str) -> dict[str, float]:
    n = 20000
    out: dict[str, float] = {"perf_counter_ns": median_ns(time.perf_counter_ns, n)}
    if device == "cuda":
        from perfsdk.cuda_driver import driver_events
        from perfsdk.timing import TorchEvents, capture_check

        ev = torch.cuda.Event(enable_timing=True, blocking=True)
        out["cuda_event_record_public"] = median_ns(ev.record, n)
        tev = TorchEvents()
        t_stream, t_record_on = tev.make_stream(), tev.make_record_on()
        out["cuda_event_record_torch_cached_stream"] = median_ns(lambda: t_record_on(ev, t_stream()), n)
        out["cuda_event_query_torch"] = median_ns(ev.query, n)
        drv = driver_events()
        if drv is not None:
            dev_ev = drv.new()
            d_stream, d_record_on = drv.make_stream(), drv.make_record_on()
            out["cuda_event_record_driver"] = median_ns(lambda: d_record_on(dev_ev, d_stream()), n)
            raw = torch._C._cuda_getCurrentRawStream
            out["raw_stream_handle"] = median_ns(lambda: raw(0), n)
            out["cuda_event_query_driver"] = median_ns(lambda: drv.query(dev_ev), n)
            torch.cuda.synchronize()
            out["cuda_event_elapsed_driver"] = median_ns(lambda: drv.elapsed_s(dev_ev, dev_ev), n)
            drv.destroy(dev_ev)
            drv.close()
        out["torch_cuda_current_stream"] = median_ns(torch.cuda.current_stream, n)
        out["capture_check"] = median_ns(capture_check(True), n)
        out["torch_compiler_is_compiling"] = median_ns(torch.compiler.is_compiling, n)
        out["torch_cuda_is_current_stream_capturing"] = median_ns(torch.cuda.is_current_stream_capturing, n)

    def enter_exit(mon: perfsdk.Monitor) -> Callable[[], None]:
        def phase() -> None:
            with mon.decode(batch=8, context_tokens=8192):
                pass

        return phase

    # Monitor settings compared; "" is perfsdk's default (the C hot path where built, driver events,
    # chained boundaries, NVTX auto); "_python" the same algorithm in Python (the reference implementation)
    variants: list[tuple[str, dict[str, Any]]] = [
        ("", {"nvtx": "auto"}),
        ("_python", {"nvtx": "auto", "hot_path": "python"}),
        ("_nvtx_forced", {}),
        ("_nvtx_forced_python", {"hot_path": "python"}),
    ]
    if device == "cuda":
        variants += [
            ("_no_chain", {"nvtx": "auto", "chain_gap_us": 0}),
            ("_no_chain_python", {"nvtx": "auto", "chain_gap_us": 0, "hot_path": "python"}),
            ("_torch_events", {"nvtx": "auto", "cuda_events": "torch"}),
            ("_torch_events_python", {"nvtx": "auto", "cuda_events": "torch", "hot_path": "python"}),
        ]
    rounds, per_round = 10, 2000
    env_hot_path = "c" if load_native() is not None else "python"
    mons: dict[str, perfsdk.Monitor] = {}
    paused = contextlib.ExitStack()  # the held-back cores, let go once measured
    for suffix, kw in variants:
        mon = make_monitor(spec, hw, **kw)
        mons["decode_phase_enter_exit" + suffix] = mon
        # the same with the step core held back: the serving thread's own cost, nothing else running;
        # enough events made up front, since nothing returns them meanwhile
        quiet = make_monitor(
            spec, hw, event_pool_size=rounds * per_round + 100, queue_size=rounds * per_round + 100, **kw
        )
        events = probe(quiet).events
        events.reserve(2 * (rounds * per_round + 100))
        if quiet.cuda_events == "torch":  # torch creates an event at its first record
            # the free list of timing.EventPool: no public seam should hand out events nobody holds
            for ev in list(events._free):  # type: ignore[attr-defined]
                ev.record()
        paused.enter_context(probe(quiet).paused_core())
        mons["decode_phase_enter_exit_collector_stopped" + suffix] = quiet
        if suffix == "_nvtx_forced":
            from perfsdk.nvtx_ranges import make_nvtx

            nv = make_nvtx(True)  # what this Monitor's steps push and pop (nvtx=True), made the same way
            assert nv.backend == mon.nvtx_backend
            out["nvtx_push_pop"] = median_ns(lambda nv=nv: (nv.push("decode", 8), nv.pop()), n)
        if not suffix:
            req = mon.request(prompt_tokens=16)
            out["request_tokens_1"] = median_ns(lambda req=req: req.tokens(1), n)
            req.finish()
    sync(device)
    # interleaved rounds, so that drift and the host's other tenants hit every variant alike
    batches: dict[str, list[float]] = {k: [] for k in mons}
    for _ in range(rounds):
        for key, mon in mons.items():
            fn = enter_exit(mon)
            for _ in range(per_round // 100):
                t0 = time.perf_counter_ns()
                for _ in range(100):
                    fn()
                batches[key].append((time.perf_counter_ns() - t0) / 100)
    for key, mon in mons.items():
        out[key] = statistics.median(batches[key])
        # torch.cuda.Event objects run the Python hot path (the C one calls driver events by address)
        expected = "python" if key.endswith("_python") or "torch_events" in key else env_hot_path
        assert mon.hot_path == expected, (key, mon.hot_path)
        sync(device)
    paused.close()
    for mon in mons.values():
        mon.close()
    from prometheus_client import CollectorRegistry, Histogram

    h = Histogram("x_seconds", "x", ["model"], registry=CollectorRegistry()).labels("m")
    out["prometheus_child_observe"] = median_ns(lambda: h.observe(0.001), n)
    return out


def collector_throughput(spec: ModelSpec, hw: Any) -> dict[str, Any]:
    """Records/s one collector thread processes with every sink on (host-timed steps + requests)."""
    mon = make_monitor(spec, hw)
    mon.flush()
    n = 50_000
    t0 = time.perf_counter()
    # pre-built records pushed straight to the core: measures the core and collector, not the producer
    from perfsdk.records import DECODE, HOST, StepRecord

    core = probe(mon)

    for i in range(n):
        core.push_step(StepRecord(DECODE, HOST, i, i + 1_500_000, None, None, 8, -1, 8192, 0, 0, 0, None))
    ok = mon.flush(300)
    dt = time.perf_counter() - t0
    steps_per_s = n / dt
    reqs = []
    for _ in range(2000):
        r = mon.request(prompt_tokens=64)
        r.scheduled()
        for _ in range(32):
            r.tokens(1)
        reqs.append(r)
    t0 = time.perf_counter()
    for r in reqs:
        r.finish()
    mon.flush(300)
    req_dt = time.perf_counter() - t0
    mon.close()

    # overload: a 1,000-record queue flooded from this thread; every push must return at once
    small = perfsdk.Monitor(
        model=spec,
        hardware=hw,
        registry=__import__("prometheus_client").CollectorRegistry(),
        otel=False,
        nvtx=False,
        timing="host",
        queue_size=1000,
    )
    worst = 0
    pc = time.perf_counter_ns
    for _ in range(200_000):
        a = pc()
        with small.decode(batch=8, context_tokens=8192):
            pass
        worst = max(worst, pc() - a)
    small.flush(300)
    dropped = small.stats()["dropped_records"]
    processed = small.stats()["decode"]["steps"]
    small.close()
    return {
        "step_records_per_s": steps_per_s,
        "flush_ok": ok,
        "finished_requests_per_s_32_tokens_each": 2000 / req_dt,
        "overload": {
            "pushed": 200_000,
            "queue_size": 1000,
            "dropped": dropped,
            "processed": processed,
            "dropped_plus_processed": dropped + processed,
            "worst_push_us": worst / 1e3,
        },
    }
