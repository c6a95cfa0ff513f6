"""Build and start the whole demo in one call: model, monitor, engine, HTTP server.

::

    from perfsdk.demo.stack import start_demo

    with start_demo(size="tiny", device="cpu", port=0) as demo:
        print(demo.server.base_url, demo.model_name)   # http://127.0.0.1:PORT demo-tiny
        ...                                            # send requests, read demo.monitor.stats()

    start_demo(size="8b", device="cuda", engine="int8")   # a rung of perfsdk.demo.rungs; "auto" by default
    start_demo(host="0.0.0.0", profile_token="s3cret")   # off loopback: POST/DELETE /debug/profile need the token

This is what ``perfsdk demo`` runs, and what the tests start. The monitor is a real
:class:`perfsdk.Monitor` with its own Prometheus registry; its model spec is counted from the module
(:func:`demo_model_spec`: int8 weights at one byte, their scales included) and its hardware is the GPU's
datasheet row on CUDA, or a quick calibration of this CPU (copy bandwidth and matmul rate, cached)
elsewhere, when that calibration is usable (else none: MBU/MFU off, with a warning). ``engine="auto"``
is the eager engine on a CPU and the fastest rung on CUDA.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["DemoStack", "build_model", "demo_model_spec", "resolve_device", "run_load", "start_demo"]

log = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when a GPU is usable, else ``"cpu"``; checks an explicit ``"cuda"``."""
    import torch

    d = device.strip().lower()
    if d == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if d.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device: {device!r} was asked for but torch sees no CUDA device")
        return d
    if d == "cpu":
        return d
    raise ConfigError(f"device: expected auto, cpu or cuda[:N], got {device!r}")


@dataclass
class DemoStack:
    """Everything ``start_demo`` built; ``close()`` (or leaving the ``with``) stops it in order."""

    model: Any
    engine: Any
    monitor: Any
    server: Any
    model_name: str
    size: str
    device: str
    model_spec: Any = None
    hardware: Any = None
    hardware_note: str = ""
    notes: list[str] = field(default_factory=list)
    rung: str = "eager"
    build_seconds: float = 0.0  # the engine's warm-up: compilation and graph capture
    _switch_interval: float | None = None

    def close(self) -> None:
        # the engine first: aborting in-flight requests ends open streams so uvicorn can shut down
        self.engine.stop()
        self.server.stop()
        if self.monitor is not None:
            try:
                self.monitor.close()
            except Exception:  # closing must not hide the report or the caller's error
                log.debug("monitor.close() failed", exc_info=True)
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

    def __enter__(self) -> DemoStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _hardware(device: str, calibrate: bool) -> tuple[Any, str]:
    from perfsdk import hardware

    if device.startswith("cuda"):
        try:
            hw = hardware.resolve("auto")
        except ConfigError as e:  # a GPU missing from the datasheet table: measure it instead
            log.warning("%s; calibrating instead", e)
        else:
            if hw is not None:
                return hw, f"datasheet: {hw.display_name}"
    if not calibrate:
        return None, "not measured (--no-calibrate): MBU/MFU are off"
    # a noisy or implausible measurement is not used: the datasheet row or no spec, and a warning
    return hardware.calibrated_spec(device="cuda" if device.startswith("cuda") else "cpu", quick=True)


def _monitor(spec: Any, hw: Any, model_name: str, profile_dir: str | None = None) -> Any:
    from prometheus_client import CollectorRegistry

    import perfsdk

    mon = perfsdk.Monitor(
        model=spec, hardware=hw, service="perfsdk-demo", model_name=model_name, registry=CollectorRegistry()
    )
    # Continuous batching under Poisson arrivals changes the batch size every few steps, so the
    # production defaults (32 steady steps of one batch size) could wait minutes here: the demo's
    # window asks for 8 steps within 30 % of each other and captures anyway after 20 s.
    extra = {} if profile_dir is None else {"directory": profile_dir}
    mon.enable_profiler(steady_window=8, steady_cv=0.3, warmup_steps=4, steady_timeout_s=20.0, **extra)
    return mon


def _warm_up(model: Any) -> None:
    """One prefill and one decode outside the monitor: first calls pay for lazy init, not the report."""
    import torch

    ids = torch.arange(16, device=model.device)
    model.prefill(ids, slot=0)
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    model.decode(ids[:1], zero, zero + 16)


def build_model(*, size: str, device: str, max_batch_slots: int = 8, max_seq: int = 1024, seed: int = 0) -> Any:
    """The demo transformer of *size* on *device*: bf16 on CUDA, float32 on a CPU."""
    import torch

    from perfsdk.demo.model import ModelArgs, Transformer

    args = ModelArgs.from_name(size)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return Transformer(args, max_batch_slots=max_batch_slots, max_seq=max_seq, device=device, dtype=dtype, seed=seed)


def demo_model_spec(model: Any, name: str) -> Any:
    """perfsdk's :class:`~perfsdk.ModelSpec` of the demo model, as it is now (bf16 or int8 weights).

    The bytes are the tensors' own: an int8 model reads one byte per weight plus its per-channel
    scales, so perfsdk's floor and MBU move with the quantisation. Parameters (what FLOPs count) are
    the same either way; the embedding is bytes, not arithmetic.
    """
    import dataclasses

    from perfsdk.demo.quant import Int8Linear
    from perfsdk.model import ModelSpec

    a = model.args
    spec = ModelSpec.from_module(
        model,
        layers=a.n_layer,
        heads=a.n_head,
        kv_heads=a.n_kv_head,
        head_dim=a.head_dim,
        kv_bytes=model.dtype.itemsize,
        name=name,
    )
    int8 = [m for m in model.modules() if isinstance(m, Int8Linear)]
    if not int8:
        return spec
    # from_module counts parameters (norms, embedding) and int8 buffers; add the scales, and the
    # quantised layers' parameters, which are buffers now
    scales = sum(m.scale.numel() * m.scale.element_size() for m in int8)
    params = a.num_params()
    return dataclasses.replace(
        spec,
        params=float(params - a.vocab_size * a.dim),
        total_params=float(params),
        weight_bytes=spec.weight_bytes + scales,
        dtype="int8",
    )


def start_demo(
    *,
    size: str | None = None,
    device: str = "auto",
    port: int = 0,
    host: str = "127.0.0.1",
    seed: int = 0,
    max_batch_slots: int = 8,
    max_seq: int = 1024,
    instrument: bool = True,
    calibrate: bool = True,
    engine: str = "auto",
    model: Any = None,
    profile_dir: str | None = None,
    compile_int8: bool | None = None,
    int8_kernel: str = "auto",
    attention: str = "auto",
    profile_token: str | None = None,
) -> DemoStack:
    """Build the model on *device*, wrap it in a monitor and an engine, and start serving on *port*.

    *engine* is a rung of :mod:`perfsdk.demo.rungs` or ``"auto"``. *model* reuses a model built
    before (:func:`build_model`; the ladder builds one for all rungs; ``"int8"`` quantises it in place).
    *profile_token*: ``POST`` and ``DELETE /debug/profile`` need ``Authorization: Bearer <token>``; a *host*
    other than loopback without one is refused (:class:`ConfigError`, before anything is built), as the
    Monitor's own metrics server refuses it.
    """
    from perfsdk.demo.model import default_size
    from perfsdk.demo.rungs import build_engine, prepare_model, resolve_engine
    from perfsdk.demo.server import DemoServer, create_app
    from perfsdk.profiling.endpoint import check_bind

    check_bind(
        host,
        profile_token,
        "--host",
        "the demo",
        "a token for POST and DELETE /debug/profile (the profiler trigger): pass --token or set "
        "PERFSDK_PROFILE_TOKEN, or bind 127.0.0.1",
    )
    dev = resolve_device(device)
    if model is None:
        size = size or default_size(dev)
    else:
        size = size or next((k for k, v in _sizes().items() if v == model.args), "custom")
    rung = resolve_engine(engine, dev, size)  # a bad name fails before a model is built
    if model is None:
        model = build_model(size=size, device=dev, max_batch_slots=max_batch_slots, max_seq=max_seq, seed=seed)
    model_name = f"demo-{size}"
    notes: list[str] = []
    mon = None
    hw = None
    hw_note = "not used (--no-instrument)"
    t0 = time.perf_counter()
    if rung == "eager":
        _warm_up(model)
    prepare_model(model, rung, int8_kernel=int8_kernel)  # int8: quantise first, so the spec counts int8 bytes
    spec = demo_model_spec(model, model_name) if instrument else None
    if instrument:
        hw, hw_note = _hardware(dev, calibrate)
        mon = _monitor(spec, hw, model_name, profile_dir)
    eng = build_engine(
        model, rung, monitor=mon, seed=seed, compile_int8=compile_int8, int8_kernel=int8_kernel, attention=attention
    )
    eng.warm_up()
    build_s = time.perf_counter() - t0
    if getattr(eng, "cuda_graphs", False) is False and rung != "eager" and not dev.startswith("cuda"):
        notes.append(f"{rung}: no CUDA graphs on a CPU; the same static step runs without capture")
    switch = None
    if dev.startswith("cuda"):
        # The engine thread shares the GIL with the HTTP thread; at the default 5 ms switch interval
        # a step of 2-5 ms can wait a whole interval for it. 1 ms keeps the GPU fed.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, 0.001))
    eng.start()
    server = DemoServer(create_app(eng, mon, model_name=model_name, profile_token=profile_token), host=host, port=port)
    try:
        server.start()
    except BaseException:
        eng.stop()
        if mon is not None:
            mon.close()
        if switch is not None:
            sys.setswitchinterval(switch)
        raise
    return DemoStack(
        model=model,
        engine=eng,
        monitor=mon,
        server=server,
        model_name=model_name,
        size=size,
        device=dev,
        model_spec=spec,
        hardware=hw,
        hardware_note=hw_note,
        notes=notes,
        rung=rung,
        build_seconds=build_s,
        _switch_interval=switch,
    )


def _sizes() -> dict[str, Any]:
    from perfsdk.demo.model import MODEL_SIZES

    return MODEL_SIZES


def _load_child(config: Any, path: str) -> None:
    from perfsdk.bench import benchmark

    benchmark(config, progress=config.progress).save(path)


def run_load(config: Any) -> Any:
    """Run :func:`perfsdk.bench.benchmark` with *config* in its own process, as a real client would be.

    In the server's process its asyncio loop would take the GIL from the engine thread between kernel
    launches and slow every step down; a separate process keeps the server's numbers honest.
    """
    import multiprocessing
    import tempfile
    from pathlib import Path

    from perfsdk.bench import BenchResult

    with tempfile.TemporaryDirectory(prefix="perfsdk-demo-") as tmp:
        path = str(Path(tmp) / "bench.json")
        proc = multiprocessing.get_context("spawn").Process(
            target=_load_child, args=(config, path), name="perfsdk-demo-load"
        )
        proc.start()
        try:
            proc.join()
        finally:
            if proc.is_alive():  # Ctrl-C reached us first
                proc.terminate()
                proc.join(5)
        if proc.exitcode != 0 or not Path(path).exists():
            raise RuntimeError(f"the load generator failed (exit code {proc.exitcode}); see its messages above")
        return BenchResult.load(path)
