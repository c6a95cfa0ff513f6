"""Small modules whose names say what they hold: no module of perfsdk (Python or C) or of the overhead
benchmark (``benchmarks/overhead*``) runs over 500 lines unless it says why — a Python module in its
docstring, a C file in its opening comment (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 500
FILES = sorted([*(ROOT / "perfsdk").rglob("*.py"), *(ROOT / "benchmarks").glob("overhead*.py")])
C_FILES = sorted((ROOT / "perfsdk" / "csrc").glob("*.[ch]"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_over_500_lines_says_why(path: Path) -> None:
    text = path.read_text()
    lines = text.count("\n")
    if lines <= LIMIT:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert f"over {LIMIT} lines" in doc, f"{path.relative_to(ROOT)}: {lines} lines, and its docstring does not say why"


@pytest.mark.parametrize("path", C_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_c_file_over_500_lines_says_why(path: Path) -> None:
    text = path.read_text()
    if text.count("\n") <= LIMIT:
        return
    opening = text.split("*/", 1)[0]
    assert f"over {LIMIT} lines" in opening, f"{path.relative_to(ROOT)}: its opening comment does not say why"


def test_the_groups_are_there() -> None:
    """The control: the globs find the modules (a moved directory would make the test above vacuous)."""
    names = {p.name for p in FILES}
    assert {"analyze.py", "window.py", "trace_events.py", "ladder.py", "overhead.py", "monitor.py"} <= names
    assert {"hotpath.c", "stepcore.c"} <= {p.name for p in C_FILES}
