"""Module docstrings say what the module owns, in about 15 lines and never more than 25
(issue 47, item 5): the how-to of a command goes to docs/commands.md, sourced facts and
measurements go beside the constant or function they justify."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("zfbench", "real", "sims", "analysis")
MAX_LINES = 25
# Temporary exceptions, each with its reason; remove a path once it is trimmed.
EXCEPTIONS: set[str] = set()


def docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return 0 if doc is None else doc.count("\n") + 1


def test_module_docstrings_are_short():
    long = {str(p.relative_to(ROOT)): n
            for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))
            if (n := docstring_lines(p)) > MAX_LINES}
    over = {p: n for p, n in long.items() if p not in EXCEPTIONS}
    assert not over, (f"module docstrings over {MAX_LINES} lines (say what the module "
                      f"owns; move how-to to docs/commands.md): {over}")


def test_exceptions_are_still_needed():
    for path in EXCEPTIONS:
        assert (ROOT / path).is_file(), f"{path} is gone: drop it from EXCEPTIONS"
        assert docstring_lines(ROOT / path) > MAX_LINES, (
            f"{path} is trimmed: drop it from EXCEPTIONS")
