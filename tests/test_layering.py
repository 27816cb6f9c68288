"""The import arrows of docs/design.md, read from the source with ast, so they stay true:
bench -> commands (zfbench.*) -> parts (zfbench.real, zfbench.sims, zfbench.analysis) ->
vocabulary (zfbench.core). The vocabulary imports nothing else of zfbench; a part imports
the vocabulary and itself, never another part and never a command; the commands import
anything below them. And one import name: an installed zfbench puts only `zfbench` (and
its console scripts) into site-packages, its parts mapped from their folders."""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"zfbench.real": "real", "zfbench.sims": "sims", "zfbench.analysis": "analysis"}
FOLDERS = {**PARTS, "zfbench.core": "zfbench/core", "zfbench": "zfbench"}
CORE = "zfbench.core"


def imports(path: Path, package: str) -> list[str]:
    """Absolute names of the modules `path` imports (relative imports resolved against
    `package`; `from X import name` also counts X.name, which may be a module)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]
    return out


def layer(module: str) -> str | None:
    """'core', a part's name, 'command', or None (not zfbench: stdlib, third party)."""
    if module == CORE or module.startswith(CORE + "."):
        return "core"
    for part in PARTS:
        if module == part or module.startswith(part + "."):
            return part
    if module == "zfbench" or module.startswith("zfbench."):
        return "command"
    return None


def allowed(importer: str, module: str) -> bool:
    if module in ("zfbench",) or layer(module) is None:
        return True  # the package itself (empty), the standard library, third party
    have, want = layer(importer), layer(module)
    if have == "core":
        return want == "core"
    if have in PARTS:
        return want in ("core", have)
    return True  # a command


def modules() -> list[tuple[str, Path]]:
    found = []
    for package, folder in FOLDERS.items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            found.append((name, path))
    return found


@pytest.mark.parametrize("name,path", modules(), ids=[m for m, _ in modules()])
def test_imports_run_downward(name, path):
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    wrong = [m for m in imports(path, package) if not allowed(name, m)]
    assert not wrong, f"{name} imports {wrong} against docs/design.md's arrows"


def test_no_module_uses_the_old_top_level_names():
    """`import real` / `from sims ...` would work in a source checkout and break in an
    installed zfbench: every import goes through `zfbench.`."""
    old = []
    for folder in ("zfbench", "real", "sims", "analysis", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom)
                         and node.level == 0 and node.module else [])
                old += [f"{path.relative_to(ROOT)}: {n}" for n in names
                        if n.split(".")[0] in ("real", "sims", "analysis")]
    assert not old, old


def test_the_checker_catches_an_arrow_against_the_layering(tmp_path):
    assert not allowed("zfbench.sims.costs", "zfbench.analysis.breakdown")
    assert not allowed("zfbench.real.engine", "zfbench.run")
    assert not allowed("zfbench.core.hardware", "zfbench.sims.costs")
    assert not allowed("zfbench.core.config", "zfbench.run_defaults")
    assert allowed("zfbench.predict", "zfbench.analysis.breakdown")
    assert allowed("zfbench.sims.costs", "zfbench.core.models")
    assert allowed("zfbench.real.engine", "zfbench.real.flat")
    probe = tmp_path / "probe.py"  # relative imports resolve against the package
    probe.write_text("from ..core import trace\nfrom . import engine\nfrom ..run import x\n")
    found = imports(probe, "zfbench.real")
    assert {"zfbench.core.trace", "zfbench.real.engine", "zfbench.run"} <= set(found)
    assert not allowed("zfbench.real.probe", "zfbench.run")


@pytest.mark.slow
def test_the_wheel_installs_one_import_name(tmp_path):
    """Build the wheel (no network, no isolation) and read its file list: every module
    lives under zfbench/, the parts at zfbench/real, zfbench/sims, zfbench/analysis, with
    the package data, and the console scripts are declared."""
    src = tmp_path / "src"  # a copy of the tracked files: the build leaves nothing here
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    for name in tracked:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(tmp_path / "dist"), str(src)], check=True,
                   capture_output=True, text=True)
    (wheel,) = (tmp_path / "dist").glob("zfbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"zfbench"}, tops
    for must in ("zfbench/real/engine.py", "zfbench/sims/simulator.py",
                 "zfbench/analysis/breakdown.py", "zfbench/core/config.py",
                 "zfbench/data/hardware.json", "zfbench/analysis/style.mplstyle",
                 "zfbench/run.py"):
        assert must in names, must
    (entry,) = [n for n in names if n.endswith("entry_points.txt")]
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "zfbench = zfbench.cli:main" in scripts


@pytest.mark.parametrize("package,folder", sorted(FOLDERS.items()))
def test_every_module_imports_under_its_zfbench_name(package, folder):
    """Each .py file under real/, sims/, analysis/, zfbench/ and zfbench/core imports as
    `<package>.<stem>` and is the file in this checkout (the package-dir mapping holds)."""
    import importlib

    files = sorted(p for p in (ROOT / folder).glob("*.py") if p.name != "__main__.py")
    assert files, folder
    for path in files:
        name = package if path.stem == "__init__" else f"{package}.{path.stem}"
        module = importlib.import_module(name)
        assert Path(module.__file__).resolve() == path.resolve(), (name, module.__file__)
