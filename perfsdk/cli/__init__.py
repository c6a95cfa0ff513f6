"""The ``perfsdk`` command line: one module per subcommand, each with ``register(subparsers)`` and ``run(args)``.

::

    perfsdk floor --model llama-3-8b --gpu h100-sxm --ctx 4096      # cli/floor.py
    perfsdk calibrate / perfsdk hardware                             # cli/hardware.py
    perfsdk demo                                                     # cli/demo.py
    perfsdk bench serve --base-url http://127.0.0.1:8000 ...         # cli/bench.py
    perfsdk bench compare before.json after.json
    perfsdk analyze trace.pt.trace.json.gz                           # cli/analyze.py
    perfsdk regress save|check ...                                   # cli/regress.py
    perfsdk sglang --fpm ipc:///tmp/sglang-fpm --model ...           # cli/sglang.py

Every module follows one pattern. ``register`` adds its parser(s) and sets ``func=run``; ``run(args)`` does
the work and returns the exit status, and raises :class:`~perfsdk.errors.PerfsdkError` (or a subclass) for
anything it cannot do — :func:`main` prints ``perfsdk: error: <message>`` on stderr and exits 2, with no
traceback. A module with subcommands (``bench serve|compare``, ``regress save|check``) or several commands
(``calibrate``, ``hardware``) names each handler ``run_<subcommand>`` and has ``run`` pick one with
:func:`dispatch`; a missing command or subcommand is a :class:`~perfsdk.errors.UsageError` naming the choices.

A subcommand module imports only argparse and perfsdk's light core at import time; what it drives
(torch, aiohttp, zmq) is imported when it runs, so ``perfsdk floor`` never pays for torch. A
subcommand module that cannot be imported — a broken install — is still listed; running it says why and
exits 2, instead of the subcommand silently vanishing.

Every number a flag takes is parsed by one of :mod:`perfsdk.cli._args`'s types (the rule of
:mod:`perfsdk.config`), so ``nan``, ``inf`` and absurd magnitudes are usage errors: exit 2 and a message
naming the flag.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence

from perfsdk._version import __version__
from perfsdk.errors import PerfsdkError, UsageError

__all__ = ["build_parser", "dispatch", "main"]

# subcommand name(s) -> module under perfsdk.cli; each module exposes register(subparsers)
COMMANDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("floor", ("floor",)),
    ("hardware", ("calibrate", "hardware")),
    ("demo", ("demo",)),
    ("bench", ("bench",)),
    ("analyze", ("analyze",)),
    ("regress", ("regress",)),
    ("sglang", ("sglang",)),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfsdk", description="How fast is your LLM server against what the hardware allows?"
    )
    parser.add_argument("--version", action="version", version=f"perfsdk {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name, commands in COMMANDS:
        try:
            module = importlib.import_module(f"perfsdk.cli.{module_name}")
        except Exception as e:  # a broken install: keep the command, make running it say why
            for command in commands:
                _broken(sub, command, module_name, e)
            continue
        module.register(sub)
    return parser


def _broken(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str, module: str, error: BaseException
) -> None:
    # no option of its own (prefix_chars that never occur): whatever follows is taken as it is
    p = sub.add_parser(
        command, help=f"(unavailable: perfsdk.cli.{module} failed to import)", add_help=False, prefix_chars="\x00"
    )
    p.add_argument("args", nargs=argparse.REMAINDER)

    def run(_: argparse.Namespace) -> int:
        raise PerfsdkError(
            f"the '{command}' command cannot run: importing perfsdk.cli.{module} failed: "
            f"{type(error).__name__}: {error}. "
            "Reinstall perfsdk (pip install --force-reinstall perfsdk)."
        )

    p.set_defaults(func=run)


def dispatch(
    args: argparse.Namespace, dest: str, handlers: Mapping[str, Callable[[argparse.Namespace], int]], command: str
) -> int:
    """Run the handler of the (sub)command named in ``args.<dest>``; a missing one is a :class:`UsageError`
    naming *handlers*' choices (``bench: give a subcommand: serve, compare (see perfsdk bench --help)``)."""
    name = getattr(args, dest, None)
    handler = handlers.get(name) if isinstance(name, str) else None
    if handler is None:
        raise UsageError(f"{command}: give a subcommand: {', '.join(handlers)} (see perfsdk {command} --help)")
    return handler(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``perfsdk`` command; returns its exit status (2: a usage or configuration error, with a
    message on stderr and no traceback)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse: a bad flag (2, its message printed) or --help/--version (0)
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        func = getattr(args, "func", None)
        if func is None:
            names = ", ".join(c for _, commands in COMMANDS for c in commands)
            raise UsageError(f"give a command: {names} (see perfsdk --help)")
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
