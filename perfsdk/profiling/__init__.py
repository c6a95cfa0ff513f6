"""Profiling: the opt-in profiler window and the trace diagnosis.

* :mod:`perfsdk.profiling.window` — ``mon.enable_profiler(...)`` / ``mon.profile()``: wait for
  steady decode steps, record a few under torch.profiler (or an Nsight Systems capture range),
  diagnose them; the gate is in :mod:`~perfsdk.profiling.steady`, the automatic and signal
  triggers in :mod:`~perfsdk.profiling.triggers`, sessions and files in :mod:`~perfsdk.profiling.capture`.
* :mod:`perfsdk.profiling.analyze` — ``analyze_trace(path)``: where a step's time went, and what
  to change next (also ``perfsdk analyze``); :mod:`~perfsdk.profiling.bandwidth` checks the kernels'
  time against the peak (and names the kernels for Nsight Compute), :mod:`~perfsdk.profiling.observer`
  puts the shares against the unprofiled step.

Importing this package imports nothing else; torch is imported only when a capture starts.
"""

from __future__ import annotations

__all__: list[str] = []
