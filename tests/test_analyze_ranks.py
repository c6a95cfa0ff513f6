"""``perfsdk analyze rank0 rank1``: the straggler, who waits for it, and transfer vs waiting.

The GPU cases here are SYNTHETIC: Kineto-shaped traces built by :func:`tp_traces`, with the field
names torch.profiler writes (``user_annotation`` step ranges, ``cuda_runtime`` launches linked by
``correlation`` to ``kernel`` events on a stream, ``distributedInfo`` at the top) and real NCCL kernel
names (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``). The ranks are simulated in lockstep: each rank's
all-reduce kernel starts when its own compute ends and ends when the last rank has arrived plus the
transfer, which is how NCCL kernels look in real tensor-parallel traces. Real 2-GPU traces are owed
(docs/benchmarks.md, "Tensor parallelism"); real 2-rank CPU (gloo) traces are analysed in
tests/test_tensor_parallel.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from perfsdk.cli import main
from perfsdk.errors import ConfigError
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.ranks import STRAGGLER_MIN_WAIT_SHARE, analyze_ranks, compare_ranks

NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "nvjet_tst_64x8_64x16_4x1_v_bz_TNT"


def tp_traces(
    compute_us: list[float] | list[list[float]],
    *,
    transfer_us: float = 10.0,
    layers: int = 4,
    steps: int = 3,
    launch_gap_us: float = 0.0,
) -> list[list[dict[str, Any]]]:
    """SYNTHETIC traces of one decode step window on each rank.

    Rank r computes ``compute_us[r]`` per layer (one GEMM kernel; or ``compute_us[step][r]``, step by step),
    then all-reduces: its NCCL kernel starts when its GEMM ends and ends ``transfer_us`` after the last rank's
    GEMM ended. The host enqueues each step ahead of the GPU (no launch gaps) unless ``launch_gap_us`` is set.
    """
    per_step: list[list[float]] = [list(c) for c in compute_us if isinstance(c, list)] or [
        [float(c) for c in compute_us if not isinstance(c, list)]
    ] * steps
    world = len(per_step[0])
    out: list[list[dict[str, Any]]] = [[] for _ in range(world)]
    corr = [0] * world
    t = 0.0  # the GPU clock, shared: lockstep
    for compute in per_step:
        step_start = t
        kernels: list[list[tuple[str, float, float]]] = [[] for _ in range(world)]
        for _layer in range(layers):
            arrive = [t + launch_gap_us + c for c in compute]
            done = max(arrive) + transfer_us
            for r in range(world):
                kernels[r].append((GEMM, t + launch_gap_us, compute[r]))
                kernels[r].append((NCCL, arrive[r], done - arrive[r]))
            t = done
        for r in range(world):
            ev = out[r]
            host = step_start - 50.0  # the host enqueues the step before the GPU runs it
            ev.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": "perfsdk.decode",
                    "ts": host,
                    "dur": 40.0,
                    "pid": 100 + r,
                    "tid": 100 + r,
                }
            )
            for k, (name, ts, dur) in enumerate(kernels[r]):
                corr[r] += 1
                ev.append(
                    {
                        "ph": "X",
                        "cat": "cuda_runtime",
                        "name": "cudaLaunchKernel",
                        "ts": host + 1 + k,
                        "dur": 0.5,
                        "pid": 100 + r,
                        "tid": 100 + r,
                        "args": {"correlation": corr[r]},
                    }
                )
                ev.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": name,
                        "ts": ts,
                        "dur": dur,
                        "pid": r,
                        "tid": 7,
                        "args": {"correlation": corr[r], "stream": 7, "device": r},
                    }
                )
    return out


def write(
    tmp_path: Path, events: list[list[dict[str, Any]]], *, dist_info: bool = True, names: list[str] | None = None
) -> list[Path]:
    paths = []
    for r, ev in enumerate(events):
        doc: dict[str, Any] = {"traceEvents": ev, "schemaVersion": 1}
        if dist_info:
            doc["distributedInfo"] = {"backend": "nccl", "rank": r, "world_size": len(events)}
        p = tmp_path / (names[r] if names else f"synthetic-tp-{r}.pt.trace.json.gz")
        with gzip.open(p, "wt") as f:
            json.dump(doc, f)
        paths.append(p)
    return paths


def test_the_slow_rank_is_named_and_the_others_wait_for_it(tmp_path: Path) -> None:
    # rank 1 computes 30 µs a layer, rank 0 10 µs: rank 0 waits 20 µs in every all-reduce
    paths = write(tmp_path, tp_traces([10.0, 30.0]))
    diags, cmp = analyze_ranks(list(reversed(paths)))  # order given does not matter: ranks from the traces
    assert [d.trace.rank for d in diags if d.trace] == [1, 0]
    assert cmp.straggler == 1
    r0, r1 = cmp.rank(0), cmp.rank(1)
    # per step: 4 layers of (30 µs compute + 10 µs transfer) on the GPU clock
    assert r0.step_us == pytest.approx(160.0) and r1.step_us == pytest.approx(160.0)
    assert r1.comm_us == pytest.approx(40.0) and r0.comm_us == pytest.approx(120.0)
    assert cmp.transfer_us == pytest.approx(40.0)
    assert r0.wait_us == pytest.approx(80.0) and r0.wait_share == pytest.approx(0.5)
    assert r1.wait_us == 0 and r1.straggler_steps == 3 and r0.straggler_steps == 0
    assert r1.outside_us == pytest.approx(120.0) and r0.outside_us == pytest.approx(40.0)
    kinds = [f.kind for f in cmp.findings]
    assert kinds == ["straggler", "communication_bound"]  # 50% waiting, then 25% transfer
    assert cmp.findings[0].share == pytest.approx(0.5)
    assert "rank 1 spends 0.120 ms per step outside collectives" in cmp.findings[0].evidence
    assert "rank 0 0.080 ms (50%)" in cmp.findings[0].evidence
    assert cmp.findings[1].share == pytest.approx(0.25)
    # each trace alone: rank 0 looks communication-bound (75%), which the comparison explains as waiting
    assert diags[1].communication_share == pytest.approx(0.75)
    assert diags[1].findings[0].kind == "communication_bound"


def test_balanced_ranks_have_no_straggler(tmp_path: Path) -> None:
    _, cmp = analyze_ranks(write(tmp_path, tp_traces([30.0, 30.0], transfer_us=2.0)))
    assert cmp.straggler is None
    assert [r.wait_us for r in cmp.ranks] == [pytest.approx(0.0), pytest.approx(0.0)]
    assert cmp.findings == []  # 2 µs of 32 per layer is under the communication threshold
    assert "findings: none above thresholds" in cmp.format_report()


def test_a_small_imbalance_is_not_called_a_straggler(tmp_path: Path) -> None:
    # rank 1 is 2 µs slower a layer: rank 0 waits 2/32 of a step, under the threshold
    _, cmp = analyze_ranks(write(tmp_path, tp_traces([28.0, 30.0], transfer_us=2.0)))
    assert cmp.rank(0).wait_share < STRAGGLER_MIN_WAIT_SHARE
    assert cmp.straggler is None


def test_rank_ids_from_file_names_when_the_traces_carry_none(tmp_path: Path) -> None:
    names = [
        "perfsdk-host-11-rank1-20261201T000000.000Z.pt.trace.json.gz",
        "perfsdk-host-10-rank0-20261201T000000.000Z.pt.trace.json.gz",
    ]
    ev = tp_traces([30.0, 10.0])  # rank 0 (by position) is the slow one; written under the name rank1
    _, cmp = analyze_ranks(write(tmp_path, ev, dist_info=False, names=names))
    assert cmp.straggler == 1  # the file named rank1 holds the slow rank


def test_bad_inputs_say_what_is_wrong(tmp_path: Path) -> None:
    paths = write(tmp_path, tp_traces([10.0, 30.0]))
    with pytest.raises(ConfigError, match="two or more traces"):
        analyze_ranks(paths[:1])
    with pytest.raises(ConfigError, match="more than one trace of rank 0"):
        analyze_ranks([paths[0], paths[0]])
    with pytest.raises(ConfigError, match="2 rank ids for 3 traces"):
        compare_ranks([analyze_trace(p) for p in [*paths, paths[0]]], ranks=[0, 1])
    cpu = tmp_path / "cpu.json"
    cpu.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "user_annotation",
                        "name": "perfsdk.decode",
                        "ts": 0,
                        "dur": 10,
                        "pid": 1,
                        "tid": 1,
                    }
                ]
            }
        )
    )
    with pytest.raises(ConfigError, match="some traces have GPU events and some do not"):
        analyze_ranks([paths[0], cpu])


def test_unaligned_captures_are_compared_by_means_with_a_note(tmp_path: Path) -> None:
    ev = tp_traces([10.0, 30.0], steps=3)
    ev[0] = ev[0][: len(ev[0]) * 2 // 3]  # rank 0's trace holds two of the three steps
    _, cmp = analyze_ranks(write(tmp_path, ev))
    assert [r.steps for r in cmp.ranks] == [2, 3]
    assert cmp.notes and "different numbers of steps" in cmp.notes[0]
    assert cmp.straggler == 1 and cmp.rank(1).straggler_steps == 0  # no step-by-step count without alignment


def test_host_collectives_in_a_cpu_trace_are_counted_once_on_any_thread() -> None:
    """SYNTHETIC CPU-only trace shaped like gloo's: the step on the main thread, the collective in a
    ``gloo:all_reduce`` range on gloo's worker thread, a short ``c10d::allreduce_`` op inside the step."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "perfsdk.decode", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 20, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": 25, "dur": 2, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 26, "dur": 60, "pid": 1, "tid": 9},
        # after the step: not this step's
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "ts": 150, "dur": 10, "pid": 1, "tid": 9},
    ]
    d = analyze_trace(events)
    assert not d.has_gpu
    assert d.steps[0].host_comm_us == pytest.approx(61.0)  # [25, 86): the op and the range, overlap once
    assert d.communication_share == pytest.approx(0.61)
    assert "in collectives: 61% of step time" in d.format_report()


def test_cli_compares_ranks_as_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = [str(p) for p in write(tmp_path, tp_traces([10.0, 30.0]))]
    assert main(["analyze", *paths]) == 0
    out = capsys.readouterr().out
    assert "ranks: 2 traces, 3 steps each" in out
    assert [line.split()[0] for line in out.splitlines() if line.endswith("<- straggler")] == ["1"]
    assert main(["analyze", *paths, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["traces"]) == 2 and doc["ranks"]["straggler"] == 1
    assert [r["wait_share"] for r in doc["ranks"]["ranks"]] == [0.5, 0.0]
    assert main(["analyze", *paths, "--plot", str(tmp_path / "x.png")]) == 2
    assert "--plot" in capsys.readouterr().err


def test_waits_from_a_one_off_hiccup_do_not_name_a_straggler(tmp_path: Path) -> None:
    # rank 1 is slow in the first step only: on average rank 0 waits well over a tenth of a step, but rank 1
    # arrived last in one step of four
    per_step = [[10.0, 100.0], [30.0, 30.0], [30.0, 30.0], [30.0, 30.0]]
    _, cmp = analyze_ranks(write(tmp_path, tp_traces(per_step, layers=1)))
    assert cmp.rank(0).wait_share > STRAGGLER_MIN_WAIT_SHARE
    assert (cmp.rank(1).straggler_steps, cmp.rank(0).straggler_steps) == (1, 0)  # tied steps credit nobody
    assert cmp.straggler is None and "straggler" not in [f.kind for f in cmp.findings]
    assert "one-off hiccups, not a straggler" in cmp.notes[0]
