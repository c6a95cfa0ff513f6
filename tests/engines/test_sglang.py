"""perfsdk's SGLang integrations against the real ``sglang`` package (0.5.23, its own venv:
scripts/test_engine.sh sglang). No GPU here, so no model runs.

The in-process hook: SGLang's plugin loader runs perfsdk's entry point and SGLang's ``HookRegistry``
applies its hook to SGLang's ``ModelRunner.forward``, which runs here on a CPU subclass whose model
execution is a stand-in (``sglang_cpu_runner.py`` says what is replaced), fed real ``ForwardBatch``
objects; ``sglang_server.py`` runs SGLang's process layout (two spawned tensor-parallel scheduler
processes, ``--enable-metrics``) and serves SGLang's own ``/metrics`` app, scraped here over HTTP.

``perfsdk sglang``: the messages are SGLang's ``ForwardPassMetrics`` structs, encoded and sent by SGLang's
``_FpmPublisherThread`` on the per-rank endpoints its scheduler binds, exactly as a server started with
``--enable-forward-pass-metrics --forward-pass-metrics-ipc-name BASE`` does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

fpm = pytest.importorskip(
    "sglang.srt.observability.forward_pass_metrics",
    reason="the SGLang suite runs in its own venv: bash scripts/test_engine.sh sglang",
)

import sglang_cpu_runner as cpu  # noqa: E402  (a placeholder torchvision first)
from engine_process import running_script  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from prometheus_server import free_ports  # noqa: E402  (tests/ is on sys.path through tests/conftest.py)
from sglang.srt.model_executor.model_runner import ModelRunner  # noqa: E402
from sglang.srt.plugins import load_plugins, load_plugins_by_group  # noqa: E402
from sglang.srt.plugins.hook_registry import HookRegistry, HookType  # noqa: E402

from perfsdk import budget, hardware  # noqa: E402
from perfsdk.engines import _common as engine_common  # noqa: E402
from perfsdk.engines import sglang_hook  # noqa: E402
from perfsdk.engines._common import StepShape  # noqa: E402
from perfsdk.engines.sglang import FPM_VERSION, FpmSubscriber  # noqa: E402
from perfsdk.hardware import HardwareSpec  # noqa: E402
from perfsdk.model import ModelSpec  # noqa: E402
from perfsdk.testing import monitor_harness  # noqa: E402

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 1e15})


def test_perfsdk_reads_the_schema_version_sglang_writes() -> None:
    assert fpm.FPM_VERSION == FPM_VERSION


def scheduled(**kw: int) -> Any:
    return fpm.ScheduledRequestMetrics(**kw)


def publish_until_heard(pubs: list[Any], sub: FpmSubscriber) -> None:
    """ZMQ drops what a PUB sends before a SUB has joined: idle heartbeats until every rank is heard."""
    deadline = time.monotonic() + 20
    while len(sub._last_seq) < len(pubs) and time.monotonic() < deadline:
        for rank, pub in enumerate(pubs):
            pub.publish(fpm.ForwardPassMetrics(worker_id="w", dp_rank=rank))
        time.sleep(0.02)
    assert len(sub._last_seq) == len(pubs), "the subscriber never heard every rank"


def test_sglangs_publisher_to_perfsdk_steps(tmp_path: Any) -> None:
    base = f"ipc://{tmp_path}/fpm"
    with monitor_harness(model=MODEL, hardware=HW) as h:
        sub = FpmSubscriber(h.monitor, base, dp_size=2)
        pubs = [fpm._FpmPublisherThread(f"{base}.{r}", worker_id="w", dp_rank=r) for r in range(2)]
        try:
            publish_until_heard(pubs, sub)
            pubs[0].publish(
                fpm.ForwardPassMetrics(
                    worker_id="w",
                    dp_rank=0,
                    wall_time=0.02,
                    scheduled_requests=scheduled(num_decode_requests=8, sum_decode_kv_tokens=8000),
                )
            )
            pubs[0].publish(
                fpm.ForwardPassMetrics(
                    worker_id="w",
                    dp_rank=0,
                    wall_time=0.03,
                    scheduled_requests=scheduled(
                        num_prefill_requests=1, sum_prefill_tokens=256, num_decode_requests=7, sum_decode_kv_tokens=7000
                    ),
                )
            )
            pubs[1].publish(
                fpm.ForwardPassMetrics(
                    worker_id="w",
                    dp_rank=1,
                    wall_time=0.05,
                    scheduled_requests=scheduled(num_prefill_requests=2, sum_prefill_tokens=1000),
                )
            )
            deadline = time.monotonic() + 20
            while sub.steps < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            for p in pubs:
                p.shutdown()
            sub.close()
        assert h.monitor.flush(5)
        st = h.monitor.stats()
        assert (st["decode"]["steps"], st["mixed"]["steps"], st["prefill"]["steps"]) == (1, 1, 1)
        assert sub.lost == 0
        assert h.sum("perfsdk_step_bandwidth_utilization", phase="decode") == pytest.approx(
            budget.decode_step_bytes(MODEL, 8000, 8) / (0.02 * 4.8e12)
        )
        assert h.sum("perfsdk_step_flops_utilization", phase="mixed") == pytest.approx(
            budget.mixed_step_flops(MODEL, [256], 7, 7000) / (0.03 * 1e15)
        )
        assert h.sum("perfsdk_step_flops_utilization", phase="prefill") == pytest.approx(
            budget.prefill_flops(MODEL, [500, 500]) / (0.05 * 1e15)
        )
        assert st["internal_errors"] == 0


def test_perfsdk_sglang_serves_the_steps_on_metrics(tmp_path: Any) -> None:
    """The command a user runs beside ``sglang serve``, scraped over HTTP."""
    base = f"ipc://{tmp_path}/fpm"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "perfsdk.cli",
            "sglang",
            "--fpm",
            base,
            "--model",
            "llama-3-8b",
            "--hardware",
            "h100-sxm",
            "--port",
            "0",
            "--duration",
            "60",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PERFSDK_OTEL": "0"},
    )
    pub = fpm._FpmPublisherThread(f"{base}.0", worker_id="w", dp_rank=0)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"(http://\S+/metrics)", line)
        assert url, line
        deadline = time.monotonic() + 30
        body = ""
        while time.monotonic() < deadline:
            pub.publish(
                fpm.ForwardPassMetrics(
                    worker_id="w",
                    dp_rank=0,
                    wall_time=0.02,
                    scheduled_requests=scheduled(num_decode_requests=8, sum_decode_kv_tokens=8000),
                )
            )
            time.sleep(0.2)
            body = urllib.request.urlopen(url.group(1), timeout=5).read().decode()
            m = re.search(r'perfsdk_step_seconds_count\{[^}]*phase="decode"[^}]*\} (\S+)', body)
            if m and float(m.group(1)) >= 1:
                break
        else:
            pytest.fail(f"no decode step on /metrics:\n{body[-2000:]}")
        assert re.search(r'perfsdk_step_bandwidth_utilization_count\{[^}]*phase="decode"', body)
        assert 'model="llama-3-8b"' in body
    finally:
        pub.shutdown()
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "steps from" in out


# ---- the in-process hook: SGLang's plugin loader, its HookRegistry, its ModelRunner.forward -----------------


SPEC = dataclasses.replace(ModelSpec.from_hf_config(cpu.LLAMA, dtype="bfloat16"), name="tiny-llama")
PHASES = ("prefill", "decode", "mixed")
# what perfsdk reads from cpu.workload(): exact lengths from each ForwardBatch
EXPECTED = [
    StepShape((100, 28), 0, 0, 0, 0),
    StepShape((125, 2), 28, 1, 1, 101),
    StepShape((), 0, 2, 2, 32 + 201),
    StepShape((), 0, 2, 6, (20 + 3) + (40 + 3)),  # a verify step decodes 1 + 2 drafts per sequence
    None,  # IDLE
]


def test_sglang_loads_the_hook_through_its_plugin_loader_and_hook_registry() -> None:
    func, dist = load_plugins_by_group("sglang.srt.plugins")["perfsdk"]
    assert func is sglang_hook.install and dist == "perfsdk"
    load_plugins()  # as every scheduler process does first: runs the plugins, then HookRegistry.apply_hooks()
    ((hook_type, hook, source),) = HookRegistry._hooks[sglang_hook.TARGET]
    assert (hook_type, hook, source.plugin_name) == (HookType.AROUND, sglang_hook.around_forward, "perfsdk")
    assert sglang_hook.TARGET in HookRegistry._patched
    assert ModelRunner.forward.__wrapped__.__qualname__ == "ModelRunner.forward"  # SGLang's, wrapped


def cost(shape: StepShape, spec: ModelSpec = SPEC) -> tuple[str, float, int]:
    """(phase, bytes, tokens) of one step, from perfsdk.budget's formulas."""
    lens = list(shape.prefill_lens)
    if shape.phase == "prefill":
        return "prefill", budget.prefill_step_bytes(spec, lens, shape.prefill_cached), sum(lens)
    if shape.phase == "decode":
        return "decode", budget.decode_step_bytes(spec, shape.decode_context, shape.decode_tokens), shape.decode_tokens
    ctx = shape.decode_context + shape.prefill_cached
    return "mixed", budget.mixed_step_bytes(spec, lens, ctx, shape.decode_tokens), sum(lens) + shape.decode_tokens


def expected_series(spec: ModelSpec, ranks: tuple[str, ...] = ("",)) -> dict[tuple[str, str, str], float]:
    want: dict[tuple[str, str, str], float] = {}
    for shape in EXPECTED:
        if shape is None:
            continue
        phase, nbytes, tokens = cost(shape, spec)
        for rank in ranks:
            for name, v in (
                ("perfsdk_step_seconds_count", 1.0),
                ("perfsdk_step_tokens_total", tokens),
                ("perfsdk_step_bytes_total", nbytes),
            ):
                want[(name, phase, rank)] = want.get((name, phase, rank), 0) + v
    return want


def registry_series() -> dict[tuple[str, str, str], float]:
    out = {}
    for p in PHASES:
        for n in ("perfsdk_step_seconds_count", "perfsdk_step_tokens_total", "perfsdk_step_bytes_total"):
            out[(n, p, "")] = REGISTRY.get_sample_value(n, {"model": "tiny-llama", "phase": p}) or 0.0
    return out


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> cpu.CpuModelRunner:
    monkeypatch.setenv("PERFSDK_HARDWARE", "h100-sxm")
    monkeypatch.delenv("PERFSDK_METRICS_PORT", raising=False)
    load_plugins()
    return cpu.CpuModelRunner(cpu.scheduler_context(tmp_path))


def test_every_forward_is_one_step_sized_exactly_from_the_forward_batch(runner: cpu.CpuModelRunner) -> None:
    batches = cpu.workload()
    assert [sglang_hook.forward_shape(fb) for fb in batches] == EXPECTED
    before = registry_series()
    for fb in batches:
        runner.forward(fb)  # SGLang's ModelRunner.forward, with perfsdk's AROUND hook applied by HookRegistry
    assert runner.seen == ["EXTEND", "MIXED", "DECODE", "TARGET_VERIFY", "IDLE"]  # every forward ran
    hook = sglang_hook.hook_of(runner)
    assert hook is not None and (hook.steps, hook.skipped) == (4, 1)
    assert hook.monitor.model == SPEC and hook.monitor.hardware == hardware.resolve("h100-sxm")
    assert hook.monitor.flush(10)
    after = registry_series()
    got = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    want = expected_series(SPEC)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == pytest.approx(v), k
    assert hook.monitor.stats()["internal_errors"] == 0


def test_sglangs_errors_pass_through_and_perfsdks_stay_inside(
    runner: cpu.CpuModelRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runner.forward(cpu.batch("DECODE", [10]))
    hook = sglang_hook.hook_of(runner)
    assert hook is not None
    steps, errors = hook.steps, hook.monitor.stats()["internal_errors"]
    runner.fail_next = True
    with pytest.raises(RuntimeError, match="the model failed"):
        runner.forward(cpu.batch("DECODE", [10]))
    assert hook.steps == steps + 1  # recorded, as a failed step

    def broken(fb: object) -> StepShape:
        raise ValueError("perfsdk bug")

    monkeypatch.setattr(sglang_hook, "forward_shape", broken)
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        out = runner.forward(cpu.batch("DECODE", [10]))
    assert out.can_run_graph is False and runner.seen[-1] == "DECODE"  # the forward ran and returned
    assert hook.monitor.stats()["internal_errors"] == errors + 1
    assert "perfsdk internal error in sglang forward hook: step begin" in caplog.text


def test_a_draft_model_runner_is_not_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_HARDWARE", "h100-sxm")
    load_plugins()
    draft = cpu.CpuModelRunner(cpu.scheduler_context(tmp_path), is_draft_worker=True)
    draft.forward(cpu.batch("DECODE", [10]))
    assert draft.seen == ["DECODE"] and sglang_hook.hook_of(draft) is None


def test_another_sglang_version_gets_a_message_naming_the_range(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    import sglang

    instrumentor = sglang_hook.SglangForwardInstrumentor()
    assert instrumentor.dependency_problem({"sglang": "0.5.23"}) is None
    assert instrumentor.dependency_problem({"sglang": "0.5.30"}) is None
    for other in ("0.5.22", "0.6.0"):
        assert "sglang>=0.5.23,<0.6" in (instrumentor.dependency_problem({"sglang": other}) or "")
    load_plugins()
    sglang_hook.uninstall()
    before = len(HookRegistry._hooks[sglang_hook.TARGET])
    monkeypatch.setattr(sglang, "__version__", "0.7.0")  # what the installed SGLang reports
    try:
        with caplog.at_level(logging.WARNING, logger="perfsdk"):
            sglang_hook.install()
        assert not instrumentor.installed
        assert len(HookRegistry._hooks[sglang_hook.TARGET]) == before
        assert "sglang 0.7.0 is outside the range" in caplog.text and "sglang>=0.5.23,<0.6" in caplog.text
        assert "not installed" in caplog.text
        monkeypatch.setenv("PERFSDK_HARDWARE", "h100-sxm")
        runner = cpu.CpuModelRunner(cpu.scheduler_context(tmp_path))
        runner.forward(cpu.batch("DECODE", [10]))
        assert runner.seen == ["DECODE"] and "_perfsdk_hook" not in vars(runner)  # not hooked, nothing recorded
    finally:
        monkeypatch.undo()
        sglang_hook.install()
    assert instrumentor.installed


def test_install_is_idempotent_and_uninstall_stops_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's registry cannot take a hook back: uninstall makes perfsdk's pass every forward through and lets
    go of the runners' hooks; install again records again, with the hook still registered once."""
    monkeypatch.setenv("PERFSDK_HARDWARE", "h100-sxm")
    load_plugins()
    sglang_hook.install()
    sglang_hook.install()
    assert [h for _, h, _ in HookRegistry._hooks[sglang_hook.TARGET]] == [sglang_hook.around_forward]
    runner = cpu.CpuModelRunner(cpu.scheduler_context(tmp_path))
    runner.forward(cpu.batch("DECODE", [10]))
    hook = sglang_hook.hook_of(runner)
    assert hook is not None and hook.steps == 1
    try:
        sglang_hook.uninstall()
        sglang_hook.uninstall()
        assert not sglang_hook.SglangForwardInstrumentor().installed
        assert "_perfsdk_hook" not in vars(runner)  # the runner's hook let go of
        runner.forward(cpu.batch("DECODE", [10]))
        assert runner.seen == ["DECODE", "DECODE"] and hook.steps == 1  # ran, not recorded
        assert "_perfsdk_hook" not in vars(runner)
    finally:
        sglang_hook.install()
    runner.forward(cpu.batch("DECODE", [10]))
    again = sglang_hook.hook_of(runner)
    assert again is not None and again is not hook and again.steps == 1
    assert [h for _, h, _ in HookRegistry._hooks[sglang_hook.TARGET]] == [sglang_hook.around_forward]


def test_a_bad_perfsdk_setting_leaves_sglang_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("PERFSDK_HARDWARE", "no-such-gpu")
    monkeypatch.setattr(engine_common, "_MONITORS", {})
    load_plugins()
    runner = cpu.CpuModelRunner(cpu.scheduler_context(tmp_path))
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        runner.forward(cpu.batch("DECODE", [10]))
    assert runner.seen == ["DECODE"] and sglang_hook.hook_of(runner) is None
    assert "not hooked" in caplog.text and "no-such-gpu" in caplog.text


# ---- two tensor-parallel scheduler processes on SGLang's /metrics (sglang_server.py) ------------------------
@pytest.fixture(scope="module")
def sglang_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sglang")
    base = free_ports(2)  # rank r serves on PERFSDK_METRICS_PORT + r
    env = {
        **os.environ,
        "PERFSDK_HARDWARE": "h100-sxm",
        "PERFSDK_METRICS_PORT": str(base),
        "PERFSDK_PROFILER": "torch",
        "PERFSDK_PROFILE_DIR": str(tmp / "traces"),
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with running_script(Path(cpu.__file__).parent / "sglang_server.py", tmp, env, startup_s=240) as info:
        yield {**info, "port": base}


def test_each_rank_reaches_sglangs_metrics_with_its_own_share(sglang_server: dict[str, Any]) -> None:
    body = urllib.request.urlopen(sglang_server["metrics"], timeout=10).read().decode()
    got = {}
    for fam in text_string_to_metric_families(body):
        for smp in fam.samples:
            if smp.name.startswith("perfsdk_step_") and smp.labels.get("model") == "tiny-llama":
                got[(smp.name, smp.labels.get("phase", ""), smp.labels.get("rank", ""))] = smp.value
    want = expected_series(SPEC.with_tp(2), ranks=("0", "1"))
    for k, v in want.items():
        assert got.get(k) == pytest.approx(v), k
    assert sglang_server["ranks"] == [0, 1]


def test_the_profiler_window_is_triggered_per_rank_on_sglang(sglang_server: dict[str, Any]) -> None:
    def post(rank: int) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"http://127.0.0.1:{sglang_server['port'] + rank}/profile?steps=2", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post(1)[0] == 202
    code, body = post(1)
    assert code == 409 and body["reason"].startswith("busy")
    assert post(0)[0] == 202
