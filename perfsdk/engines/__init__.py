"""perfsdk inside LLM engines, loaded by the engines themselves: vLLM (:mod:`perfsdk.engines.vllm`,
``docs/vllm.md``) and SGLang (:mod:`perfsdk.engines.sglang_hook`, ``docs/sglang.md``).

In each GPU process of the engine (a vLLM worker, an SGLang scheduler) a hook opens a perfsdk step —
a pooled CUDA event — where the engine's step starts and closes it where it ends, sized exactly from
the engine's own batch description (:class:`~perfsdk.engines._common.StepShape`): device time, MBU and
MFU per GPU, on the engine's own ``/metrics`` through ``PROMETHEUS_MULTIPROC_DIR`` or on a port per rank.
The engines' request latencies come from what they measure themselves (vLLM's stat loggers:
:mod:`perfsdk.engines.vllm.stats`). Beside an unmodified SGLang, ``perfsdk sglang``
(:mod:`perfsdk.engines.sglang`) reads its forward-pass metrics feed from another process.

Importing this package imports no engine. The hooks are loaded through each engine's plugin entry points
(``pyproject.toml``) and share one base, :class:`~perfsdk.engines.instrumentor.Instrumentor`: the engine
releases each supports declared as data and checked before anything is patched, install and uninstall
idempotent, patches that carry perfsdk's marker and are undone exactly. They never raise into the engine.
"""

from perfsdk.records import split_evenly

__all__ = ["split_evenly"]
