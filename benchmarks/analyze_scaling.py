"""How ``perfsdk analyze`` scales with the trace: time and peak memory on 20, 50 and 200 MB traces.

::

    python benchmarks/analyze_scaling.py                          # the current code only
    python benchmarks/analyze_scaling.py --before 16ba3bd         # and the code at a git commit, side by side
    python benchmarks/analyze_scaling.py --sizes 20 --out /tmp/r.json --traces /tmp/traces

**The traces.** Synthetic, but made of a real one: the four decode steps of the eager H200 trace in
``tests/data/h200_eager.pt.trace.json.gz`` (Kineto's layout, ~256 bytes an event) are tiled end to end
until the file reaches the size asked for, each copy shifted in time by the template's span and with
its correlation, External id and flow ids offset so that every step links its own GPU work. A 200 MB
trace has ~860,000 events and ~2,000 steps (``ProfilerStep#N`` around ``perfsdk.decode``), the shape
engine profiles have. Written once per size into ``--traces`` (default: a temporary directory).

**A measurement.** Each run is a fresh Python process (``python -c``) that imports the analyser, calls
``analyze_trace(path)`` and ``to_dict()`` on the result, and reports its own wall time for that and its
peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, which counts the interpreter and imports too:
~25-70 MB). ``--before REF`` runs the same in a process whose ``perfsdk`` comes from ``git archive REF``
(the code before a change), on the same traces in the same run, alternating before/after; both
processes hash their ``to_dict()`` output, so the JSON also says whether the results are identical.
``--stdlib`` adds the current code with the standard library's parser (what runs without msgspec).

The machine matters: the numbers in ``benchmarks/results/`` were taken on a 2-core CPU shared with other
work, so each row also records the median of ``--repeats`` runs. No test asserts any of these times.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "tests" / "data" / "h200_eager.pt.trace.json.gz"

# the child: analyse one trace, print what it measured as one JSON line
_CHILD = r"""
import hashlib, json, resource, sys, time
t0 = time.perf_counter()
import perfsdk
from perfsdk.profiling.analyze import analyze_trace
t1 = time.perf_counter()
if sys.argv[2] != "auto":  # the parser of the reader (code that predates load_trace(parser=) is run as is)
    from perfsdk.profiling.trace_events import load_trace
    diag = analyze_trace(load_trace(sys.argv[1], parser=sys.argv[2]))
else:
    diag = analyze_trace(sys.argv[1])
out = json.dumps(diag.to_dict(), sort_keys=True)
t2 = time.perf_counter()
print(json.dumps({
    "perfsdk_file": perfsdk.__file__,
    "import_s": t1 - t0,
    "analyze_s": t2 - t1,
    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "steps": len(diag.steps),
    "findings": [f.kind for f in diag.findings],
    "result_sha256": hashlib.sha256(out.encode()).hexdigest(),
}))
"""


# ---- the synthetic traces ------------------------------------------------------------------------


def _kineto_event(ev: dict[str, Any]) -> str:
    """One event in Kineto's own layout (what torch.profiler writes), so sizes match real files."""
    head = {k: ev[k] for k in ("ph", "cat", "name", "pid", "tid") if k in ev}
    lines = ["  {", "    " + json.dumps(head)[1:-1] + ","]
    rest = {k: v for k, v in ev.items() if k not in head and k != "args"}
    if rest:
        lines.append("    " + json.dumps(rest)[1:-1] + ("," if "args" in ev else ""))
    if "args" in ev:
        lines.append('    "args": {')
        lines.append("      " + json.dumps(ev["args"])[1:-1])
        lines.append("    }")
    lines.append("  }")
    return "\n".join(lines)


def _shifted(
    ev: dict[str, Any], k: int, dt: float, id_step: int, step_base: int, steps_per_tile: int
) -> dict[str, Any]:
    out = dict(ev)
    if "ts" in out:
        out["ts"] = round(float(out["ts"]) + k * dt, 3)
    if out.get("ph") in ("s", "f") and isinstance(out.get("id"), int):
        out["id"] = out["id"] + k * id_step
    args = out.get("args")
    if isinstance(args, dict):
        args = dict(args)
        for key in ("correlation", "External id"):
            if isinstance(args.get(key), int):
                args[key] = args[key] + k * id_step
        out["args"] = args
    name = out.get("name", "")
    if isinstance(name, str) and name.startswith("ProfilerStep#"):
        out["name"] = f"ProfilerStep#{step_base + k * steps_per_tile + int(name[13:]) - step_base}"
    return out


def write_synthetic_trace(path: Path, target_bytes: int) -> dict[str, Any]:
    """Tile the template's steps until *path* (uncompressed JSON) holds about *target_bytes*."""
    doc = json.loads(gzip.decompress(TEMPLATE.read_bytes()))
    events: list[dict[str, Any]] = doc.pop("traceEvents")
    timed = [e for e in events if e.get("ph") in ("X", "s", "f") and "ts" in e]
    static = [e for e in events if e not in timed]
    steps = sorted((e for e in timed if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    t_first = min(float(e["ts"]) for e in timed)
    t_last = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in timed)
    dt = t_last - t_first + 100.0  # 100 µs between copies
    ids = [a.get(key) for e in timed if isinstance(a := e.get("args"), dict) for key in ("correlation", "External id")]
    ids += [e.get("id") for e in timed if e.get("ph") in ("s", "f")]
    id_step = max(i for i in ids if isinstance(i, int)) + 1
    step_base = int(str(steps[0]["name"])[13:])
    header = {k: v for k, v in doc.items() if k != "traceName"}
    text_head = json.dumps(header, indent=2)[:-2] + ',\n  "traceEvents": [\n'
    n_events = n_tiles = 0
    with open(path, "w") as f:
        size = f.write(text_head)
        first = True
        for ev in static:
            size += f.write(("" if first else ",\n") + _kineto_event(ev))
            first = False
            n_events += 1
        while size < target_bytes:
            for ev in timed:
                size += f.write(",\n" + _kineto_event(_shifted(ev, n_tiles, dt, id_step, step_base, len(steps))))
                n_events += 1
            n_tiles += 1
        size += f.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return {"bytes": size, "events": n_events, "steps": n_tiles * len(steps), "tiles": n_tiles}


# ---- measuring -----------------------------------------------------------------------------------


def _code_at(ref: str, into: Path) -> Path:
    """``perfsdk/`` as of git *ref*, unpacked under *into* (to put first on PYTHONPATH)."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "perfsdk"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def measure(trace: Path, code: Path, parser: str = "auto") -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(code))
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(trace), parser],
        env=env,
        cwd=str(code),
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - t0
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if not Path(out.pop("perfsdk_file")).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"the child imported perfsdk from elsewhere than {code}")
    out["process_wall_s"] = wall
    return out


def _median_row(runs: list[dict[str, Any]], trace_bytes: int) -> dict[str, Any]:
    row = {k: statistics.median(r[k] for r in runs) for k in ("analyze_s", "process_wall_s", "peak_rss_bytes")}
    row["peak_rss_over_file"] = row["peak_rss_bytes"] / trace_bytes
    row["runs"] = runs
    hashes = {r["result_sha256"] for r in runs}
    row["result_sha256"] = hashes.pop() if len(hashes) == 1 else sorted(hashes)
    row["steps"] = runs[0]["steps"]
    row["findings"] = runs[0]["findings"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[20, 50, 200], help="trace sizes in MB (1e6 bytes)")
    ap.add_argument("--before", metavar="GIT_REF", help="also measure perfsdk/ as of this commit")
    ap.add_argument("--before-max-mb", type=int, default=10**9, help="measure --before only up to this size")
    ap.add_argument(
        "--stdlib",
        action="store_true",
        help="also measure the current code with the standard library's parser (no msgspec)",
    )
    ap.add_argument("--repeats", type=int, default=1, help="runs per size and code (median reported)")
    ap.add_argument("--traces", type=Path, default=None, help="where to write the traces (kept)")
    ap.add_argument("--out", type=Path, default=None, help="write the results JSON here")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="perfsdk-analyze-scaling-"))
    traces = args.traces or tmp
    traces.mkdir(parents=True, exist_ok=True)
    codes: dict[str, tuple[Path, str]] = {"after": (ROOT, "auto")}
    if args.before:
        codes = {"before": (_code_at(args.before, tmp / "before"), "auto"), "after": (ROOT, "auto")}
    if args.stdlib:
        codes["after_stdlib"] = (ROOT, "json")
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result: dict[str, Any] = {
        "benchmark": "analyze_scaling",
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "processor": _cpu_name(),
        },
        "code": {
            "after": f"working tree at {head} (msgspec when installed)",
            "before": args.before,
            "after_stdlib": "the same, load_trace(parser='json')" if args.stdlib else None,
        },
        "template": str(TEMPLATE.relative_to(ROOT)),
        "sizes": [],
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    for mb in args.sizes:
        path = traces / f"synthetic_{mb}mb.pt.trace.json"
        sidecar = path.with_suffix(".info")
        if path.exists() and sidecar.exists():  # written by an earlier run with --traces
            info = json.loads(sidecar.read_text())
        else:
            info = write_synthetic_trace(path, mb * 10**6)
            sidecar.write_text(json.dumps(info))
        print(f"== {mb} MB: {info['bytes']:,} bytes, {info['events']:,} events", file=sys.stderr, flush=True)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in codes}
        for _ in range(args.repeats):
            for name, (code, parser) in codes.items():  # alternate the variants within each repeat
                if name == "before" and mb > args.before_max_mb:
                    continue
                r = measure(path, code, parser)
                runs[name].append(r)
                print(
                    f"   {name:6s} {r['analyze_s']:8.2f} s  {r['peak_rss_bytes'] / 2**20:8.0f} MiB  {r['steps']} steps",
                    file=sys.stderr,
                    flush=True,
                )
        row: dict[str, Any] = {"mb": mb, **info}
        for name, rs in runs.items():
            if rs:
                row[name] = _median_row(rs, info["bytes"])
        measured = [row[name]["result_sha256"] for name in codes if name in row]
        if len(measured) > 1:  # every variant's to_dict() hashed the same
            row["identical_results"] = all(h == measured[0] for h in measured)
        if "before" in row and "after" in row:
            row["speedup"] = row["before"]["analyze_s"] / row["after"]["analyze_s"]
            row["memory_ratio"] = row["after"]["peak_rss_bytes"] / row["before"]["peak_rss_bytes"]
        result["sizes"].append(row)
        if args.out:  # write after every size: a long run keeps what it measured
            args.out.write_text(json.dumps(result, indent=2) + "\n")
    if not args.traces:
        for p in [*traces.glob("synthetic_*.json"), *traces.glob("synthetic_*.info")]:
            p.unlink()
    print(json.dumps([{k: v for k, v in r.items() if k not in ("before", "after")} for r in result["sizes"]], indent=2))
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
