"""perfsdk inside LLM engines that time themselves: vLLM (:mod:`perfsdk.engines.vllm`).

An engine already measures its steps and requests; these integrations hand those values to a
:class:`perfsdk.Monitor` (``record_step``, ``record_latencies``, ``record_finished``), which adds what the
engine does not say — MBU and MFU against the exact GPU's floors, perfsdk's metric names beside the
engine's own, OpenTelemetry request spans, the Grafana dashboard and alerts in ``integrations/grafana`` —
through each engine's public extension point, never by patching it.

Each module imports its engine at import time: import it only where the engine is installed (the
engine's plugin loader does). Without the engine it raises :class:`perfsdk.errors.MissingDependencyError`.
"""
