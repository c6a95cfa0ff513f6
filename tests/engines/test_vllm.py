"""perfsdk's vLLM stat logger against the real ``vllm`` package (0.33, its own venv: scripts/test_engine.sh vllm).

No GPU here, so no model runs; everything else is vLLM's own code: its plugin loader finds perfsdk
through the installed entry point, a real ``VllmConfig`` is built from a local Llama config, vLLM's
``StatLoggerManager`` builds and drives the logger, and the stats it passes are vLLM's own classes —
for the request lifecycle, filled by vLLM's own ``IterationStats.update_from_output`` /
``update_from_finished_request`` from engine-core outputs and events, as its output processor does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM suite runs in its own venv: bash scripts/test_engine.sh vllm")

from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from vllm.config import DeviceConfig, ModelConfig, ObservabilityConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason  # noqa: E402
from vllm.v1.metrics.loggers import StatLoggerManager, load_stat_logger_plugin_factories  # noqa: E402
from vllm.v1.metrics.stats import (  # noqa: E402
    FinishedRequestStats,
    IterationStats,
    LoRARequestStates,
    RequestStateStats,
    SchedulerIterationDetails,
    SchedulerStats,
)

from perfsdk import budget, hardware  # noqa: E402
from perfsdk.engines import vllm as perfsdk_vllm  # noqa: E402
from perfsdk.model import ModelSpec  # noqa: E402

LLAMA = {  # a small Llama: vLLM reads it like any checkpoint's config.json
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 512, "intermediate_size": 1376,
    "num_attention_heads": 8, "num_key_value_heads": 4, "num_hidden_layers": 4, "vocab_size": 32000,
    "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "rms_norm_eps": 1e-5, "head_dim": 64,
}
HW = hardware.resolve("h100-sxm")
SPAN_EXPORTER = InMemorySpanExporter()


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A VllmConfig for a local Llama config and vLLM's StatLoggerManager with its plugins loaded."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PERFSDK_HARDWARE", "h100-sxm")  # no GPU to detect here
    mp.setenv("PERFSDK_METRICS_PORT", "")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SPAN_EXPORTER))
    trace.set_tracer_provider(provider)
    model_dir = tmp_path_factory.mktemp("llama")
    (model_dir / "config.json").write_text(json.dumps(LLAMA))
    cfg = VllmConfig(  # as `vllm serve ... --enable-logging-iteration-details --no-async-scheduling`
        model_config=ModelConfig(model=str(model_dir), served_model_name="tiny-llama", skip_tokenizer_init=True),
        device_config=DeviceConfig(device="cpu"),
        observability_config=ObservabilityConfig(enable_logging_iteration_details=True),
        scheduler_config=SchedulerConfig(async_scheduling=False, max_model_len=4096, is_encoder_decoder=False),
    )
    cfg.cache_config.num_gpu_blocks = 1000  # what the engine core reports after profiling
    manager = StatLoggerManager(cfg, engine_idxs=[0], custom_stat_loggers=load_stat_logger_plugin_factories(),
                                enable_default_loggers=False)
    mon = perfsdk_vllm.current_monitor()
    assert mon is not None
    yield cfg, manager, mon
    mp.undo()


def test_vllm_finds_perfsdk_through_its_plugin_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    assert perfsdk_vllm.PerfsdkStatLogger in load_stat_logger_plugin_factories()
    monkeypatch.setenv("VLLM_PLUGINS", "someone-else")  # vLLM's own filter turns it off
    assert perfsdk_vllm.PerfsdkStatLogger not in load_stat_logger_plugin_factories()


def test_the_monitor_knows_vllms_model_and_the_hardware(stack: Any) -> None:
    _, _, mon = stack
    assert mon.model_name == "tiny-llama"
    assert mon.model == dataclasses.replace(ModelSpec.from_hf_config(LLAMA, dtype="bfloat16"), name="tiny-llama")
    assert mon.hardware == HW


def test_steps_vllm_reports_become_perfsdk_steps_with_mbu_and_mfu(stack: Any) -> None:
    cfg, manager, mon = stack
    spec = mon.model
    block = cfg.cache_config.block_size
    m = {"model": "tiny-llama"}
    before = {p: value("perfsdk_step_seconds_count", phase=p, **m) for p in ("prefill", "decode", "mixed")}
    mbu_before = value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m)
    mfu_before = value("perfsdk_step_flops_utilization_sum", phase="prefill", **m)

    def step(i: int, ctx_reqs: int, ctx_tokens: int, gen_reqs: int, ms: float, usage: float) -> None:
        details = SchedulerIterationDetails(iteration_index=i, num_ctx_requests=ctx_reqs, num_ctx_tokens=ctx_tokens,
                                            num_generation_requests=gen_reqs, num_generation_tokens=gen_reqs,
                                            elapsed_ms=ms)
        manager.record(SchedulerStats(kv_cache_usage=usage, iteration_details=details), None, engine_idx=0)

    step(0, 2, 1000, 0, 50.0, 0.1)       # prefill of two prompts
    step(1, 0, 0, 8, 20.0, 0.5)          # decode, 8 sequences, half the KV blocks in use
    step(2, 1, 256, 7, 30.0, 0.5)        # chunked prefill beside decode
    step(3, 0, 0, 0, 0.0, 0.0)           # an empty step: nothing
    manager.record(SchedulerStats(iteration_details=SchedulerIterationDetails(
        iteration_index=4, num_ctx_requests=0, num_ctx_tokens=0, num_generation_requests=0,
        num_generation_tokens=0, elapsed_ms=0.0, is_dummy=True)), None, engine_idx=0)  # DP padding
    assert mon.flush(10)
    assert {p: value("perfsdk_step_seconds_count", phase=p, **m) - before[p] for p in before} == {
        "prefill": 1, "decode": 1, "mixed": 1}
    ctx = 0.5 * 1000 * block  # kv_cache_usage x KV blocks x block size
    assert value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m) - mbu_before == pytest.approx(
        budget.decode_step_bytes(spec, ctx) / (0.020 * HW.memory_bandwidth))
    assert value("perfsdk_step_flops_utilization_sum", phase="prefill", **m) - mfu_before == pytest.approx(
        budget.prefill_flops(spec, [500, 500]) / (0.050 * HW.flops["bf16"]))
    assert mon.stats()["internal_errors"] == 0


def test_a_request_as_vllms_own_stats_code_sees_it(stack: Any) -> None:
    """One request over three engine steps, through vLLM's IterationStats update methods."""
    _, manager, mon = stack
    m = {"model": "tiny-llama"}
    names = ("gen_ai_server_time_to_first_token_seconds", "perfsdk_inter_token_latency_seconds",
             "gen_ai_server_time_per_output_token_seconds", "perfsdk_request_queue_seconds",
             "gen_ai_server_request_duration_seconds")
    before = {n: (value(n + "_count", **m), value(n + "_sum", **m)) for n in names}
    SPAN_EXPORTER.clear()

    arrival = 1_000.0  # frontend wall clock
    req = RequestStateStats(arrival_time=arrival)
    lora = LoRARequestStates(log_stats=False)
    events = [EngineCoreEvent(EngineCoreEventType.QUEUED, 50.00), EngineCoreEvent(EngineCoreEventType.SCHEDULED, 50.10)]
    outputs = [(50.25, True, events), (50.27, False, None), (50.30, False, None)]  # engine-core monotonic clock
    for i, (ts, prefilling, evs) in enumerate(outputs):
        it = IterationStats()
        it.iteration_timestamp = arrival + 0.3 + 0.02 * i
        it.update_from_output(EngineCoreOutput(request_id="r1", new_token_ids=[7], events=evs), ts, prefilling,
                              req, lora, None)
        if i == len(outputs) - 1:
            it.update_from_finished_request(FinishReason.LENGTH, "r1", num_prompt_tokens=12, max_tokens_param=3,
                                            req_stats=req)
        manager.record(None, it, engine_idx=0)
    assert mon.flush(10)
    got = {n: (value(n + "_count", **m) - before[n][0], value(n + "_sum", **m) - before[n][1]) for n in names}
    assert got["gen_ai_server_time_to_first_token_seconds"] == (1, pytest.approx(0.3))
    assert got["perfsdk_inter_token_latency_seconds"] == (2, pytest.approx(0.05))
    assert got["perfsdk_request_queue_seconds"] == (1, pytest.approx(0.10))
    assert got["gen_ai_server_time_per_output_token_seconds"] == (1, pytest.approx(0.025))  # decode 0.05 / 2
    assert got["gen_ai_server_request_duration_seconds"] == (1, pytest.approx(0.34))
    spans = [s for s in SPAN_EXPORTER.get_finished_spans() if s.attributes.get("gen_ai.request.model") == "tiny-llama"
             and s.parent is None]
    assert len(spans) == 1
    span = spans[0]
    assert span.attributes["gen_ai.usage.input_tokens"] == 12 and span.attributes["gen_ai.usage.output_tokens"] == 3
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.34)


def test_finished_request_reasons_and_errors(stack: Any) -> None:
    _, manager, mon = stack
    SPAN_EXPORTER.clear()
    it = IterationStats()
    it.finished_requests.append(FinishedRequestStats(FinishReason.ERROR, request_id="bad", e2e_latency=0.2,
                                                     num_generation_tokens=1))
    it.finished_requests.append(FinishedRequestStats(FinishReason.ABORT, request_id="gone", e2e_latency=0.1))
    manager.record(None, it, engine_idx=0)
    assert mon.flush(10)
    roots = [s for s in SPAN_EXPORTER.get_finished_spans() if s.parent is None]
    assert sorted(tuple(s.attributes["gen_ai.response.finish_reasons"]) for s in roots) == [("abort",), ("error",)]
    errored = next(s for s in roots if s.attributes["gen_ai.response.finish_reasons"] == ("error",))
    assert errored.status.status_code.name == "ERROR"


def test_nothing_perfsdk_does_wrong_reaches_vllm(stack: Any, caplog: pytest.LogCaptureFixture) -> None:
    _, manager, mon = stack
    errors = mon.stats()["internal_errors"]
    broken = SchedulerIterationDetails(iteration_index=9, num_ctx_requests=0, num_ctx_tokens=0,
                                       num_generation_requests=2, num_generation_tokens=-2, elapsed_ms=5.0)
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        manager.record(SchedulerStats(iteration_details=broken), None, engine_idx=0)  # must not raise
    assert mon.stats()["internal_errors"] == errors + 1
    assert "perfsdk internal error in record_step" in caplog.text  # refused where it is recorded, logged once


def test_without_iteration_details_it_says_what_to_turn_on(stack: Any, caplog: pytest.LogCaptureFixture) -> None:
    cfg, _, _ = stack
    plain = VllmConfig(model_config=cfg.model_config, device_config=DeviceConfig(device="cpu"),
                       scheduler_config=cfg.scheduler_config)
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        StatLoggerManager(plain, engine_idxs=[0], custom_stat_loggers=[perfsdk_vllm.PerfsdkStatLogger],
                          enable_default_loggers=False).log_engine_initialized()
    assert "--enable-logging-iteration-details" in caplog.text


def test_with_a_batch_queue_no_step_times_are_taken(stack: Any, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's async scheduling (its default) times only the wait for an earlier batch: no steps from it."""
    cfg, _, mon = stack
    queued = VllmConfig(model_config=cfg.model_config, device_config=DeviceConfig(device="cpu"),
                        observability_config=ObservabilityConfig(enable_logging_iteration_details=True))
    assert queued.scheduler_config.async_scheduling and queued.max_concurrent_batches > 1  # vLLM's default
    manager = StatLoggerManager(queued, engine_idxs=[0], custom_stat_loggers=[perfsdk_vllm.PerfsdkStatLogger],
                                enable_default_loggers=False)
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        manager.log_engine_initialized()
    assert "--no-async-scheduling" in caplog.text
    before = mon.stats()["decode"]["steps"]
    details = SchedulerIterationDetails(iteration_index=0, num_ctx_requests=0, num_ctx_tokens=0,
                                        num_generation_requests=4, num_generation_tokens=4, elapsed_ms=0.5)
    manager.record(SchedulerStats(kv_cache_usage=0.2, iteration_details=details), None, engine_idx=0)
    assert mon.flush(10)
    assert mon.stats()["decode"]["steps"] == before


def test_the_engines_kv_cache_size_gives_the_decode_context(stack: Any) -> None:
    cfg, manager, mon = stack
    m = {"model": "tiny-llama"}
    cfg.cache_config.kv_cache_size_tokens = 20_000  # what the engine core reports, per engine
    try:
        before = value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m)
        details = SchedulerIterationDetails(iteration_index=0, num_ctx_requests=0, num_ctx_tokens=0,
                                            num_generation_requests=4, num_generation_tokens=4, elapsed_ms=10.0)
        manager.record(SchedulerStats(kv_cache_usage=0.25, iteration_details=details), None, engine_idx=0)
        assert mon.flush(10)
        assert value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m) - before == pytest.approx(
            budget.decode_step_bytes(mon.model, 5_000) / (0.010 * HW.memory_bandwidth))
    finally:
        cfg.cache_config.kv_cache_size_tokens = None


def test_one_odd_request_costs_only_itself(stack: Any) -> None:
    """Straight to perfsdk's logger: vLLM's own Prometheus logger would fail on this request first."""
    cfg, _, mon = stack
    logger = perfsdk_vllm.PerfsdkStatLogger(cfg, 0)
    m = {"model": "tiny-llama"}
    e2e_before = value("gen_ai_server_request_duration_seconds_count", **m)
    steps_before = mon.stats()["decode"]["steps"]
    errors = mon.stats()["internal_errors"]
    it = IterationStats()
    it.finished_requests.append(FinishedRequestStats(None, request_id="odd", e2e_latency=0.3))  # type: ignore[arg-type]
    it.finished_requests.append(FinishedRequestStats(FinishReason.STOP, request_id="fine", e2e_latency=0.2))
    details = SchedulerIterationDetails(iteration_index=0, num_ctx_requests=0, num_ctx_tokens=0,
                                        num_generation_requests=2, num_generation_tokens=2, elapsed_ms=5.0)
    logger.record(SchedulerStats(kv_cache_usage=0.1, iteration_details=details), it, engine_idx=0)
    assert mon.flush(10)
    assert value("gen_ai_server_request_duration_seconds_count", **m) - e2e_before == 1
    assert mon.stats()["decode"]["steps"] == steps_before + 1
    assert mon.stats()["internal_errors"] == errors + 1


def test_a_bad_perfsdk_setting_never_stops_vllm(stack: Any, monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    cfg, _, _ = stack
    monkeypatch.setattr(perfsdk_vllm, "_MONITOR", None)
    monkeypatch.setenv("PERFSDK_HARDWARE", "no-such-gpu")
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        manager = StatLoggerManager(cfg, engine_idxs=[0], custom_stat_loggers=[perfsdk_vllm.PerfsdkStatLogger],
                                    enable_default_loggers=False)
        manager.record(None, IterationStats(), engine_idx=0)  # inert, not raising
        manager.log_engine_initialized()
    assert "vLLM stat logger disabled" in caplog.text and "no-such-gpu" in caplog.text
