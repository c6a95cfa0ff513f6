"""How reading a hostile trace scales: compression bombs of 128, 256 and 512 MiB, before and after.

::

    python benchmarks/analyze_bombs.py                              # the current code only
    python benchmarks/analyze_bombs.py --before 438d598             # and the code at a git commit
    python benchmarks/analyze_bombs.py --sizes 64 128 --out /tmp/r.json

**The files.** ``.json.gz`` files of a few hundred KB whose JSON holds one bulk of *size* MiB where the
reader of issue 20 (item 4) rescanned it: ``leading whitespace`` (the whitespace before the document;
1 GiB of it took 209 s and 4.2 GB), ``one string`` (one event's name), ``cut patterns in a string`` (a
string made of ``},`` — every byte of it looks like the end of an event). Each is built from
concatenated gzip members (one MiB compressed once, repeated), which every gzip reader joins, so a
512 MiB bomb costs no time to build.

**A measurement.** A fresh Python process per file and code: ``load_trace(path)``, its wall time and
its peak RSS (``ru_maxrss``, the interpreter included). ``--before REF`` runs the same with ``perfsdk/``
from ``git archive REF``. The ratio column is each time over the time at the previous (half) size:
about 2 when the work is linear, about 4 when it is quadratic. ``--before-max-mib`` stops the old code
early (it takes minutes past 256 MiB). No test asserts these times; tests/test_trace_events.py counts
the reader's work instead (``Trace.read_stats``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
from perfsdk.profiling.trace_events import load_trace
t0 = time.perf_counter()
trace = load_trace(sys.argv[1])
t1 = time.perf_counter()
print(json.dumps({"load_s": t1 - t0, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "events": len(trace.gpu_ops) + len(trace.cpu_ops) + len(trace.runtime) + len(trace.annotations)}))
"""

_EVENTS = (
    b'{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 0, "tid": 0, "ts": 0, "dur": 10}, '
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": 0, "ts": 1, "dur": 5}'
)
_HEAD = b'{"traceEvents": ['

# name -> (before the bulk, one MiB of the bulk, after it)
SHAPES: dict[str, tuple[bytes, bytes, bytes]] = {
    "leading whitespace": (b"", b" " * 2**20, _HEAD + _EVENTS + b"]}"),
    "one string": (_HEAD + _EVENTS + b', {"ph": "i", "name": "', b"a" * 2**20, b'"}]}'),
    "cut patterns in a string": (_HEAD + _EVENTS + b', {"ph": "i", "name": "', b"}," * 2**19, b'"}]}'),
}


def write_bomb(path: Path, shape: str, mib: int) -> None:
    before, bulk, after = SHAPES[shape]
    member = gzip.compress(bulk, compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(before))
        for _ in range(mib):
            f.write(member)
        f.write(gzip.compress(after))


def _code_at(ref: str, into: Path) -> Path:
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "perfsdk"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(path: Path, code: Path) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path)], env=env, cwd=str(code), capture_output=True, text=True, check=True
    )
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256, 512], help="bulk sizes in MiB")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--before", metavar="GIT_REF", help="also measure perfsdk/ as of this commit")
    ap.add_argument("--before-max-mib", type=int, default=256, help="measure --before only up to this size")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="perfsdk-analyze-bombs-"))
    codes = {"after": ROOT}
    if args.before:
        codes = {"before": _code_at(args.before, tmp / "before"), "after": ROOT}
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, Any] = {
        "benchmark": "analyze_bombs",
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "code": {"after": f"working tree at {head}", "before": args.before},
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": [],
    }
    for shape in args.shapes:
        last: dict[str, float] = {}
        for mib in sorted(args.sizes):
            path = tmp / "bomb.json.gz"
            write_bomb(path, shape, mib)
            row: dict[str, Any] = {"shape": shape, "mib": mib, "gz_bytes": path.stat().st_size}
            for name, code in codes.items():
                if name == "before" and mib > args.before_max_mib:
                    continue
                r = measure(path, code)
                r["ratio_to_half_size"] = r["load_s"] / last[name] if name in last else None
                last[name] = r["load_s"]
                row[name] = r
                ratio = "" if r["ratio_to_half_size"] is None else f"  x{r['ratio_to_half_size']:.2f}"
                print(
                    f"{shape:26s} {mib:5d} MiB  {name:6s} {r['load_s']:8.2f} s{ratio:8s} "
                    f"{r['peak_rss_bytes'] / 2**20:8.0f} MiB",
                    file=sys.stderr,
                    flush=True,
                )
            result["rows"].append(row)
            path.unlink()
            if args.out:
                args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
