"""What a benchmark run does: :class:`BenchConfig`, validated when built.

::

    from perfsdk.bench import BenchConfig

    cfg = BenchConfig(
        base_url="http://127.0.0.1:8000",
        model="tiny-llama",
        endpoint="chat",              # or "completions" (the default)
        num_prompts=200,
        request_rate=8.0,             # requests/s; float("inf") sends all at once
        burstiness=1.0,               # 1 = Poisson; <1 burstier, >1 more regular
        max_concurrency=32,
        input_len="uniform:64-256",   # int, text or LengthSpec
        output_len=128,
        goodput={"ttft": 500, "tpot": 50},   # SLOs in milliseconds
        seed=0,
        repeat=3,                     # the same load three times: spread, and intervals in compare
        duration_s=600.0,             # stop sending after 10 minutes (None: send all num_prompts)
        max_chunks=None,              # text chunks per response: None = 4 x max_tokens + 64
    )

``duration_s`` ends a run early: no request is sent once that many seconds
have passed since the first (per repetition), so ``num_prompts`` may be huge;
the requests are built as they are sent. ``max_chunks`` caps the text chunks
of every response (``None``: ``4 * max_tokens + 64`` per request, see
``client.py``); a stream past it fails as ``too_many_chunks``.

Every field is checked in ``__post_init__``; a bad value raises
:class:`perfsdk.errors.ConfigError` whose message starts with the field name.
Lengths given as ``int`` or text are converted to :class:`LengthSpec`, so
``cfg.input_len`` is always a ``LengthSpec``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlparse

from perfsdk.bench.distributions import LengthSpec
from perfsdk.config import check_number, parse_float
from perfsdk.errors import ConfigError

__all__ = ["GOODPUT_METRICS", "BenchConfig", "parse_goodput"]

#: SLO names accepted by ``--goodput``; values are milliseconds, at most MAX_SLO_MS.
GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")
MAX_SLO_MS = 1e9

Endpoint = Literal["completions", "chat"]

_ENDPOINT_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def parse_goodput(items: Sequence[str] | Mapping[str, float] | None) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` or ``{"ttft": 500}`` -> ``{"ttft": 500.0, ...}`` (milliseconds)."""
    if not items:
        return {}
    pairs: list[tuple[str, Any]]
    if isinstance(items, Mapping):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            name, sep, value = str(item).partition(":")
            if not sep:
                raise ConfigError(f"goodput: expected NAME:MS (e.g. ttft:500), got {item!r}")
            pairs.append((name, value))
    out: dict[str, float] = {}
    for name, value in pairs:
        key = str(name).strip().lower()
        if key not in GOODPUT_METRICS:
            raise ConfigError(f"goodput: unknown metric {name!r}; choose from {', '.join(GOODPUT_METRICS)}")
        if isinstance(value, str):  # from the command line: perfsdk.config's number rule
            try:
                out[key] = parse_float(value, 0, MAX_SLO_MS, open_low=True, what="a number of milliseconds")
            except ValueError as e:
                raise ConfigError(f"goodput: {key}: {e}") from None
        else:
            what = "a number of milliseconds"
            out[key] = check_number(f"goodput: {key}", value, 0, MAX_SLO_MS, open_low=True, what=what)
    return out


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run against an OpenAI-compatible server (see the module docstring)."""

    base_url: str
    model: str
    endpoint: Endpoint = "completions"
    num_prompts: int = 100
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    input_len: LengthSpec | int | str = 128
    output_len: LengthSpec | int | str = 128
    seed: int = 0
    warmup: int = 0
    ignore_eos: bool = False
    goodput: Mapping[str, float] = field(default_factory=dict)
    percentiles: tuple[float, ...] = (99.0,)
    timeout_s: float = 300.0
    save_result: str | None = None
    plot: str | None = None
    progress: bool = True
    api_key: str | None = field(default=None, repr=False)  # never saved in results
    temperature: float = 0.0
    repeat: int = 1  # repetitions of the same load (same seed, same requests, same schedule)
    duration_s: float | None = None  # stop sending new requests this long after the first (per repetition)
    max_chunks: int | None = None  # text chunks one response may send; None: derived from its max_tokens

    def __post_init__(self) -> None:
        url = urlparse(self.base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ConfigError(f"base_url: expected http(s)://host:port, got {self.base_url!r}")
        # "/v1" is a common habit (OpenAI clients want it); accept it and drop it once
        base = self.base_url.rstrip("/")
        base = base.removesuffix("/v1")
        object.__setattr__(self, "base_url", base)
        if not self.model:
            raise ConfigError("model: must be a non-empty model name as the server knows it")
        if self.endpoint not in _ENDPOINT_PATHS:
            raise ConfigError(f"endpoint: expected 'completions' or 'chat', got {self.endpoint!r}")
        _check_int("num_prompts", self.num_prompts, minimum=1)
        _check_int("warmup", self.warmup, minimum=0)
        _check_int("seed", self.seed, minimum=None)
        _check_int("repeat", self.repeat, minimum=1)
        if isinstance(self.request_rate, bool) or not (
            isinstance(self.request_rate, (int, float)) and self.request_rate > 0
        ):
            raise ConfigError(f"request_rate: must be > 0 requests/s (or inf), got {self.request_rate!r}")
        object.__setattr__(self, "request_rate", float(self.request_rate))
        if isinstance(self.burstiness, bool) or not (isinstance(self.burstiness, (int, float)) and self.burstiness > 0):
            raise ConfigError(f"burstiness: must be > 0 (1 = Poisson), got {self.burstiness!r}")
        object.__setattr__(self, "burstiness", float(self.burstiness))
        per_s = self.request_rate * self.burstiness
        if math.isfinite(self.request_rate) and (per_s == 0 or not math.isfinite(1.0 / per_s)):
            # the gamma draw's scale, 1 / (rate x burstiness), must be a number of seconds
            raise ConfigError(
                f"request_rate: {self.request_rate!r} requests/s with burstiness {self.burstiness!r} puts the "
                "requests beyond any finite time; use a larger rate (or inf)"
            )
        if self.max_concurrency is not None:
            _check_int("max_concurrency", self.max_concurrency, minimum=1)
        object.__setattr__(self, "input_len", LengthSpec.parse(self.input_len, field="input_len"))
        object.__setattr__(self, "output_len", LengthSpec.parse(self.output_len, field="output_len"))
        object.__setattr__(self, "goodput", parse_goodput(self.goodput))
        pct: list[float] = []
        for p in self.percentiles:
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 100:
                raise ConfigError(f"percentiles: each must be in (0, 100], got {p!r}")
            pct.append(float(p))
        object.__setattr__(self, "percentiles", tuple(sorted(set(pct))))
        # finite: aiohttp cannot arm an infinite connect timeout, and JSON has no Infinity to send
        if not (_is_finite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError(f"timeout_s: must be a finite number of seconds > 0, got {self.timeout_s!r}")
        if not (_is_finite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature: must be a finite number >= 0, got {self.temperature!r}")
        if self.duration_s is not None and not (_is_finite(self.duration_s) and self.duration_s > 0):
            raise ConfigError(f"duration_s: must be a finite number of seconds > 0, got {self.duration_s!r}")
        if self.max_chunks is not None:
            _check_int("max_chunks", self.max_chunks, minimum=1)

    @property
    def url(self) -> str:
        """The full URL requests are POSTed to."""
        return self.base_url + _ENDPOINT_PATHS[self.endpoint]

    @property
    def input_spec(self) -> LengthSpec:
        assert isinstance(self.input_len, LengthSpec)  # converted in __post_init__
        return self.input_len

    @property
    def output_spec(self) -> LengthSpec:
        assert isinstance(self.output_len, LengthSpec)
        return self.output_len

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view for saved results; the API key is left out on purpose."""
        return {
            "base_url": self.base_url,
            "url": self.url,
            "model": self.model,
            "endpoint": self.endpoint,
            "num_prompts": self.num_prompts,
            "request_rate": _json_float(self.request_rate),
            "burstiness": _json_float(self.burstiness),
            "max_concurrency": self.max_concurrency,
            "input_len": str(self.input_len),
            "output_len": str(self.output_len),
            "seed": self.seed,
            "warmup": self.warmup,
            "ignore_eos": self.ignore_eos,
            "goodput": dict(self.goodput),
            "percentiles": list(self.percentiles),
            "timeout_s": self.timeout_s,
            "temperature": self.temperature,
            "repeat": self.repeat,
            "duration_s": self.duration_s,
            "max_chunks": self.max_chunks,
        }


def _json_float(x: float) -> float | str:
    # JSON has no Infinity; "inf" round-trips through float()
    return "inf" if math.isinf(x) else x


def _is_finite(value: object) -> bool:
    """A real number (not a bool) within the float range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond 1e308
        return False


def _check_int(name: str, value: object, *, minimum: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}: must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}: must be >= {minimum}, got {value}")
