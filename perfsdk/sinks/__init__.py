"""Where the collector sends what it computed: Prometheus metrics and OpenTelemetry spans.

Sinks run on the collector thread only and know nothing of each other. NVTX is
not a sink: it lives on the hot path (:mod:`perfsdk.nvtx_ranges`).
"""
