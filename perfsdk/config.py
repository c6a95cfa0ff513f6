"""Monitor settings: arguments and ``PERFSDK_*`` environment variables, read and validated in one place.

:meth:`MonitorConfig.from_env` takes the arguments a :class:`perfsdk.Monitor` was given (``None`` where
the caller said nothing), fills the rest from the environment, then from defaults, and checks every
value once — so a server instrumented without code changes gets the same clear errors as one that passes
arguments::

    cfg = MonitorConfig.from_env(queue_size=None, step_span_rate=0.01)
    cfg.queue_size          # PERFSDK_QUEUE_SIZE, else 65536
    MonitorConfig.from_env(poll_interval=float("nan"))
    # ConfigError: poll_interval: expected a finite number of seconds within [0.0001, 10], got nan

=============================  ===========================  =========================================
setting                        environment                  accepted
=============================  ===========================  =========================================
``enabled``                    ``PERFSDK_ENABLED``          true/false (1/0, yes/no, on/off)
``service``                    ``PERFSDK_SERVICE``          any text
``model_name``                 ``PERFSDK_MODEL_NAME``       any text (the ``model`` label)
``model`` (the Monitor's)      ``PERFSDK_MODEL``            a known model name (or, as an argument, a spec)
``hardware`` (the Monitor's)   ``PERFSDK_HARDWARE``         ``auto``, a datasheet name, ``calibrate``
``nvtx``                       ``PERFSDK_NVTX``             ``auto``, true/false, ``nvtx``, ``torch``
``otel``                       ``PERFSDK_OTEL``             true/false
``timing``                     ``PERFSDK_TIMING``           ``auto``, ``cuda``, ``host``
``cuda_events``                ``PERFSDK_CUDA_EVENTS``      ``auto``, ``driver``, ``torch``
``hot_path``                   ``PERFSDK_HOT_PATH``         ``auto``, ``c``, ``python``
``queue_size``                 ``PERFSDK_QUEUE_SIZE``       an integer in [1, 2**24]
``event_pool_size``            ``PERFSDK_EVENT_POOL_SIZE``  an integer in [1, 2**20]
``timing_every``               ``PERFSDK_TIMING_EVERY``     an integer in [1, 2**20]
``chain_gap_us``               ``PERFSDK_CHAIN_GAP_US``     a number in [0, 10000]
``step_span_rate``             ``PERFSDK_STEP_SPAN_RATE``   a number in [0, 1]
``poll_interval``              ``PERFSDK_POLL_INTERVAL``    seconds in [0.0001, 10]
``export_interval``            ``PERFSDK_EXPORT_INTERVAL``  seconds in [0.001, 60]
``strict``                     ``PERFSDK_STRICT``           true/false
(``serve_metrics`` at start)   ``PERFSDK_METRICS_PORT``     an integer in [0, 65535]; plus ``LOCAL_RANK``
                                                            at most 65535 (:func:`metrics_endpoint`)
                               ``PERFSDK_METRICS_ADDR``     a loopback address (default 127.0.0.1): the
                                                            trigger off loopback needs a token, which only
                                                            ``serve_metrics(token=...)`` takes
=============================  ===========================  =========================================

Explicit arguments win over the environment; an environment variable set to the empty string counts as
unset.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsdk.errors import ConfigError

__all__ = ["MonitorConfig", "check_int", "check_number", "env", "metrics_endpoint"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``os.environ[name]``, with the empty string read as unset."""
    v = (os.environ if environ is None else environ).get(name)
    return v if v not in (None, "") else None


def _source(field: str, env_name: str | None, from_env: bool) -> str:
    return f"{env_name} (environment)" if from_env and env_name else field


def _pick(field: str, value: Any, env_name: str | None, environ: Mapping[str, str] | None) -> tuple[Any, bool]:
    if value is not None or env_name is None:
        return value, False
    v = env(env_name, environ)
    return v, v is not None


def _flag(name: str, value: Any, from_env: bool) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and "(environment)" in name and value.lower() in (*_TRUE, *_FALSE):
        return value.lower() in _TRUE
    raise ConfigError(f"{name}: expected true or false, got {value!r}")


def _range(low: float, high: float | None, open_low: bool) -> str:
    left = f"> {low:g}" if open_low else f">= {low:g}"
    return left if high is None else f"{'(' if open_low else '['}{low:g}, {high:g}]"


def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """*value* as an int within [*low*, *high*], else :class:`ConfigError` naming *name*.

    The one integer check of perfsdk's settings (Monitor, profiler window); ``bool`` is refused. A string is
    parsed only when *name* says it came from the environment.
    """
    where = "within " + _range(low, high, False) if high is not None else _range(low, None, False)
    if isinstance(value, str) and "(environment)" in name:
        try:
            value = int(value.strip(), 10)
        except ValueError:
            raise ConfigError(f"{name}: expected an integer {where}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: expected an integer {where}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{name}: must be {where}, got {value}")
    return value


def check_number(name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = False,
                 what: str = "a number") -> float:
    """*value* as a finite float within the range, else :class:`ConfigError` naming *name*.

    The one number check of perfsdk's settings: NaN, infinities and ``bool`` are refused; *open_low* makes
    the lower bound exclusive. A string is parsed only when *name* says it came from the environment.
    """
    where = ("within " if high is not None else "") + _range(low, high, open_low)
    if isinstance(value, str) and "(environment)" in name:
        try:
            value = float(value.strip())
        except ValueError:
            raise ConfigError(f"{name}: expected {what} {where}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected {what} {where}, got {value!r}")
    f = float(value)
    if not math.isfinite(f) or f < low or (open_low and f == low) or (high is not None and f > high):
        raise ConfigError(f"{name}: expected a finite {what.removeprefix('a ')} {where}, got {value!r}")
    return f


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    v = value.lower() if isinstance(value, str) else value
    if v not in choices:
        raise ConfigError(f"{name}: expected one of {', '.join(repr(c) for c in choices)}, got {value!r}")
    return str(v)


@dataclass(frozen=True)
class MonitorConfig:
    """Every setting of a Monitor except its model, hardware, registry and clock (the Monitor resolves those,
    reading ``PERFSDK_MODEL`` and ``PERFSDK_HARDWARE`` through :func:`env`).

    See the module docstring for the environment variable of each field.
    """

    enabled: bool = True
    service: str = "perfsdk"
    model_name: str | None = None
    nvtx: bool | str = "auto"
    otel: bool = True
    otel_explicit: bool = False  # otel=True was asked for (a missing SDK is then an error)
    timing: str = "auto"
    cuda_events: str = "auto"
    hot_path: str = "auto"
    queue_size: int = 65536
    event_pool_size: int = 1024
    timing_every: int = 1
    chain_gap_us: float = 10.0
    step_span_rate: float = 0.0
    poll_interval: float = 0.005
    export_interval: float = 1.0
    strict: bool = False
    operation: str = "text_completion"
    compute_dtype: str | None = None
    rank: int | str | None = "auto"
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> MonitorConfig:
        """The settings: *given* arguments (``None`` = not given), then ``PERFSDK_*`` from *environ*
        (default ``os.environ``), then defaults; each validated, with the variable named in errors."""
        unknown = set(given) - {f for f in cls.__dataclass_fields__ if f != "otel_explicit"}
        if unknown:
            raise TypeError(f"MonitorConfig: unknown settings {sorted(unknown)}")
        d = cls()
        out: dict[str, Any] = {}

        def get(field: str, env_name: str | None) -> tuple[Any, str]:
            v, from_env = _pick(field, given.get(field), env_name, environ)
            return (getattr(d, field) if v is None else v), _source(field, env_name, from_env)

        v, src = get("enabled", "PERFSDK_ENABLED")
        out["enabled"] = _flag(src, v, True)
        for field, env_name in (("service", "PERFSDK_SERVICE"), ("model_name", "PERFSDK_MODEL_NAME"),
                                ("operation", None), ("metrics_addr", "PERFSDK_METRICS_ADDR")):
            v, src = get(field, env_name)
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"{src}: expected text, got {v!r}")
            out[field] = v
        v, src = get("nvtx", "PERFSDK_NVTX")
        if isinstance(v, str) and v.lower() in (*_TRUE, *_FALSE):
            v = v.lower() in _TRUE
        if not isinstance(v, bool) and (not isinstance(v, str) or v.lower() not in ("auto", "nvtx", "torch")):
            raise ConfigError(f"{src}: expected 'auto', True, False, 'nvtx' or 'torch', got {v!r}")
        out["nvtx"] = v.lower() if isinstance(v, str) else v
        out["otel_explicit"] = given.get("otel") is True
        v, src = get("otel", "PERFSDK_OTEL")
        out["otel"] = _flag(src, v, False)
        for field, env_name, choices in (("timing", "PERFSDK_TIMING", ("auto", "cuda", "host")),
                                         ("cuda_events", "PERFSDK_CUDA_EVENTS", ("auto", "driver", "torch")),
                                         ("hot_path", "PERFSDK_HOT_PATH", ("auto", "c", "python"))):
            v, src = get(field, env_name)
            out[field] = _choice(src, v, choices)
        for field, env_name, low, high in (("queue_size", "PERFSDK_QUEUE_SIZE", 1, 2**24),
                                           ("event_pool_size", "PERFSDK_EVENT_POOL_SIZE", 1, 2**20),
                                           ("timing_every", "PERFSDK_TIMING_EVERY", 1, 2**20)):
            v, src = get(field, env_name)
            out[field] = check_int(src, v, low, high)
        v, src = get("chain_gap_us", "PERFSDK_CHAIN_GAP_US")
        out["chain_gap_us"] = check_number(src, v, 0, 10_000, what="a number of microseconds")
        v, src = get("step_span_rate", "PERFSDK_STEP_SPAN_RATE")
        out["step_span_rate"] = check_number(src, v, 0, 1, what="a fraction")
        v, src = get("poll_interval", "PERFSDK_POLL_INTERVAL")
        out["poll_interval"] = check_number(src, v, 1e-4, 10, what="a number of seconds")
        v, src = get("export_interval", "PERFSDK_EXPORT_INTERVAL")
        out["export_interval"] = check_number(src, v, 1e-3, 60, what="a number of seconds")
        v, src = get("strict", "PERFSDK_STRICT")
        out["strict"] = _flag(src, v, False)
        v, src = get("compute_dtype", None)
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"compute_dtype: expected a dtype name, got {v!r}")
        out["compute_dtype"] = v
        v, src = get("rank", "PERFSDK_RANK")
        if isinstance(v, str) and v not in ("auto", "none") and "(environment)" in src:
            v = check_int(src, v, 0, 2**20)
        elif isinstance(v, bool) or (isinstance(v, int) and not 0 <= v <= 2**20) or (
                not isinstance(v, int) and v not in ("auto", "none")):
            raise ConfigError(f"{src}: expected 'auto', None or a rank number, got {v!r}")
        out["rank"] = None if v == "none" else v
        v, src = get("metrics_port", "PERFSDK_METRICS_PORT")
        out["metrics_port"] = None if v is None else check_int(src, v, 0, 65535)
        return cls(**out)


def metrics_endpoint(cfg: MonitorConfig, environ: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """``(port, address)`` a Monitor serves at start (``PERFSDK_METRICS_PORT``), or None; checked before
    anything starts, so that a setting which cannot work fails the constructor with nothing to undo.

    The port is the base plus torchrun's ``LOCAL_RANK`` (every rank of a host its own scrape target; port 0,
    any free one, stays 0), and must stay within 65535. An address other than loopback is refused: it would
    expose ``POST /profile``, which then needs a token, and a token is only taken by
    :meth:`perfsdk.Monitor.serve_metrics` (call it yourself, with ``token=...``).
    """
    if cfg.metrics_port is None:
        return None
    port = cfg.metrics_port
    local = env("LOCAL_RANK", environ) or ""
    if port and local.isdigit():
        if port + int(local) > 65535:
            raise ConfigError(f"PERFSDK_METRICS_PORT (environment): {port} plus LOCAL_RANK={local} is port "
                              f"{port + int(local)}, beyond 65535; choose a base port of at most {65535 - int(local)}")
        port += int(local)
    from perfsdk.metrics_server import is_loopback  # only here: the server module is not needed otherwise

    if not is_loopback(cfg.metrics_addr):
        raise ConfigError(f"PERFSDK_METRICS_ADDR (environment): serving metrics on {cfg.metrics_addr!r} (not "
                          "loopback) needs a token for POST /profile, which the environment cannot give; bind "
                          "127.0.0.1, or call mon.serve_metrics(addr=..., token=...) yourself")
    return port, cfg.metrics_addr
