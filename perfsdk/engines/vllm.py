"""perfsdk in vLLM (V1 engine): a stat logger, loaded by vLLM itself.

With perfsdk installed next to vLLM, ``vllm serve`` loads :class:`PerfsdkStatLogger` through vLLM's
``vllm.stat_logger_plugins`` entry point: nothing to change in the server. Ask vLLM for the per-step
details that MBU and MFU need::

    PERFSDK_HARDWARE=h200 vllm serve meta-llama/Llama-3.1-8B-Instruct \\
        --enable-logging-iteration-details --no-async-scheduling --disable-log-stats

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
  (``elapsed_ms``: the engine core's host clock from just after the step's work was submitted to the
  GPU until its output was back). One perfsdk step each: ``prefill``, ``decode``, or ``mixed`` when a
  step has both (chunked prefill). That time is a step's only without async scheduling
  (``--no-async-scheduling``; vLLM 0.33 turns it on by default): with a batch queue, ``elapsed_ms``
  covers only the wait for an earlier batch, so perfsdk records no steps then and says so once. The
  decode steps' KV-cache bytes need the running sequences' context lengths, which vLLM does not report
  per step; perfsdk estimates their sum as ``kv_cache_usage × the engine's KV-cache tokens`` (blocks
  the running requests hold: at most one partly filled block per sequence too many; a prefix shared by
  several requests is counted once).
* ``IterationStats``: times to first token and inter-token latencies as they happen (vLLM measures one
  inter-token gap per request per step: with speculative decoding a gap can cover several tokens), and
  the requests that finished (duration, queue time, prefill time, time per output token).

The model's sizes come from the Hugging Face config vLLM loaded, split per GPU for tensor parallelism;
at its quantized width for quantized checkpoints; the hardware from ``PERFSDK_HARDWARE`` (a datasheet
name) or detection. Other settings come from perfsdk's environment variables (``PERFSDK_ENABLED=0``
mutes perfsdk; ``VLLM_PLUGINS``, when set, lists the vLLM plugins to load — with perfsdk loaded vLLM
keeps its stats on even under ``--disable-log-stats``, which then only silences its console logger,
and that is the way to avoid one log line per step that ``--enable-logging-iteration-details`` prints).
Nothing here can fail vLLM: a bad setting is logged and leaves this logger inert, and errors while
recording are counted in ``perfsdk_internal_errors_total`` and logged once.

Not covered: the profiler window (vLLM's steps run in the engine-core process; use vLLM's own
``--profiler-config`` and ``perfsdk analyze`` on its trace), pipeline parallelism (the model is split by
TP only), and data-parallel engines are summed into one Monitor per process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any

from perfsdk.engines import split_evenly
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
    from perfsdk.model import ModelSpec, quantized_weight_dtype

    mc = getattr(vllm_config, "model_config", None)
    if mc is None:
        return None, None
    served = getattr(mc, "served_model_name", None)
    name = served[0] if isinstance(served, (list, tuple)) and served else served
    try:
        act = str(getattr(mc, "dtype", "") or "").replace("torch.", "") or None  # what the model computes in
        quant = quantized_weight_dtype(getattr(mc.hf_config, "quantization_config", None))
        cache_dtype = str(getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", "auto") or "auto")
        kv_dtype = act if cache_dtype == "auto" else ("fp8" if cache_dtype.startswith("fp8") else cache_dtype)
        spec = ModelSpec.from_hf_config(mc.hf_config, dtype=quant or act, kv_dtype=kv_dtype)
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
        self.monitor: Monitor | None = None
        try:
            self.monitor = monitor_for(vllm_config)
        except Exception as e:  # a bad PERFSDK_* setting must not stop vLLM from starting
            log.error("perfsdk: vLLM stat logger disabled: %s", e)
        details = getattr(getattr(vllm_config, "observability_config", None), "enable_logging_iteration_details",
                          False)
        batches = getattr(vllm_config, "max_concurrent_batches", 1)
        # with a batch queue (async scheduling, pipeline parallelism) elapsed_ms is not a step's time
        self._steps_timed = isinstance(batches, int) and batches <= 1
        self._warned_no_steps = bool(details) and self._steps_timed

    # ---- StatLoggerBase ----------------------------------------------
    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
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
                mon._errors.record(e, "vllm stat logger step")
        if iteration_stats is not None:
            try:
                ttft, itl = iteration_stats.time_to_first_tokens_iter, iteration_stats.inter_token_latencies_iter
                if len(ttft) or len(itl):
                    mon.record_latencies(ttft_s=ttft, itl_s=itl)
            except Exception as e:
                mon._errors.record(e, "vllm stat logger latencies")
            for fr in iteration_stats.finished_requests:
                try:
                    self._finished(mon, fr)
                except Exception as e:
                    mon._errors.record(e, "vllm stat logger finished request")

    def log_engine_initialized(self) -> None:
        if self._warned_no_steps or self.monitor is None:
            return
        self._warned_no_steps = True
        if not self._steps_timed:
            log.warning("perfsdk: vLLM engine %d runs a batch queue (async scheduling or pipeline parallelism): "
                        "the step time it reports is not a step's, so perfsdk records no steps, MBU or MFU; "
                        "start vLLM with --no-async-scheduling for them (latency metrics work as they are)",
                        self.engine_index)
        else:
            log.warning("perfsdk: vLLM engine %d reports no per-step details, so perfsdk has no step time, MBU "
                        "or MFU; start vLLM with --enable-logging-iteration-details (latency metrics work as "
                        "they are)", self.engine_index)

    # ---- mapping -------------------------------------------------------
    @staticmethod
    def _finished(mon: Monitor, fr: Any) -> None:
        reason = _FINISH_REASONS.get(int(fr.finish_reason), str(fr.finish_reason).lower())
        out = int(fr.num_generation_tokens)
        e2e = float(fr.e2e_latency)
        mon.record_finished(
            e2e_s=max(e2e, 0.0), queue_s=fr.queued_time, prefill_s=fr.prefill_time,
            # arrival to first token: the end less the decode (queue + prefill would miss the frontend's part)
            ttft_s=max(e2e - float(fr.decode_time), 0.0),
            tpot_s=fr.mean_time_per_output_token if out > 1 else None,
            prompt_tokens=int(fr.num_prompt_tokens), output_tokens=out, finish_reason=reason,
            error="vllm: request error" if reason == "error" else None, request_id=fr.request_id,
        )

    def _step(self, mon: Monitor, d: Any, stats: Any) -> None:  # one SchedulerIterationDetails
        if getattr(d, "is_dummy", False) or not d.elapsed_ms or d.elapsed_ms <= 0:
            return  # a data-parallel padding step, or one not timed
        seconds = d.elapsed_ms / 1e3
        prefill_tokens, prefill_reqs = int(d.num_ctx_tokens), int(d.num_ctx_requests)
        decode_tokens = int(d.num_generation_tokens)
        if prefill_tokens and decode_tokens:
            mon.record_step("mixed", seconds, batch=decode_tokens, context_tokens=self._context_tokens(stats),
                            seq_lens=split_evenly(prefill_tokens, prefill_reqs))
        elif prefill_tokens:
            mon.record_step("prefill", seconds, batch=max(prefill_reqs, 1), tokens=prefill_tokens,
                            seq_lens=split_evenly(prefill_tokens, prefill_reqs))
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

