"""Small modules whose names say what they hold: no module of the trace analysis and the profiler window
(``perfsdk/profiling/``), the demo's ladder (``perfsdk/demo/ladder*``) or the overhead benchmark
(``benchmarks/overhead*``) runs over 500 lines unless its docstring says why (issue 23)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 500
FILES = sorted(
    [
        *(ROOT / "perfsdk" / "profiling").glob("*.py"),
        *(ROOT / "perfsdk" / "demo").glob("ladder*.py"),
        *(ROOT / "benchmarks").glob("overhead*.py"),
    ]
)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_module_over_500_lines_says_why(path: Path) -> None:
    text = path.read_text()
    lines = text.count("\n")
    if lines <= LIMIT:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert f"over {LIMIT} lines" in doc, f"{path.relative_to(ROOT)}: {lines} lines, and its docstring does not say why"


def test_the_groups_are_there() -> None:
    """The control: the globs find the modules (a moved directory would make the test above vacuous)."""
    names = {p.name for p in FILES}
    assert {"analyze.py", "window.py", "trace_events.py", "ladder.py", "overhead.py"} <= names
