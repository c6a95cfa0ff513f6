"""perfsdk in vLLM's API server: a stat logger for the request latencies, loaded by vLLM itself.

With perfsdk installed next to vLLM, ``vllm serve`` loads :class:`PerfsdkStatLogger` through vLLM's
``vllm.stat_logger_plugins`` entry point (name ``perfsdk``); nothing changes in the server. vLLM hands
it, in its API-server process, what it measured of every request (``vllm.v1.metrics.stats``):

* ``IterationStats``: times to first token and inter-token latencies as they happen (vLLM measures one
  inter-token gap per request per step: with speculative decoding a gap can cover several tokens), and
  the requests that finished (duration, queue time, prefill time, time per output token, finish reason).

They become perfsdk's ``gen_ai_server_time_to_first_token_seconds``, ``perfsdk_inter_token_latency_seconds``,
``gen_ai_server_time_per_output_token_seconds``, ``perfsdk_request_queue_seconds`` and
``gen_ai_server_request_duration_seconds`` on vLLM's own ``/metrics`` (the default Prometheus registry,
or every process's values under ``PROMETHEUS_MULTIPROC_DIR``), and one OpenTelemetry span per request
where a tracer provider is configured. In Python::

    from vllm.v1.engine.async_llm import AsyncLLM
    from perfsdk.engines.vllm import PerfsdkStatLogger

    llm = AsyncLLM.from_engine_args(engine_args, stat_loggers=[PerfsdkStatLogger])

**Steps come from the workers.** Step time, MBU and MFU are measured on the GPU by perfsdk's worker hook
(:mod:`perfsdk.engines.vllm.worker`, vLLM's ``vllm.general_plugins`` entry point ``perfsdk_worker``, or
``--worker-extension-cls``), so this logger records no steps while that hook is in place: the two never
count a step twice. Only where the hook is off (``VLLM_PLUGINS`` without ``perfsdk_worker`` and no
extension) does it fall back to vLLM's own per-step report, ``SchedulerStats.iteration_details``
(``--enable-logging-iteration-details``): host time of the engine core from just after a step was
submitted until its output was back, a step's time only without async scheduling
(``--no-async-scheduling``; with a batch queue it times only a wait, and nothing is recorded), with the
decode context estimated as ``kv_cache_usage`` × the engine's KV-cache tokens.

The model's sizes come from the Hugging Face config vLLM loaded (:mod:`perfsdk.engines.vllm.config`);
the hardware from ``PERFSDK_HARDWARE`` or vLLM's platform (NVML: no CUDA context in this process).
``PERFSDK_ENABLED=0`` mutes perfsdk; ``--disable-log-stats`` only silences vLLM's console logger (with
perfsdk loaded vLLM keeps its stats on). Nothing here can fail vLLM: a bad setting is logged and leaves
this logger inert, and errors while recording are counted in ``perfsdk_internal_errors_total`` and
logged once.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from perfsdk.engines import split_evenly
from perfsdk.engines._common import count_error
from perfsdk.engines.vllm.config import hardware_of, model_of
from perfsdk.errors import MissingDependencyError

try:
    from vllm.v1.metrics.loggers import StatLoggerBase
except ImportError as e:  # pragma: no cover - exercised only where vLLM is absent
    raise MissingDependencyError("vllm", "perfsdk's vLLM stat logger") from e

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor

__all__ = ["PerfsdkStatLogger", "current_monitor", "monitor_for"]

log = logging.getLogger("perfsdk")

_LOCK = threading.Lock()
_MONITOR: Monitor | None = None
_FINISH_REASONS = {0: "stop", 1: "length", 2: "abort", 3: "error", 4: "repetition"}


def current_monitor() -> Monitor | None:
    """The Monitor the vLLM stat loggers of this process write to (None before vLLM made one)."""
    return _MONITOR


def monitor_for(vllm_config: Any) -> Monitor:
    """This process's Monitor for a vLLM engine: made from the first engine's config, then shared."""
    global _MONITOR
    with _LOCK:
        if _MONITOR is None:
            import perfsdk

            model, name = model_of(vllm_config)
            # host timing: this process (vLLM's API server) runs no steps, and must not initialise CUDA
            _MONITOR = perfsdk.Monitor(
                model=model, hardware=hardware_of(), model_name=name, service="vllm", timing="host"
            )
        return _MONITOR


def worker_hook_expected(vllm_config: Any) -> bool:
    """Whether perfsdk's worker hook times this engine's steps: the ``perfsdk_worker`` general plugin was
    loaded (vLLM loads general plugins in this process too, filtered by ``VLLM_PLUGINS`` as everywhere),
    or ``--worker-extension-cls`` names perfsdk's extension."""
    from perfsdk.engines.vllm import worker

    ext = getattr(getattr(vllm_config, "parallel_config", None), "worker_extension_cls", "") or ""
    return worker.installed() or (isinstance(ext, str) and ext.startswith("perfsdk.engines.vllm"))


class PerfsdkStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped here
    """A vLLM stat logger (one per engine) that hands vLLM's measurements to a perfsdk Monitor."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self._config = vllm_config
        self.monitor: Monitor | None = None
        self.steps_from_workers = False
        self._steps_timed = False
        self._warned_no_steps = True
        try:
            from perfsdk.engines.vllm.worker import VllmWorkerInstrumentor

            problem = VllmWorkerInstrumentor().dependency_problem()  # the one declared range
            if problem is not None:
                log.warning("perfsdk: %s: the stat logger may misread its stats", problem)
            self.monitor = monitor_for(vllm_config)
            # the worker hook times every step on the GPU: steps from here would be counted twice
            self.steps_from_workers = worker_hook_expected(vllm_config)
            details = getattr(
                getattr(vllm_config, "observability_config", None), "enable_logging_iteration_details", False
            )
            batches = getattr(vllm_config, "max_concurrent_batches", 1)
            # with a batch queue (async scheduling, pipeline parallelism) elapsed_ms is not a step's time
            self._steps_timed = not self.steps_from_workers and isinstance(batches, int) and batches <= 1
            self._warned_no_steps = self.steps_from_workers or (bool(details) and self._steps_timed)
        except Exception as e:  # a bad PERFSDK_* setting must not stop vLLM from starting
            log.error("perfsdk: vLLM stat logger disabled: %s", e)
            self.monitor = None

    # ---- StatLoggerBase ----------------------------------------------
    def record(
        self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
    ) -> None:
        mon = self.monitor
        if mon is None:
            return
        # each part guarded on its own: one odd value costs only itself (never raised into vLLM's loop)
        if scheduler_stats is not None and self._steps_timed:
            try:
                details = getattr(scheduler_stats, "iteration_details", None)
                if details is not None:
                    self._step(mon, details, scheduler_stats)
            except Exception as e:
                count_error(mon, e, "vllm stat logger step")
        if iteration_stats is not None:
            try:
                ttft, itl = iteration_stats.time_to_first_tokens_iter, iteration_stats.inter_token_latencies_iter
                if len(ttft) or len(itl):
                    mon.record_latencies(ttft_s=ttft, itl_s=itl)
            except Exception as e:
                count_error(mon, e, "vllm stat logger latencies")
            for fr in iteration_stats.finished_requests:
                try:
                    self._finished(mon, fr)
                except Exception as e:
                    count_error(mon, e, "vllm stat logger finished request")

    def log_engine_initialized(self) -> None:
        if self.monitor is None:
            return
        if self.steps_from_workers:
            log.info(
                "perfsdk: vLLM engine %d: request latencies here; step time, MBU and MFU from perfsdk's "
                "worker hook (device time on each GPU)",
                self.engine_index,
            )
        if self._warned_no_steps:
            return
        self._warned_no_steps = True
        off = "perfsdk's worker hook is off (VLLM_PLUGINS leaves out perfsdk_worker), and "
        if not self._steps_timed:
            log.warning(
                "perfsdk: vLLM engine %d: %sthis engine runs a batch queue (async scheduling or pipeline "
                "parallelism): the step time it reports is not a step's, so perfsdk records no steps, "
                "MBU or MFU; let the worker hook load, or start vLLM with --no-async-scheduling "
                "(latency metrics work as they are)",
                self.engine_index,
                off,
            )
        else:
            log.warning(
                "perfsdk: vLLM engine %d: %sthe engine reports no per-step details, so perfsdk has no "
                "step time, MBU or MFU; let the worker hook load, or start vLLM with "
                "--enable-logging-iteration-details (latency metrics work as they are)",
                self.engine_index,
                off,
            )

    # ---- mapping -------------------------------------------------------
    @staticmethod
    def _finished(mon: Monitor, fr: Any) -> None:
        reason = _FINISH_REASONS.get(int(fr.finish_reason), str(fr.finish_reason).lower())
        out = int(fr.num_generation_tokens)
        e2e = float(fr.e2e_latency)
        mon.record_finished(
            e2e_s=max(e2e, 0.0),
            queue_s=fr.queued_time,
            prefill_s=fr.prefill_time,
            # arrival to first token: the end less the decode (queue + prefill would miss the frontend's part)
            ttft_s=max(e2e - float(fr.decode_time), 0.0),
            tpot_s=fr.mean_time_per_output_token if out > 1 else None,
            prompt_tokens=int(fr.num_prompt_tokens),
            output_tokens=out,
            finish_reason=reason,
            error="vllm: request error" if reason == "error" else None,
            request_id=fr.request_id,
        )

    def _step(self, mon: Monitor, d: Any, stats: Any) -> None:  # one SchedulerIterationDetails
        if getattr(d, "is_dummy", False) or not d.elapsed_ms or d.elapsed_ms <= 0:
            return  # a data-parallel padding step, or one not timed
        seconds = d.elapsed_ms / 1e3
        prefill_tokens, prefill_reqs = int(d.num_ctx_tokens), int(d.num_ctx_requests)
        decode_tokens = int(d.num_generation_tokens)
        if prefill_tokens and decode_tokens:
            mon.record_step(
                "mixed",
                seconds,
                batch=decode_tokens,
                context_tokens=self._context_tokens(stats),
                seq_lens=split_evenly(prefill_tokens, prefill_reqs),
            )
        elif prefill_tokens:
            mon.record_step(
                "prefill",
                seconds,
                batch=max(prefill_reqs, 1),
                tokens=prefill_tokens,
                seq_lens=split_evenly(prefill_tokens, prefill_reqs),
            )
        elif decode_tokens:
            # FLOPs per generated token (speculative decoding verifies several per sequence)
            mon.record_step("decode", seconds, batch=decode_tokens, context_tokens=self._context_tokens(stats))

    def _context_tokens(self, stats: Any) -> int:
        """Sum of the running sequences' context lengths, estimated from the KV blocks in use."""
        cache: Any = getattr(self._config, "cache_config", None)
        usage = getattr(stats, "kv_cache_usage", None)
        if usage is None or cache is None:
            return 0
        tokens = getattr(cache, "kv_cache_size_tokens", None)  # this engine's KV cache, in tokens
        if not tokens:
            blocks = getattr(cache, "num_gpu_blocks", None)  # the API server's sum over its engines
            if not blocks:
                return 0
            dp = int(getattr(getattr(self._config, "parallel_config", None), "data_parallel_size", 1) or 1)
            tokens = int(blocks) / dp * int(cache.block_size)
        return round(float(usage) * float(tokens))
