"""One pattern for the ``perfsdk`` command modules (perfsdk/cli/__init__.py): ``register`` + ``run``, errors raised
for ``main`` to print (exit 2, one line on stderr, no traceback), a missing command or subcommand handled one way."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Iterator

import pytest

from perfsdk.cli import COMMANDS, build_parser, main


def parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(command, parser) for every top-level command."""
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


@pytest.mark.parametrize("module", sorted({m for m, _ in COMMANDS}))
def test_every_command_module_has_register_and_run(module: str) -> None:
    mod = importlib.import_module(f"perfsdk.cli.{module}")
    assert callable(mod.register) and callable(mod.run)
    assert "run" in mod.__all__ and "register" in mod.__all__


def test_every_command_runs_its_modules_run() -> None:
    owner = {command: module for module, commands in COMMANDS for command in commands}
    seen = set()
    for command, parser in parsers():
        func = parser.get_default("func")
        assert func is importlib.import_module(f"perfsdk.cli.{owner[command]}").run, command
        seen.add(command)
    assert seen == set(owner)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "give a command: floor, calibrate, hardware, demo, bench, analyze, regress, sglang (see perfsdk --help)"),
        (["bench"], "bench: give a subcommand: serve, compare (see perfsdk bench --help)"),
        (["regress"], "regress: give a subcommand: save, check (see perfsdk regress --help)"),
    ],
)
def test_a_missing_command_or_subcommand_is_one_usage_error(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"perfsdk: error: {words}\n"


def test_the_command_line_itself_says_the_same() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "perfsdk.cli", "bench"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "perfsdk: error: bench: give a subcommand: serve, compare (see perfsdk bench --help)"


def test_a_handler_error_is_raised_for_main_to_print(capsys: pytest.CaptureFixture[str]) -> None:
    """No module prints its own error: floor and analyze raise, main prints one line and exits 2."""
    assert main(["floor"]) == 2
    assert capsys.readouterr().err == "perfsdk: error: params: give --model NAME or --params (e.g. --params 8B)\n"
    assert main(["analyze", "/no/such/trace.json", "/no/other.json", "--plot", "x.png"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("perfsdk: error: --plot:") and "Traceback" not in err
