"""What a run produced: :class:`BenchResult`, and its JSON file.

::

    result = benchmark(cfg)
    result.summary["ttft_ms"]["p99"]          # see report.py for every key
    [r.ttft for r in result.records if r.ok]  # per-request records, seconds
    result.save("run.json")
    again = BenchResult.load("run.json")      # records and summary round-trip
    [rep.summary["ttft_ms"]["p99"] for rep in again.repetitions]   # one per --repeat

The JSON file holds ``format`` (a version number), ``config`` (without the API
key), ``seed``, ``environment`` (perfsdk, Python and aiohttp versions, host,
platform, start time, command line), ``summary``, ``records`` and
``warmup_records``. A record stopped at its time or chunk limit holds
``itl_summary`` (count, total, min, max, p50, p90, p99 of its gaps, seconds)
and an empty ``itl``; files written before it existed load as before.

A run of one repetition is written as format 1, exactly as before ``--repeat``
existed. A run of N > 1 repetitions (``perfsdk bench serve --repeat N``) is
format 2: ``summary`` is the summary of all repetitions' requests pooled (see
:func:`perfsdk.bench.report.summarize_repetitions`), and ``repetitions`` holds
one ``{"summary", "records", "warmup_records"}`` per repetition; the top-level
``records``/``warmup_records`` are empty (the requests are stored once, in their
repetition). Loading either format gives ``result.repetitions`` (one entry for
a format-1 file), ``result.records`` (every repetition's requests) and
``result.summary``. A file that is not JSON, or whose structure is not a bench
result's, raises :class:`~perfsdk.errors.ConfigError` naming the file and the
JSON path; values are checked where they are used (``perfsdk regress``).
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
from perfsdk.bench.report import LATENCY_KEYS, format_spread, format_summary
from perfsdk.errors import ConfigError

__all__ = ["RESULT_FORMAT", "BenchResult", "Repetition", "environment"]

#: The format written for a run of several repetitions; a single repetition is still written as 1.
RESULT_FORMAT = 2


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
class Repetition:
    """One repetition of the load: its summary and its requests."""

    summary: dict[str, Any]
    records: list[RequestRecord] = field(default_factory=list)
    warmup_records: list[RequestRecord] = field(default_factory=list)
    #: where ``summary`` sits in the JSON file, for messages: ``summary`` or ``repetitions[2].summary``
    where: str = field(default="summary", compare=False)


@dataclass
class BenchResult:
    """The records, the summary and the context of one benchmark run."""

    config: dict[str, Any]
    summary: dict[str, Any]
    records: list[RequestRecord]
    warmup_records: list[RequestRecord] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    #: every repetition; a run of one repetition has one entry built from the fields above
    repetitions: list[Repetition] = field(default_factory=list)
    #: the file it was loaded from, for messages (None when made in memory)
    source: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.repetitions:
            self.repetitions = [Repetition(self.summary, self.records, self.warmup_records)]

    @property
    def seed(self) -> int | None:
        seed = self.config.get("seed")
        return int(seed) if seed is not None else None

    @property
    def name(self) -> str:
        """The file it came from, or ``"(in memory)"``: how messages name this run."""
        return self.source if self.source is not None else "(in memory)"

    def format(self) -> str:
        """The human-readable table (and, for several repetitions, their spread)."""
        n = len(self.repetitions)
        if n == 1:
            return format_summary(self.summary)
        title = f"Serving Benchmark Result ({n} repetitions pooled)"
        return format_summary(self.summary, title=title) + "\n" + format_spread([r.summary for r in self.repetitions])

    def to_dict(self) -> dict[str, Any]:
        if len(self.repetitions) == 1:  # format 1, as written before repetitions existed
            return {
                "format": 1,
                "config": self.config,
                "seed": self.seed,
                "environment": self.environment,
                "summary": self.summary,
                "records": [r.to_dict() for r in self.records],
                "warmup_records": [r.to_dict() for r in self.warmup_records],
            }
        return {
            "format": RESULT_FORMAT,
            "config": self.config,
            "seed": self.seed,
            "environment": self.environment,
            "summary": self.summary,
            "records": [],
            "warmup_records": [],
            "repetitions": [
                {
                    "summary": rep.summary,
                    "records": [r.to_dict() for r in rep.records],
                    "warmup_records": [r.to_dict() for r in rep.warmup_records],
                }
                for rep in self.repetitions
            ],
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        out = Path(path)
        if out.parent and not out.parent.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
        # allow_nan=False: a NaN would make the file unreadable by strict JSON parsers
        out.write_text(json.dumps(_clean(self.to_dict()), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def from_dict(cls, d: Any, *, source: str | None = None) -> BenchResult:
        """A result from its JSON form (either format); a wrong structure raises ConfigError naming the path."""
        where = f"result {source!r}" if source is not None else "result"
        if not isinstance(d, dict) or "summary" not in d:
            raise ConfigError(f"{where}: not a perfsdk bench result (no 'summary')")
        config = _object(d.get("config", {}), "config", where)
        environment = _object(d.get("environment", {}), "environment", where)
        summary = _summary(d["summary"], "summary", where)
        raw_reps = d.get("repetitions")
        if raw_reps is None:
            records = _records(d.get("records", []), "records", where)
            warm = _records(d.get("warmup_records", []), "warmup_records", where)
            return cls(config, summary, records, warm, environment, source=source)
        if not isinstance(raw_reps, list) or not raw_reps:
            raise ConfigError(f"{where}: repetitions: expected a non-empty list, got {_kind(raw_reps)}")
        reps: list[Repetition] = []
        for i, raw in enumerate(raw_reps):
            path = f"repetitions[{i}]"
            rep = _object(raw, path, where)
            if "summary" not in rep:
                raise ConfigError(f"{where}: {path}.summary is missing")
            reps.append(
                Repetition(
                    summary=_summary(rep["summary"], f"{path}.summary", where),
                    records=_records(rep.get("records", []), f"{path}.records", where),
                    warmup_records=_records(rep.get("warmup_records", []), f"{path}.warmup_records", where),
                    where=f"{path}.summary",
                )
            )
        records = [r for rep in reps for r in rep.records]
        return cls(config, summary, records, reps[0].warmup_records, environment, reps, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> BenchResult:
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"result: no such file {str(p)!r}") from None
        except OSError as e:  # a directory, no permission, ...
            raise ConfigError(f"result: cannot read {str(p)!r}: {e.strerror or e}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(f"result: {str(p)!r} is not JSON text ({e.reason})") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"result: {str(p)!r} is not JSON ({e})") from None
        except RecursionError:
            raise ConfigError(f"result: {str(p)!r} is nested too deeply to be a saved run") from None
        return cls.from_dict(data, source=str(p))


def _kind(x: Any) -> str:
    """How a JSON value is named in messages: ``a string ('12')``, ``null``, ``a list``."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return f"a boolean ({str(x).lower()})"
    if isinstance(x, str):
        return f"a string ({x[:40]!r})"
    if isinstance(x, list):
        return "a list"
    if isinstance(x, dict):
        return "an object"
    return repr(x)


def _object(x: Any, path: str, where: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise ConfigError(f"{where}: {path}: expected an object, got {_kind(x)}")
    return dict(x)


def _summary(x: Any, path: str, where: str) -> dict[str, Any]:
    summary = _object(x, path, where)
    for key in LATENCY_KEYS:  # compare and regress read these as {statistic: value}
        stats = summary.get(key)
        if stats is not None and not isinstance(stats, dict):
            raise ConfigError(f"{where}: {path}.{key}: expected an object of statistics, got {_kind(stats)}")
    return summary


def _records(x: Any, path: str, where: str) -> list[RequestRecord]:
    if not isinstance(x, list):
        raise ConfigError(f"{where}: {path}: expected a list of requests, got {_kind(x)}")
    out = []
    for i, r in enumerate(x):
        if not isinstance(r, dict):
            raise ConfigError(f"{where}: {path}[{i}]: expected an object, got {_kind(r)}")
        try:
            out.append(RequestRecord.from_dict(r))
        except TypeError as e:  # a required field missing
            raise ConfigError(f"{where}: {path}[{i}]: not a request record ({e})") from None
    return out


def _clean(x: Any) -> Any:
    # JSON has no NaN/inf; they only appear in edge cases (zero duration), store null
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x
