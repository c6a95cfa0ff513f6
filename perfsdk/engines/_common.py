"""What the in-process engine hooks (vLLM workers, SGLang schedulers) share.

* :class:`StepShape` — the exact work of one engine step, and :func:`enter_step`, which opens the
  matching perfsdk step (``prefill`` / ``decode`` / ``mixed``) on the calling thread;
* :func:`process_monitor` — one Monitor per process, model and rank, made after a fork in the child,
  exporting where the engine's ``/metrics`` reads (``PROMETHEUS_MULTIPROC_DIR``) and/or on a per-rank port;
* :func:`count_error` — a perfsdk failure counted and logged once, never raised into the engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from perfsdk.config import env, env_flag, env_int

if TYPE_CHECKING:
    from perfsdk.hardware import HardwareSpec
    from perfsdk.model import ModelSpec
    from perfsdk.monitor import Monitor

__all__ = ["StepShape", "count_error", "enabled", "enter_step", "process_monitor"]

log = logging.getLogger("perfsdk")


@dataclass(frozen=True, slots=True)
class StepShape:
    """The work of one engine step, exactly as the engine scheduled it.

    ``prefill_lens``: new tokens of each sequence in prefill (a whole prompt or a chunk of one);
    ``prefill_cached``: their tokens already in the KV cache (prefix-cache hits, earlier chunks);
    ``decode_requests`` / ``decode_tokens``: sequences decoding and the tokens they compute (one each, more
    when speculative decoding verifies drafts); ``decode_context``: the sum of those sequences' context
    lengths — every token whose key and value the step reads, its own new ones included.
    """

    prefill_lens: tuple[int, ...]
    prefill_cached: int
    decode_requests: int
    decode_tokens: int
    decode_context: int

    @property
    def phase(self) -> str | None:
        """``"prefill"``, ``"decode"``, ``"mixed"``, or None for a step that computes nothing."""
        if self.prefill_lens:
            return "mixed" if self.decode_tokens else "prefill"
        return "decode" if self.decode_tokens else None

    @property
    def tokens(self) -> int:
        return sum(self.prefill_lens) + self.decode_tokens


def enter_step(mon: Monitor, shape: StepShape) -> Any:
    """Open (``__enter__``) the perfsdk step for *shape* on this thread and return it; None for an empty
    step. The caller exits it (``__exit__``) on the same thread when the step's device work is queued."""
    phase = shape.phase
    if phase == "decode":
        step = mon.decode(batch=shape.decode_tokens, context_tokens=shape.decode_context)
    elif phase == "prefill":
        lens = list(shape.prefill_lens)
        step = mon.prefill(tokens=sum(lens), batch=len(lens), seq_lens=lens, cached_tokens=shape.prefill_cached)
    elif phase == "mixed":
        # the chunks' cached prefix is read like decode context (perfsdk's mixed step has no per-chunk
        # prefix): its bytes are exact, its attention FLOPs an undercount
        step = mon.mixed(
            prefill_seq_lens=list(shape.prefill_lens),
            decode_batch=shape.decode_tokens,
            context_tokens=shape.decode_context + shape.prefill_cached,
        )
    else:
        return None
    step.__enter__()
    return step


def exit_step(mon: Monitor, step: Any, exc: BaseException | None = None) -> None:
    """Close a step from :func:`enter_step` (with the engine's exception, if the step raised)."""
    try:
        if exc is None:
            step.__exit__(None, None, None)
        else:
            step.__exit__(type(exc), exc, exc.__traceback__)
    except Exception as e:
        count_error(mon, e, "engine hook: step end")


def enabled() -> bool:
    """``PERFSDK_ENABLED`` (default on), as :class:`perfsdk.Monitor` reads it (:mod:`perfsdk.config`: a bad
    value is a :class:`~perfsdk.errors.ConfigError` naming it, which the hooks log before running without)."""
    return env_flag("PERFSDK_ENABLED", True)


def distributed_rank() -> int | None:
    """This process's torch.distributed rank when there are several ranks (the engine set them up)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return int(dist.get_rank())
    except Exception:
        pass
    return None


def metrics_export() -> tuple[bool, int | None]:
    """(whether this process writes to ``PROMETHEUS_MULTIPROC_DIR``, ``PERFSDK_METRICS_PORT`` or None).

    prometheus_client picks its value store when it is first imported: a directory set later (or
    only in another process) leaves this process's metrics in memory, where the engine's ``/metrics``
    does not read them.
    """
    multiproc = False
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import values

        multiproc = values.ValueClass is not values.MutexValue
    return multiproc, env_int("PERFSDK_METRICS_PORT", 0, 65535)


@contextlib.contextmanager
def env_without(name: str) -> Iterator[None]:
    """*name* unset while the block runs (a Monitor reads ``PERFSDK_METRICS_PORT`` itself and would bind
    the same port in every process; the hooks serve each rank on its own port instead)."""
    saved = os.environ.pop(name, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[name] = saved


_LOCK = threading.Lock()
_MONITORS: dict[tuple[Any, ...], Monitor] = {}  # (pid, engine, model, name, rank): a fork makes its own


def process_monitor(
    engine: str,
    model: ModelSpec | None,
    name: str | None,
    hardware: HardwareSpec | str | None,
    *,
    port_offset: int,
    rank: int | None = None,
    profiler: bool = True,
) -> Monitor:
    """This process's Monitor for *engine*'s *model* at *rank*, made on first use, then shared.

    Per process (a forked child makes its own, for its rank and port; the one it inherited keeps working there, idle).
    ``PERFSDK_METRICS_PORT=P`` serves it on ``P + port_offset + rank``; ``PERFSDK_PROFILER=torch|nsys``
    enables its profiler window (``SIGUSR2`` on the main thread, traces under ``PERFSDK_PROFILE_DIR``).
    Says once in the log where the numbers go, or that they go nowhere.
    """
    key = (os.getpid(), engine, model, name, rank)
    with _LOCK:
        mon = _MONITORS.get(key)
        if mon is not None:
            return mon
        import perfsdk

        export = metrics_export()  # a bad PERFSDK_METRICS_PORT refuses before a Monitor exists
        with env_without("PERFSDK_METRICS_PORT"):
            mon = perfsdk.Monitor(model=model, hardware=hardware, model_name=name, service=engine, rank=rank)
        _MONITORS[key] = mon
    _export(mon, engine, (rank or 0) + port_offset, rank or 0, export)
    if profiler:
        _profiler(mon)
    return mon


def _export(mon: Monitor, engine: str, offset: int, rank: int, export: tuple[bool, int | None]) -> None:
    multiproc, port = export
    served = None
    if port is not None:
        try:
            served = mon.serve_metrics(port=port + offset, addr=env("PERFSDK_METRICS_ADDR") or "127.0.0.1").url
        except Exception as e:
            log.warning("perfsdk: %s rank %d cannot serve its metrics: %s", engine, rank, e)
    if multiproc or served:
        where = " and ".join(
            w
            for w in (
                "PROMETHEUS_MULTIPROC_DIR (the server's /metrics)" if multiproc else "",
                f"{served}/metrics" if served else "",
            )
            if w
        )
        log.info("perfsdk: %s rank %d: step metrics in %s", engine, rank, where)
    elif os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        log.warning(
            "perfsdk: %s rank %d: PROMETHEUS_MULTIPROC_DIR was set after this process imported "
            "prometheus_client, so its step metrics reach no /metrics; set it before the server starts "
            "(or set PERFSDK_METRICS_PORT)",
            engine,
            rank,
        )
    else:
        log.warning(
            "perfsdk: %s rank %d measures its steps but nothing exports them: set "
            "PROMETHEUS_MULTIPROC_DIR to an empty directory before the server starts (its /metrics then "
            "carries them) or PERFSDK_METRICS_PORT=P (a port per rank)",
            engine,
            rank,
        )


def _profiler(mon: Monitor) -> None:
    mode = (env("PERFSDK_PROFILER") or "").lower()
    if mode in ("", "0", "off", "false", "no"):
        return
    try:
        mon.enable_profiler(
            mode=mode,
            directory=env("PERFSDK_PROFILE_DIR") or "./perfsdk-traces",
            signal=threading.current_thread() is threading.main_thread(),
        )
    except Exception as e:
        log.warning("perfsdk: profiler window not enabled in this process: %s", e)


def count_error(mon: Monitor | None, exc: BaseException, where: str) -> None:
    """Count *exc* in *mon*'s ``perfsdk_internal_errors_total`` (:meth:`perfsdk.Monitor.count_error`: logged
    once per site), or log it when there is no Monitor yet. Never raises."""
    try:
        if mon is not None:
            mon.count_error(exc, where)
        else:
            log.error("perfsdk: %s: %s", where, exc)
    except Exception:
        pass
