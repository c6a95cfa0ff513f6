"""perfsdk with LLM engines that time themselves: vLLM (:mod:`perfsdk.engines.vllm`, a stat-logger plugin)
and SGLang (:mod:`perfsdk.engines.sglang`, a subscriber to its forward-pass metrics: ``perfsdk sglang``).

An engine already measures its steps and requests; these integrations hand those values to a
:class:`perfsdk.Monitor` (``record_step``, ``record_latencies``, ``record_finished``), which adds what the
engine does not say — MBU and MFU against the exact GPU's floors, perfsdk's metric names beside the
engine's own, OpenTelemetry request spans, the Grafana dashboard and alerts in ``integrations/grafana`` —
through each engine's public extension point, never by patching it.

:mod:`perfsdk.engines.vllm` imports vLLM at import time (vLLM's plugin loader imports it, in vLLM's
process); without vLLM it raises :class:`perfsdk.errors.MissingDependencyError`.
:mod:`perfsdk.engines.sglang` needs only ``pyzmq`` and ``msgspec`` (``perfsdk[sglang]``), not SGLang.
"""

__all__ = ["split_evenly"]


def split_evenly(tokens: int, requests: int) -> list[int]:
    """*tokens* over *requests* sequences as evenly as possible (engines report only the sums)."""
    n = max(int(requests), 1)
    base, extra = divmod(int(tokens), n)
    return [base + (1 if i < extra else 0) for i in range(n) if base or i < extra]
