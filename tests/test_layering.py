"""The import arrows of docs/design.md, read from the source with ast, so they stay true:
the vocabulary (zfbench.config*, models, hardware, trace, schedule, provenance) imports none
of the parts or commands; real/, sims/ and analysis/ import the vocabulary and themselves,
never each other and never a command; only the commands (the rest of zfbench/) and bench/
join them."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("real", "sims", "analysis")
VOCABULARY = ("zfbench.config", "zfbench.models", "zfbench.hardware", "zfbench.trace",
              "zfbench.schedule", "zfbench.provenance")


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
            if node.module == "zfbench":  # `from zfbench import hardware`
                out += [f"zfbench.{a.name}" for a in node.names]
    return out


def is_vocabulary(module: str) -> bool:
    return module.startswith(VOCABULARY)


def allowed(importer: str, module: str) -> bool:
    top = module.split(".")[0]
    if top not in PARTS + ("zfbench",) or module == "zfbench":
        return True  # the standard library and third-party packages
    if is_vocabulary(importer):
        return is_vocabulary(module)
    if importer.split(".")[0] in PARTS:
        return is_vocabulary(module) or top == importer.split(".")[0]
    return True  # a command


def modules() -> list[tuple[str, Path]]:
    found = []
    for folder in PARTS + ("zfbench",):
        for path in sorted((ROOT / folder).glob("*.py")):
            found.append((f"{folder}.{path.stem}", path))
    return found


@pytest.mark.parametrize("name,path", modules(), ids=[m for m, _ in modules()])
def test_imports_run_downward(name, path):
    wrong = [m for m in imports(path) if not allowed(name, m)]
    assert not wrong, f"{name} imports {wrong} against docs/design.md's arrows"


def test_the_checker_catches_an_arrow_against_the_layering():
    assert not allowed("sims.costs", "analysis.breakdown")
    assert not allowed("real.engine", "zfbench.run")
    assert not allowed("zfbench.hardware", "sims.costs")
    assert allowed("zfbench.predict", "analysis.breakdown")
    assert allowed("sims.costs", "zfbench.models")
