"""`python -m zfbench.simulate`: the table, the files, sweeps, bad input, and a golden table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from zfbench.simulate import main

GOLDEN = Path(__file__).parent / "golden" / "simulate_default.csv"
GOLDEN_COLUMNS = ["strategy", "step_time_s", "compute_s", "exposed_io_s", "host_wait_s",
                  "stall_fraction", "d2h_bytes_per_step", "h2d_bytes_per_step",
                  "pcie_bytes_per_step_over_model_bytes", "speedup_vs_zero_offload"]
SMALL = ["--model", "qwen2.5-1.5b", "--layers", "2", "--steps", "12", "--quiet"]


def test_default_run_prints_four_strategies_and_writes_files(tmp_path, capsys):
    assert main(SMALL + ["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("device", "zero-offload", "zero-offload-dpu", "zenflow"):
        assert name in printed
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary["strategy"]) == ["device", "zero-offload", "zero-offload-dpu",
                                         "zenflow"]
    for col in ("step_time_s", "compute_s", "exposed_io_s", "stall_s", "stall_fraction",
                "d2h_bytes_per_step", "h2d_bytes_per_step",
                "pcie_bytes_per_step_over_model_bytes", "host_busy_fraction",
                "speedup_vs_zero_offload", "d2h_gb_per_s", "h2d_gb_per_s",
                "host_adam_params_per_s"):
        assert col in summary.columns
    assert summary.set_index("strategy").loc["zero-offload", "speedup_vs_zero_offload"] == 1
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    steps = pd.read_csv(tmp_path / "steps.csv")
    assert set(steps["strategy"]) == set(summary["strategy"])
    assert (tmp_path / "zenflow.spans.csv").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]


def test_sweep_writes_one_table(tmp_path):
    assert main(SMALL + ["--sweep", "pcie=gen3,gen4,gen5", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "summary.csv")
    assert len(table) == 12 and list(table.columns[:2]) == ["pcie", "strategy"]
    offload = table[table["strategy"] == "zero-offload"].set_index("pcie")["step_time_s"]
    assert offload["gen3"] >= offload["gen4"] >= offload["gen5"]
    assert (tmp_path / "pcie=gen5.zenflow.spans.csv").exists()


@pytest.mark.parametrize("argv, words", [
    (["--model", "llama3"], ["unknown model 'llama3'", "llama2-7b"]),
    (["--gpu", "v100"], ["v100", "a100-80g"]),
    (["--pcie", "gen9"], ["gen9", "gen4"]),
    (["--topk-ratio", "0"], ["topk_ratio"]),
    (["--topk-ratio", "1.5"], ["topk_ratio"]),
    (["--update-interval", "0"], ["update_interval"]),
    (["--select-interval", "2", "--update-interval", "4"], ["select_interval"]),
    (["--sweep", "topk=0.1,0.2"], ["unknown knob 'topk'", "topk_ratio"]),
    (["--sweep", "topk_ratio=0.1,2"], ["topk_ratio"]),
    (["--gpus", "two"], ["gpus"]),
])
def test_bad_input_names_the_problem_and_writes_nothing(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert main(argv + ["--steps", "4", "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert not out.exists() or not any(out.iterdir())


def test_asking_for_a_strategy_that_cannot_fit_says_by_how_much(capsys):
    argv = ["--model", "llama2-13b", "--gpus", "1", "--gpu", "a100-40g",
            "--strategy", "device", "--steps", "4", "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "device does not fit" in err and "short by" in err and "GiB" in err


def test_table_marks_strategies_that_do_not_fit(capsys):
    argv = ["--model", "llama2-13b", "--gpus", "1", "--gpu", "a100-40g", "--layers", "40",
            "--steps", "3", "--quiet"]
    assert main(argv) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.strip().startswith("device"))
    assert "NO (dev" in line


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "zfbench.simulate", *SMALL,
                           "--strategy", "zenflow"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "zenflow" in proc.stdout


def test_golden_default_table(tmp_path):
    """The default scenario's breakdown table equals the stored one (regenerate with
    ZFBENCH_UPDATE_GOLDEN=1 when a model change is intended, and say why in the commit)."""
    assert main(["--steps", "24", "--quiet", "--out", str(tmp_path)]) == 0
    got = pd.read_csv(tmp_path / "summary.csv")[GOLDEN_COLUMNS]
    if os.environ.get("ZFBENCH_UPDATE_GOLDEN") == "1":
        got.to_csv(GOLDEN, index=False, float_format="%.12g")
    want = pd.read_csv(GOLDEN)
    assert list(got["strategy"]) == list(want["strategy"])
    pd.testing.assert_frame_equal(got, want, check_exact=False, check_dtype=False,
                                  rtol=1e-9, atol=1e-12)
