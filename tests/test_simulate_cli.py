"""`python -m zfbench.simulate`: the table, the files, sweeps, bad input, and a golden table."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from zfbench.simulate.command import main
from zfbench.core.trace import columnar_format

GOLDEN = Path(__file__).parent / "golden" / "simulate_default.csv"
GOLDEN_COLUMNS = ["strategy", "step_time_s", "compute_s", "exposed_io_s", "host_wait_s",
                  "stall_fraction", "d2h_bytes_per_step", "h2d_bytes_per_step",
                  "pcie_bytes_per_step_over_model_bytes", "speedup_vs_zero_offload"]
SMALL = ["--model", "qwen2.5-1.5b", "--layers", "2", "--steps", "12", "--quiet"]
FMT = columnar_format()  # where the spans go: parquet with pyarrow, else csv


def test_default_run_prints_every_strategy_and_writes_files(tmp_path, capsys):
    assert main(SMALL + ["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("device", "zero-offload", "zero-offload-dpu", "zero-infinity", "zenflow"):
        assert name in printed
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert list(summary["strategy"]) == ["device", "zero-offload", "zero-offload-dpu",
                                         "zero-infinity", "zenflow"]
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
    assert (tmp_path / f"zenflow.spans.{FMT}").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".staging")]


def test_sweep_writes_one_table(tmp_path):
    assert main(SMALL + ["--sweep", "pcie=gen3,gen4,gen5", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "summary.csv")
    assert len(table) == 15 and list(table.columns[:2]) == ["pcie", "strategy"]
    offload = table[table["strategy"] == "zero-offload"].set_index("pcie")["step_time_s"]
    assert offload["gen3"] >= offload["gen4"] >= offload["gen5"]
    assert (tmp_path / f"pcie=gen5.zenflow.spans.{FMT}").exists()


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


@pytest.mark.slow
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


def test_too_short_run_warns_and_marks_its_rows(tmp_path, capsys):
    """2 steps hold no host update at all (zenflow looked 5.7x faster than zero-offload):
    warm-up 0 + 2 windows of 4 left out + 1 measured window = 12 steps needed."""
    assert main(SMALL[:-3] + ["--steps", "2", "--quiet", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "2 steps, needs 12" in warnings[0]
    rows = pd.read_csv(tmp_path / "a" / "summary.csv")
    assert rows["too_short"].all() and (rows["steps_needed"] == 12).all()
    assert main(SMALL[:-3] + ["--steps", "12", "--quiet", "--out", str(tmp_path / "b")]) == 0
    assert "warning" not in capsys.readouterr().err
    rows = pd.read_csv(tmp_path / "b" / "summary.csv")
    assert not rows["too_short"].any() and (rows["steps_needed"] == 12).all()
    # warm-up 2 + 3 windows of 3
    argv = SMALL[:-3] + ["--quiet", "--full-warm-up-rounds", "2", "--update-interval", "3",
                         "--strategy", "zenflow"]
    assert main(argv + ["--steps", "10"]) == 0
    assert "10 steps, needs 11" in capsys.readouterr().err
    assert main(argv + ["--steps", "11"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_sweep_marks_only_the_cases_that_are_too_short(tmp_path, capsys):
    assert main(SMALL[:-3] + ["--steps", "9", "--quiet", "--strategy", "zenflow", "--sweep",
                              "update_interval=2,3,4", "--out", str(tmp_path)]) == 0
    warning = capsys.readouterr().err.strip()
    assert warning.startswith("warning:") and "update_interval=4: 9 steps, needs 12" in warning
    assert "update_interval=2" not in warning and "update_interval=3" not in warning
    rows = pd.read_csv(tmp_path / "summary.csv").set_index("update_interval")
    assert rows["too_short"].to_dict() == {2: False, 3: False, 4: True}
    assert rows["steps_needed"].to_dict() == {2: 6, 3: 9, 4: 12}


def test_several_sweeps_make_a_grid(tmp_path, capsys):
    argv = SMALL + ["--strategy", "zenflow"]
    assert main(argv + ["--sweep", "pcie=gen3,gen5", "--sweep", "update_interval=2,4",
                        "--out", str(tmp_path / "grid")]) == 0
    table = pd.read_csv(tmp_path / "grid" / "summary.csv")
    assert list(table.columns[:3]) == ["pcie", "update_interval", "strategy"]
    assert sorted(zip(table["pcie"], table["update_interval"])) == [
        ("gen3", 2), ("gen3", 4), ("gen5", 2), ("gen5", 4)]
    for pcie, u in (("gen3", 2), ("gen5", 4)):
        assert (tmp_path / "grid" / f"pcie={pcie},update_interval={u}.zenflow.spans.{FMT}").exists()
        # each grid cell is the run with those flags
        assert main(argv + ["--pcie", pcie, "--update-interval", str(u), "--out",
                            str(tmp_path / f"{pcie}{u}")]) == 0
        one = pd.read_csv(tmp_path / f"{pcie}{u}" / "summary.csv")
        cell = table[(table["pcie"] == pcie) & (table["update_interval"] == u)]
        assert cell["step_time_s"].iloc[0] == pytest.approx(one["step_time_s"].iloc[0], rel=1e-12)
    steps = pd.read_csv(tmp_path / "grid" / "steps.csv")
    assert list(steps.columns[:3]) == ["pcie", "update_interval", "strategy"]
    summary = json.loads((tmp_path / "grid" / "summary.json").read_text())
    assert summary["sweep"] == {"pcie": ["gen3", "gen5"], "update_interval": [2, 4]}
    assert "pcie" not in summary["settings"] and summary["settings"]["steps"] == 12
    assert main(argv + ["--sweep", "pcie=gen3", "--sweep", "pcie=gen5"]) == 2
    assert "pcie given more than once" in capsys.readouterr().err


def test_one_strategy_prints_no_speedup_as_a_dash(tmp_path, capsys):
    assert main(SMALL + ["--strategy", "zenflow", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(l for l in lines if l.strip().startswith("strategy")).split()
    row = next(l for l in lines if l.strip().startswith("zenflow")).split()
    assert row[head.index("speedup")] == "-"
    assert "nan" not in "\n".join(lines)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rows"][0]["speedup_vs_zero_offload"] is None  # JSON has no NaN


def test_summary_json_has_settings_and_provenance(tmp_path):
    argv = SMALL + ["--strategy", "zenflow", "--topk-ratio", "0.2", "--out", str(tmp_path)]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    s = summary["settings"]
    assert (s["model"], s["layers"], s["steps"], s["topk_ratio"], s["gpus"]) == \
        ("qwen2.5-1.5b", 2, 12, 0.2, 4)
    prov = summary["provenance"]
    assert prov["command_line"] == "python -m zfbench.simulate " + " ".join(argv)
    for key in ("zfbench_version", "torch_version", "machine", "date_utc"):
        assert prov[key], key
    assert summary["cases"] == [{"labels": {}, "steps": 12, "ranks": 4, "steps_needed": 12,
                                 "too_short": False, "update_interval_auto": None}]


@pytest.mark.parametrize("case", ["out is a file", "out under a file"])
def test_out_path_is_checked_before_any_work(tmp_path, capsys, case):
    """Was: FileExistsError after all the work was done."""
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" if case == "out is a file" else tmp_path / "file" / "out"
    assert main(SMALL + ["--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: --out") and captured.err.count("\n") == 1
    assert "is not a directory" in captured.err and captured.out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["file"]
    assert (tmp_path / "file").read_text() == "x"
