"""The import arrows of docs/design.md, read from the source with ast, so they stay true:
bench -> commands (zfbench.*) -> parts (zfbench.real, zfbench.sims, zfbench.analysis) ->
vocabulary (zfbench.core). The vocabulary imports nothing else of zfbench; a part imports
the vocabulary and itself, never another part and never a command; the commands import
anything below them. No import circle among zfbench's modules (but the pending ones listed
with their issue). And one import name: an installed zfbench puts only `zfbench` (and its
console scripts) into site-packages, its parts mapped from their folders."""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"zfbench.real": "real", "zfbench.sims": "sims", "zfbench.analysis": "analysis"}
# The command packages (zfbench/run/, zfbench/simulate/, ...: every folder of zfbench/ with
# an __init__.py but core/), found rather than listed, so a new command is checked too.
COMMAND_PACKAGES = {f"zfbench.{p.name}": f"zfbench/{p.name}"
                    for p in sorted((ROOT / "zfbench").iterdir())
                    if (p / "__init__.py").is_file() and p.name != "core"}
FOLDERS = {**PARTS, "zfbench.core": "zfbench/core", "zfbench": "zfbench", **COMMAND_PACKAGES}
CORE = "zfbench.core"


def imports(path: Path, package: str) -> list[str]:
    """Absolute names of the modules `path` imports (relative imports resolved against
    `package`; `from X import name` also counts X.name, which may be a module)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]
    return out


def absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a `from ... import` reads (relative levels resolved
    against `package`)."""
    base = node.module or ""
    if node.level:
        up = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return base


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
    assert not allowed("zfbench.core.config", "zfbench.run.defaults")
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
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w",
                            str(tmp_path / "dist"), str(src)], check=True,
                           capture_output=True, text=True)
    # the package data declared as setuptools expects: no "Package would be ignored" wall
    assert "Warning" not in built.stderr + built.stdout, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("zfbench-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"zfbench"}, tops
    for must in ("zfbench/real/engine.py", "zfbench/sims/simulator.py",
                 "zfbench/analysis/breakdown.py", "zfbench/core/config.py",
                 "zfbench/data/hardware.json", "zfbench/data/paper_zero_offload_bars.json",
                 "zfbench/data/published/offload_measurements.csv",
                 "zfbench/data/published/held_out_no_offload_v100.csv",
                 "zfbench/analysis/style.mplstyle",
                 "zfbench/run/command.py", "zfbench/real/host_fused.cpp"):
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


# Import circles still to be removed, each the exact set of modules of one circle, with
# the issue that removes it. The checker fails on any other circle, on a listed one that
# grew, and on a listed one that is gone (take it off this list).
PENDING_CIRCLES: dict = {}  # none left (issue 27 removed the last, sims/settings)


def arrows(path: Path, package: str, known: set[str]) -> set[str]:
    """The modules of `known` that the module at `path` imports, at the top or inside a
    function alike (a deferred import still closes a circle). `from P import name` is an
    arrow to P.name where that is a module, else to P (a package's __init__, or the module
    defining name)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = absolute(node, package)
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                    for a in node.names}
    return out & known


def import_graph() -> dict[str, set[str]]:
    """Every module of zfbench (the commands, core and the three parts) -> the modules of
    zfbench it imports."""
    found = dict(modules())
    return {name: arrows(path, name if path.stem == "__init__" else name.rpartition(".")[0],
                         set(found)) - {name}
            for name, path in found.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan): each is one
    or more import circles through the same modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles():
    """No module of zfbench imports, directly or through others, a module that imports it
    (issue 27: core/hardware <-> hardware_types and core/trace <-> trace_files were such
    circles), but for the circles listed as pending."""
    found = circles(import_graph())
    new = [sorted(c) for c in found if c not in PENDING_CIRCLES]
    assert not new, f"import circles (draw the files so imports run one way): {new}"
    gone = [sorted(c) for c in PENDING_CIRCLES if c not in found]
    assert not gone, f"pending circles no longer there, take them off PENDING_CIRCLES: {gone}"


def test_the_circle_checker_finds_a_circle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert circles(graph) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []
    probe = tmp_path / "probe.py"  # a deferred import counts; a name is an arrow to its module
    probe.write_text("from . import flat, initialize\n"
                     "def f():\n    from ..core.trace import Timeline\n")
    known = {"zfbench.real", "zfbench.real.flat", "zfbench.core.trace", "zfbench.run"}
    assert arrows(probe, "zfbench.real", known) == {"zfbench.real", "zfbench.real.flat",
                                                    "zfbench.core.trace"}


def test_each_command_is_a_package():
    """Each `zfbench COMMAND` is the package zfbench/COMMAND/: command.py holds its flags and
    main, __main__.py makes `python -m zfbench.COMMAND` run it, and its own modules sit beside
    them; no flat zfbench/COMMAND.py or COMMAND_*.py is left in zfbench/."""
    from zfbench.cli import COMMANDS

    assert set(COMMAND_PACKAGES) == {f"zfbench.{name}" for name in COMMANDS}
    for name in COMMANDS:
        folder = ROOT / "zfbench" / name
        assert (folder / "command.py").is_file() and (folder / "__main__.py").is_file(), name
        flat = [*(ROOT / "zfbench").glob(f"{name}.py"), *(ROOT / "zfbench").glob(f"{name}_*.py")]
        assert not flat, flat


def test_the_engine_package_loads_torch_only_when_an_engine_name_is_used():
    """`zfbench.real` resolves its names lazily: a torch-free module of the package
    imports without torch; `zfbench.real.initialize` then loads the engine."""
    code = ("import sys\n"
            "import zfbench.real, zfbench.real.memory\n"
            "assert 'torch' not in sys.modules, 'torch loaded'\n"
            "from zfbench.real import initialize, Engine\n"
            "assert 'torch' in sys.modules and initialize.__module__.endswith('deepspeed_api')\n"
            "assert set(dir(zfbench.real)) >= set(zfbench.real.__all__)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
