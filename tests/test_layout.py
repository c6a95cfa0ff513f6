"""The shape of the house: no import cycle among perfsdk's modules, a cheap ``import perfsdk``, and a CLI
that says why when a subcommand cannot run.

The import graph counts every import of a perfsdk module — at module level, inside functions (lazy) and
under ``TYPE_CHECKING`` — because a cycle through a lazy or type-only import is still two modules that
must be read together.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "perfsdk"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The perfsdk modules *path* imports (the deepest known module each import names)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            t = target
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t not in (name, "perfsdk"):
                out.add(t)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_perfsdk_modules() -> None:
    mods = modules()
    known = set(mods)
    graph = {name: imports_of(name, path, known) for name, path in mods.items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_one() -> None:
    """The control: a cycle through a type-only import is reported."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_monitor_is_the_public_api_only() -> None:
    """monitor.py holds the Monitor; the hot path, the core, the hand-off and the sinks live elsewhere."""
    lines = (ROOT / "monitor.py").read_text().count("\n")
    assert lines < 575  # about half of what it was (1,109 lines) when it held all of it


def test_import_perfsdk_loads_no_torch_and_starts_no_thread() -> None:
    code = ("import sys, threading; import perfsdk; perfsdk.Monitor; "
            "print('torch' in sys.modules, threading.active_count())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "1"]


def test_a_subcommand_that_cannot_import_says_why_and_exits_non_zero(monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    from perfsdk import cli

    real = importlib.import_module

    def broken(name: str, package: str | None = None) -> object:
        if name == "perfsdk.cli.floor":
            raise ImportError("No module named 'perfsdk.model' (a broken install)")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", broken)
    assert cli.main(["floor", "--model", "llama-3-8b"]) == 2
    err = capsys.readouterr().err
    assert "'floor' command cannot run" in err and "a broken install" in err
    assert cli.main(["hardware"]) == 0  # the others still work
