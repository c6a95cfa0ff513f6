"""perfsdk in vLLM (V1 engine): a stat logger, loaded by vLLM itself.

With perfsdk installed next to vLLM, ``vllm serve`` loads :class:`PerfsdkStatLogger` through vLLM's
``vllm.stat_logger_plugins`` entry point: nothing to change in the server. Ask vLLM for the per-step
details that MBU and MFU need::

    PERFSDK_HARDWARE=h200 vllm serve meta-llama/Llama-3.1-8B-Instruct --enable-logging-iteration-details

``/metrics`` (vLLM's own endpoint, which serves the default Prometheus registry) then carries perfsdk's
metrics beside ``vllm:*``: ``perfsdk_step_bandwidth_utilization`` (MBU of decode steps) and
``perfsdk_step_flops_utilization`` (MFU of prefill and mixed steps) against the GPU's datasheet, step
time per phase, TTFT, inter-token latency, time per output token, queue time and request duration under
the OpenTelemetry GenAI names, so ``integrations/grafana``'s dashboard and alerts work unchanged; and,
where an OpenTelemetry tracer provider is configured, one span per request. In Python::

    from vllm.v1.engine.async_llm import AsyncLLM
    from perfsdk.engines.vllm import PerfsdkStatLogger

    llm = AsyncLLM.from_engine_args(engine_args, stat_loggers=[PerfsdkStatLogger])

What vLLM reports, and how it is used (``vllm.v1.metrics.stats``):

* ``SchedulerStats.iteration_details`` (only with ``--enable-logging-iteration-details``): each engine
  step's prefill ("context") and decode ("generation") requests and tokens, and its time
  (``elapsed_ms``: the engine core's host clock around the step, so it includes what the engine does
  around the GPU). One perfsdk step each: ``prefill``, ``decode``, or ``mixed`` when a step has both
  (chunked prefill). The decode steps' KV-cache bytes need the running sequences' context lengths,
  which vLLM does not report per step; perfsdk estimates their sum as
  ``kv_cache_usage × KV blocks × block size`` (the blocks the running requests hold: at most one
  partly filled block per sequence too many).
* ``IterationStats``: times to first token and inter-token latencies as they happen (vLLM measures one
  inter-token gap per request per step: with speculative decoding a gap can cover several tokens), and
  the requests that finished (duration, queue time, prefill time, time per output token).

The model's sizes come from the Hugging Face config vLLM loaded, split per GPU for tensor parallelism;
the hardware from ``PERFSDK_HARDWARE`` (a datasheet name) or detection. Other settings come from
perfsdk's environment variables (``PERFSDK_ENABLED=0`` turns it off; ``VLLM_PLUGINS`` lists the vLLM
plugins to load, when set). Nothing here can fail vLLM: errors are counted in
``perfsdk_internal_errors_total`` and logged once.

Not covered: the profiler window (vLLM's steps run in the engine-core process; use vLLM's own
``--profiler-config`` and ``perfsdk analyze`` on its trace), pipeline parallelism (the model is split by
TP only), and data-parallel engines are summed into one Monitor per process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any

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

            model, name = _model_of(vllm_config)
            # host timing: this process (vLLM's API server) runs no steps, and must not initialise CUDA
            _MONITOR = perfsdk.Monitor(model=model, hardware=_hardware(), model_name=name, service="vllm",
                                       timing="host")
        return _MONITOR


def _hardware() -> Any:
    """``PERFSDK_HARDWARE`` if set, else the GPU as vLLM's platform reports it (through NVML: no CUDA
    context in this process), else None (MBU/MFU off, with the Monitor's warning)."""
    import os

    from perfsdk import hardware

    named = os.environ.get("PERFSDK_HARDWARE")
    if named:
        return hardware.resolve(named)
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cuda_alike():
            return None
        return hardware.match_device_name(current_platform.get_device_name(0),
                                          int(current_platform.get_device_total_memory(0)))
    except Exception as e:
        log.warning("perfsdk: could not tell which GPU vLLM runs on (%s); set PERFSDK_HARDWARE", e)
        return None


def _model_of(vllm_config: Any) -> tuple[Any, str | None]:
    """(the per-GPU ModelSpec or None, the served model name) of a VllmConfig."""
    from perfsdk.model import ModelSpec

    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return None, None
    served = getattr(mc, "served_model_name", None)
    name = served[0] if isinstance(served, (list, tuple)) and served else served
    try:
        dtype = str(getattr(mc, "dtype", "") or "").replace("torch.", "") or None
        cache_dtype = str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto") or "auto")
        kv_dtype = None if cache_dtype == "auto" else ("fp8" if cache_dtype.startswith("fp8") else cache_dtype)
        spec = ModelSpec.from_hf_config(mc.hf_config, dtype=dtype, kv_dtype=kv_dtype)
        if name:
            spec = dataclasses.replace(spec, name=str(name))
        tp = int(getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1) or 1)
        return (spec.with_tp(tp) if tp > 1 else spec), (str(name) if name else None)
    except Exception as e:  # an architecture perfsdk cannot size: latency metrics only
        log.warning("perfsdk: cannot size model %s from its config (%s): MBU/MFU off", name, e)
        return None, (str(name) if name else None)


class PerfsdkStatLogger(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped here
    """A vLLM stat logger (one per engine) that hands vLLM's measurements to a perfsdk Monitor."""

    def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
        self.engine_index = engine_index
        self._config = vllm_config
        self.monitor = monitor_for(vllm_config)
        details = getattr(getattr(vllm_config, "observability_config", None), "enable_logging_iteration_details",
                          False)
        self._warned_no_steps = bool(details)

    # ---- StatLoggerBase ----------------------------------------------
    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        mon = self.monitor
        try:
            if iteration_stats is not None:
                self._iteration(mon, iteration_stats)
            if scheduler_stats is not None:
                details = getattr(scheduler_stats, "iteration_details", None)
                if details is not None:
                    self._step(mon, details, scheduler_stats)
        except Exception as e:  # never into vLLM's output loop
            mon._errors.record(e, "vllm stat logger record")

    def log_engine_initialized(self) -> None:
        if not self._warned_no_steps:
            self._warned_no_steps = True
            log.warning("perfsdk: vLLM engine %d reports no per-step details, so perfsdk has no step time, MBU "
                        "or MFU; start vLLM with --enable-logging-iteration-details (latency metrics work as "
                        "they are)", self.engine_index)

    # ---- mapping -------------------------------------------------------
    @staticmethod
    def _iteration(mon: Monitor, it: Any) -> None:
        ttft, itl = it.time_to_first_tokens_iter, it.inter_token_latencies_iter
        if ttft or itl:
            mon.record_latencies(ttft_s=ttft, itl_s=itl)
        for fr in it.finished_requests:
            reason = _FINISH_REASONS.get(int(fr.finish_reason), str(fr.finish_reason).lower())
            out = int(fr.num_generation_tokens)
            mon.record_finished(
                e2e_s=fr.e2e_latency, queue_s=fr.queued_time, prefill_s=fr.prefill_time,
                tpot_s=fr.mean_time_per_output_token if out > 1 else None,
                prompt_tokens=int(fr.num_prompt_tokens), output_tokens=out, finish_reason=reason,
                error="vllm: request error" if reason == "error" else None, request_id=fr.request_id,
            )

    def _step(self, mon: Monitor, d: Any, stats: Any) -> None:
        if getattr(d, "is_dummy", False) or not d.elapsed_ms or d.elapsed_ms <= 0:
            return  # a data-parallel padding step, or one not timed
        seconds = d.elapsed_ms / 1e3
        prefill_tokens, prefill_reqs = int(d.num_ctx_tokens), int(d.num_ctx_requests)
        decode_tokens = int(d.num_generation_tokens)
        if prefill_tokens and decode_tokens:
            mon.record_step("mixed", seconds, batch=decode_tokens, context_tokens=self._context_tokens(stats),
                            seq_lens=_split(prefill_tokens, prefill_reqs))
        elif prefill_tokens:
            mon.record_step("prefill", seconds, batch=max(prefill_reqs, 1), tokens=prefill_tokens,
                            seq_lens=_split(prefill_tokens, prefill_reqs))
        elif decode_tokens:
            # FLOPs per generated token (speculative decoding verifies several per sequence)
            mon.record_step("decode", seconds, batch=decode_tokens, context_tokens=self._context_tokens(stats))

    def _context_tokens(self, stats: Any) -> int:
        """Sum of the running sequences' context lengths, estimated from the KV blocks in use."""
        cache: Any = getattr(self._config, "cache_config", None)
        blocks = getattr(cache, "num_gpu_blocks", None)
        usage = getattr(stats, "kv_cache_usage", None)
        if not blocks or usage is None:
            return 0
        dp = int(getattr(getattr(self._config, "parallel_config", None), "data_parallel_size", 1) or 1)
        # the API server holds the sum over data-parallel engines; usage is this engine's
        return round(float(usage) * (int(blocks) / dp) * int(cache.block_size))


def _split(tokens: int, requests: int) -> list[int]:
    """*tokens* over *requests* prefill sequences as evenly as possible (vLLM reports only the sums)."""
    n = max(int(requests), 1)
    base, extra = divmod(int(tokens), n)
    return [base + (1 if i < extra else 0) for i in range(n) if base or i < extra]
