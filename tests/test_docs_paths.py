"""Docstrings, comments and docs cite only paths and names that exist.

A comment that points at ``perfsdk/_native/stepcore.c`` when the file is ``perfsdk/csrc/stepcore.c``, or at a
test that was never written, sends the next maintainer looking for nothing. Checked here, statically (no
optional dependency is imported):

* **paths** — every ``perfsdk/…``, ``tests/…``, ``benchmarks/…``, ``integrations/…``, ``docs/…``, ``scripts/…``
  and ``constraints/…`` written in perfsdk's sources (Python and C) and in the docs names a file or folder of
  this repository (a ``*`` or ``{a,b}`` pattern must match at least one);
* **dotted names** — a ``perfsdk.x.y`` whose ``x`` is one of perfsdk's modules or packages must resolve:
  each part a module, or a name the module defines, imports or re-exports (read from its source). Dotted
  names whose first part is no module — span and attribute names such as ``perfsdk.phase``, the profiler
  ranges ``perfsdk.decode`` — are not code and are not checked, unless they start with an underscore
  (``perfsdk._something`` is always meant as code).

Where a doc quotes a command's *output* path (``--out benchmarks/results/x.json``) or history that names an
old file on purpose, the line says so with ``(not written yet)`` / ``(then ...)``; :data:`ALLOWED` lists them.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "perfsdk"

PATH_RE = re.compile(
    r"(?<![\w./-])((?:perfsdk|tests|benchmarks|integrations|docs|scripts|constraints)/[\w./*{},-]*[\w*}])"
)
NAME_RE = re.compile(r"(?<![\w./])(perfsdk(?:\.[A-Za-z_]\w*)+)")

# (file, cited text): a citation that is right where it stands, with the reason
ALLOWED: dict[tuple[str, str], str] = {
    ("docs/benchmarks.md", "benchmarks/results/h200x2_tensor_parallel.json"): "the command that writes it (owed)",
    ("docs/benchmarks.md", "tests/data/h200x2_*_rank{0,1}.pt.trace.json.gz"): "fixtures owed by the two-GPU run",
    ("perfsdk/bench/workload.py", "perfsdk.bench.lengths"): "the name of a seeded random stream, not code",
    ("perfsdk/bench/workload.py", "perfsdk.bench.output_lengths"): "the name of a seeded random stream, not code",
}


def sources() -> list[Path]:
    files = [*PKG.rglob("*.py"), *PKG.rglob("*.pyi"), *PKG.rglob("*.c"), *PKG.rglob("*.h")]
    files += [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
    return sorted(f for f in files if "__pycache__" not in f.parts)


def _expand(pattern: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in _expand(pattern[: m.start()] + alt + pattern[m.end() :])]


def path_exists(text: str) -> bool:
    for p in _expand(text.rstrip(".")):
        if any(c in p for c in "*?[") and not any(ROOT.glob(p)):
            return False
        if not any(c in p for c in "*?[") and not (ROOT / p).exists():
            return False
    return True


def _module_file(parts: list[str]) -> Path | None:
    """The source of module *parts*: its ``.py``, its package's ``__init__.py``, or — for the compiled
    ``perfsdk._native`` — its stub ``_native.pyi``, which must then name everything cited of it."""
    base = ROOT.joinpath(*parts)
    for cand in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".pyi")):
        if cand.exists():
            return cand
    return None


@functools.cache
def _everything() -> frozenset[str]:
    """Every name any perfsdk module defines (a class's members live where the class is defined)."""
    return frozenset().union(*(_defined(f) for f in [*PKG.rglob("*.py"), *PKG.rglob("*.pyi")]))


@functools.cache
def _defined(path: Path) -> frozenset[str]:
    """Names a module defines at its top level (or in its classes, for Class.attr), imports, or re-exports."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        names.add(n.id)
                    elif isinstance(n, ast.Attribute):
                        names.add(n.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            names.add(node.value)  # __all__ entries and PEP 562 lazy names
    return frozenset(names)


def name_resolves(dotted: str) -> bool | None:
    """True/False for a code reference; None when it is not one (a span or attribute name)."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[1] in _defined(PKG / "__init__.py"):
        return True  # perfsdk.Monitor, perfsdk.__version__ and the other public names
    if _module_file(parts[:2]) is None and not parts[1].startswith("_"):
        return None
    i = len(parts)
    while i > 1 and _module_file(parts[:i]) is None:
        i -= 1
    if i == 1:
        return False
    module = _module_file(parts[:i])
    assert module is not None
    rest = parts[i:]
    if not rest:
        return True
    # an attribute of the module; past it, a class's member (defined wherever the class is)
    return rest[0] in _defined(module) and all(r in _everything() for r in rest[1:])


def citations() -> list[tuple[str, str, bool]]:
    out = []
    for f in sources():
        rel = str(f.relative_to(ROOT))
        text = f.read_text()
        for m in PATH_RE.finditer(text):
            cited = m.group(1).rstrip(".")
            out.append((rel, cited, path_exists(cited) or (rel, cited) in ALLOWED))
        for m in NAME_RE.finditer(text):
            ok = name_resolves(m.group(1).rstrip("."))
            if ok is not None:
                out.append((rel, m.group(1), ok or (rel, m.group(1)) in ALLOWED))
    return out


def test_every_cited_path_and_name_exists() -> None:
    wrong = sorted({(f, c) for f, c, ok in citations() if not ok})
    assert not wrong, "citations of paths or names that do not exist:\n" + "\n".join(f"  {f}: {c}" for f, c in wrong)


@pytest.mark.parametrize(
    ("cited", "exists"),
    [
        ("perfsdk/csrc/stepcore.c", True),
        ("perfsdk/_native/stepcore.c", False),
        ("perfsdk/csrc/*.c", True),
        ("tests/data/h200_*.pt.trace.json.gz", True),
        ("tests/data/h200_{eager,item_sync}.pt.trace.json.gz", True),
        ("tests/data/h200x2_*_rank{0,1}.pt.trace.json.gz", False),
        ("tests/test_nothing_here.py", False),
    ],
)
def test_the_path_check_can_fail(cited: str, exists: bool) -> None:
    assert path_exists(cited) is exists


@pytest.mark.parametrize(
    ("dotted", "resolves"),
    [
        ("perfsdk.Monitor", True),
        ("perfsdk.hardware.calibrate", True),
        ("perfsdk.records.StepRecord", True),
        ("perfsdk.records.count_or_none", False),
        ("perfsdk._hotpath", False),
        ("perfsdk.phase", None),
        ("perfsdk.decode", None),
        ("perfsdk.bench.lengths", False),
    ],
)
def test_the_name_check_can_fail(dotted: str, resolves: bool | None) -> None:
    assert name_resolves(dotted) is resolves
