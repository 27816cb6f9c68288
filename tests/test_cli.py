"""The `zfbench` console script: one entry point dispatching to the commands."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from zfbench.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]


def test_dispatches_to_the_command_with_its_flags(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--model", "tiny", "--gpus", "1", "--steps", "12",
                 "--strategy", "zero-offload", "--quiet", "--out", str(out)]) == 0
    assert list(pd.read_csv(out / "summary.csv")["strategy"]) == ["zero-offload"]


def test_unknown_command_and_no_command(capsys):
    assert main(["simulat"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown command 'simulat'") and "simulate" in err
    assert main([]) == 2
    assert "usage: zfbench COMMAND" in capsys.readouterr().out
    assert main(["--help"]) == 0


def test_every_command_is_a_module_with_main_and_the_script_is_declared():
    import importlib

    for name in COMMANDS:
        assert callable(importlib.import_module(f"zfbench.{name}").main), name
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["zfbench"] == "zfbench.cli:main"


@pytest.mark.slow
def test_installed_script_runs():
    script = Path(sys.executable).parent / "zfbench"
    assert script.exists(), "reinstall (make setup): pyproject declares the zfbench script"
    done = subprocess.run([str(script), "predict", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--from-breakdown" in done.stdout
