"""The ``perfsdk`` command line.

::

    perfsdk floor --model llama-3-8b --gpu h100-sxm --ctx 4096
    perfsdk calibrate
    perfsdk demo
    perfsdk bench serve --base-url http://127.0.0.1:8000 --num-prompts 200 --request-rate 8
    perfsdk bench compare before.json after.json
    perfsdk analyze trace.pt.trace.json.gz

Each sub-command lives beside the code it drives and registers itself through a
``register(subparsers)`` function; this module only wires them up, importing
each lazily so that ``perfsdk floor`` never pays for torch or aiohttp.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from perfsdk._version import __version__
from perfsdk.errors import PerfsdkError

# module path of each sub-command group; each exposes register(subparsers)
_COMMANDS: tuple[str, ...] = (
    "perfsdk.floor_cli",
    "perfsdk.hardware_cli",
    "perfsdk.demo.cli",
    "perfsdk.bench.cli",
    "perfsdk.profiling.cli",
    "perfsdk.regress_cli",
    "perfsdk.engines.sglang",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfsdk",
        description="How fast is your LLM server against what the hardware allows?",
    )
    parser.add_argument("--version", action="version", version=f"perfsdk {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:  # that sub-command is not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        rc = func(args)
    except PerfsdkError as e:
        print(f"perfsdk: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `perfsdk hardware | head`: the reader left; exit quietly like other tools
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
