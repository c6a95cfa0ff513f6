"""The instrumentation core on CPU: exact counts, values under a controlled clock, spans, failure isolation."""

from __future__ import annotations

import asyncio
import logging
import math
import os
import subprocess
import sys
import textwrap
import urllib.request
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

import perfsdk
from perfsdk import budget
from perfsdk.errors import ConfigError
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.records import DECODE, HOST, UNTIMED, StepRecord
from perfsdk.sinks.prometheus import PrometheusSink
from perfsdk.testing import FakeClock, monitor_harness, probe

TTFT = "gen_ai_server_time_to_first_token_seconds"
TPOT = "gen_ai_server_time_per_output_token_seconds"
E2E = "gen_ai_server_request_duration_seconds"
ITL = "perfsdk_inter_token_latency_seconds"
QUEUE = "perfsdk_request_queue_seconds"
STEP = "perfsdk_step_seconds"
MBU = "perfsdk_step_bandwidth_utilization"
MFU = "perfsdk_step_flops_utilization"

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=2e12, flops={"bf16": 500e12})

pytestmark = pytest.mark.usefixtures("each_hot_path")  # the C step wrappers and the Python reference


def test_counts_after_n_requests_match_exactly() -> None:
    tokens = [1, 2, 5, 9, 3]
    steps = 0
    with monitor_harness(model=MODEL, hardware=HW) as h:
        mon = h.monitor
        for n in tokens:
            with mon.request(prompt_tokens=32) as req:
                req.scheduled()
                with mon.prefill(tokens=32):
                    steps += 1
                for i in range(n):
                    with mon.decode(batch=1, context_tokens=32 + i):
                        steps += 1
                    req.tokens(1)
        N = len(tokens)
        assert h.count(TTFT) == N
        assert h.count(E2E) == N
        assert h.count(QUEUE) == N
        assert h.count(ITL) == sum(tokens) - N
        assert h.count(TPOT) == sum(1 for n in tokens if n > 1)  # TPOT needs a second token
        assert h.count(STEP, phase="decode") == sum(tokens)
        assert h.count(STEP, phase="prefill") == N
        assert h.count(STEP, phase="decode") + h.count(STEP, phase="prefill") == steps
        assert h.count(MBU, phase="decode") == sum(tokens)
        assert h.count(MFU, phase="prefill") == N
        assert h.value("perfsdk_step_tokens_total", phase="decode") == sum(tokens)
        assert h.value("perfsdk_step_tokens_total", phase="prefill") == 32 * N
        stats = mon.stats()
        assert stats["decode"]["steps"] == sum(tokens)
        assert stats["dropped_records"] == 0
        assert stats["internal_errors"] == 0


def test_latency_values_under_a_controlled_clock() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        req = h.monitor.request(prompt_tokens=100)
        clock.advance(0.030)
        req.scheduled()  # queue 30 ms
        clock.advance(0.070)
        req.tokens(1)  # TTFT 100 ms
        for gap in (0.010, 0.020, 0.030):
            clock.advance(gap)
            req.tokens(1)
        clock.advance(0.005)
        req.finish("length")  # e2e 165 ms, 4 tokens
        assert h.sum(QUEUE) == pytest.approx(0.030)
        assert h.sum(TTFT) == pytest.approx(0.100)
        assert h.sum(ITL) == pytest.approx(0.060)
        assert h.count(ITL) == 3
        assert h.sum(E2E) == pytest.approx(0.165)
        assert h.sum(TPOT) == pytest.approx((0.165 - 0.100) / 3)  # (e2e - ttft) / (tokens - 1)
        # a bucket check: the 100 ms TTFT falls in le=0.1, not le=0.08
        assert h.value(f"{TTFT}_bucket", le="0.1") == 1
        assert h.value(f"{TTFT}_bucket", le="0.08") == 0


def test_tokens_with_n_counts_output_tokens_once_per_call() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        req = h.monitor.request(prompt_tokens=4)
        clock.advance(0.1)
        req.tokens(4)  # a speculative-decoding burst: one emission, four tokens
        clock.advance(0.1)
        req.tokens(2)
        req.finish()
        req.finish("abort")  # ignored: a request finishes once
        assert req.output_tokens == 6
        assert h.count(ITL) == 1
        assert h.sum(TPOT) == pytest.approx(0.1 / 5)
        assert h.count(E2E) == 1


def test_mbu_and_mfu_are_the_budget_formulas_on_the_step_time() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        mon = h.monitor
        with mon.decode(batch=4, context_tokens=4 * 1000):
            clock.advance(0.010)
        with mon.prefill(tokens=1000, batch=2, seq_lens=[600, 400]):
            clock.advance(0.050)
        with mon.mixed(prefill_seq_lens=[256], decode_batch=3, context_tokens=3000):
            clock.advance(0.020)
        decode_bytes = budget.decode_step_bytes(MODEL, 4000, 4)
        assert h.sum(MBU, phase="decode") == pytest.approx(decode_bytes / (0.010 * 2e12))
        prefill_flops = budget.prefill_flops(MODEL, [600, 400])
        assert h.sum(MFU, phase="prefill") == pytest.approx(prefill_flops / (0.050 * 500e12))
        # a mixed step reports both
        assert h.sum(MBU, phase="mixed") == pytest.approx(
            budget.mixed_step_bytes(MODEL, [256], 3000, 3) / (0.020 * 2e12)
        )
        assert h.sum(MFU, phase="mixed") == pytest.approx(
            budget.mixed_step_flops(MODEL, [256], 3, 3000) / (0.020 * 500e12)
        )
        assert h.value("perfsdk_step_bytes_total", phase="decode") == pytest.approx(decode_bytes)
        assert h.value("perfsdk_step_flops_total", phase="decode") == pytest.approx(budget.decode_flops(MODEL, 4, 4000))
        assert h.sum(STEP, phase="decode") == pytest.approx(0.010)
        assert h.registry.get_sample_value("perfsdk_hardware_peak_bandwidth_bytes", {"device": "test-gpu"}) == 2e12


def test_spans_names_structure_and_attributes() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry import trace

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, operation="chat") as h:
        tracer = h.tracer_provider.get_tracer("server")
        with tracer.start_as_current_span("POST /v1/chat/completions") as http_span:
            req = h.monitor.request(prompt_tokens=12, request_id="r-1")
        clock.advance(0.01)
        req.scheduled()
        clock.advance(0.02)
        req.tokens(1)
        clock.advance(0.03)
        req.tokens(1)
        req.finish("stop")
        spans = {s.name: s for s in h.spans()}
        root = spans["chat llama-3-8b"]
        assert root.kind == trace.SpanKind.SERVER
        assert root.parent is not None and root.parent.span_id == http_span.get_span_context().span_id
        attrs = dict(root.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "llama-3-8b"
        assert attrs["gen_ai.usage.input_tokens"] == 12
        assert attrs["gen_ai.usage.output_tokens"] == 2
        assert attrs["gen_ai.server.time_to_first_token"] == pytest.approx(0.03)
        assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("stop",)
        for child in ("queue", "prefill", "decode"):
            assert spans[child].parent is not None
            assert spans[child].parent.span_id == root.context.span_id
        assert spans["queue"].end_time - spans["queue"].start_time == 10_000_000
        assert spans["prefill"].end_time - spans["prefill"].start_time == 20_000_000
        assert spans["decode"].end_time - spans["decode"].start_time == 30_000_000
        assert root.end_time - root.start_time == 60_000_000


def test_step_spans_are_opt_in_and_sampled() -> None:
    pytest.importorskip("opentelemetry.sdk")
    with monitor_harness(model=MODEL, hardware=HW) as h:
        for _ in range(5):
            with h.monitor.decode(batch=1):
                pass
        assert not [s for s in h.spans() if s.name.endswith(" step")]
    with monitor_harness(model=MODEL, hardware=HW, step_span_rate=1.0) as h:
        for _ in range(5):
            with h.monitor.decode(batch=2, context_tokens=10):
                pass
        steps = [s for s in h.spans() if s.name == "decode step"]
        assert len(steps) == 5
        assert steps[0].attributes["perfsdk.batch"] == 2
        assert "perfsdk.mbu" in steps[0].attributes


def test_no_tracer_provider_configured_builds_no_spans() -> None:
    pytest.importorskip("opentelemetry")
    from perfsdk.sinks.otel import make_otel_sink

    sink = make_otel_sink(None)
    assert sink is not None
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ == "ProxyTracerProvider":
        assert sink.tracer() is None  # nothing configured: nothing built


def test_user_exceptions_propagate_and_are_recorded_as_errors() -> None:
    pytest.importorskip("opentelemetry.sdk")
    with monitor_harness(model=MODEL, hardware=HW, step_span_rate=1.0) as h:
        mon = h.monitor
        with pytest.raises(KeyError, match="boom"), mon.decode(batch=1):
            raise KeyError("boom")
        req = mon.request(prompt_tokens=3)

        def handler() -> None:
            with req:
                req.tokens(1)
                raise ValueError("bad prompt")

        with pytest.raises(ValueError, match="bad prompt"):
            handler()
        assert req.finish_reason == "error"
        assert req.error == "ValueError"
        h.flush()
        assert mon.stats()["decode"]["errors"] == 1
        assert h.count(STEP, phase="decode") == 0  # a failed step is not a step time
        spans = h.spans()
        failed = [s for s in spans if s.name == "decode step"]
        assert failed[0].status.status_code.name == "ERROR"
        root = next(s for s in spans if s.name.startswith("text_completion"))
        assert root.attributes["error.type"] == "ValueError"
        assert root.status.status_code.name == "ERROR"


def test_internal_failures_never_reach_the_server(caplog: pytest.LogCaptureFixture) -> None:
    with monitor_harness(model=MODEL, hardware=HW) as h:
        mon = h.monitor

        def broken_nvtx(*_: Any) -> None:
            raise RuntimeError("nvtx exploded")

        with h.probe.hooks(nvtx_push=broken_nvtx), caplog.at_level(logging.ERROR, logger="perfsdk"):
            for _ in range(3):
                with mon.decode(batch=1):
                    ran = True
        assert ran
        assert h.value("perfsdk_internal_errors_total") == 3
        assert (
            sum("nvtx exploded" in r.getMessage() or "internal error" in r.getMessage() for r in caplog.records) == 1
        )  # logged once per site

        # a sink that raises on the collector thread: counted, the collector keeps going
        prom = next(s for s in h.probe.sinks if isinstance(s, PrometheusSink))

        real_record = prom.record

        def exploding(batch: Any) -> None:
            if batch.steps is not None:
                raise OSError("disk full")
            real_record(batch)  # the batch that reports the failure

        prom.record = exploding  # type: ignore[method-assign]
        with mon.prefill(tokens=8):
            pass
        h.flush()
        del prom.record
        with mon.prefill(tokens=8):
            pass
        assert h.count(STEP, phase="prefill") == 1
        assert h.value("perfsdk_internal_errors_total") == 4


def test_overflow_drops_and_counts_never_blocks() -> None:
    with monitor_harness(queue_size=10) as h:
        mon = h.monitor
        with h.probe.paused_core() as core:  # a step core that has fallen far behind
            for _ in range(25):
                with mon.decode(batch=1):
                    pass
            assert mon.stats()["dropped_records"] == 15
            assert core.waiting == 10
        # it catches up; the drop count is exported
        assert h.value("perfsdk_dropped_records_total") == 15
        assert h.count(STEP, phase="decode") == 10


def test_decorator_reads_the_call_arguments() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        mon = h.monitor

        @mon.decode(batch=lambda ids, ctx: len(ids), context_tokens=lambda ids, ctx: sum(ctx))
        def decode_step(ids: list[int], ctx: list[int]) -> str:
            clock.advance(0.004)
            return "ok"

        @mon.prefill(tokens=lambda prompt, **_: len(prompt), batch=1)
        async def prefill(prompt: str, *, temperature: float = 1.0) -> int:
            clock.advance(0.02)
            return len(prompt)

        assert decode_step([1, 2, 3], [100, 200, 300]) == "ok"
        assert decode_step.__name__ == "decode_step"
        assert asyncio.run(prefill("hello world", temperature=0.0)) == 11
        assert h.value("perfsdk_step_tokens_total", phase="decode") == 3
        assert h.value("perfsdk_step_bytes_total", phase="decode") == pytest.approx(
            budget.decode_step_bytes(MODEL, 600, 3)
        )
        assert h.value("perfsdk_step_tokens_total", phase="prefill") == 11
        assert h.sum(STEP, phase="prefill") == pytest.approx(0.02)


def test_bare_decorators_time_the_function_and_never_swallow_it() -> None:
    """``@mon.decode`` without parentheses: the body runs, its value comes back, each call is a timed step
    with no sizes (no bytes, no MBU/MFU); strict mode has nothing to raise. Functions, coroutines,
    generators, methods and static methods alike."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        mon = h.monitor
        ran: list[str] = []

        @mon.decode
        def decode_step(x: int) -> int:
            ran.append("decode")
            clock.advance(0.004)
            return x * 2

        @mon.prefill
        async def prefill(prompt: str) -> int:
            ran.append("prefill")
            clock.advance(0.02)
            return len(prompt)

        @mon.mixed
        def mixed() -> str:
            clock.advance(0.01)
            return "m"

        @mon.decode
        def tokens(n: int) -> Any:
            for i in range(n):
                clock.advance(0.001)
                yield i

        class Engine:
            @mon.decode
            def method(self, x: int) -> int:
                clock.advance(0.003)
                return x + 1

            @mon.decode
            @staticmethod
            def static(x: int) -> int:
                clock.advance(0.003)
                return x - 1

        assert decode_step(21) == 42
        assert decode_step.__name__ == "decode_step"
        assert asyncio.run(prefill("hello")) == 5
        assert mixed() == "m"
        assert list(tokens(3)) == [0, 1, 2]
        assert Engine().method(1) == 2
        assert Engine.static(1) == 0
        assert ran == ["decode", "prefill"]
        assert h.count(STEP, phase="decode") == 4  # decode_step, the generator (one step), method, static
        assert h.sum(STEP, phase="decode") == pytest.approx(0.004 + 0.003 + 0.003 + 0.003)
        assert h.count(STEP, phase="prefill") == 1
        assert h.count(STEP, phase="mixed") == 1
        assert h.count(MBU, phase="decode") == 0  # no sizes, so no MBU ...
        assert h.count(MFU, phase="prefill") == 0  # ... and no MFU
        assert h.value("perfsdk_step_bytes_total", phase="decode") in (None, 0)
        assert mon.stats()["internal_errors"] == 0


def test_a_size_callable_is_not_mistaken_for_the_decorated_function() -> None:
    with monitor_harness(model=MODEL, hardware=HW) as h:
        mon = h.monitor

        @mon.decode(lambda ids: len(ids))  # noqa: PLW0108 (a lambda given positionally is a size)
        def step(ids: list[int]) -> int:
            return len(ids)

        @mon.decode(batch=len)  # so is a builtin
        def step2(ids: list[int]) -> int:
            return 0

        assert step([1, 2, 3]) == 3
        assert step2([1, 2]) == 0
        assert h.value("perfsdk_step_tokens_total", phase="decode") == 5


def test_bare_decorator_on_a_disabled_monitor_returns_the_function() -> None:
    mon = perfsdk.Monitor(enabled=False)

    @mon.decode
    def f(x: int) -> int:
        return x + 1

    assert f(1) == 2


def test_callable_sizes_in_a_with_block_are_a_clear_error() -> None:
    with (
        monitor_harness() as h,
        pytest.raises(ConfigError, match="decorator form"),
        h.monitor.decode(batch=lambda x: 1),
    ):
        pass


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"batch": -1}, "batch"), ({"batch": 1.5}, "batch"), ({"context_tokens": "many"}, "context_tokens")],
)
def test_bad_phase_sizes_fail_at_construction(kwargs: dict[str, Any], field: str) -> None:
    with monitor_harness() as h, pytest.raises(ConfigError, match=field):
        h.monitor.decode(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"queue_size": 0}, "queue_size"),
        ({"timing": "gpu"}, "timing"),
        ({"step_span_rate": 2.0}, "step_span_rate"),
        ({"model": 42}, "model"),
        ({"hardware": "h100-sxn"}, "Did you mean"),
    ],
)
def test_bad_monitor_config_fails_at_construction(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        perfsdk.Monitor(registry=CollectorRegistry(), **kwargs)


def test_numpy_style_integers_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    with monitor_harness(model=MODEL, hardware=HW) as h:
        with h.monitor.decode(batch=np.int64(4), context_tokens=np.int32(100)):
            pass
        assert h.value("perfsdk_step_tokens_total", phase="decode") == 4


def test_phase_object_can_be_reused_and_nested() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        p = h.monitor.decode(batch=1)
        with p:
            clock.advance(0.001)
            with p:
                clock.advance(0.002)
            clock.advance(0.003)
        with p:
            clock.advance(0.004)
        assert h.count(STEP, phase="decode") == 3
        assert h.sum(STEP, phase="decode") == pytest.approx(0.002 + 0.006 + 0.004)


def test_graph_capture_makes_wrappers_noops() -> None:
    with monitor_harness() as h:
        mon = h.monitor
        # what the capture checks report inside CUDA-graph capture (the Python path's and the C path's)
        with h.probe.hooks(capturing=lambda: True):
            with mon.decode(batch=1):
                pass
            assert mon.flush(5)
            assert h.count(STEP, phase="decode") == 0
        with h.probe.hooks(capturing=lambda: False), mon.decode(batch=1):
            pass
        assert h.count(STEP, phase="decode") == 1


@pytest.mark.parametrize("form", ["with", "decorator"])
def test_torch_compile_traces_through_the_wrappers_as_noops(form: str) -> None:
    """torch.compile(fullgraph=True) of a step wrapped by perfsdk: no graph break, and nothing recorded
    for the traced call; the same function run eagerly is a step."""
    torch = pytest.importorskip("torch")
    with monitor_harness() as h:
        mon = h.monitor
        if form == "with":

            def step(x: Any) -> Any:
                with mon.decode(batch=2, context_tokens=8):
                    return x * 2 + 1
        else:

            @mon.decode(batch=lambda x: x.shape[0])
            def step(x: Any) -> Any:
                return x * 2 + 1

        torch._dynamo.reset()
        compiled = torch.compile(step, backend="eager", fullgraph=True)  # a graph break would raise
        for _ in range(3):
            assert torch.equal(compiled(torch.ones(4)), torch.full((4,), 3.0))
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 0
        step(torch.ones(4))
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 1
        assert mon.stats()["internal_errors"] == 0


def test_capture_check_is_real_torch() -> None:
    pytest.importorskip("torch")
    from perfsdk.timing import capture_check

    check = capture_check(cuda=False)
    assert check() is False


def test_registry_survives_two_monitors() -> None:
    reg = CollectorRegistry()
    a = perfsdk.Monitor(registry=reg, model_name="a", otel=False, nvtx=False)
    b = perfsdk.Monitor(registry=reg, model_name="b", otel=False, nvtx=False)
    try:
        a.request(prompt_tokens=1).tokens(1)
        b.request(prompt_tokens=1).tokens(1)
        b.request(prompt_tokens=1).tokens(1)
        a.flush()
        b.flush()
        assert reg.get_sample_value(f"{TTFT}_count", {"model": "a"}) == 1
        assert reg.get_sample_value(f"{TTFT}_count", {"model": "b"}) == 2
    finally:
        a.close()
        b.close()
    # and on the global registry, twice in one process
    for _ in range(2):
        m = perfsdk.Monitor(otel=False, nvtx=False, model_name="global-twice")
        m.close()


def test_exported_metrics_are_exactly_the_documented_set() -> None:
    with monitor_harness(model=MODEL, hardware=HW) as h:
        h.flush()
        names = {m.name for m in h.registry.collect()}
        assert names == {
            "gen_ai_server_time_to_first_token_seconds",
            "gen_ai_server_time_per_output_token_seconds",
            "gen_ai_server_request_duration_seconds",
            "perfsdk_inter_token_latency_seconds",
            "perfsdk_request_queue_seconds",
            "perfsdk_step_seconds",
            "perfsdk_step_bandwidth_utilization",
            "perfsdk_step_flops_utilization",
            "perfsdk_step_bytes",
            "perfsdk_step_flops",
            "perfsdk_step_tokens",
            "perfsdk_hardware_peak_bandwidth_bytes",
            "perfsdk_hardware_peak_flops",
            "perfsdk_dropped_records",
            "perfsdk_dropped_spans",
            "perfsdk_internal_errors",
            "perfsdk_profile_gpu_busy_fraction",
            "perfsdk_profile_communication_fraction",
            "perfsdk_suspect_utilization",
            "perfsdk_requests",
        }
        text = generate_latest(h.registry).decode()
        assert "vllm:" not in text
        assert "sglang:" not in text


@pytest.mark.skipif(not os.path.exists("/usr/bin/promtool"), reason="promtool not installed (Debian prometheus)")
def test_promtool_accepts_the_exposition(tmp_path: Any) -> None:
    with monitor_harness(model=MODEL, hardware=HW) as h:
        with h.monitor.request(prompt_tokens=4) as req:
            req.scheduled()
            req.tokens(1)
            req.tokens(1)
        with h.monitor.decode(batch=1, context_tokens=4):
            pass
        h.flush()
        text = generate_latest(h.registry)
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()


def test_the_exported_metrics_are_exactly_the_documented_table() -> None:
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_:]+)` \|", doc, flags=re.MULTILINE))
    with monitor_harness(model=MODEL, hardware=HW) as h:
        h.monitor.window_deps()[1](0.5, 0.1)  # the profile gauges appear at the first capture
        exported = {m.name + ("_total" if m.type == "counter" else "") for m in h.registry.collect()}
    assert exported == documented


def test_an_impossible_utilisation_is_counted_logged_once_with_its_peak_and_marked_suspect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A peak far too low (a bad calibration, the wrong SKU) makes MBU/MFU exceed 1: never silently."""
    low = HardwareSpec(name="too-low", memory_bandwidth=1e9, flops={"bf16": 1e9}, source="a bad calibration")
    clock = FakeClock()
    with (
        caplog.at_level(logging.WARNING, logger="perfsdk"),
        monitor_harness(model=MODEL, hardware=low, clock=clock) as h,
    ):
        mon = h.monitor
        for _ in range(3):
            with mon.decode(batch=1, context_tokens=100):
                clock.advance(0.005)  # 16 GB in 5 ms at "1 GB/s": MBU 3,000
            with mon.prefill(tokens=100):
                clock.advance(0.005)
            h.flush()
        reason = "perfsdk_suspect_utilization_total"
        assert h.value(reason, phase="decode", reason="mbu_above_peak") == 3
        assert h.value(reason, phase="prefill", reason="mfu_above_peak") == 3
        assert h.value(reason, phase="decode", reason="mfu_above_peak") == 0
        stats = mon.stats()
        assert "3 of the last 3 steps had MBU above 100%" in stats["decode"]["mbu_suspect"]
        assert "mfu_suspect" in stats["prefill"] and "mbu_suspect" not in stats["prefill"]
    logged = [r.getMessage() for r in caplog.records if "impossible" in r.getMessage()]
    assert len(logged) == 2  # once per phase and quantity, however many steps
    mbu_log = next(m for m in logged if "MBU" in m)
    assert "0.001 TB/s" in mbu_log and "a bad calibration" in mbu_log and "too-low" in mbu_log


def test_utilisation_at_the_floor_is_one_and_never_above() -> None:
    """MBU and MFU are bounded by 1 for any step no faster than its floor, in the core as in budget."""
    from perfsdk import budget

    hw = HardwareSpec(name="t", memory_bandwidth=3.35e12, flops={"bf16": 989e12})
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=hw, clock=clock) as h:
        mon = h.monitor
        for batch, ctx in ((1, 0), (8, 8 * 4096), (64, 64 * 512)):
            floor = budget.decode_floor_s(MODEL, hw.memory_bandwidth, ctx, batch)
            for slack in (1.0, 1.5, 10.0):
                with mon.decode(batch=batch, context_tokens=ctx):
                    clock.advance(floor * slack * 1.000001)  # the fake clock keeps whole nanoseconds
        for n in (16, 2048):
            floor = budget.prefill_floor_s(MODEL, hw.peak_flops("bf16"), [n])
            with mon.prefill(tokens=n):
                clock.advance(floor * 1.000001)
        h.flush()
        stats = mon.stats()
        assert min(stats["decode"]["mbu_p50"], stats["prefill"]["mfu_p50"]) > 0
        assert h.count(MBU, phase="decode") == 9 and h.count(MFU, phase="prefill") == 2
        assert h.value(f"{MBU}_bucket", phase="decode", le="1.0") == 9  # none above 1
        assert h.value(f"{MFU}_bucket", phase="prefill", le="1.0") == 2
        assert "mbu_suspect" not in stats["decode"] and "mfu_suspect" not in stats["prefill"]


def test_no_arguments_works_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        mon = perfsdk.Monitor(registry=CollectorRegistry(), otel=False)
    try:
        warnings = [r for r in caplog.records if "MBU/MFU are off" in r.getMessage()]
        assert len(warnings) == 1
        assert "model=" in warnings[0].getMessage()
        assert "hardware=" in warnings[0].getMessage()
        assert mon.timing == "host"
        with mon.request(prompt_tokens=1) as r:
            r.tokens(1)
        with mon.decode(batch=1):
            pass
        assert mon.flush()
        assert mon.stats()["decode"]["mbu_mean"] is None
    finally:
        mon.close()


def test_environment_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_MODEL", "mistral-7b")
    monkeypatch.setenv("PERFSDK_HARDWARE", "h100-sxm")
    monkeypatch.setenv("PERFSDK_SERVICE", "from-env")
    mon = perfsdk.Monitor(registry=CollectorRegistry(), otel=False, nvtx=False)  # model and hardware: not given
    try:
        assert mon.model is not None
        assert mon.model.name == "mistral-7b"
        assert mon.hardware is not None
        assert mon.hardware.name == "h100-sxm"
        assert mon.service == "from-env"
    finally:
        mon.close()
    monkeypatch.setenv("PERFSDK_ENABLED", "0")
    off = perfsdk.Monitor(registry=CollectorRegistry())
    with off.request(prompt_tokens=3) as r, off.decode(batch=2):
        r.tokens(1)
    assert probe(off).collector_thread is None
    assert off.flush()
    off.close()


def test_rank_label_when_one_of_several(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    with monitor_harness() as h:
        h.monitor.request(prompt_tokens=1).tokens(1)
        h.flush()
        assert h.registry.get_sample_value(f"{TTFT}_count", {"model": "unknown", "rank": "2"}) == 1


def test_serve_metrics_over_real_http() -> None:
    with monitor_harness(model=MODEL, hardware=HW) as h:
        srv = h.monitor.serve_metrics(port=0)
        with h.monitor.request(prompt_tokens=2) as req:
            req.tokens(1)
        h.flush()
        body = urllib.request.urlopen(f"{srv.url}/metrics", timeout=10).read().decode()
        assert 'gen_ai_server_time_to_first_token_seconds_count{model="llama-3-8b"} 1.0' in body
        assert urllib.request.urlopen(f"{srv.url}/health", timeout=10).status == 200
        assert h.monitor.serve_metrics(port=0) is srv  # idempotent
    with monitor_harness() as h, pytest.raises(ConfigError, match="needs token"):
        h.monitor.serve_metrics(port=0, addr="0.0.0.0")


def test_prometheus_multiproc_dir(tmp_path: Any) -> None:
    """Two worker processes write; one registry built from the directory sees both."""
    mp = tmp_path / "mp"
    mp.mkdir()
    worker = textwrap.dedent("""
        import perfsdk
        mon = perfsdk.Monitor(otel=False, nvtx=False, model_name="mp", hardware="h100-sxm")
        for _ in range(3):
            with mon.request(prompt_tokens=1) as r:
                r.tokens(1)
        mon.close()
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", worker], env=env, check=True, timeout=120)
    code = textwrap.dedent("""
        from perfsdk.sinks.prometheus import multiprocess_registry
        reg = multiprocess_registry()
        print(reg.get_sample_value("gen_ai_server_time_to_first_token_seconds_count", {"model": "mp"}))
        print(reg.get_sample_value("perfsdk_hardware_peak_bandwidth_bytes", {"device": "h100-sxm"}))
    """)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True, timeout=120
    ).stdout.split()
    assert float(out[0]) == 6.0
    assert math.isclose(float(out[1]), 3.35e12)


def test_import_is_cheap_and_side_effect_free() -> None:
    code = textwrap.dedent("""
        import sys, threading
        import perfsdk
        from prometheus_client import REGISTRY
        assert "torch" not in sys.modules, "torch imported"
        assert threading.active_count() == 1, "a thread started"
        assert not [m for m in REGISTRY.collect() if m.name.startswith(("perfsdk", "gen_ai"))], "metrics registered"
        assert perfsdk.ModelSpec.named("llama-3-8b").kv_bytes_per_token == 131072
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.stdout.strip() == "ok", out.stderr


def test_untimed_steps_are_counted_but_not_timed() -> None:
    """Monitor(timing_every=N) on a GPU pushes unsampled steps with events=False: counters only."""
    with monitor_harness(model=MODEL, hardware=HW) as h:
        mon = h.monitor
        h.probe.push_step(StepRecord(DECODE, UNTIMED, 0, 1_000_000, None, None, 2, -1, 100, 0, 0, 0, None))
        h.probe.push_step(StepRecord(DECODE, HOST, 0, 1_000_000, None, None, 2, -1, 100, 0, 0, 0, None))
        assert h.count(STEP, phase="decode") == 1
        assert h.count(MBU, phase="decode") == 1
        assert h.value("perfsdk_step_tokens_total", phase="decode") == 4
        # bytes only for the timed step, so bytes / step seconds (the PromQL MBU) stays exact
        assert h.value("perfsdk_step_bytes_total", phase="decode") == pytest.approx(
            budget.decode_step_bytes(MODEL, 100, 2)
        )
        assert mon.stats()["decode"]["steps"] == 2


def test_timing_every_is_validated() -> None:
    with pytest.raises(ConfigError, match="timing_every"):
        perfsdk.Monitor(registry=CollectorRegistry(), timing_every=0)


def test_cuda_events_choice_is_validated() -> None:
    with pytest.raises(ConfigError, match="cuda_events"):
        perfsdk.Monitor(registry=CollectorRegistry(), cuda_events="cupy")


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"chain_gap_us": -1}, "chain_gap_us"),
        ({"chain_gap_us": "10"}, "chain_gap_us"),
        ({"event_pool_size": 0}, "event_pool_size"),
    ],
)
def test_event_settings_are_validated(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        perfsdk.Monitor(registry=CollectorRegistry(), **kw)


def test_request_edge_cases() -> None:
    clock = FakeClock()
    with monitor_harness(clock=clock) as h:
        req = h.monitor.request(prompt_tokens=3)
        req.tokens(0)  # nothing emitted: no TTFT
        assert req.first_token_ns is None
        clock.advance(0.01)
        req.tokens(1)
        req.finish("abort")
        req.tokens(1)  # late token after finish: ignored
        assert req.output_tokens == 1
        assert h.count(E2E) == 1
        # two threads racing to finish: one wins
        racer = h.monitor.request(prompt_tokens=1)
        import threading

        threads = [threading.Thread(target=racer.finish, args=(r,)) for r in ("stop", "abort") * 8]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert h.count(E2E) == 2


def test_disabled_monitor_requests_read_as_empty() -> None:
    off = perfsdk.Monitor(registry=CollectorRegistry(), enabled=False)
    req = off.request(prompt_tokens=5)
    assert req.finished is False
    assert req.output_tokens == 0
    assert req.request_id is None
    off.close()


def test_decorator_with_a_bad_size_value_still_runs_the_call() -> None:
    with monitor_harness() as h:

        @h.monitor.decode(batch=lambda x: x / 2)  # a float: not a batch size
        def step(x: int) -> int:
            return x + 1

        assert step(4) == 5
        assert h.value("perfsdk_internal_errors_total") == 1


def test_numpy_sequence_lengths_in_mixed_and_prefill_steps() -> None:
    np = pytest.importorskip("numpy")
    with monitor_harness(model=MODEL, hardware=HW) as h:
        with h.monitor.mixed(prefill_seq_lens=np.array([128, 64]), decode_batch=2, context_tokens=500):
            pass
        with h.monitor.prefill(seq_lens=[np.int64(32), np.int64(16)], batch=2):
            pass
        assert h.value("perfsdk_step_tokens_total", phase="mixed") == 194
        assert h.value("perfsdk_step_tokens_total", phase="prefill") == 48
        assert h.value("perfsdk_internal_errors_total") == 0


def test_values_measured_elsewhere_go_through_the_same_metrics_and_spans() -> None:
    """record_step / record_latencies / record_finished: what an engine's own timers measured."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        mon = h.monitor
        mon.record_step("decode", 0.02, batch=8, context_tokens=8000)
        mon.record_step("prefill", 0.05, tokens=1000, batch=2, seq_lens=[600, 400])
        mon.record_step("mixed", 0.03, batch=4, context_tokens=100, seq_lens=[256])
        mon.record_latencies(ttft_s=[0.1, 0.2], itl_s=[0.01, 0.02, 0.03])
        mon.record_finished(
            e2e_s=1.5,
            queue_s=0.25,
            prefill_s=0.15,
            prompt_tokens=10,
            output_tokens=11,
            finish_reason="length",
            request_id="r1",
        )
        mon.record_finished(e2e_s=0.5, tpot_s=0.04, output_tokens=5)
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 1 and h.sum(STEP, phase="decode") == pytest.approx(0.02)
        assert h.count(STEP, phase="prefill") == 1 and h.count(STEP, phase="mixed") == 1
        assert h.sum(MBU, phase="decode") == pytest.approx(budget.decode_step_bytes(MODEL, 8000, 8) / (0.02 * 2e12))
        assert h.sum(MFU, phase="prefill") == pytest.approx(budget.prefill_flops(MODEL, [600, 400]) / (0.05 * 500e12))
        assert h.count(TTFT) == 2 and h.sum(TTFT) == pytest.approx(0.3)
        assert h.count(ITL) == 3 and h.sum(ITL) == pytest.approx(0.06)
        assert h.count(E2E) == 2 and h.sum(E2E) == pytest.approx(2.0)
        assert h.count(QUEUE) == 1 and h.sum(QUEUE) == pytest.approx(0.25)
        # first request: ttft = queue + prefill = 0.4, tpot = (1.5 - 0.4) / 10; second: given
        assert h.count(TPOT) == 2 and h.sum(TPOT) == pytest.approx(0.11 + 0.04)
        spans = [s for s in h.spans() if s.attributes.get("gen_ai.response.finish_reasons") == ("length",)]
        assert len(spans) == 1
        span = spans[0]
        assert (span.end_time - span.start_time) / 1e9 == pytest.approx(1.5)
        assert span.attributes["gen_ai.usage.output_tokens"] == 11
        assert span.attributes["gen_ai.server.time_to_first_token"] == pytest.approx(0.4)
        with pytest.raises(ConfigError, match="phase"):
            mon.record_step("verify", 0.01)
        with pytest.raises(ConfigError, match="seconds"):
            mon.record_step("decode", float("nan"))
        with pytest.raises(ConfigError, match="batch"):
            mon.record_step("decode", 0.01, batch=-1)


def test_values_measured_elsewhere_skip_what_is_not_a_time() -> None:
    class Array:  # an array whose truth value is ambiguous, as numpy's is
        def __init__(self, *v: float) -> None:
            self.v = v

        def __len__(self) -> int:
            return len(self.v)

        def __iter__(self) -> Any:
            return iter(self.v)

        def __bool__(self) -> bool:
            raise ValueError("ambiguous")

    with monitor_harness() as h:
        mon = h.monitor
        mon.record_latencies(ttft_s=Array(0.1, float("nan")), itl_s=[0.01, None, -1.0, float("inf"), 0.02])  # type: ignore[list-item]
        mon.record_finished(e2e_s=1.0, queue_s=float("nan"), ttft_s=float("inf"), output_tokens=3)
        with pytest.raises(ConfigError, match="e2e_s"):
            mon.record_finished(e2e_s=float("inf"))
        with pytest.raises(ConfigError, match="seconds"):
            mon.record_step("decode", float("inf"))
        assert mon.flush(5)
        assert h.count(TTFT) == 1 and h.count(ITL) == 2 and h.sum(ITL) == pytest.approx(0.03)
        assert h.count(E2E) == 1 and h.count(QUEUE) == 0 and h.count(TPOT) == 0
        assert mon.stats()["internal_errors"] == 1  # None, NaN, inf are missing values; -1.0 a clock gone back
        assert len([s for s in h.spans() if s.parent is None]) == 1


def test_prefill_mfu_counts_attention_over_the_cached_prefix() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        with h.monitor.prefill(tokens=100, cached_tokens=1000):
            clock.advance(0.01)
        assert h.monitor.flush(5)
        assert h.sum(MFU, phase="prefill") == pytest.approx(
            budget.prefill_flops(MODEL, [100], cached_tokens=1000) / (0.01 * 500e12)
        )
        assert budget.prefill_flops(MODEL, [100], cached_tokens=1000) > budget.prefill_flops(MODEL, [100])
