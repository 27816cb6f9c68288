"""bench/host_lane_evidence.py (issue 44, item 2): its numbers read off the committed GPU
runs, checked against the same numbers taken from the files by hand, its windows, the
mechanisms' verdicts on the committed data, and its replay of the committed fit."""

import csv
import json
from pathlib import Path

import pandas as pd
import pytest

from bench_helpers import bench_module

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "gpu"


@pytest.fixture(scope="module")
def ev():
    return bench_module("host_lane_evidence")


@pytest.fixture(scope="module")
def facts(ev):
    return {n: ev.machine_facts(RESULTS, n) for n in ev.MACHINES}


def rows_of(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_complete_windows_follow_the_update_interval(ev):
    assert ev.complete_windows(pd.Series(range(8)), 4) == [[4, 5, 6, 7]]
    assert ev.complete_windows(pd.Series(range(12)), 4) == [[4, 5, 6, 7], [8, 9, 10, 11]]
    assert ev.complete_windows(pd.Series(range(10)), 4) == [[4, 5, 6, 7]]  # 8-9 incomplete
    assert ev.complete_windows(pd.Series(range(4)), 4) == []


@pytest.mark.parametrize("name", ["H100-VM", "H200-VM"])
def test_the_spans_are_the_committed_files_numbers(ev, facts, name):
    f = facts[name]
    run = RESULTS / ev.MACHINES[name][0] / ev.RUN
    meta = json.loads((run / "summary.json").read_text())
    P, U = meta["settings"]["params"], meta["configs"]["zenflow"]["zenflow"]["update_interval"]
    summary = {r["strategy"]: r for r in rows_of(run / "summary.csv")}
    zf, zo = summary["zenflow"], summary["zero-offload"]
    # the measured steps hold one window job: P / U a step at the row's rate
    assert f["window_alone_s"] == pytest.approx(
        P / U * int(zf["steps_measured"]) / float(zf["host_adam_params_per_s"]))
    assert f["zo_job_s"] == pytest.approx(P / float(zo["host_adam_params_per_s"]))
    busy = {int(r["step"]): float(r["host_busy_s"]) for r in rows_of(run / "steps.csv")
            if r["strategy"] == "zenflow"}
    assert f["accum_run_s"] == pytest.approx((busy[1] + busy[2]) / 2)
    assert f["window_busy_s"][0] == pytest.approx(sum(busy[s] for s in range(4, 8)))
    assert f["zf_threads"] == int(zf["host_threads"]) == 8


def test_m5_predicts_each_window_job_from_its_zero_offload_job(ev, facts):
    """M5 by hand: ZeRO-Offload's host job x 38/40 (the runs' engine: 6 + 28 + 6 B a
    parameter against 28 + 4 + 6 B) x the profile's thread scaling (H200: ZeRO-Offload's
    16-thread lane over ZenFlow's 8; H100: both lanes 8 threads)."""
    prof = json.loads((RESULTS / ev.MACHINES["H200-VM"][0] / "profile" / "profile.json"
                       ).read_text())["calibration"]
    scale = (prof["host_lanes"]["zero-offload"]["host_adam_params_per_s"]
             / prof["host_adam_params_per_s"])
    rows = pd.DataFrame(ev.mechanism_rows(facts))
    m5 = rows[rows["mechanism"] == "M5 engine's host job in the fit (no constant)"]
    pred = dict(zip(m5["derived_on"], m5["predicted"]))
    assert pred["H100-VM"] == pytest.approx(facts["H100-VM"]["zo_job_s"] * 38 / 40)
    assert pred["H200-VM"] == pytest.approx(facts["H200-VM"]["zo_job_s"] * 38 / 40 * scale)
    verdicts = rows.groupby("mechanism")["verdict"].first()
    assert verdicts["M5 engine's host job in the fit (residual carried)"] == "kept"
    assert verdicts["M1 host DRAM shared by AdamW and DMA uploads"] == "rejected"
    assert verdicts["M6 accumulation at a share of the ZeRO-Offload job's stream"] == "rejected"
    crossed = rows[rows["derived_on"] != rows["checked_on"]]
    assert set(zip(crossed["derived_on"], crossed["checked_on"])) == {
        ("H100-VM", "H200-VM"), ("H200-VM", "H100-VM")}


def test_the_replay_of_the_committed_fit_gives_the_committed_prediction(ev, facts):
    """The what-if's first variant is the committed fit itself: its ZenFlow step is the
    one predict_host_lane/summary.csv holds."""
    rows = pd.DataFrame(ev.replay_rows(RESULTS, facts))
    now = rows[rows["variant"] == "now (committed fit)"].set_index("machine")["step_s"]
    for name in ev.MACHINES:
        committed = {r["strategy"]: r for r in rows_of(
            RESULTS / ev.MACHINES[name][0] / ev.FIT / "summary.csv")}
        assert now[name] == pytest.approx(float(committed["zenflow"]["step_time_s"]), rel=1e-6)
    m5 = rows[rows["variant"].str.startswith("M5: ")].set_index("machine")
    assert (m5["adam_scale"] < 1).all()  # the window job is costed slower, not faster


def test_a_missing_results_folder_is_one_clear_error(ev, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        ev.main(["--results", str(tmp_path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no committed run" in err and "--results" in err
