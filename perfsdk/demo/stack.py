"""Build and start the whole demo in one call: model, monitor, engine, HTTP server.

::

    from perfsdk.demo.stack import start_demo

    with start_demo(size="tiny", device="cpu", port=0) as demo:
        print(demo.server.base_url, demo.model_name)   # http://127.0.0.1:PORT demo-tiny
        ...                                            # send requests, read demo.monitor.stats()

This is what ``perfsdk demo`` runs, and what the tests start. The monitor is a real
:class:`perfsdk.Monitor` with its own Prometheus registry; its model spec is counted from the module
(:meth:`perfsdk.model.ModelSpec.from_module`) and its hardware is the GPU's datasheet row on CUDA, or
a quick calibration of this CPU (copy bandwidth and matmul rate, cached) elsewhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["DemoStack", "resolve_device", "start_demo"]

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

    def close(self) -> None:
        # the engine first: aborting in-flight requests ends open streams so uvicorn can shut down
        self.engine.stop()
        self.server.stop()
        if self.monitor is not None:
            try:
                self.monitor.close()
            except Exception:  # closing must not hide the report or the caller's error
                log.debug("monitor.close() failed", exc_info=True)

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
    cal = hardware.calibrate(device="cuda" if device.startswith("cuda") else "cpu", quick=True)
    spec = cal.as_spec()
    return spec, f"calibrated: {spec.display_name}"


def _monitor(spec: Any, hw: Any, model_name: str) -> Any:
    from prometheus_client import CollectorRegistry

    import perfsdk

    mon = perfsdk.Monitor(
        model=spec, hardware=hw, service="perfsdk-demo", model_name=model_name, registry=CollectorRegistry()
    )
    # Continuous batching under Poisson arrivals changes the batch size every few steps, so the
    # production defaults (32 steady steps of one batch size) could wait minutes here: the demo's
    # window asks for 8 steps within 30 % of each other and captures anyway after 20 s.
    mon.enable_profiler(steady_window=8, steady_cv=0.3, warmup_steps=4, steady_timeout_s=20.0)
    return mon


def _warm_up(model: Any) -> None:
    """One prefill and one decode outside the monitor: first calls pay for lazy init, not the report."""
    import torch

    ids = torch.arange(16, device=model.device)
    model.prefill(ids, slot=0)
    zero = torch.zeros(1, dtype=torch.long, device=model.device)
    model.decode(ids[:1], zero, zero + 16)


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
) -> DemoStack:
    """Build the model on *device*, wrap it in a monitor and an engine, and start serving on *port*."""
    import torch

    from perfsdk.demo.engine import Engine
    from perfsdk.demo.model import ModelArgs, Transformer, default_size
    from perfsdk.demo.server import DemoServer, create_app

    dev = resolve_device(device)
    size = size or default_size(dev)
    args = ModelArgs.from_name(size)
    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32
    model = Transformer(args, max_batch_slots=max_batch_slots, max_seq=max_seq, device=dev, dtype=dtype, seed=seed)
    model_name = f"demo-{size}"
    _warm_up(model)
    notes: list[str] = []
    spec = hw = mon = None
    hw_note = "not used (--no-instrument)"
    if instrument:
        from perfsdk.model import ModelSpec

        spec = ModelSpec.from_module(
            model,
            layers=args.n_layer,
            heads=args.n_head,
            kv_heads=args.n_kv_head,
            head_dim=args.head_dim,
            kv_bytes=torch.finfo(dtype).bits // 8,
            name=model_name,
        )
        hw, hw_note = _hardware(dev, calibrate)
        mon = _monitor(spec, hw, model_name)
    engine = Engine(model, monitor=mon, seed=seed).start()
    server = DemoServer(create_app(engine, mon, model_name=model_name), host=host, port=port)
    try:
        server.start()
    except BaseException:
        engine.stop()
        if mon is not None:
            mon.close()
        raise
    return DemoStack(
        model=model,
        engine=engine,
        monitor=mon,
        server=server,
        model_name=model_name,
        size=size,
        device=dev,
        model_spec=spec,
        hardware=hw,
        hardware_note=hw_note,
        notes=notes,
    )
