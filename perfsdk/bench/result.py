"""What a run produced: :class:`BenchResult`, and its JSON file.

::

    result = benchmark(cfg)
    result.summary["ttft_ms"]["p99"]          # see report.py for every key
    [r.ttft for r in result.records if r.ok]  # per-request records, seconds
    result.save("run.json")
    again = BenchResult.load("run.json")      # records and summary round-trip

The JSON file holds ``format`` (a version number), ``config`` (without the API
key), ``seed``, ``environment`` (perfsdk, Python and aiohttp versions, host,
platform, start time, command line), ``summary``, ``records`` and
``warmup_records``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import sys
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from perfsdk.bench.records import RequestRecord
from perfsdk.bench.report import format_summary
from perfsdk.errors import ConfigError

__all__ = ["RESULT_FORMAT", "BenchResult", "environment"]

RESULT_FORMAT = 1


def environment() -> dict[str, Any]:
    """Where and with what a run was made; stored beside the numbers so that two files can be compared."""
    from perfsdk._version import __version__  # kept local: avoids a cycle at import

    try:
        import aiohttp  # optional dependency

        aiohttp_version: str | None = aiohttp.__version__
    except ImportError:
        aiohttp_version = None
    return {
        "perfsdk": __version__,
        "python": platform.python_version(),
        "aiohttp": aiohttp_version,
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "argv": list(sys.argv),
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


@dataclass
class BenchResult:
    """The records, the summary and the context of one benchmark run."""

    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[RequestRecord]
    warmup_records: list[RequestRecord] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return int(seed) if seed is not None else None

    def format(self) -> str:
        """The human-readable table."""
        return format_summary(self.summary)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": RESULT_FORMAT,
            "config": self.config,
            "seed": self.seed,
            "environment": self.environment,
            "summary": self.summary,
            "records": [r.to_dict() for r in self.records],
            "warmup_records": [r.to_dict() for r in self.warmup_records],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        # allow_nan=False: a NaN would make the file unreadable by strict JSON parsers
        out.write_text(json.dumps(_clean(self.to_dict()), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchResult:
        if not isinstance(d, dict) or "summary" not in d:
            raise ConfigError("result: not a perfsdk bench result (no 'summary')")
        return cls(
            config=dict(d.get("config", {})),
            summary=dict(d["summary"]),
            records=[RequestRecord.from_dict(r) for r in d.get("records", [])],
            warmup_records=[RequestRecord.from_dict(r) for r in d.get("warmup_records", [])],
            environment=dict(d.get("environment", {})),
        )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BenchResult:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"result: no such file {str(p)!r}") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"result: {str(p)!r} is not JSON ({e})") from None
        return cls.from_dict(data)


def _clean(x: Any) -> Any:
    # JSON has no NaN/inf; they only appear in edge cases (zero duration), store null
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
