"""perfsdk's vLLM integration against the real ``vllm`` package (0.26 and 0.33, each in its own venv:
scripts/test_engine.sh vllm).

No GPU here, so no model runs; everything else is vLLM's own code. The worker hook is loaded by vLLM's
plugin loader from the installed entry point and attached through vLLM's ``WorkerWrapperBase.init_worker``
/ ``init_device``; vLLM's ``EngineCore`` with its default ``AsyncScheduler`` (built from a ``VllmConfig``)
schedules real requests and drives vLLM's ``Worker.execute_model`` / ``sample_tokens`` through its
executors. Only the forward pass is a stand-in (``vllm_cpu_worker.py`` says exactly what is replaced),
and steps are timed with the host clock instead of CUDA events. ``test_vllm_tp.py`` runs two forked
tensor-parallel workers and scrapes vLLM's ``/metrics`` over HTTP.

The stat logger's tests feed vLLM's own stats classes through vLLM's ``StatLoggerManager``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM suite runs in its own venv: bash scripts/test_engine.sh vllm")

import vllm_cpu_worker as cpu  # noqa: E402  (after vllm: it patches two no-GPU facts into vLLM first)
from engine_process import running_script  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from prometheus_server import free_ports  # noqa: E402  (tests/ is on sys.path through tests/conftest.py)
from vllm.config import DeviceConfig, ModelConfig, ObservabilityConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel  # noqa: E402
from vllm.plugins import load_plugins_by_group  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason  # noqa: E402
from vllm.v1.engine.core import EngineCore  # noqa: E402
from vllm.v1.executor.uniproc_executor import UniProcExecutor  # noqa: E402
from vllm.v1.metrics.loggers import StatLoggerManager, load_stat_logger_plugin_factories  # noqa: E402
from vllm.v1.metrics.stats import (  # noqa: E402
    FinishedRequestStats,
    IterationStats,
    LoRARequestStates,
    RequestStateStats,
    SchedulerIterationDetails,
    SchedulerStats,
)
from vllm.v1.serial_utils import run_method  # noqa: E402
from vllm.v1.worker.worker_base import WorkerWrapperBase  # noqa: E402

from perfsdk import budget, hardware  # noqa: E402
from perfsdk.engines import _common as engine_common  # noqa: E402
from perfsdk.engines.instrumentor import is_ours  # noqa: E402
from perfsdk.engines.vllm import stats as vllm_stats  # noqa: E402
from perfsdk.engines.vllm import worker as vllm_worker  # noqa: E402
from perfsdk.engines.vllm.batch import StepShape, step_shape  # noqa: E402
from perfsdk.model import ModelSpec  # noqa: E402

HW = hardware.resolve("h100-sxm")
VLLM_VERSION = vllm.__version__
VLLM_RELEASE = tuple(int(x) for x in VLLM_VERSION.split("+")[0].split(".")[:2])
SPEC = dataclasses.replace(ModelSpec.from_hf_config(cpu.LLAMA, dtype="bfloat16"), name="tiny-llama")
M = {"model": "tiny-llama"}
PHASES = ("prefill", "decode", "mixed")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {**M, **labels}) or 0.0


def snapshot() -> dict[str, float]:
    """Every per-phase step series perfsdk exports, from the process's registry (vLLM's /metrics)."""
    out = {}
    for p in PHASES:
        for n in (
            "perfsdk_step_seconds_count",
            "perfsdk_step_tokens_total",
            "perfsdk_step_bytes_total",
            "perfsdk_step_flops_total",
            "perfsdk_step_bandwidth_utilization_count",
            "perfsdk_step_flops_utilization_count",
        ):
            out[f"{n}/{p}"] = value(n, phase=p)
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


@pytest.fixture(scope="module", autouse=True)
def env() -> Iterator[None]:
    mp = pytest.MonkeyPatch()
    mp.setenv("PERFSDK_HARDWARE", "h100-sxm")  # no GPU to detect here
    mp.delenv("PERFSDK_METRICS_PORT", raising=False)
    mp.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    yield
    mp.undo()


def shutdown_dist() -> None:
    destroy_model_parallel()
    destroy_distributed_environment()


# ---- the worker hook ---------------------------------------------------------------------------------
def test_vllm_loads_the_worker_hook_from_its_general_plugins_entry_point() -> None:
    plugins = load_plugins_by_group("vllm.general_plugins")
    assert plugins["perfsdk_worker"] is vllm_worker.register
    vllm.plugins.load_general_plugins()  # as vLLM's engine args, engine core and init_worker call it
    assert vllm_worker.installed()


# Hand-derived from vLLM's scheduling rules for PROMPTS (100, 30, 200), 3 tokens each, 128 tokens a step,
# async scheduling (each step is scheduled before the previous one's token is back):
EXPECTED = [
    # 1: r0's whole prompt, then r1's first 28 tokens fill the budget
    StepShape(prefill_lens=(100, 28), prefill_cached=0, decode_requests=0, decode_tokens=0, decode_context=0),
    # 2 (scheduled ahead of step 1's output): r0 decodes at context 100 + 1; r1's last 2 tokens (28 cached);
    #   r2's first 125 tokens
    StepShape(prefill_lens=(125, 2), prefill_cached=28, decode_requests=1, decode_tokens=1, decode_context=101),
    # 3: r0 at 102, r1 at 30 + 1; r2's last 75 tokens with 125 cached
    StepShape(prefill_lens=(75,), prefill_cached=125, decode_requests=2, decode_tokens=2, decode_context=133),
    # 4: r0 has its 3 tokens; r1 at 32, r2 at 201
    StepShape(prefill_lens=(), prefill_cached=0, decode_requests=2, decode_tokens=2, decode_context=233),
    # 5: r2 at 202
    StepShape(prefill_lens=(), prefill_cached=0, decode_requests=1, decode_tokens=1, decode_context=202),
]


def cost(shape: StepShape, spec: ModelSpec = SPEC) -> tuple[str, float, float, int]:
    """(phase, bytes, FLOPs, tokens) of one step, from perfsdk.budget's formulas."""
    lens = list(shape.prefill_lens)
    if shape.phase == "prefill":
        return (
            "prefill",
            budget.prefill_step_bytes(spec, lens, shape.prefill_cached),
            budget.prefill_flops(spec, lens, cached_tokens=shape.prefill_cached),
            sum(lens),
        )
    if shape.phase == "decode":
        return (
            "decode",
            budget.decode_step_bytes(spec, shape.decode_context, shape.decode_tokens),
            budget.decode_flops(spec, shape.decode_tokens, shape.decode_context),
            shape.decode_tokens,
        )
    ctx = shape.decode_context + shape.prefill_cached
    return (
        "mixed",
        budget.mixed_step_bytes(spec, lens, ctx, shape.decode_tokens),
        budget.mixed_step_flops(spec, lens, shape.decode_tokens, ctx),
        sum(lens) + shape.decode_tokens,
    )


@pytest.fixture(scope="class")
def engine(tmp_path_factory: pytest.TempPathFactory, env: None) -> Iterator[tuple[EngineCore, Any]]:
    """vLLM's EngineCore (AsyncScheduler, batch queue of 2) over its in-process executor and a CpuWorker."""
    cfg = cpu.engine_config(tmp_path_factory.mktemp("llama"))
    core = EngineCore(cfg, UniProcExecutor, log_stats=False)
    try:
        yield core, core.model_executor.driver_worker
    finally:
        stop(core)


def stop(core: EngineCore) -> None:
    try:
        core.shutdown()
    except RuntimeError as e:  # its last act, emptying the GPU's cache, needs a GPU
        if "accelerator" not in str(e):
            raise
    shutdown_dist()


@pytest.mark.usefixtures("engine")
class TestEngineCore:
    """vLLM's EngineCore, started once for these tests (and shut down after them)."""

    def test_vllms_default_is_async_scheduling_with_a_batch_queue(self, engine: tuple[EngineCore, Any]) -> None:
        core, _ = engine
        assert type(core.scheduler).__name__ == "AsyncScheduler"
        assert core.batch_queue_size == 2

    def test_the_hook_is_attached_by_vllms_own_worker_setup(self, engine: tuple[EngineCore, Any]) -> None:
        """UniProcExecutor → WorkerWrapperBase.init_worker (plugins) → init_device → perfsdk attaches."""
        _, wrapper = engine
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None and hook.worker is wrapper.worker
        assert hook.ready  # vLLM ran compile_or_warm_up_model while the engine core started
        assert hook.warmup == 1 and hook.steps == 0  # the warm-up pass went through the hook, unrecorded
        assert hook.monitor.model == SPEC and hook.monitor.hardware == HW

    def test_every_step_vllm_schedules_is_one_perfsdk_step_sized_exactly(self, engine: tuple[EngineCore, Any]) -> None:
        core, wrapper = engine
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None
        runner = wrapper.worker.model_runner
        runner.seen.clear()
        before = snapshot()
        cpu.run_requests(core)
        assert hook.monitor.flush(10)
        # what vLLM's scheduler handed the worker, read by perfsdk
        assert [step_shape(so) for so in runner.seen] == EXPECTED
        assert [s.phase for s in EXPECTED] == ["prefill", "mixed", "mixed", "decode", "decode"]
        # and what perfsdk recorded of it: counts, tokens, bytes and FLOPs per phase
        want: dict[str, float] = {}
        for shape in EXPECTED:
            phase, nbytes, flops, tokens = cost(shape)
            for key, v in (
                ("perfsdk_step_seconds_count", 1),
                ("perfsdk_step_tokens_total", tokens),
                ("perfsdk_step_bytes_total", nbytes),
                ("perfsdk_step_flops_total", flops),
                ("perfsdk_step_bandwidth_utilization_count", phase != "prefill"),  # MBU: decode, mixed
                ("perfsdk_step_flops_utilization_count", phase != "decode"),
            ):  # MFU: prefill, mixed
                if v:
                    want[f"{key}/{phase}"] = want.get(f"{key}/{phase}", 0) + v
        got = delta(before, snapshot())
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert got[k] == pytest.approx(v), k
        # all prompt tokens computed once, the other two tokens of each request decoded one at a time
        assert sum(v for k, v in got.items() if k.startswith("perfsdk_step_tokens_total")) == (
            sum(cpu.PROMPTS) + len(cpu.PROMPTS) * (cpu.MAX_TOKENS - 1)
        )
        assert (hook.steps, hook.unpaired) == (len(EXPECTED), 0)
        assert hook.monitor.stats()["internal_errors"] == 0

    def test_vllms_errors_pass_through_and_the_step_is_recorded_as_failed(self, engine: tuple[EngineCore, Any]) -> None:
        _, wrapper = engine
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None
        wrapper.worker.model_runner.fail_next = True
        steps = hook.monitor.stats()["prefill"]["steps"]
        with pytest.raises(RuntimeError, match="the model failed"):
            wrapper.execute_model(cpu.warmup_output())
        assert hook.monitor.flush(10)
        assert hook.monitor.stats()["prefill"]["steps"] == steps + 1

    def test_nothing_perfsdk_does_wrong_reaches_vllm(
        self, engine: tuple[EngineCore, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        _, wrapper = engine
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None
        errors = hook.monitor.stats()["internal_errors"]

        def broken(so: Any) -> StepShape:
            raise ValueError("perfsdk bug")

        monkeypatch.setattr(vllm_worker, "step_shape", broken)
        with caplog.at_level(logging.ERROR, logger="perfsdk"):
            assert wrapper.execute_model(cpu.warmup_output()) is None  # vLLM's step runs on
            out = wrapper.sample_tokens(None)
        assert out.req_ids == ["warmup"] and out.sampled_token_ids == [[7]]
        assert hook.monitor.stats()["internal_errors"] == errors + 1
        assert "perfsdk internal error in vllm worker hook: step begin" in caplog.text


def test_a_speculative_verify_step_is_a_decode(tmp_path: Path) -> None:
    """vLLM's n-gram speculative decoding: each decode schedules its token plus 2 drafts to verify."""
    from vllm.config import SpeculativeConfig, VllmConfig

    sync = VLLM_RELEASE < (0, 33)  # vLLM 0.26 runs n-gram drafts only without async scheduling
    base = cpu.engine_config(tmp_path, async_scheduling=False if sync else None)
    cfg = VllmConfig(
        model_config=base.model_config,
        device_config=base.device_config,
        scheduler_config=base.scheduler_config,
        cache_config=base.cache_config,
        parallel_config=base.parallel_config,
        speculative_config=SpeculativeConfig(
            method="ngram", num_speculative_tokens=2, prompt_lookup_max=3, prompt_lookup_min=1
        ),
    )
    core = EngineCore(cfg, UniProcExecutor, log_stats=False)
    try:
        runner = core.model_executor.driver_worker.worker.model_runner
        runner.seen.clear()
        runner.drafts = 2 if sync else 0  # without async scheduling the worker's drafter proposes them
        cpu.run_requests(core)
    finally:
        stop(core)
    assert all(len(d) == 2 for so in runner.seen[1:] for d in so.scheduled_spec_decode_tokens.values())
    if sync:
        # each step scheduled after the previous one's output: a decoding sequence's context is what it has
        # computed (every draft rejected: one token a step) plus its 1 + 2 tokens
        assert [step_shape(so) for so in runner.seen] == [
            StepShape((100, 28), 0, 0, 0, 0),
            StepShape((123, 2), 28, 1, 3, 100 + 3),
            StepShape((77,), 123, 2, 6, (101 + 3) + (30 + 3)),
            StepShape((), 0, 2, 6, (31 + 3) + (200 + 3)),
            StepShape((), 0, 1, 3, 201 + 3),
        ]
        return
    # as in EXPECTED, with 1 + 2 tokens per decoding sequence (and 2 fewer prompt tokens fitting step 2)
    assert [step_shape(so) for so in runner.seen] == [
        StepShape((100, 28), 0, 0, 0, 0),
        StepShape((123, 2), 28, 1, 3, 100 + 3),
        StepShape((77,), 123, 2, 6, (103 + 3) + (30 + 3)),
        StepShape((), 0, 2, 6, (33 + 3) + (200 + 3)),
        StepShape((), 0, 1, 3, 203 + 3),
    ]


def test_a_resumed_request_recomputes_as_a_prefill() -> None:
    """After preemption vLLM reschedules a request among the cached ones, with outputs: it recomputes."""
    so = SchedulerOutput.make_empty()
    so.scheduled_cached_reqs = CachedRequestData(
        req_ids=["a", "b"],
        resumed_req_ids={"b"},
        new_token_ids=[[], []],
        all_token_ids={},
        new_block_ids=[None, None],
        num_computed_tokens=[40, 0],
        num_output_tokens=[5, 9],
    )
    so.num_scheduled_tokens = {"a": 1, "b": 64}
    so.total_num_scheduled_tokens = 65
    assert step_shape(so) == StepShape((64,), 0, 1, 1, 41)


# ---- --worker-extension-cls, versions, switches ------------------------------------------------------------
@pytest.fixture
def no_plugin() -> Iterator[None]:
    """vLLM's WorkerWrapperBase as if perfsdk's general plugin had not loaded (VLLM_PLUGINS without it)."""
    vllm_worker.unregister()
    assert not vllm_worker.installed()
    yield
    with pytest.MonkeyPatch.context() as mp:  # installed again whatever the test set
        mp.delenv("PERFSDK_ENABLED", raising=False)
        mp.setattr(vllm, "__version__", VLLM_VERSION)
        vllm_worker.register()
    assert vllm_worker.installed()


def make_worker(cfg: Any) -> WorkerWrapperBase:
    from vllm.utils.network_utils import get_distributed_init_method, get_open_port

    wrapper = WorkerWrapperBase(rpc_rank=0)
    wrapper.init_worker(
        [
            {
                "vllm_config": cfg,
                "local_rank": 0,
                "rank": 0,
                "is_driver_worker": True,
                "distributed_init_method": get_distributed_init_method("127.0.0.1", get_open_port()),
            }
        ]
    )
    wrapper.init_device()
    return wrapper


def test_the_worker_extension_class_hooks_the_worker(tmp_path: Path, no_plugin: None) -> None:
    cfg = cpu.engine_config(
        tmp_path,
        worker_cls="vllm_cpu_worker.ExtensionCpuWorker",
        extension="perfsdk.engines.vllm.worker.PerfsdkWorkerExtension",
    )
    wrapper = make_worker(cfg)  # vLLM's init_worker mixes the class in; its init_device calls init_worker_extension
    try:
        if VLLM_RELEASE < (0, 33):  # vLLM 0.26 calls no init_worker_extension: the extension's RPC methods only
            assert vllm_worker.hook_of(wrapper) is None
            run_method(wrapper, "init_worker_extension", (), {})  # what vLLM 0.33 calls there
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None and not hook.ready
        assert run_method(wrapper, "compile_or_warm_up_model", (), {}) is not None  # as the executor calls it
        assert hook.ready and hook.warmup == 1 and hook.steps == 0
        wrapper.execute_model(cpu.warmup_output())
        wrapper.sample_tokens(None)
        stats = run_method(wrapper, "perfsdk_stats", (), {})  # a collective_rpc target by name
        assert (stats["rank"], stats["steps"], stats["warmup"], stats["unpaired"]) == (0, 1, 1, 0)
        refused = run_method(wrapper, "perfsdk_profile", (), {"steps": 2, "ranks": [1]})
        assert refused == {"accepted": False, "reason": "not this rank", "rank": 0}
        run_method(wrapper, "destroy_worker_extension", (), {})
        assert vllm_worker.hook_of(wrapper) is None
    finally:
        shutdown_dist()


def test_profile_by_collective_rpc_reaches_the_ranks_window(tmp_path: Path, no_plugin: None) -> None:
    cfg = cpu.engine_config(tmp_path)
    wrapper = make_worker(cfg)
    try:
        hook = vllm_worker.attach(wrapper.worker, ready=True)
        assert hook is not None
        hook.monitor.enable_profiler(directory=str(tmp_path / "traces"))
        got = run_method(wrapper, vllm_worker.profile, (), {"steps": 2, "ranks": [0]})  # a callable, as collective_rpc
        assert got["accepted"] and got["rank"] == 0 and got["state"] == "armed"
        assert hook.monitor.stats()["profiler"]["state"] == "armed"
        hook.monitor.enable_profiler(directory=str(tmp_path / "traces"))  # cancels the armed capture
    finally:
        hook_ = vllm_worker.hook_of(wrapper)
        if hook_ is not None:
            hook_.detach()
        shutdown_dist()


def test_another_vllm_version_gets_a_message_naming_the_range(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, no_plugin: None
) -> None:
    hook = vllm_worker.VllmWorkerInstrumentor()
    for ok in ("0.26.0", "0.29.1", "0.33.2", "0.33.0+cu129"):
        assert hook.dependency_problem({"vllm": ok}) is None
    for other in ("0.34.0", "0.25.1", "1.0.0"):
        assert "vllm>=0.26,<0.34" in (hook.dependency_problem({"vllm": other}) or "")
    monkeypatch.setattr(vllm, "__version__", "0.35.1")
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        vllm_worker.register()
    assert not vllm_worker.installed()
    assert "vllm 0.35.1 is outside the range perfsdk's vllm integration supports (vllm>=0.26,<0.34)" in caplog.text
    assert not is_ours(WorkerWrapperBase.__dict__["init_device"])  # nothing was patched


def test_ci_tests_the_oldest_and_the_newest_supported_release() -> None:
    """constraints/vllm-VERSION-cpu.txt are the releases scripts/test_engine.sh runs: the range's ends."""
    from perfsdk.engines.instrumentor import Requirement

    req = Requirement.parse(vllm_worker.VllmWorkerInstrumentor._instruments[0])
    tested = sorted(
        tuple(int(x) for x in p.name.split("-")[1].split("."))
        for p in (Path(__file__).parents[2] / "constraints").glob("vllm-*-cpu.txt")
    )
    low = next(v for op, v in req.clauses if op == ">=")
    high = next(v for op, v in req.clauses if op == "<")
    assert tested[0][: len(low)] == low  # the oldest supported minor release
    assert tested[-1][:2] == (high[0], high[1] - 1)  # the newest: the minor release below the bound
    assert VLLM_RELEASE in [v[:2] for v in tested]  # and this run is one of them


def test_register_twice_wraps_once_and_unregister_unhooks_the_workers(tmp_path: Path) -> None:
    """unregister undoes register: vLLM's init_device back, and each worker it hooked with its own methods back."""
    vllm_worker.register()
    vllm_worker.register()
    wrapped = WorkerWrapperBase.__dict__["init_device"]
    assert is_ours(wrapped) and not is_ours(wrapped.__wrapped__)  # one perfsdk wrapper, around vLLM's own
    wrapper = make_worker(cpu.engine_config(tmp_path))
    try:
        hook = vllm_worker.hook_of(wrapper)
        assert hook is not None
        hook.ready = True
        wrapper.execute_model(cpu.warmup_output())
        wrapper.sample_tokens(None)
        assert hook.steps == 1
        vllm_worker.unregister()
        vllm_worker.unregister()  # twice: nothing more to undo
        assert WorkerWrapperBase.__dict__["init_device"] is wrapped.__wrapped__
        assert vllm_worker.hook_of(wrapper) is None
        for name in ("execute_model", "sample_tokens", "compile_or_warm_up_model"):
            assert name not in vars(wrapper.worker)  # the class's own methods show again
            assert getattr(wrapper.worker, name).__func__ is getattr(type(wrapper.worker), name)
        wrapper.execute_model(cpu.warmup_output())
        assert wrapper.sample_tokens(None).req_ids == ["warmup"]
        assert hook.steps == 1  # no longer recorded
    finally:
        vllm_worker.register()
        shutdown_dist()
    assert vllm_worker.installed()


def test_unregister_leaves_a_wrapper_another_library_put_on_top_alone(tmp_path: Path) -> None:
    import wrapt

    def theirs(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return wrapped(*args, **kwargs)

    vllm_worker.register()
    ours = WorkerWrapperBase.__dict__["init_device"]
    wrapt.wrap_function_wrapper(WorkerWrapperBase, "init_device", theirs)
    try:
        vllm_worker.unregister()
        top = WorkerWrapperBase.__dict__["init_device"]
        assert top.__wrapped__ is ours  # theirs stays where it was, around perfsdk's
        assert not vllm_worker.installed()
        wrapper = make_worker(cpu.engine_config(tmp_path))  # through theirs and perfsdk's, which passes through
        try:
            assert vllm_worker.hook_of(wrapper) is None
        finally:
            shutdown_dist()
    finally:
        WorkerWrapperBase.init_device = ours.__wrapped__
        vllm_worker.register()
    assert is_ours(WorkerWrapperBase.__dict__["init_device"])


def test_perfsdk_enabled_0_installs_nothing(monkeypatch: pytest.MonkeyPatch, no_plugin: None) -> None:
    monkeypatch.setenv("PERFSDK_ENABLED", "0")
    vllm_worker.register()
    assert not vllm_worker.installed()


def test_a_bad_perfsdk_setting_leaves_the_worker_unhooked_not_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PERFSDK_HARDWARE", "no-such-gpu")
    monkeypatch.setattr(engine_common, "_MONITORS", {})  # a fresh Monitor, made with this setting
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        wrapper = make_worker(cpu.engine_config(tmp_path))  # through the plugin's init_device wrapper
    try:
        assert vllm_worker.hook_of(wrapper) is None
        assert "vLLM worker not hooked" in caplog.text and "no-such-gpu" in caplog.text
        wrapper.execute_model(cpu.warmup_output())  # vLLM's own methods, untouched
        assert wrapper.sample_tokens(None).req_ids == ["warmup"]
    finally:
        shutdown_dist()


def test_a_worker_that_exports_nowhere_says_how_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(engine_common, "_MONITORS", {})  # a fresh Monitor, made with this setting
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        wrapper = make_worker(cpu.engine_config(tmp_path))
    try:
        assert vllm_worker.hook_of(wrapper) is not None
        assert "PROMETHEUS_MULTIPROC_DIR" in caplog.text and "PERFSDK_METRICS_PORT" in caplog.text
    finally:
        shutdown_dist()


# ---- two tensor-parallel workers, forked by vLLM, on vLLM's /metrics (vllm_tp_server.py) -------------------
@pytest.fixture(scope="module")
def tp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("tp")
    (tmp / "prom").mkdir()
    base = free_ports(3)
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp / "prom"),
        "PERFSDK_HARDWARE": "h100-sxm",
        "PERFSDK_METRICS_PORT": str(base),
        "PERFSDK_PROFILER": "torch",
        "PERFSDK_PROFILE_DIR": str(tmp / "traces"),
    }
    with running_script(Path(cpu.__file__).parent / "vllm_tp_server.py", tmp, env, startup_s=180) as info:
        yield {**info, "port": base, "prom": tmp / "prom"}


def scrape(url: str) -> dict[tuple[str, str, str], float]:
    """{(sample name, phase, rank): value} of perfsdk's step series, read over HTTP."""
    body = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for smp in fam.samples:
            if smp.name.startswith("perfsdk_step_") and smp.labels.get("model") == "tiny-llama":
                out[(smp.name, smp.labels.get("phase", ""), smp.labels.get("rank", ""))] = smp.value
    return out


def test_each_tensor_parallel_rank_reaches_vllms_metrics_with_its_own_share(tp_server: dict[str, Any]) -> None:
    per_gpu = SPEC.with_tp(2)
    want: dict[tuple[str, str, str], float] = {}
    for shape in EXPECTED:
        phase, nbytes, flops, tokens = cost(shape, per_gpu)
        for rank in ("0", "1"):
            for name, v in (
                ("perfsdk_step_seconds_count", 1.0),
                ("perfsdk_step_tokens_total", tokens),
                ("perfsdk_step_bytes_total", nbytes),
                ("perfsdk_step_flops_total", flops),
            ):
                want[(name, phase, rank)] = want.get((name, phase, rank), 0) + v
    got: dict[tuple[str, str, str], float] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the workers' collector threads write a little after each step
        got = scrape(tp_server["metrics"])
        if all(got.get(k) == pytest.approx(v) for k, v in want.items()):
            break
        time.sleep(0.5)
    for k, v in want.items():
        assert got.get(k) == pytest.approx(v), k
    # a rank's weight share is half the model's: the same step reads fewer bytes per GPU than on one GPU
    assert want[("perfsdk_step_bytes_total", "decode", "0")] < sum(cost(s)[1] for s in EXPECTED if s.phase == "decode")
    # the values came from the two forked worker processes, through PROMETHEUS_MULTIPROC_DIR
    written = {p.name for p in tp_server["prom"].iterdir()}
    for pid in tp_server["workers"]:
        assert f"histogram_{pid}.db" in written


def test_the_profiler_window_is_triggered_per_rank(tp_server: dict[str, Any]) -> None:
    def post(rank: int) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"http://127.0.0.1:{tp_server['port'] + 1 + rank}/profile?steps=2", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    code, body = post(1)
    assert (code, body["accepted"], body["state"]) == (202, True, "armed")
    code, body = post(1)  # rank 1's window is armed now
    assert (code, body["accepted"]) == (409, False) and body["reason"].startswith("busy")
    code, body = post(0)  # rank 0's is its own
    assert (code, body["accepted"]) == (202, True)


# ---- the stat logger (API server): request latencies; steps only where the worker hook is off ----------
SPAN_EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A VllmConfig for a local Llama config and vLLM's StatLoggerManager with its plugins loaded."""
    mp = pytest.MonkeyPatch()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SPAN_EXPORTER))
    trace.set_tracer_provider(provider)
    model_dir = tmp_path_factory.mktemp("llama")
    (model_dir / "config.json").write_text(json.dumps(cpu.LLAMA))
    cfg = VllmConfig(  # as `vllm serve ... --enable-logging-iteration-details --no-async-scheduling`
        model_config=ModelConfig(model=str(model_dir), served_model_name="tiny-llama", skip_tokenizer_init=True),
        device_config=DeviceConfig(device="cpu"),
        observability_config=ObservabilityConfig(enable_logging_iteration_details=True),
        scheduler_config=SchedulerConfig(async_scheduling=False, max_model_len=4096, is_encoder_decoder=False),
    )
    cfg.cache_config.num_gpu_blocks = 1000  # what the engine core reports after profiling
    manager = StatLoggerManager(
        cfg, engine_idxs=[0], custom_stat_loggers=load_stat_logger_plugin_factories(), enable_default_loggers=False
    )
    mon = vllm_stats.current_monitor()
    assert mon is not None
    yield cfg, manager, mon
    mp.undo()


def test_vllm_finds_the_stat_logger_through_its_plugin_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfsdk.engines.vllm import PerfsdkStatLogger  # the name the docs use, loaded on first use

    assert PerfsdkStatLogger is vllm_stats.PerfsdkStatLogger
    assert vllm_stats.PerfsdkStatLogger in load_stat_logger_plugin_factories()
    monkeypatch.setenv("VLLM_PLUGINS", "someone-else")  # vLLM's own filter turns it off
    assert vllm_stats.PerfsdkStatLogger not in load_stat_logger_plugin_factories()


def test_the_monitor_knows_vllms_model_and_the_hardware(stack: Any) -> None:
    _, _, mon = stack
    assert mon.model_name == "tiny-llama"
    assert mon.model == SPEC
    assert mon.hardware == HW


def test_with_the_worker_hook_the_stat_logger_records_no_steps(stack: Any, caplog: pytest.LogCaptureFixture) -> None:
    """vLLM's own step report and perfsdk's worker hook would count every step twice: the hook wins."""
    cfg, _, mon = stack
    assert vllm_worker.installed()
    manager = StatLoggerManager(
        cfg, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
    )
    with caplog.at_level(logging.INFO, logger="perfsdk"):
        manager.log_engine_initialized()
    assert "step time, MBU and MFU from perfsdk's worker hook" in caplog.text
    before = snapshot()
    details = SchedulerIterationDetails(
        iteration_index=0,
        num_ctx_requests=1,
        num_ctx_tokens=64,
        num_generation_requests=4,
        num_generation_tokens=4,
        elapsed_ms=5.0,
    )
    manager.record(SchedulerStats(kv_cache_usage=0.2, iteration_details=details), None, engine_idx=0)
    assert mon.flush(10)
    assert delta(before, snapshot()) == {}


def test_without_the_worker_hook_steps_vllm_reports_become_perfsdk_steps(stack: Any, no_plugin: None) -> None:
    cfg, _, mon = stack
    manager = StatLoggerManager(
        cfg, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
    )
    spec = mon.model
    block = cfg.cache_config.block_size
    m = {"model": "tiny-llama"}
    before = {p: value("perfsdk_step_seconds_count", phase=p, **m) for p in ("prefill", "decode", "mixed")}
    mbu_before = value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m)
    mfu_before = value("perfsdk_step_flops_utilization_sum", phase="prefill", **m)

    def step(i: int, ctx_reqs: int, ctx_tokens: int, gen_reqs: int, ms: float, usage: float) -> None:
        details = SchedulerIterationDetails(
            iteration_index=i,
            num_ctx_requests=ctx_reqs,
            num_ctx_tokens=ctx_tokens,
            num_generation_requests=gen_reqs,
            num_generation_tokens=gen_reqs,
            elapsed_ms=ms,
        )
        manager.record(SchedulerStats(kv_cache_usage=usage, iteration_details=details), None, engine_idx=0)

    step(0, 2, 1000, 0, 50.0, 0.1)  # prefill of two prompts
    step(1, 0, 0, 8, 20.0, 0.5)  # decode, 8 sequences, half the KV blocks in use
    step(2, 1, 256, 7, 30.0, 0.5)  # chunked prefill beside decode
    step(3, 0, 0, 0, 0.0, 0.0)  # an empty step: nothing
    manager.record(
        SchedulerStats(
            iteration_details=SchedulerIterationDetails(
                iteration_index=4,
                num_ctx_requests=0,
                num_ctx_tokens=0,
                num_generation_requests=0,
                num_generation_tokens=0,
                elapsed_ms=0.0,
                is_dummy=True,
            )
        ),
        None,
        engine_idx=0,
    )  # DP padding
    assert mon.flush(10)
    assert {p: value("perfsdk_step_seconds_count", phase=p, **m) - before[p] for p in before} == {
        "prefill": 1,
        "decode": 1,
        "mixed": 1,
    }
    ctx = 0.5 * 1000 * block  # kv_cache_usage x KV blocks x block size
    assert value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m) - mbu_before == pytest.approx(
        budget.decode_step_bytes(spec, ctx, 8) / (0.020 * HW.memory_bandwidth)
    )
    assert value("perfsdk_step_flops_utilization_sum", phase="prefill", **m) - mfu_before == pytest.approx(
        budget.prefill_flops(spec, [500, 500]) / (0.050 * HW.flops["bf16"])
    )
    assert mon.stats()["internal_errors"] == 0


def test_a_request_as_vllms_own_stats_code_sees_it(stack: Any) -> None:
    """One request over three engine steps, through vLLM's IterationStats update methods."""
    _, manager, mon = stack
    m = {"model": "tiny-llama"}
    names = (
        "gen_ai_server_time_to_first_token_seconds",
        "perfsdk_inter_token_latency_seconds",
        "gen_ai_server_time_per_output_token_seconds",
        "perfsdk_request_queue_seconds",
        "gen_ai_server_request_duration_seconds",
    )
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
        it.update_from_output(
            EngineCoreOutput(request_id="r1", new_token_ids=[7], events=evs), ts, prefilling, req, lora, None
        )
        if i == len(outputs) - 1:
            it.update_from_finished_request(
                FinishReason.LENGTH, "r1", num_prompt_tokens=12, max_tokens_param=3, req_stats=req
            )
        manager.record(None, it, engine_idx=0)
    assert mon.flush(10)
    got = {n: (value(n + "_count", **m) - before[n][0], value(n + "_sum", **m) - before[n][1]) for n in names}
    assert got["gen_ai_server_time_to_first_token_seconds"] == (1, pytest.approx(0.3))
    assert got["perfsdk_inter_token_latency_seconds"] == (2, pytest.approx(0.05))
    assert got["perfsdk_request_queue_seconds"] == (1, pytest.approx(0.10))
    assert got["gen_ai_server_time_per_output_token_seconds"] == (1, pytest.approx(0.025))  # decode 0.05 / 2
    assert got["gen_ai_server_request_duration_seconds"] == (1, pytest.approx(0.34))
    spans = [
        s
        for s in SPAN_EXPORTER.get_finished_spans()
        if s.attributes.get("gen_ai.request.model") == "tiny-llama" and s.parent is None
    ]
    assert len(spans) == 1
    span = spans[0]
    assert span.attributes["gen_ai.usage.input_tokens"] == 12 and span.attributes["gen_ai.usage.output_tokens"] == 3
    assert span.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.34)


def test_finished_request_reasons_and_errors(stack: Any) -> None:
    _, manager, mon = stack
    SPAN_EXPORTER.clear()
    it = IterationStats()
    it.finished_requests.append(
        FinishedRequestStats(FinishReason.ERROR, request_id="bad", e2e_latency=0.2, num_generation_tokens=1)
    )
    it.finished_requests.append(FinishedRequestStats(FinishReason.ABORT, request_id="gone", e2e_latency=0.1))
    manager.record(None, it, engine_idx=0)
    assert mon.flush(10)
    roots = [s for s in SPAN_EXPORTER.get_finished_spans() if s.parent is None]
    assert sorted(tuple(s.attributes["gen_ai.response.finish_reasons"]) for s in roots) == [("abort",), ("error",)]
    errored = next(s for s in roots if s.attributes["gen_ai.response.finish_reasons"] == ("error",))
    assert errored.status.status_code.name == "ERROR"


def test_nothing_the_stat_logger_does_wrong_reaches_vllm(
    stack: Any, caplog: pytest.LogCaptureFixture, no_plugin: None
) -> None:
    cfg, _, mon = stack
    manager = StatLoggerManager(
        cfg, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
    )
    errors = mon.stats()["internal_errors"]
    broken = SchedulerIterationDetails(
        iteration_index=9,
        num_ctx_requests=0,
        num_ctx_tokens=0,
        num_generation_requests=2,
        num_generation_tokens=-2,
        elapsed_ms=5.0,
    )
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        manager.record(SchedulerStats(iteration_details=broken), None, engine_idx=0)  # must not raise
    assert mon.stats()["internal_errors"] == errors + 1
    assert "perfsdk internal error" in caplog.text and "got -2" in caplog.text


def test_without_iteration_details_it_says_what_to_turn_on(
    stack: Any, caplog: pytest.LogCaptureFixture, no_plugin: None
) -> None:
    cfg, _, _ = stack
    plain = VllmConfig(
        model_config=cfg.model_config, device_config=DeviceConfig(device="cpu"), scheduler_config=cfg.scheduler_config
    )
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        StatLoggerManager(
            plain, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
        ).log_engine_initialized()
    assert "--enable-logging-iteration-details" in caplog.text


def test_with_a_batch_queue_no_step_times_are_taken(
    stack: Any, caplog: pytest.LogCaptureFixture, no_plugin: None
) -> None:
    """vLLM's async scheduling (its default) times only the wait for an earlier batch: no steps from it."""
    cfg, _, mon = stack
    queued = VllmConfig(
        model_config=cfg.model_config,
        device_config=DeviceConfig(device="cpu"),
        observability_config=ObservabilityConfig(enable_logging_iteration_details=True),
    )
    assert queued.scheduler_config.async_scheduling and queued.max_concurrent_batches > 1  # vLLM's default
    manager = StatLoggerManager(
        queued, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
    )
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        manager.log_engine_initialized()
    assert "--no-async-scheduling" in caplog.text
    before = mon.stats()["decode"]["steps"]
    details = SchedulerIterationDetails(
        iteration_index=0,
        num_ctx_requests=0,
        num_ctx_tokens=0,
        num_generation_requests=4,
        num_generation_tokens=4,
        elapsed_ms=0.5,
    )
    manager.record(SchedulerStats(kv_cache_usage=0.2, iteration_details=details), None, engine_idx=0)
    assert mon.flush(10)
    assert mon.stats()["decode"]["steps"] == before


def test_the_engines_kv_cache_size_gives_the_decode_context(stack: Any, no_plugin: None) -> None:
    cfg, _, mon = stack
    manager = StatLoggerManager(
        cfg, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
    )
    m = {"model": "tiny-llama"}
    cfg.cache_config.kv_cache_size_tokens = 20_000  # what the engine core reports, per engine
    try:
        before = value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m)
        details = SchedulerIterationDetails(
            iteration_index=0,
            num_ctx_requests=0,
            num_ctx_tokens=0,
            num_generation_requests=4,
            num_generation_tokens=4,
            elapsed_ms=10.0,
        )
        manager.record(SchedulerStats(kv_cache_usage=0.25, iteration_details=details), None, engine_idx=0)
        assert mon.flush(10)
        assert value("perfsdk_step_bandwidth_utilization_sum", phase="decode", **m) - before == pytest.approx(
            budget.decode_step_bytes(mon.model, 5_000, 4) / (0.010 * HW.memory_bandwidth)
        )
    finally:
        cfg.cache_config.kv_cache_size_tokens = None


def test_one_odd_request_costs_only_itself(stack: Any, no_plugin: None) -> None:
    """Straight to perfsdk's logger: vLLM's own Prometheus logger would fail on this request first."""
    cfg, _, mon = stack
    logger = vllm_stats.PerfsdkStatLogger(cfg, 0)
    m = {"model": "tiny-llama"}
    e2e_before = value("gen_ai_server_request_duration_seconds_count", **m)
    steps_before = mon.stats()["decode"]["steps"]
    errors = mon.stats()["internal_errors"]
    it = IterationStats()
    it.finished_requests.append(FinishedRequestStats(None, request_id="odd", e2e_latency=0.3))  # type: ignore[arg-type]
    it.finished_requests.append(FinishedRequestStats(FinishReason.STOP, request_id="fine", e2e_latency=0.2))
    details = SchedulerIterationDetails(
        iteration_index=0,
        num_ctx_requests=0,
        num_ctx_tokens=0,
        num_generation_requests=2,
        num_generation_tokens=2,
        elapsed_ms=5.0,
    )
    logger.record(SchedulerStats(kv_cache_usage=0.1, iteration_details=details), it, engine_idx=0)
    assert mon.flush(10)
    assert value("gen_ai_server_request_duration_seconds_count", **m) - e2e_before == 1
    assert mon.stats()["decode"]["steps"] == steps_before + 1
    assert mon.stats()["internal_errors"] == errors + 1


def test_a_bad_perfsdk_setting_never_stops_vllm(
    stack: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, _, _ = stack
    monkeypatch.setattr(vllm_stats, "_MONITOR", None)
    monkeypatch.setenv("PERFSDK_HARDWARE", "no-such-gpu")
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        manager = StatLoggerManager(
            cfg, engine_idxs=[0], custom_stat_loggers=[vllm_stats.PerfsdkStatLogger], enable_default_loggers=False
        )
        manager.record(None, IterationStats(), engine_idx=0)  # inert, not raising
        manager.log_engine_initialized()
    assert "vLLM stat logger disabled" in caplog.text and "no-such-gpu" in caplog.text
