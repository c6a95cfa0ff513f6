"""perfsdk regress save|check: a regression gate for CI over saved `perfsdk bench serve` runs.

Exit status of check: 0 no regression, 1 a gated number got worse beyond its tolerance, 2 the runs
cannot be compared (no baseline, no summary, different configuration without --allow-config-diff).
Details: the perfsdk.regress module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from perfsdk.cli._args import finite_float
from perfsdk.errors import ConfigError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from perfsdk.regress import DEFAULT_BASELINE, DEFAULT_GATES

    p = sub.add_parser("regress", help="store a baseline run; fail CI when a new run is worse",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    rsub = p.add_subparsers(dest="regress_command", required=True)

    s = rsub.add_parser("save", help="store a saved `perfsdk bench serve` run as the baseline")
    s.add_argument("run", metavar="RUN.json")
    s.add_argument("--baseline", default=str(DEFAULT_BASELINE), help=f"where (default {DEFAULT_BASELINE})")
    s.set_defaults(func=_save)

    c = rsub.add_parser("check", help="compare a run with the baseline; exit 1 on a regression")
    c.add_argument("run", metavar="RUN.json")
    c.add_argument("--baseline", default=str(DEFAULT_BASELINE), help=f"the baseline run (default {DEFAULT_BASELINE})")
    c.add_argument("--tolerance", default="10%", help="relative worsening allowed by default (default 10%%)")
    c.add_argument("--gate", action="append", default=[], metavar="METRIC=TOL",
                   help="gate METRIC with its own tolerance, e.g. 'TTFT P99 (ms)=20%%' (repeatable); "
                        f"default gates: {', '.join(DEFAULT_GATES)}")
    c.add_argument("--only", action="store_true", help="gate only the --gate metrics, not the defaults")
    c.add_argument("--min-delta-ms", type=finite_float(0, 1e9, what="a number of milliseconds"), default=1.0,
                   help="a latency must also move by more than this many ms to fail (default 1)")
    c.add_argument("--allow-config-diff", action="store_true",
                   help="compare runs made with different settings (rate, lengths, model, ...)")
    c.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown (e.g. $GITHUB_STEP_SUMMARY)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(func=_check)


def _save(args: argparse.Namespace) -> int:
    from perfsdk.regress import save_baseline

    out = save_baseline(args.run, args.baseline)
    print(f"baseline stored: {out}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from perfsdk.bench.result import BenchResult
    from perfsdk.regress import DEFAULT_GATES, check, parse_gate, parse_tolerance

    if not Path(args.baseline).exists():
        print(f"perfsdk regress: no baseline at {args.baseline}; store one with `perfsdk regress save RUN.json`",
              file=sys.stderr)
        return 2
    tolerance = parse_tolerance(args.tolerance)
    gates: dict[str, float | None] = {} if args.only else dict(DEFAULT_GATES)
    for g in args.gate:
        name, tol = parse_gate(g)
        gates[name] = tol
    if not gates:
        raise ConfigError("regress check: --only without any --gate leaves nothing to check")
    report = check(BenchResult.load(args.baseline), BenchResult.load(args.run), tolerance=tolerance,
                   min_delta_ms=args.min_delta_ms, gates=gates)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown())
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.format())
    if report.config_diff and not args.allow_config_diff:
        print("perfsdk regress: the runs were made with different settings (above): not comparable. "
              "Re-run with the baseline's settings, or pass --allow-config-diff.", file=sys.stderr)
        return 2
    return 0 if report.passed else 1
