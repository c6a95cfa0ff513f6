"""Measuring the ceilings: :func:`calibrate`, and :func:`calibrated_spec`, what a Monitor or the demo uses.

::

    cal = hw.calibrate()                         # "auto", "cpu" or "cuda[:N]"; cached while usable
    cal = hw.calibrate("cpu", cache=False)       # measure, read and write no file
    spec, note = hw.calibrated_spec("cpu")       # the calibration as a spec, or the fallback, and which

How a calibration is measured: each figure (copy; one GEMM per dtype) in rounds, 5 (``quick``) or 9 on a
CPU and 10 or 20 on a GPU; the figure is the median of its rounds and its spread is kept. A result that
is not usable (:mod:`perfsdk.hardware.calibration` lists the rules and thresholds) is measured once more
with twice the rounds; if that is not usable either, :func:`calibrate` returns it, with its problems, and
neither caches it nor lets it become a spec.

What perfsdk uses instead: :func:`calibrated_spec` (and so ``Monitor(hardware="calibrate")``, the demo,
the ladder) logs one warning naming the figure and the bound it broke, and falls back to the GPU's
datasheet row (a GPU in the table) or to no spec (a CPU, an unknown GPU): MBU and MFU are off then
rather than wrong.

A cached calibration is used only while :mod:`perfsdk.hardware.calibration_cache` allows it (format,
machine, age, checks), and only if a short probe does not prove it wrong: the best of three copies of
the calibration's size and three small GEMMs per dtype (well under a second on a CPU, milliseconds on a
GPU). A probe rate above :data:`PROBE_MARGIN` (1.5 ×) a cached figure cannot come from a machine whose
ceiling that figure is, so the file is discarded and the device measured again. (Small GEMMs run below
the large ones' rate and a probe's best of three reads at most ~15 % above a median on a quiet machine,
so 1.5 × is past a probe's own noise; the cache of issue 19, 1.4 GFLOP/s on a CPU doing ~100, is 70 ×.)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
from datetime import datetime, timezone
from typing import Any

import perfsdk.hardware.calibration_cache as cache_files
from perfsdk.errors import ConfigError
from perfsdk.hardware.calibration import Calibration, Spread, format_rate, label, unit
from perfsdk.hardware.calibration_timing import Clock, Progress, measure_cpu, measure_cuda, probe_cpu, probe_cuda
from perfsdk.hardware.datasheets import HardwareSpec
from perfsdk.hardware.detection import cpu_name, cuda_index, device_info, memory_bytes

__all__ = ["PROBE_MARGIN", "ROUNDS", "calibrate", "calibrated_spec"]

log = logging.getLogger(__name__)

#: A probe rate above this multiple of a cached figure proves the cached figure wrong.
PROBE_MARGIN = 1.5
#: Rounds per figure by (backend, quick); an unusable result is measured once more with twice as many.
ROUNDS = {("cpu", True): 5, ("cpu", False): 9, ("cuda", True): 10, ("cuda", False): 20}


def _machine(torch: Any, dev: Any, backend: str, threads: int) -> dict[str, Any]:
    """Where a calibration is measured: what must match for a cached one to be used, and context."""
    info = device_info(cuda_index(torch, str(dev))) if backend != "cpu" else {}
    return {
        "hostname": platform.node(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "memory_bytes": memory_bytes(torch, dev),
        "cuda_version": getattr(torch.version, "cuda", None),
        "hip_version": getattr(torch.version, "hip", None),
        "driver": info.get("driver"),  # NVML's, where pynvml is installed
        "python": platform.python_version(),
    }


def _disproved(torch: Any, dev: Any, cal: Calibration, clock: Clock) -> list[str]:
    """The cached figures a short probe beats by more than PROBE_MARGIN (empty: none, or no probe ran)."""
    sizes = cal.details.get("gemm_n")
    gemm_n = {k: int(v) for k, v in sizes.items() if k in cal.flops} if isinstance(sizes, dict) else {}
    copy_bytes = int(cal.details.get("copy_bytes") or 64 * 2**20)
    try:
        if cal.backend == "cpu":
            rates = probe_cpu(torch, copy_bytes=copy_bytes, gemm_n=gemm_n, clock=clock)
        else:
            rates = probe_cuda(torch, dev, copy_bytes=copy_bytes, gemm_n=gemm_n)
    except Exception as e:  # out of memory, a busy device: no proof either way, keep the cache
        log.debug("perfsdk: calibration probe failed: %s", e)
        return []
    wrong = []
    for key, rate in rates.items():
        cached = cal.figures.get(key)
        if cached and rate > PROBE_MARGIN * cached:
            wrong.append(f"{label(key)}: the cache says {format_rate(cached, unit(key))}, a probe just measured "
                         f"{format_rate(rate, unit(key))} ({rate / cached:.1f}x)")  # fmt: skip
    return wrong


def _measure(
    torch: Any, dev: Any, *, backend: str, device_name: str, size_mb: int | None, quick: bool, rounds: int,
    clock: Clock, machine: dict[str, Any],
) -> Calibration:  # fmt: skip
    if backend == "cpu":
        progress = Progress(total=2 + rounds)
        try:
            samples = measure_cpu(
                torch, size_mb=size_mb or (64 if quick else 256), quick=quick, rounds=rounds, clock=clock,
                progress=progress,
            )  # fmt: skip
        finally:
            progress.close()
    else:
        progress = Progress(total=4)
        try:
            samples = measure_cuda(
                torch, dev, size_mb=size_mb or (256 if quick else 1024), quick=quick, rounds=rounds, progress=progress
            )
        finally:
            progress.close()
    spread = {key: Spread.of(rates) for key, rates in samples.rates.items() if rates}
    details = {**samples.details, "threads": machine["threads"]}
    cal = Calibration(
        device=device_name,
        copy_bandwidth=spread["copy"].median,
        flops={key: s.median for key, s in spread.items() if key != "copy"},
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        torch_version=str(torch.__version__),
        backend=backend,
        quick=quick,
        details=details,
        spread=spread,
        machine=machine,
    )
    return dataclasses.replace(cal, problems=cal.check(cal.datasheet()))


def calibrate(
    device: str = "auto",
    *,
    cache: bool = True,
    size_mb: int | None = None,
    quick: bool = False,
    rounds: int | None = None,
    max_age_days: float | None = None,
    probe: bool = True,
    clock: Clock | None = None,
) -> Calibration:
    """Measure the achievable copy bandwidth and GEMM rate of ``"auto"``, ``"cuda[:N]"`` or ``"cpu"``.

    CUDA/ROCm: a device-to-device copy of *size_mb* MiB (default 1024, ``quick`` 256) timed with CUDA
    events, and 8192³ (``quick``: 4096³) matmuls of random bf16, fp16 and fp32 (TF32 off), each in
    rounds after a warm-up. CPU: a copy of a 256 MiB (``quick``: 64 MiB) float32 tensor and fp32 (and
    bf16, where it runs) matmuls sized to finish in well under a second each, interleaved round by round.
    The copy figure counts bytes read plus bytes written, the convention of the datasheet peak.

    *rounds* per figure (at least 3) defaults to :data:`ROUNDS`. The result carries each figure's
    spread and, when it is too noisy or implausible, its ``problems``: such a result is never cached
    (see :mod:`perfsdk.hardware.calibration_run`). A usable result is cached per device in
    ``$PERFSDK_CACHE_DIR`` or ``~/.cache/perfsdk/calibration-<device>.json`` and read back while it
    still fits this machine and is younger than *max_age_days* (default 7, ``$PERFSDK_CALIBRATION_MAX_AGE_DAYS``),
    unless *probe* (a short measurement, on by default) proves it wrong; ``cache=False`` measures and
    reads or writes nothing. *clock* times the CPU measurement (nanoseconds; default
    ``time.perf_counter_ns``); a GPU is timed with CUDA events.
    """
    try:
        import torch  # calibration is the only part of perfsdk.hardware that needs torch
    except ImportError:
        from perfsdk.errors import MissingDependencyError  # only on this error path

        raise MissingDependencyError("torch", "perfsdk.hardware.calibrate", extra="torch") from None
    if size_mb is not None and (isinstance(size_mb, bool) or not isinstance(size_mb, int) or size_mb <= 0):
        raise ConfigError(f"size_mb: must be a positive int (MiB), got {size_mb!r}")
    if rounds is not None and (isinstance(rounds, bool) or not isinstance(rounds, int) or not 3 <= rounds <= 1000):
        raise ConfigError(f"rounds: must be an int from 3 to 1000 (a spread needs several), got {rounds!r}")
    if clock is not None and not callable(clock):
        raise ConfigError(f"clock: expected a callable returning nanoseconds, got {clock!r}")
    max_age = cache_files.max_age_days(max_age_days)
    requested = device.strip().lower() if isinstance(device, str) else device
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(requested)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {device!r} asked for, but torch {torch.__version__} sees no GPU")
        if clock is not None:
            raise ConfigError("clock: a GPU is timed with CUDA events; clock= applies to device='cpu' only")
        dev = torch.device("cuda", cuda_index(torch, str(dev)))
        device_name = str(torch.cuda.get_device_name(dev))
        backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    elif dev.type == "cpu":
        device_name = cpu_name()
        backend = "cpu"
    else:
        raise ConfigError(f"device: expected 'auto', 'cpu' or 'cuda[:N]', got {device!r}")

    if size_mb is not None:
        # the copy needs the buffer twice (source and destination): refuse what cannot fit rather than
        # fail mid-allocation with a raw RuntimeError (or push a shared host into swap)
        memory = memory_bytes(torch, dev)
        if memory is not None and 2 * size_mb * 2**20 > memory:
            raise ConfigError(
                f"size_mb: the copy needs 2 x {size_mb:,} MiB, more than the {memory / 2**20:,.0f} MiB of {device_name}"
            )

    timer: Clock = clock or time.perf_counter_ns
    threads = int(torch.get_num_threads()) if backend == "cpu" else 0
    machine = _machine(torch, dev, backend, threads)
    torch_version = str(torch.__version__)
    path = cache_files.cache_path(device_name)
    if cache:
        cached = cache_files.load(
            path, device=device_name, torch_version=torch_version, machine=machine, quick=quick, max_age_days=max_age
        )
        wrong = _disproved(torch, dev, cached, timer) if cached is not None and probe else []
        if wrong:
            log.warning("perfsdk: the cached calibration %s is wrong (%s); measuring again", path, "; ".join(wrong))
        elif cached is not None:
            log.debug("perfsdk: calibration of %s read from %s", device_name, path)
            return dataclasses.replace(cached, cache=f"read from {path}")

    n = rounds or ROUNDS[("cpu" if backend == "cpu" else "cuda", quick)]
    kwargs: dict[str, Any] = {"backend": backend, "device_name": device_name, "size_mb": size_mb, "quick": quick,
                              "clock": timer, "machine": machine}  # fmt: skip
    cal = _measure(torch, dev, rounds=n, **kwargs)
    if cal.problems:
        log.info("perfsdk: calibration of %s not usable (%s); measuring again with %d rounds",
                 device_name, "; ".join(cal.problems), 2 * n)  # fmt: skip
        cal = _measure(torch, dev, rounds=2 * n, **kwargs)
    if not cache:
        return dataclasses.replace(cal, cache="not read or written (cache=False)")
    if cal.problems:
        cache_files.remove(path)  # whatever was there was not usable either
        return dataclasses.replace(cal, cache=f"not written to {path}: not usable")
    cache_files.store(path, cal)
    return dataclasses.replace(cal, cache=f"written to {path}")


def calibrated_spec(
    device: str = "auto", *, quick: bool = False, cache: bool = True, clock: Clock | None = None
) -> tuple[HardwareSpec | None, str]:
    """The calibration of *device* as a spec when it is usable, else what perfsdk uses instead; and a note.

    The note says which (``"calibrated: <device> (calibrated)"``, or the fallback and why). When the
    calibration is not usable, one warning names each problem and the fallback: the GPU's datasheet
    row, or no spec (MBU/MFU off) on a CPU or an unknown GPU. Arguments as for :func:`calibrate`.
    """
    cal = calibrate(device, quick=quick, cache=cache, clock=clock)
    if cal.usable:
        spec = cal.as_spec()
        return spec, f"calibrated: {spec.display_name}"
    fallback, instead = cal.fallback()
    log.warning("perfsdk: the calibration of %s is not used (%s); using %s instead",
                cal.device, "; ".join(cal.problems), instead)  # fmt: skip
    return fallback, f"{instead}: the calibration was not usable ({cal.problems[0]})"
