"""A real 2-process tensor-parallel run on CPU (torch.distributed, gloo), scraped by a real Prometheus.

Two processes (``tests/tp_worker.py``) join a gloo process group with explicit ranks, each with a
Monitor (``rank="auto"``) serving ``/metrics`` on its own port, and step a column/row-parallel stack
with an all-reduce after every row-parallel matmul; rank 1 is given extra work in every step. A real
Prometheus scrapes both ports with ``integrations/grafana/perfsdk-rules.yml`` loaded. Checked:

- each rank's series carry its rank, and the step counts per rank in Prometheus are exact;
- the per-rank and fleet MBU recording rules (and the dashboard's per-rank MBU query) give what the
  ranks' own counters say;
- both ranks captured the same steps (``mon.profile(steady=False)`` at the same step), and
  ``perfsdk analyze rank0 rank1`` names rank 1 as the straggler and rank 0 as waiting for it; the
  ``PerfsdkStraggler`` alert fires for rank 1 from the ranks' exported communication shares;
- a rank that stops is not silent: ``up`` drops for its port, ``PerfsdkRankDown`` goes pending for it,
  the dashboard's "targets up" panel shows it down.

The tests of this module share one run (a module fixture) and run in file order; the last one stops rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_server import PROMETHEUS, PROMTOOL, free_port, free_ports, query, running_prometheus

pytest.importorskip("torch")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None or PROMTOOL is None, reason="the prometheus binary is not installed (apt install prometheus)"
    ),
]

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "tp_worker.py"
RULES = ROOT / "integrations" / "grafana" / "perfsdk-rules.yml"
STEPS = 30
PROFILE_AT, PROFILE_STEPS = 5, 3
STRAGGLER = 1


@dataclass
class Run:
    dir: Path
    prom: str
    ports: dict[int, int]
    procs: dict[int, subprocess.Popen[bytes]]
    done: dict[int, dict[str, Any]] = field(default_factory=dict)

    def instance(self, rank: int) -> str:
        return f"127.0.0.1:{self.ports[rank]}"

    def log(self, rank: int) -> str:
        return (self.dir / f"rank{rank}.log").read_text()[-3000:]


def _result(prom: str, promql: str) -> list[dict[str, Any]]:
    body = query(prom, promql)
    if body.get("status") != "success":  # e.g. a 503 while Prometheus starts: _eventually asks again
        raise ValueError(f"{promql}: Prometheus answered {body}")
    return list(body["data"]["result"])


def _by_rank(prom: str, promql: str) -> dict[str, float]:
    return {r["metric"].get("rank", ""): float(r["value"][1]) for r in _result(prom, promql)}


def _eventually(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll *check* until it returns something truthy (Prometheus scrapes and evaluates every second)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, ValueError) as e:  # Prometheus not listening, or not ready, yet
            last = e
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.25)
    raise AssertionError(f"{what}: not seen in {timeout:.0f} s (last: {last!r})")


def _panel_query(title: str, ref: str) -> str:
    """A query of the committed dashboard JSON, its variables set to match everything."""
    dash = json.loads((ROOT / "integrations" / "grafana" / "perfsdk-dashboard.json").read_text())
    (panel,) = [p for p in dash["panels"] if p.get("title") == title]
    (expr,) = [t["expr"] for t in panel["targets"] if t["refId"] == ref]
    return str(expr).replace("$model", ".*").replace("$instance", ".*")


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A rank's own /metrics, parsed: {(sample name, sorted labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _one(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    d = tmp_path_factory.mktemp("tp")
    # no RANK/WORLD_SIZE/LOCAL_RANK: the Monitor must find its rank through the initialised process group
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PROMETHEUS_MULTIPROC_DIR")
    }
    init = f"tcp://127.0.0.1:{free_port()}"
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for r in (0, 1):
            with (d / f"rank{r}.log").open("wb") as log:
                procs[r] = subprocess.Popen(
                    [
                        sys.executable,
                        str(WORKER),
                        "--rank",
                        str(r),
                        "--world",
                        "2",
                        "--init",
                        init,
                        "--dir",
                        str(d),
                        "--steps",
                        str(STEPS),
                        "--straggler",
                        str(STRAGGLER),
                        "--profile-at",
                        str(PROFILE_AT),
                        "--profile-steps",
                        str(PROFILE_STEPS),
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=ROOT,
                )

        def ports() -> dict[int, int] | None:
            for r, p in procs.items():
                assert p.poll() is None, (d / f"rank{r}.log").read_text()[-3000:]
            files = [d / f"port{r}" for r in (0, 1)]
            return {r: int(f.read_text()) for r, f in enumerate(files)} if all(f.exists() for f in files) else None

        port = _eventually("both ranks serving /metrics", ports, timeout=180)
        with running_prometheus(
            d, job="tp", targets=[f"127.0.0.1:{port[r]}" for r in (0, 1)], rule_files=[RULES]
        ) as prom:
            r = Run(d, prom.url, port, procs)
            # the ranks step only once Prometheus holds their zeros: rates then cover every step exactly
            _eventually(
                "a first scrape of both ranks",
                lambda: len(_by_rank(prom.url, 'perfsdk_step_seconds_count{job="tp", phase="decode"} == 0')) == 2,
            )
            (d / "go").write_text("go")
            for rank in (0, 1):
                done = d / f"done{rank}.json"
                _eventually(
                    f"rank {rank} done",
                    lambda done=done, rank=rank: (
                        done.exists() or (procs[rank].poll() is not None and pytest.fail(r.log(rank)))
                    ),
                    timeout=240,
                )
                r.done[rank] = json.loads(done.read_text())
            yield r
    finally:
        for rank, p in procs.items():
            (d / f"stop{rank}").write_text("stop")
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_each_rank_is_labelled_and_counted_exactly_from_a_real_scrape(run: Run) -> None:
    for rank in (0, 1):
        assert run.done[rank]["decode_steps"] == STEPS, run.log(rank)
    # the final scrape: exactly STEPS decode steps per rank, each series with its rank label
    counts = _eventually(
        "the final counts",
        lambda: (
            (c := _by_rank(run.prom, 'perfsdk_step_seconds_count{job="tp", phase="decode"}'))
            == {"0": STEPS, "1": STEPS}
            and c
        ),
    )
    assert counts == {"0": float(STEPS), "1": float(STEPS)}
    from tp_worker import BATCH, CONFIG, CONTEXT

    from perfsdk.budget import decode_step_bytes
    from perfsdk.model import ModelSpec

    per_step = decode_step_bytes(ModelSpec.from_hf_config(CONFIG).with_tp(2), CONTEXT, BATCH)
    assert _by_rank(run.prom, 'perfsdk_step_tokens_total{job="tp", phase="decode"}') == {
        "0": STEPS * BATCH,
        "1": STEPS * BATCH,
    }
    assert _by_rank(run.prom, 'perfsdk_step_bytes_total{job="tp", phase="decode"}') == {
        "0": STEPS * per_step,
        "1": STEPS * per_step,
    }
    # which rank is on which port: the label agrees with the process that served it
    for rank in (0, 1):
        up = _result(run.prom, f'perfsdk_step_seconds_count{{instance="{run.instance(rank)}", phase="decode"}}')
        assert [s["metric"]["rank"] for s in up] == [str(rank)]


def test_per_rank_and_fleet_mbu_rules_agree_with_the_ranks_own_counters(run: Run) -> None:
    own: dict[str, tuple[float, float, float]] = {}
    for rank in (0, 1):
        s = _scrape(run.ports[rank])
        own[str(rank)] = (
            _one(s, "perfsdk_step_bytes_total", phase="decode"),
            _one(s, "perfsdk_step_seconds_sum", phase="decode"),
            _one(s, "perfsdk_hardware_peak_bandwidth_bytes"),
        )
    expected = {r: b / sec / peak for r, (b, sec, peak) in own.items()}

    def per_rank() -> dict[str, float] | None:
        got = _by_rank(run.prom, 'perfsdk:decode_mbu:ratio_rate5m{job="tp"}')
        # rules lag the last scrape by up to an evaluation: wait until they hold the final values
        ok = got.keys() == expected.keys() and all(got[r] == pytest.approx(expected[r], rel=1e-9) for r in got)
        return got if ok else None

    got = _eventually("per-rank MBU from the final counters", per_rank)
    assert all(0 < v < 1 for v in got.values())
    # the fleet: all bytes over all GPU-seconds at each GPU's peak. rate() extrapolates each target over
    # its own scrape times, so the fleet ratio of two targets is exact only up to that (~1e-3 here).
    fleet = _result(run.prom, 'perfsdk:decode_mbu:fleet_ratio_rate5m{job="tp"}')
    exact = sum(b for b, _, _ in own.values()) / sum(sec * peak for _, sec, peak in own.values())
    assert [s["metric"] for s in fleet] == [
        {"__name__": "perfsdk:decode_mbu:fleet_ratio_rate5m", "job": "tp", "model": "tp-test"}
    ]
    assert float(fleet[0]["value"][1]) == pytest.approx(exact, rel=1e-2)
    # the dashboard's per-rank MBU panel query gives the same per-rank values
    promql = _panel_query("Decode MBU by rank", "A").replace("$__rate_interval", "5m")
    panel = {r["metric"]["rank"]: float(r["value"][1]) for r in _result(run.prom, promql)}
    assert panel == pytest.approx(expected, rel=1e-9)


def test_the_same_steps_are_captured_on_both_ranks_and_analyze_names_the_straggler(
    run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    from perfsdk.cli import main
    from perfsdk.profiling.ranks import analyze_ranks

    traces = [run.done[r]["trace"] for r in (0, 1)]
    assert all(traces) and not [run.done[r]["error"] for r in (0, 1) if run.done[r]["error"]], run.done
    diagnoses, cmp = analyze_ranks(traces)
    # one step window, the same steps: the profiler started at the step after the trigger on both ranks
    assert [d.trace.rank for d in diagnoses if d.trace] == [0, 1]  # from torch.profiler's distributedInfo
    assert [len(d.steps) for d in diagnoses] == [PROFILE_STEPS, PROFILE_STEPS]
    assert cmp.straggler == STRAGGLER
    waiting = cmp.rank(0)
    assert waiting.wait_share >= 0.1 and waiting.comm_us > cmp.rank(STRAGGLER).comm_us
    assert cmp.rank(STRAGGLER).straggler_steps == PROFILE_STEPS
    assert cmp.findings[0].kind == "straggler"
    capsys.readouterr()
    assert main(["analyze", *traces]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.endswith("<- straggler"))
    assert row.split()[0] == str(STRAGGLER)
    assert "1. straggler (" in out and f"rank {STRAGGLER} spends" in out


def test_prometheus_names_the_straggler_from_the_ranks_profiles(run: Run) -> None:
    shares = _by_rank(run.prom, 'perfsdk_profile_communication_fraction{job="tp"}')
    assert set(shares) == {"0", "1"} and shares["0"] > shares["1"]
    wait = _eventually(
        "the collective-wait rule", lambda: _by_rank(run.prom, 'perfsdk:profile_collective_wait:share{job="tp"}')
    )
    assert wait["1"] == 0 and wait["0"] == pytest.approx(shares["0"] - shares["1"])
    alerts = _eventually(
        "PerfsdkStraggler firing",
        lambda: _result(run.prom, 'ALERTS{alertname="PerfsdkStraggler", alertstate="firing"}'),
    )
    assert [(a["metric"]["rank"], a["metric"]["instance"]) for a in alerts] == [
        (str(STRAGGLER), run.instance(STRAGGLER))
    ]


def test_a_rank_that_stops_is_visible(run: Run) -> None:
    # before: both targets up, no alert
    assert _result(run.prom, 'ALERTS{alertname="PerfsdkRankDown"}') == []
    (run.dir / "stop1").write_text("stop")
    run.procs[1].wait(60)
    down = _eventually(
        "PerfsdkRankDown for the stopped rank", lambda: _result(run.prom, 'ALERTS{alertname="PerfsdkRankDown"}')
    )
    assert [(a["metric"]["instance"], a["metric"]["alertstate"]) for a in down] == [(run.instance(1), "pending")]
    panel = {r["metric"]["instance"]: r["value"][1] for r in _result(run.prom, _panel_query("perfsdk targets up", "A"))}
    assert panel == {run.instance(0): "1", run.instance(1): "0"}


# ------------------------------------------------------------------ benchmarks/tensor_parallel.py on CPU
def test_the_tensor_parallel_benchmark_runs_end_to_end_on_cpu_under_torchrun(tmp_path: Path) -> None:
    """The 2-GPU benchmark's code path short of the GPU: torchrun, gloo, a tiny shape, eager only."""
    out = tmp_path / "tp.json"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(ROOT / "benchmarks" / "tensor_parallel.py"),
            "--device",
            "cpu",
            "--out",
            str(out),
            "--steps",
            "6",
            "--warmup",
            "2",
            "--batches",
            "1,2",
            "--profile-steps",
            "2",
            # extra work of two healthy steps on rank 1: the other waits about two thirds of each step
            "--straggler-fraction",
            "2.0",
        ],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["world_size"] == 2 and [e["rank"] for e in res["environment"]] == [0, 1]
    assert all(e["backend"] == "gloo" and e["torch"] for e in res["environment"])
    # each rank is costed against its share: half the weights of the whole model
    import importlib.util

    from perfsdk.model import ModelSpec

    spec = importlib.util.spec_from_file_location("tensor_parallel", ROOT / "benchmarks" / "tensor_parallel.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["tensor_parallel"] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    whole = ModelSpec.from_hf_config(bench.SHAPES["tiny"].hf_config("float32"))
    assert res["model"]["per_rank_spec"]["weight_bytes"] == pytest.approx(whole.weight_bytes / 2)
    assert [(c["mode"], c["batch"]) for c in res["configs"]] == [("eager", 1), ("eager", 2)]
    for c in [*res["configs"], *res["straggler_runs"]]:
        assert [r["rank"] for r in c["ranks"]] == [0, 1]
        for r in c["ranks"]:
            assert r["steps"] == 6 and r["step_ms_perfsdk_mean"] > 0 and r["mbu_perfsdk_mean"] > 0
            assert r["profile"]["error"] is None and Path(r["profile"]["trace"]).exists()
        # the same steps captured on both ranks; each step's communication share per rank
        assert [r["steps"] for r in c["comparison"]["ranks"]] == [2, 2]
        assert {k: len(v) for k, v in c["comm_share_per_step"].items()} == {"0": 2, "1": 2}
    (straggler,) = res["straggler_runs"]
    assert straggler["straggler_rank"] == 1 and straggler["ranks"][1]["extra_repeats"] > 0
    assert straggler["named_straggler"] == 1, straggler["comparison_report"]
    assert "<- straggler" in straggler["comparison_report"]
    waiting = straggler["comparison"]["ranks"][0]
    assert waiting["rank"] == 0 and waiting["wait_share"] >= 0.1


# ------------------------------------------------------------------ one /metrics per rank: why, and how
def test_perfsdk_metrics_port_gives_each_local_rank_its_own_port() -> None:
    """torchrun starts every rank with the same environment: PERFSDK_METRICS_PORT is the base, LOCAL_RANK
    the offset, so the ranks of a host do not fight over one port."""
    base = free_ports(2)
    code = (
        "import perfsdk; m = perfsdk.Monitor(hardware=None, otel=False, nvtx=False); "
        "print(m.serve_metrics().port); m.close()"
    )
    got = []
    for local in ("0", "1"):
        env = {**os.environ, "PERFSDK_METRICS_PORT": str(base), "LOCAL_RANK": local, "WORLD_SIZE": "2", "RANK": local}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert out.returncode == 0, out.stderr
        got.append(int(out.stdout.split()[0]))
    assert got == [base, base + 1]
    env = {**os.environ, "PERFSDK_METRICS_PORT": "ninety", "LOCAL_RANK": "1"}
    bad = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert bad.returncode != 0
    assert "PERFSDK_METRICS_PORT (environment): expected an integer" in bad.stderr and "'ninety'" in bad.stderr


def test_with_a_multiprocess_directory_a_dead_rank_is_silent(tmp_path: Path) -> None:
    """Why docs/metrics.md recommends one port per rank: behind PROMETHEUS_MULTIPROC_DIR both ranks are
    served from one endpoint (apart by their rank label), and a rank whose process has exited keeps being
    served with its last values -- nothing tells Prometheus it is gone."""
    mp = tmp_path / "mp"
    mp.mkdir()
    worker = (
        "import perfsdk\n"
        "mon = perfsdk.Monitor(hardware=None, otel=False, nvtx=False, model_name='tp', timing='host')\n"
        "for _ in range(STEPS):\n"
        "    with mon.decode(batch=1, context_tokens=8):\n"
        "        pass\n"
        "mon.close()\n"
    )
    for rank, steps in ((0, 5), (1, 3)):
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp), "WORLD_SIZE": "2", "RANK": str(rank)}
        subprocess.run([sys.executable, "-c", worker.replace("STEPS", str(steps))], env=env, check=True, timeout=120)
    read = (
        "from perfsdk.sinks.prometheus import multiprocess_registry\n"
        "reg = multiprocess_registry()\n"
        "for r in ('0', '1'):\n"
        "    print(reg.get_sample_value('perfsdk_step_seconds_count', {'model': 'tp', 'phase': 'decode', "
        "'rank': r}))\n"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(mp)}
    out = subprocess.run(
        [sys.executable, "-c", read], env=env, capture_output=True, text=True, timeout=120, check=True
    ).stdout.split()
    # both processes have exited, yet both ranks' counts are still served, as if alive
    assert [float(v) for v in out] == [5.0, 3.0]
