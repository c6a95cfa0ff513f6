"""perfsdk regress save|check: a regression gate for CI over saved `perfsdk bench serve` runs.

    perfsdk bench serve ... --repeat 3 --save-result run.json
    perfsdk regress save run.json           # once: the baseline
    perfsdk regress check run.json          # on every change

A gated number fails only when it got worse beyond its tolerance (relative, and --min-delta-ms for
latencies) and beyond the noise: with several repetitions per run (--repeat 3), the 95 % interval of
the change (Welch's t over the per-repetition values) must exclude 0, else it is "within noise".
With one repetition on each side the noise is unknown and the tolerance alone decides. Failed
requests gate at zero tolerance and without a noise allowance.

Exit status of check:
  0  pass: no gated number got worse beyond its tolerance and the noise
  1  regression: at least one did
  2  cannot compare: no baseline, a file that is not a saved run, a gated value that is missing,
     null, NaN/Infinity, negative or not a number (the message names the file and the JSON path),
     runs made with different settings (without --allow-config-diff), or a bad flag value. The last
     line on stdout then starts "cannot compare:", and the reason also goes to stderr (a flag that
     does not parse at all gets argparse's usage message on stderr, also exit 2).
save exits 0, or 2 with the reason. Details: the perfsdk.regress module.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from perfsdk.cli import dispatch
from perfsdk.cli._args import finite_float
from perfsdk.errors import ConfigError, PerfsdkError

if TYPE_CHECKING:
    from perfsdk.regress import RegressionReport

__all__ = ["register", "run", "run_check", "run_save"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from perfsdk.regress import DEFAULT_BASELINE, DEFAULT_GATES

    p = sub.add_parser(
        "regress",
        help="store a baseline run; fail CI when a new run is worse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    rsub = p.add_subparsers(dest="regress_command", metavar="SUBCOMMAND")
    p.set_defaults(func=run)

    s = rsub.add_parser("save", help="store a saved `perfsdk bench serve` run as the baseline")
    s.add_argument("run", metavar="RUN.json")
    s.add_argument("--baseline", default=str(DEFAULT_BASELINE), help=f"where (default {DEFAULT_BASELINE})")

    c = rsub.add_parser(
        "check",
        help="compare a run with the baseline; exit 1 on a regression, 2 if it cannot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("run", metavar="RUN.json")
    c.add_argument("--baseline", default=str(DEFAULT_BASELINE), help=f"the baseline run (default {DEFAULT_BASELINE})")
    c.add_argument("--tolerance", default="10%", help="relative worsening allowed by default (default 10%%)")
    c.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="METRIC=TOL",
        help="gate METRIC with its own tolerance, e.g. 'TTFT P99 (ms)=20%%' (repeatable); "
        f"default gates: {', '.join(DEFAULT_GATES)}",
    )
    c.add_argument("--only", action="store_true", help="gate only the --gate metrics, not the defaults")
    c.add_argument(
        "--min-delta-ms",
        type=finite_float(0, 1e9, what="a number of milliseconds"),
        default=1.0,
        help="a latency must also move by more than this many ms to fail (default 1)",
    )
    c.add_argument(
        "--allow-config-diff",
        action="store_true",
        help="compare runs made with different settings (rate, lengths, model, ...)",
    )
    c.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown (e.g. $GITHUB_STEP_SUMMARY)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    return dispatch(args, "regress_command", {"save": run_save, "check": run_check}, "regress")


def run_save(args: argparse.Namespace) -> int:
    from perfsdk.bench.result import BenchResult
    from perfsdk.regress import save_baseline

    out = save_baseline(args.run, args.baseline)
    print(f"baseline stored: {out}")
    if len(BenchResult.load(out).repetitions) == 1:
        print(
            "note: the baseline holds one repetition, so `regress check` cannot tell a change from noise; "
            "store a run made with `perfsdk bench serve --repeat 3` instead"
        )
    return 0


def run_check(args: argparse.Namespace) -> int:
    """Print the report and return its exit code; bad input raises for `main` (stderr, exit 2)."""
    from perfsdk.regress import CannotCompareError, cannot_compare_markdown

    try:
        report = _report(args)
        if args.markdown:
            _write(args.markdown, report.markdown())
    except PerfsdkError as e:
        # the verdict on stdout too: a CI log that keeps only stdout must not end without one
        if args.json:
            print(json.dumps({"passed": False, "verdict": "cannot compare", "exit_code": 2, "reason": str(e)}))
        else:
            print(f"cannot compare: {e}")
        if args.markdown:
            with contextlib.suppress(ConfigError):  # the summary file itself may be what failed
                _write(args.markdown, cannot_compare_markdown(str(e)))
        raise
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.format())
    if report.exit_code == 2:
        raise CannotCompareError(report.reason())
    return report.exit_code


def _report(args: argparse.Namespace) -> RegressionReport:
    from perfsdk.bench.result import BenchResult
    from perfsdk.regress import DEFAULT_GATES, CannotCompareError, check, parse_gate, parse_tolerance

    if not Path(args.baseline).exists():
        raise CannotCompareError(f"no baseline at {args.baseline}; store one with `perfsdk regress save RUN.json`")
    tolerance = parse_tolerance(args.tolerance)
    gates: dict[str, float | None] = {} if args.only else dict(DEFAULT_GATES)
    for g in args.gate:
        name, tol = parse_gate(g)
        gates[name] = tol
    if not gates:
        raise ConfigError("regress check: --only without any --gate leaves nothing to check")
    return check(
        BenchResult.load(args.baseline),
        BenchResult.load(args.run),
        tolerance=tolerance,
        min_delta_ms=args.min_delta_ms,
        gates=gates,
        allow_config_diff=args.allow_config_diff,
    )


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise ConfigError(f"--markdown: cannot write {path}: {e.strerror or e}") from None
