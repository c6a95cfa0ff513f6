"""NVTX ranges for the step phases, so Nsight Systems timelines show them.

Chosen once, when a Monitor is built: the ``nvtx`` package (a ``perfsdk``
domain, event attributes built once per phase and batch size and cached, the
batch size as the range's payload), else ``torch.cuda.nvtx`` (plain messages),
else nothing.

By default (``"auto"``) ranges are pushed only when an NVTX tool is attached:
Nsight Systems and Nsight Compute load their collector through
``NVTX_INJECTION64_PATH``, which they set for the process they launch. Without
it every NVTX call is a no-op in C, but the Python binding still costs ~1.2 µs
per push+pop on an H200 host, so perfsdk skips it. ``nvtx=True`` forces them on.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["NvtxRanges", "make_nvtx"]

_COLORS = {"prefill": 0xE67E22, "decode": 0x2E86C1, "mixed": 0x8E44AD}
_MAX_CACHED = 4096  # distinct (phase, batch) attribute objects kept; batch sizes are few in practice


class NvtxRanges:
    """``push(phase, batch)`` / ``pop()``; a backend named by :attr:`backend`."""

    backend = "none"

    def push(self, phase: str, batch: int) -> None:
        pass

    def pop(self) -> None:
        pass


class _NvtxPackage(NvtxRanges):
    backend = "nvtx"

    def __init__(self, nvtx: Any) -> None:
        self._domain = nvtx.get_domain("perfsdk")
        self._attrs: dict[tuple[str, int], Any] = {}
        self._push: Callable[[Any], None] = self._domain.push_range
        self.pop = self._domain.pop_range  # type: ignore[method-assign]  # bound straight to C: no Python frame

    def _make(self, phase: str, batch: int) -> Any:
        attrs = self._domain.get_event_attributes(
            message=f"{phase} (batch {batch})", color=_COLORS.get(phase, 0x7F8C8D), payload=batch
        )
        if len(self._attrs) < _MAX_CACHED:
            self._attrs[(phase, batch)] = attrs
        return attrs

    def push(self, phase: str, batch: int) -> None:
        attrs = self._attrs.get((phase, batch))
        self._push(attrs if attrs is not None else self._make(phase, batch))


class _TorchNvtx(NvtxRanges):
    backend = "torch.cuda.nvtx"

    def __init__(self, nvtx: Any) -> None:
        self._range_push = nvtx.range_push
        self.pop = nvtx.range_pop  # type: ignore[method-assign]  # bound directly: one Python frame fewer
        self._msgs: dict[tuple[str, int], str] = {}

    def push(self, phase: str, batch: int) -> None:
        key = (phase, batch)
        msg = self._msgs.get(key)
        if msg is None:
            msg = f"perfsdk.{phase} (batch {batch})"
            if len(self._msgs) < _MAX_CACHED:
                self._msgs[key] = msg
        self._range_push(msg)


_INJECTION_VARS = ("NVTX_INJECTION64_PATH", "NVTX_INJECTION32_PATH")


def tool_attached() -> bool:
    """Whether an NVTX consumer (Nsight Systems / Compute) was set up for this process."""
    return any(os.environ.get(v) for v in _INJECTION_VARS)


def make_nvtx(enabled: bool | str = "auto") -> NvtxRanges:
    """The best NVTX backend available (``enabled="nvtx"``/``"torch"`` to insist on one).

    ``"auto"``: as ``True`` when an NVTX tool is attached (:func:`tool_attached`), else nothing.
    """
    if enabled == "auto":
        if not tool_attached():
            return NvtxRanges()
        enabled = True
    if enabled is False or enabled == "none":
        return NvtxRanges()
    if enabled in (True, "nvtx"):
        try:
            import nvtx

            return _NvtxPackage(nvtx)
        except Exception:
            if enabled == "nvtx":
                from perfsdk.errors import MissingDependencyError

                raise MissingDependencyError("nvtx", "NVTX ranges", extra="nvtx") from None
    if "torch" in sys.modules or enabled == "torch":
        try:
            import torch

            if torch.cuda.is_available():
                return _TorchNvtx(torch.cuda.nvtx)
        except Exception:
            pass
    return NvtxRanges()
