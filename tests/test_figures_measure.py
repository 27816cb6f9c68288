"""`zfbench.figures.measure`: `make figures` runs the measurements its figures lack."""

from __future__ import annotations

import pandas as pd
import pytest

from zfbench.figures import command as figures
from zfbench.figures import measure as fm


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """Quick validate + tiny gradient statistics, run for real into an empty directory."""
    root = tmp_path_factory.mktemp("measured")
    notes = fm.run_missing(root, {10, 11, 12}, quick=True, quiet=True)
    return root, notes


@pytest.mark.slow
def test_missing_measurements_run_and_land_whole(measured):
    root, notes = measured
    assert [n.split(":")[0] for n in notes] == ["figures 10", "figures 11, 12"]
    assert all("measured with" in n for n in notes)
    table = pd.read_csv(root / "validate.csv")
    assert set(table.strategy) == {"device", "zero-offload", "zero-offload-dpu", "zenflow"}
    assert (table.measured_step_time_s > 0).all()
    assert (root / "grad_stats/heatmap.csv").exists()
    # Parquet when pyarrow is installed (the real-model extra), else CSV
    assert any((root / f"grad_stats/column_norms.{ext}").exists() for ext in ("csv", "parquet"))
    assert not list(root.glob(".*.tmp"))  # staging directories are gone
    # a second pass finds everything and runs nothing
    assert fm.run_missing(root, {10, 11, 12}, quick=True, quiet=True) == []


@pytest.mark.slow
def test_measured_files_draw_figures_10_to_12(measured, tmp_path):
    root, _ = measured
    rc = figures.main(["--quick", "--quiet", "--no-measure", "--out", str(tmp_path),
                       "--measured", str(root), "--only", "10,11,12"])
    assert rc == 0
    for stem in ("fig10_measured_vs_simulated", "fig11_gradient_concentration",
                 "fig12_temporal_locality"):
        assert (tmp_path / f"{stem}.png").stat().st_size > 10_000, stem


@pytest.mark.slow
def test_failed_run_leaves_nothing_and_says_so(tmp_path, monkeypatch):
    bad = fm.MeasureJob("validate", (10,), ("validate.csv",),
                        ("zfbench.validate", "--no-such-flag"))
    monkeypatch.setattr(fm, "measure_jobs", lambda quick: [bad])
    notes = fm.run_missing(tmp_path, {10}, quick=True, quiet=True)
    assert len(notes) == 1 and "failed with exit code 2" in notes[0]
    assert list(tmp_path.iterdir()) == []


def test_real_model_runs_are_skipped_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(fm, "real_model_missing", lambda: "gguf not installed: run "
                        "`make real-model-setup`")
    notes = fm.run_missing(tmp_path, {13, 14}, quick=False, quiet=True)
    assert notes == ["figures 13, 14: not measured, gguf not installed: run "
                     "`make real-model-setup`"]
    assert list(tmp_path.iterdir()) == []


def test_a_job_past_the_time_budget_is_stopped_and_the_rest_left_out(tmp_path, monkeypatch):
    """The budget covers all measurements: a job still running at the deadline is
    stopped and leaves nothing; a job after it is not started; both notes say so and
    give the command to run."""
    slow = fm.MeasureJob("gradients", (11,), ("grad_stats/heatmap.csv",),
                         ("zfbench.no_such_module_sleeps",))
    later = fm.MeasureJob("accuracy", (13,), ("accuracy/quality.csv",), ("zfbench.accuracy",))
    monkeypatch.setattr(fm, "measure_jobs", lambda quick: [slow, later])
    monkeypatch.setattr(fm, "MIN_JOB_S", 0.5)
    import subprocess
    import types
    clock = [0.0]  # a clock of the test's own: only the jobs move it, however busy the machine
    monkeypatch.setattr(fm, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    def sleeper(cmd, env=None, timeout=None, stdout=None):  # runs past its timeout
        clock[0] += 0.2
        raise subprocess.TimeoutExpired(cmd, timeout)
    monkeypatch.setattr(fm.subprocess, "run", sleeper)
    notes = fm.run_missing(tmp_path, {11, 13}, quick=True, quiet=True, budget_s=0.6)
    assert notes[0].startswith("figures 11: not measured, stopped at the time budget")
    assert "python -m zfbench.no_such_module_sleeps" in notes[0]
    assert notes[1] == ("figures 13: not measured, the time budget is spent; run "
                        f"`python -m zfbench.accuracy --out {tmp_path}`")
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]
