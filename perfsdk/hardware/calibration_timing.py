"""Timing the copy and the GEMMs behind :func:`perfsdk.hardware.calibrate`: rounds of rates, no verdict.

Each function takes the imported ``torch`` module from its caller (importing this module imports no
torch) and returns rates per *figure*: ``"copy"`` in bytes read + written per second, and one GEMM
rate in FLOP/s per dtype key (``"fp32"``, ``"bf16"``, ``"fp16"``). What the rates are worth (median,
spread, plausibility) is decided in :mod:`perfsdk.hardware.calibration`.

* :func:`measure_cpu` sizes the GEMMs to a time budget, warms everything up, then runs *rounds* rounds;
  each round times one copy and one GEMM per dtype, in turn. Interleaved on purpose: a neighbour process
  that takes the cores for a second slows a few rounds of every figure, which shows as spread, instead of
  every round of one figure, which would look steady and be wrong.
* :func:`measure_cuda` warms each figure up by time, then times *rounds* launches with CUDA events.
* :func:`probe_cpu` / :func:`probe_cuda` time the same operations a few times at a small size and keep
  the best rate, well under a second in all: a rate achieved once is achievable, so a probe that beats
  a cached ceiling proves that ceiling wrong.

A rate whose timing came out zero (a timer that did not advance) is ``inf``; the caller refuses it.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Clock", "Progress", "Samples", "measure_cpu", "measure_cuda", "probe_cpu", "probe_cuda"]

log = logging.getLogger(__name__)

#: A monotonic clock in nanoseconds (``time.perf_counter_ns``); the CPU's timer.
Clock = Callable[[], int]

# The largest GEMM a probe runs: 512³ fp32 is ~1-20 ms on a CPU core pair, so three tries of each dtype
# stay well under a second; on a GPU 4096³ is a fraction of a millisecond.
_PROBE_N_CPU = 512
_PROBE_N_GPU = 4096
_PROBE_COPY_GPU = 256 * 2**20  # far beyond any GPU's L2 (50-60 MB), so the copy still reads memory
_PROBE_TRIES = 3


@dataclass
class Samples:
    """Rates per figure, one per round, and how they were measured (sizes, rounds)."""

    rates: dict[str, list[float]]
    details: dict[str, Any]


class Progress:
    """A tqdm bar on an interactive terminal, nothing otherwise."""

    def __init__(self, total: int, desc: str = "calibrate") -> None:
        self._bar: Any = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm  # optional, only for people watching

                self._bar = tqdm(total=total, desc=desc, leave=False)
            except ImportError:
                pass

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(what)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _rate(work: float, seconds: float) -> float:
    return work / seconds if seconds > 0 else math.inf


def _copier(src: Any) -> Callable[[], object]:
    """``dst.copy_(src)`` as a callable; the buffers are freed with it."""
    dst = src.new_empty(src.shape)

    def copy() -> object:
        return dst.copy_(src)

    return copy


def _multiplier(torch: Any, a: Any, b: Any, out: Any = None) -> Callable[[], object]:
    """``a @ b`` as a callable (into *out* when given, so no allocation is timed on a GPU)."""

    def multiply() -> object:
        return torch.matmul(a, b) if out is None else torch.matmul(a, b, out=out)

    return multiply


def _gemm_dtypes(torch: Any) -> dict[str, Any]:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------------------------------------- CPU


def _cpu_seconds(clock: Clock) -> Callable[[Callable[[], object]], float]:
    def seconds(fn: Callable[[], object]) -> float:
        t0 = clock()
        fn()
        return (clock() - t0) / 1e9

    return seconds


def measure_cpu(torch: Any, *, size_mb: int, quick: bool, rounds: int, clock: Clock, progress: Progress) -> Samples:
    """Rounds of a float32 copy of *size_mb* MiB and fp32 (and bf16, where it runs) GEMMs, interleaved."""
    seconds = _cpu_seconds(clock)
    gemm_budget_s = 0.05 if quick else 0.3  # per multiply; sizes adapt so slow CPUs still finish fast
    gen = torch.Generator().manual_seed(0)
    n_elems = size_mb * 2**20 // 4
    ops: dict[str, tuple[Callable[[], object], float]] = {
        "copy": (_copier(torch.randn(n_elems, dtype=torch.float32, generator=gen)), 2.0 * n_elems * 4)
    }
    sizes: dict[str, int] = {}
    for key in ("fp32", "bf16"):
        dtype = _gemm_dtypes(torch)[key]
        try:
            # time a small multiply, then pick the size the budget allows (a CPU without native bf16 may
            # be 50x slower than with it)
            probe_n = 256
            a = torch.randn(probe_n, probe_n, generator=gen).to(dtype)
            small = _multiplier(torch, a, a)
            small()
            rate = _rate(2 * probe_n**3, statistics.median(seconds(small) for _ in range(3)))
            n = int((gemm_budget_s * rate / 2) ** (1 / 3)) // 128 * 128 if math.isfinite(rate) else probe_n
            n = max(probe_n, min(n, 2048 if quick else 4096))
            a = torch.randn(n, n, generator=gen).to(dtype)
            b = torch.randn(n, n, generator=gen).to(dtype)
            ops[key] = (_multiplier(torch, a, b), 2.0 * n**3)
            sizes[key] = n
        except RuntimeError as e:  # a build without bf16 matmul on this CPU
            log.debug("calibrate: %s matmul on CPU failed: %s", key, e)
        progress.step(f"size {key}")
    for fn, _ in ops.values():
        fn()  # warm-up: first-touch page faults, thread-pool start-up, the GEMM's packing buffers
    rates: dict[str, list[float]] = {key: [] for key in ops}
    for r in range(rounds):
        for key, (fn, work) in ops.items():
            rates[key].append(_rate(work, seconds(fn)))
        progress.step(f"round {r + 1}/{rounds}")
    return Samples(rates, {"copy_bytes": n_elems * 4, "gemm_n": sizes, "rounds": rounds})


def probe_cpu(torch: Any, *, copy_bytes: int, gemm_n: Mapping[str, int], clock: Clock) -> dict[str, float]:
    """The best of a few short runs: a copy of *copy_bytes* and GEMMs of each dtype in *gemm_n* (at most 512³).

    The copy keeps the calibration's size: a smaller buffer could fit in the CPU's last-level cache and
    read faster than memory, which would "prove" a true ceiling wrong.
    """
    seconds = _cpu_seconds(clock)
    gen = torch.Generator().manual_seed(1)
    n_elems = max(1, copy_bytes // 4)
    # ones, not randn: a copy's speed does not depend on the values, and filling 256 MiB with random
    # numbers would cost more than the probe itself
    ops: dict[str, tuple[Callable[[], object], float]] = {
        "copy": (_copier(torch.ones(n_elems, dtype=torch.float32)), 2.0 * n_elems * 4)
    }
    dtypes = _gemm_dtypes(torch)
    for key, size in gemm_n.items():
        if key in dtypes:
            n = min(int(size), _PROBE_N_CPU)
            a = torch.randn(n, n, generator=gen).to(dtypes[key])
            ops[key] = (_multiplier(torch, a, a), 2.0 * n**3)
    return {key: max(_rate(work, seconds(fn)) for _ in range(_PROBE_TRIES)) for key, (fn, work) in ops.items()}


# --------------------------------------------------------------------------------------------- CUDA


def _cuda_seconds(torch: Any) -> Callable[[Callable[[], object]], float]:
    def seconds(fn: Callable[[], object]) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3

    return seconds


def measure_cuda(torch: Any, dev: Any, *, size_mb: int, quick: bool, rounds: int, progress: Progress) -> Samples:
    """A device-to-device copy of *size_mb* MiB, then 8192³ (``quick``: 4096³) bf16, fp16, fp32 GEMMs.

    Each figure is warmed up, then timed *rounds* times with CUDA events, one figure after the other.
    """
    # Warm up by time, not by count: an idle GPU sits at a low clock (345 MHz on an idle H200) and
    # the copy, which runs first, brings it to its boost clock. The GEMMs then get a short warm-up
    # only: seconds of back-to-back 8192³ GEMMs hit the power limit and measure a throttled rate
    # (~680 instead of ~750 TFLOP/s on an H200), lower than what a prefill burst sees. For the same
    # reason the figures are not interleaved as on a CPU: a copy between GEMMs changes the clocks
    # each GEMM starts from.
    seconds = _cuda_seconds(torch)

    def bench(fn: Callable[[], object], work: float, warmup_s: float) -> list[float]:
        spent, runs = 0.0, 0
        while spent < warmup_s or runs < 3:
            spent += seconds(fn)
            runs += 1
        return [_rate(work, seconds(fn)) for _ in range(rounds)]

    rates: dict[str, list[float]] = {}
    with torch.cuda.device(dev):
        n_bytes = size_mb * 2**20
        buffer = torch.empty(n_bytes, dtype=torch.uint8, device=dev).random_()
        rates["copy"] = bench(_copier(buffer), 2.0 * n_bytes, warmup_s=0.1 if quick else 0.5)
        del buffer
        progress.step("copy")

        n = 4096 if quick else 8192
        gen = torch.Generator(device=dev).manual_seed(0)
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 here, not tf32
        try:
            for key in ("bf16", "fp16", "fp32"):
                dtype = _gemm_dtypes(torch)[key]
                a = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
                b = torch.randn(n, n, device=dev, dtype=dtype, generator=gen)
                out = torch.empty(n, n, device=dev, dtype=dtype)
                rates[key] = bench(_multiplier(torch, a, b, out), 2.0 * n**3, warmup_s=0.02)
                del a, b, out
                progress.step(key)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    sizes = dict.fromkeys(("bf16", "fp16", "fp32"), n)
    return Samples(rates, {"copy_bytes": n_bytes, "gemm_n": sizes, "rounds": rounds})


def probe_cuda(torch: Any, dev: Any, *, copy_bytes: int, gemm_n: Mapping[str, int]) -> dict[str, float]:
    """The best of a few short runs on the GPU: a copy (at most 256 MiB) and GEMMs (at most 4096³)."""
    seconds = _cuda_seconds(torch)
    out: dict[str, float] = {}
    with torch.cuda.device(dev):
        n_bytes = max(1, min(copy_bytes, _PROBE_COPY_GPU))
        buffer = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
        copy = _copier(buffer)
        out["copy"] = max(_rate(2.0 * n_bytes, seconds(copy)) for _ in range(_PROBE_TRIES))
        del buffer, copy
        dtypes = _gemm_dtypes(torch)
        gen = torch.Generator(device=dev).manual_seed(1)
        old_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # as measured
        try:
            for key, size in gemm_n.items():
                if key in dtypes:
                    n = min(int(size), _PROBE_N_GPU)
                    # random data, as measured: a GEMM of constants draws less power and runs faster
                    a = torch.randn(n, n, device=dev, dtype=dtypes[key], generator=gen)
                    c = torch.empty(n, n, device=dev, dtype=dtypes[key])
                    multiply = _multiplier(torch, a, a, c)
                    out[key] = max(_rate(2.0 * n**3, seconds(multiply)) for _ in range(_PROBE_TRIES))
                    del a, c, multiply
        finally:
            torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return out
