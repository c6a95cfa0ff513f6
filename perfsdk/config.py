"""Monitor settings: arguments and environment variables, read and validated in one place.

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
``queue_size``                 ``PERFSDK_QUEUE_SIZE``       an integer in [1, 16777216] (2**24)
``event_pool_size``            ``PERFSDK_EVENT_POOL_SIZE``  an integer in [1, 1048576] (2**20)
``timing_every``               ``PERFSDK_TIMING_EVERY``     an integer in [1, 1048576]
``chain_gap_us``               ``PERFSDK_CHAIN_GAP_US``     a number in [0, 10000]
``step_span_rate``             ``PERFSDK_STEP_SPAN_RATE``   a number in [0, 1]
``poll_interval``              ``PERFSDK_POLL_INTERVAL``    seconds in [0.0001, 10]
``export_interval``            ``PERFSDK_EXPORT_INTERVAL``  seconds in [0.001, 60]
``strict``                     ``PERFSDK_STRICT``           true/false
``rank``                       ``PERFSDK_RANK``             ``auto``, ``none`` or an integer in [0, 1048576]:
                                                            the ``rank`` label (``auto``: this process's
                                                            rank when it is one of several)
(``serve_metrics`` at start)   ``PERFSDK_METRICS_PORT``     an integer in [0, 65535]; plus ``LOCAL_RANK``
                                                            at most 65535 (:func:`metrics_endpoint`)
                               ``PERFSDK_METRICS_ADDR``     a loopback address (default 127.0.0.1): the
                                                            trigger off loopback needs a token, which only
                                                            ``serve_metrics(token=...)`` takes
(calibration cache)            ``PERFSDK_CACHE_DIR``        a directory (default ``~/.cache/perfsdk``)
(vLLM / SGLang hooks)          ``PERFSDK_PROFILER``         ``torch``, ``nsys``, or off (0/false/no/off)
                               ``PERFSDK_PROFILE_DIR``      a directory (default ``./perfsdk-traces``)
(read, not perfsdk's)          ``LOCAL_RANK``, ``RANK``,    integers in [0, 1048576] (torchrun's)
                               ``WORLD_SIZE``
                               ``PROMETHEUS_MULTIPROC_DIR`` an existing, writable directory, exactly as
                                                            written (checked when a Monitor is built)
=============================  ===========================  =========================================

One rule for every variable and every number read from text (here and on the ``perfsdk`` command line,
:mod:`perfsdk.cli._args`):

* ASCII whitespace (space, tab, newline, CR, VT, FF) is stripped from both ends of a value; a value that is
  then empty counts as unset. Nothing else is trimmed (a no-break or ideographic space is part of the value).
* Flags: ``1/0``, ``true/false``, ``yes/no``, ``on/off``; flags and choices ignore case.
* Integers: an optional sign and ASCII digits only (``12``, not ``１２``, ``1_000`` or ``12.0``).
* Numbers: ASCII decimal or exponent notation (``0.5``, ``.5``, ``5e-3``); never ``nan``, and ``inf`` only
  where a setting says so; a value beyond its range (``1e400`` included) is refused, naming the variable.
* ``PROMETHEUS_MULTIPROC_DIR`` is prometheus_client's: it uses the value as written, so perfsdk does not trim
  it but refuses a value with surrounding whitespace (and an empty one: prometheus_client would write its
  files into the current directory).

Explicit arguments win over the environment. Arguments are Python values, not text: ``queue_size="12"`` is
refused (an int is expected), and the text rules above do not apply to them.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfsdk.errors import ConfigError

__all__ = [
    "MAX_RANK",
    "MonitorConfig",
    "cache_dir",
    "check_int",
    "check_number",
    "clean",
    "env",
    "env_flag",
    "env_int",
    "metrics_endpoint",
    "multiproc_dir",
    "parse_flag",
    "parse_float",
    "parse_int",
]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_ASCII_SPACE = " \t\n\r\x0b\x0c"
_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INF = ("inf", "+inf", "infinity", "+infinity")
_MAX_DIGITS = 40  # longer integers are out of every range here (and int() of 4,300+ digits raises)
MAX_RANK = 2**20


# ---- text: the one trimming rule and the one number syntax ------------------------------------------------
def clean(text: str | None) -> str | None:
    """*text* with ASCII whitespace stripped from both ends; ``None`` when nothing is left."""
    if text is None:
        return None
    t = text.strip(_ASCII_SPACE)
    return t or None


def env(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The environment variable *name* (of *environ*, default ``os.environ``), :func:`clean`-ed: ASCII
    whitespace stripped, an empty value read as unset."""
    return clean((os.environ if environ is None else environ).get(name))


def _num(x: float) -> str:
    return str(int(x)) if isinstance(x, int) or (math.isfinite(x) and x == int(x) and abs(x) < 1e15) else f"{x:g}"


def _range(low: float, high: float | None, open_low: bool = False) -> str:
    if high is None:
        return f"> {_num(low)}" if open_low else f">= {_num(low)}"
    return f"within {'(' if open_low else '['}{_num(low)}, {_num(high)}]"


def parse_int(text: str, low: int, high: int | None = None) -> int:
    """*text* as an integer within [*low*, *high*] by the module's rule (sign and ASCII digits, ASCII
    whitespace around). Raises :class:`ValueError` whose message says what was expected (no name)."""
    t = clean(text) or ""
    if not _INT.fullmatch(t):
        raise ValueError(f"expected an integer {_range(low, high)} (ASCII digits), got {text!r}")
    if len(t.lstrip("+-")) > _MAX_DIGITS:
        raise ValueError(f"must be {_range(low, high)}, got a {len(t.lstrip('+-'))}-digit number")
    value = int(t)
    if value < low or (high is not None and value > high):
        raise ValueError(f"must be {_range(low, high)}, got {value}")
    return value


def parse_float(
    text: str,
    low: float,
    high: float | None = None,
    *,
    open_low: bool = False,
    allow_inf: bool = False,
    what: str = "a number",
) -> float:
    """*text* as a finite float within the range by the module's rule (ASCII decimal or exponent notation;
    ``inf`` only with *allow_inf*). Raises :class:`ValueError` whose message says what was expected."""
    t = clean(text) or ""
    where = _range(low, high, open_low) + (" (or inf)" if allow_inf else "")
    if allow_inf and t.lower() in _INF:
        return math.inf
    if not _FLOAT.fullmatch(t):
        raise ValueError(f"expected {what} {where}, got {text!r}")
    value = float(t)
    if not math.isfinite(value) or value < low or (open_low and value == low) or (high is not None and value > high):
        raise ValueError(f"must be {what} {where}, got {text.strip(_ASCII_SPACE)!r}")
    return value


def parse_flag(text: str) -> bool:
    """*text* as true/false (``1/0``, ``true/false``, ``yes/no``, ``on/off``, any case). Raises ValueError."""
    t = (clean(text) or "").lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError(f"expected true or false (1/0, yes/no, on/off), got {text!r}")


def _named(name: str, e: ValueError) -> ConfigError:
    return ConfigError(f"{name}: {e}")


def env_int(name: str, low: int, high: int | None = None, environ: Mapping[str, str] | None = None) -> int | None:
    """The integer environment variable *name*, or None when unset; :class:`ConfigError` naming it if bad."""
    t = env(name, environ)
    if t is None:
        return None
    try:
        return parse_int(t, low, high)
    except ValueError as e:
        raise _named(f"{name} (environment)", e) from None


def env_flag(name: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """The true/false environment variable *name*, else *default*; :class:`ConfigError` naming it if bad."""
    t = env(name, environ)
    if t is None:
        return default
    try:
        return parse_flag(t)
    except ValueError as e:
        raise _named(f"{name} (environment)", e) from None


# ---- Python values (arguments) ----------------------------------------------------------------------------
def check_int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """*value* as an int within [*low*, *high*], else :class:`ConfigError` naming *name*.

    The one integer check of perfsdk's settings given as Python values (Monitor, profiler window); ``bool``
    and text are refused (text goes through :func:`parse_int`).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: expected an integer {_range(low, high)}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{name}: must be {_range(low, high)}, got {value}")
    return value


def check_number(
    name: str, value: Any, low: float, high: float | None = None, *, open_low: bool = False, what: str = "a number"
) -> float:
    """*value* as a finite float within the range, else :class:`ConfigError` naming *name*.

    The one number check of perfsdk's settings given as Python values: NaN, infinities, ``bool`` and text
    are refused (text goes through :func:`parse_float`); *open_low* makes the lower bound exclusive.
    """
    where = _range(low, high, open_low)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}: expected {what} {where}, got {value!r}")
    try:
        f = float(value)
    except OverflowError:  # an int beyond the float range
        f = math.inf
    if not math.isfinite(f) or f < low or (open_low and f == low) or (high is not None and f > high):
        shown = repr(value) if isinstance(value, float) or abs(value) < 10**_MAX_DIGITS else "a huge integer"
        raise ConfigError(f"{name}: expected a finite {what.removeprefix('a ')} {where}, got {shown}")
    return f


# ---- directories -------------------------------------------------------------------------------------------
def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where perfsdk caches measurements (calibration): ``PERFSDK_CACHE_DIR``, else ``~/.cache/perfsdk``."""
    d = env("PERFSDK_CACHE_DIR", environ)
    return Path(d).expanduser() if d else Path.home() / ".cache" / "perfsdk"


def multiproc_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """prometheus_client's multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``, else the deprecated
    ``prometheus_multiproc_dir``), or None when neither is set.

    Checked as prometheus_client will use it — the value as written: :class:`ConfigError` naming the
    variable when it is empty, padded with whitespace, missing, not a directory or not writable (each of
    which prometheus_client would turn into a bare OS error on the first metric, or into files in the
    current directory).
    """
    environ = os.environ if environ is None else environ
    name = "PROMETHEUS_MULTIPROC_DIR" if "PROMETHEUS_MULTIPROC_DIR" in environ else "prometheus_multiproc_dir"
    value = environ.get(name)
    if value is None:
        return None
    src = f"{name} (environment)"
    hint = "set it to an empty directory this process can write (and clear it when the server starts)"
    if not value.strip():
        raise ConfigError(
            f"{src}: is set but empty, so prometheus_client would write its files into the current "
            f"directory; unset it, or {hint}"
        )
    if value != value.strip():
        raise ConfigError(
            f"{src}: {value!r} has whitespace around it, and prometheus_client uses the value as "
            f"written; remove the whitespace"
        )
    if not os.path.exists(value):
        raise ConfigError(f"{src}: {value!r} does not exist; {hint}")
    if not os.path.isdir(value):
        raise ConfigError(f"{src}: {value!r} is not a directory; {hint}")
    if not os.access(value, os.W_OK | os.X_OK):
        raise ConfigError(f"{src}: {value!r} is not writable by this process; {hint}")
    return value


# ---- the Monitor's settings ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class MonitorConfig:
    """Every setting of a Monitor except its registry and clock; ``model`` and ``hardware`` hold only what
    ``PERFSDK_MODEL`` and ``PERFSDK_HARDWARE`` say (the Monitor's arguments, which may be objects, win).

    See the module docstring for the environment variable of each field.
    """

    enabled: bool = True
    service: str = "perfsdk"
    model_name: str | None = None
    model: str | None = None
    hardware: str = "auto"
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

        def get(field: str, env_name: str | None) -> tuple[Any, str, bool]:
            """(value, the name errors use, whether the value is environment text)."""
            v = given.get(field)
            if v is None and env_name is not None:
                t = env(env_name, environ)
                if t is not None:
                    return t, f"{env_name} (environment)", True
            return (getattr(d, field) if v is None else v), field, False

        def text_rule(src: str, parse: Any, t: str, *args: Any, **kw: Any) -> Any:
            try:
                return parse(t, *args, **kw)
            except ValueError as e:
                raise _named(src, e) from None

        def flag(field: str, env_name: str) -> bool:
            v, src, is_text = get(field, env_name)
            if is_text:
                return bool(text_rule(src, parse_flag, v))
            if not isinstance(v, bool):
                raise ConfigError(f"{src}: expected true or false, got {v!r}")
            return v

        def integer(field: str, env_name: str, low: int, high: int) -> int:
            v, src, is_text = get(field, env_name)
            return int(text_rule(src, parse_int, v, low, high)) if is_text else check_int(src, v, low, high)

        def number(field: str, env_name: str, low: float, high: float, what: str) -> float:
            v, src, is_text = get(field, env_name)
            if is_text:
                return float(text_rule(src, parse_float, v, low, high, what=what))
            return check_number(src, v, low, high, what=what)

        out["enabled"] = flag("enabled", "PERFSDK_ENABLED")
        for field, env_name in (
            ("service", "PERFSDK_SERVICE"),
            ("model_name", "PERFSDK_MODEL_NAME"),
            ("model", "PERFSDK_MODEL"),
            ("hardware", "PERFSDK_HARDWARE"),
            ("operation", None),
            ("metrics_addr", "PERFSDK_METRICS_ADDR"),
        ):
            v, src, _ = get(field, env_name)
            if v is not None and not isinstance(v, str):
                raise ConfigError(f"{src}: expected text, got {v!r}")
            out[field] = v
        v, src, is_text = get("nvtx", "PERFSDK_NVTX")
        if is_text and v.lower() in (*_TRUE, *_FALSE):
            v = v.lower() in _TRUE
        if not isinstance(v, bool) and (not isinstance(v, str) or v.lower() not in ("auto", "nvtx", "torch")):
            raise ConfigError(f"{src}: expected 'auto', True, False, 'nvtx' or 'torch', got {v!r}")
        out["nvtx"] = v.lower() if isinstance(v, str) else v
        out["otel_explicit"] = given.get("otel") is True
        out["otel"] = flag("otel", "PERFSDK_OTEL")
        for field, env_name, choices in (
            ("timing", "PERFSDK_TIMING", ("auto", "cuda", "host")),
            ("cuda_events", "PERFSDK_CUDA_EVENTS", ("auto", "driver", "torch")),
            ("hot_path", "PERFSDK_HOT_PATH", ("auto", "c", "python")),
        ):
            v, src, _ = get(field, env_name)
            c = v.lower() if isinstance(v, str) else v
            if c not in choices:
                raise ConfigError(f"{src}: expected one of {', '.join(repr(c) for c in choices)}, got {v!r}")
            out[field] = c
        out["queue_size"] = integer("queue_size", "PERFSDK_QUEUE_SIZE", 1, 2**24)
        out["event_pool_size"] = integer("event_pool_size", "PERFSDK_EVENT_POOL_SIZE", 1, 2**20)
        out["timing_every"] = integer("timing_every", "PERFSDK_TIMING_EVERY", 1, 2**20)
        out["chain_gap_us"] = number("chain_gap_us", "PERFSDK_CHAIN_GAP_US", 0, 10_000, "a number of microseconds")
        out["step_span_rate"] = number("step_span_rate", "PERFSDK_STEP_SPAN_RATE", 0, 1, "a fraction")
        out["poll_interval"] = number("poll_interval", "PERFSDK_POLL_INTERVAL", 1e-4, 10, "a number of seconds")
        out["export_interval"] = number("export_interval", "PERFSDK_EXPORT_INTERVAL", 1e-3, 60, "a number of seconds")
        out["strict"] = flag("strict", "PERFSDK_STRICT")
        v, src, _ = get("compute_dtype", None)
        if v is not None and not isinstance(v, str):
            raise ConfigError(f"compute_dtype: expected a dtype name, got {v!r}")
        out["compute_dtype"] = v
        v, src, is_text = get("rank", "PERFSDK_RANK")
        if is_text:
            v = v.lower() if v.lower() in ("auto", "none") else text_rule(src, parse_int, v, 0, MAX_RANK)
        elif v not in ("auto", "none") and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_RANK):
            raise ConfigError(f"{src}: expected 'auto', None or a rank number in [0, {MAX_RANK}], got {v!r}")
        out["rank"] = None if v == "none" else v
        v, src, is_text = get("metrics_port", "PERFSDK_METRICS_PORT")
        if v is not None:
            v = int(text_rule(src, parse_int, v, 0, 65535)) if is_text else check_int(src, v, 0, 65535)
        out["metrics_port"] = v
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
    local = env_int("LOCAL_RANK", 0, MAX_RANK, environ) or 0
    if port and local:
        if port + local > 65535:
            raise ConfigError(
                f"PERFSDK_METRICS_PORT (environment): {port} plus LOCAL_RANK={local} is port "
                f"{port + local}, beyond 65535; choose a base port of at most {65535 - local}"
            )
        port += local
    from perfsdk.profiling.endpoint import is_loopback  # only here: the HTTP rules are not needed otherwise

    if not is_loopback(cfg.metrics_addr):
        raise ConfigError(
            f"PERFSDK_METRICS_ADDR (environment): serving metrics on {cfg.metrics_addr!r} (not "
            "loopback) needs a token for POST /profile, which the environment cannot give; bind "
            "127.0.0.1, or call mon.serve_metrics(addr=..., token=...) yourself"
        )
    return port, cfg.metrics_addr
