"""The profiler window over HTTP: what ``POST``, ``GET`` and ``DELETE`` of a profile endpoint answer.

Both of perfsdk's HTTP servers serve it through these functions, so they answer alike: the Monitor's
metrics server at ``/profile`` (:mod:`perfsdk.metrics_server`) and the demo at ``/debug/profile``
(:mod:`perfsdk.demo.server`)::

    curl -X POST   'http://127.0.0.1:9400/profile?steps=4&mode=torch'  # 202 armed; 409 one is under way
    curl           'http://127.0.0.1:9400/profile'                     # 200 the window now and the last result
    curl -X DELETE 'http://127.0.0.1:9400/profile'                     # 200 cancelled; 409 nothing to cancel

``GET`` answers the window's state (``idle``, ``armed``, ``ready``, ``running``, ``writing``), the capture
under way (``current``: id, trigger, mode, steps, state), its counters, and the last result (``last``:
verdict, trace path, diagnosis path, error, and the diagnosis' ``findings``); ``enabled`` is false while the
Monitor has no profiler window yet (the first ``POST`` makes one). A ``409`` to a ``POST`` says which capture
is under way and names the ``GET`` and ``DELETE`` that show and cancel it. ``DELETE`` drops an armed
capture at once; a running one stops at the serving thread's next step (its result then carries the
reason); one being written and diagnosed cannot be cancelled (409).

``POST`` and ``DELETE`` need ``Authorization: Bearer <token>`` whenever the server has a token, and a
server that binds anything but loopback must have one (:func:`check_bind`); ``GET`` is open, like
``/metrics``.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Any, Protocol

from perfsdk.errors import ConfigError

__all__ = ["ProfileHost", "arm", "bearer_ok", "cancel", "check_bind", "is_loopback", "status"]


class ProfileHost(Protocol):
    """What the endpoint needs of its Monitor (perfsdk.Monitor is one)."""

    def profile(self, steps: int | None = None, mode: str | None = None, reason: str = "api") -> Any: ...

    def profile_status(self) -> dict[str, Any] | None: ...

    def cancel_profile(self, reason: str = "cancelled") -> bool: ...


def is_loopback(addr: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``); ``""`` (every address) is not."""
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def check_bind(addr: str, token: str | None, what: str, server: str, needs: str) -> None:
    """Refuse (:class:`ConfigError` naming *what*) to serve the profile endpoint on a non-loopback *addr*
    without a token."""
    if not is_loopback(addr) and not token:
        raise ConfigError(f"{what}: binding {server} to {addr!r} (not loopback) needs {needs}")


def bearer_ok(token: str | None, header: str | None) -> bool:
    """Whether an ``Authorization`` *header* carries *token* (always, when there is no token)."""
    if token is None:
        return True
    expected = f"Bearer {token}"
    return header is not None and hmac.compare_digest(header.encode("utf-8", "replace"), expected.encode())


def _see(path: str) -> str:
    return f"GET {path} shows the capture under way and the last result; DELETE {path} cancels it"


def arm(host: ProfileHost, steps: int | None, mode: str | None, path: str) -> tuple[int, dict[str, Any], Any]:
    """``POST``: arm a capture. ``(status, body, handle)``: 202 armed, 409 refused (body says why and what to
    do), 400 a bad setting (:class:`ConfigError` names it; *handle* is None then)."""
    try:
        handle = host.profile(steps=steps, mode=mode, reason="http")
    except ConfigError as e:
        return 400, {"error": str(e)}, None
    info = handle.to_dict() if hasattr(handle, "to_dict") else {"accepted": bool(handle)}
    if info.get("accepted", True):
        return 202, info, handle
    info["see"] = _see(path)
    return 409, info, handle


def status(host: ProfileHost) -> tuple[int, dict[str, Any]]:
    """``GET``: the window's state, the capture under way and the last result."""
    st = host.profile_status()
    if st is None:
        return 200, {"enabled": False, "state": "idle", "current": None, "last": None, "captures": 0}
    return 200, {"enabled": True, **st}


def cancel(host: ProfileHost, path: str) -> tuple[int, dict[str, Any]]:
    """``DELETE``: cancel the capture under way. 200 with the window's state after it, or 409 and why not."""
    before = host.profile_status()
    current = None if before is None else before.get("current")
    if host.cancel_profile("cancelled over HTTP"):
        after = host.profile_status() or {}
        note = "stops at the serving thread's next step" if current and current.get("state") == "running" else "dropped"
        return 200, {"cancelled": True, "capture": current, "note": note, **after}
    state = "idle" if before is None else before.get("state", "idle")
    if state == "writing":
        reason = (
            f"capture {current.get('id') if current else '?'} is being written and diagnosed; it cannot be "
            f"cancelled (GET {path} shows its result when done)"
        )
    else:
        reason = f"no capture is armed or running (POST {path} arms one)"
    return 409, {"cancelled": False, "reason": reason, "state": state}
