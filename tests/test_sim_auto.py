"""`update_interval: auto` in the simulator (sims/update_windows.py) and in the CLI.

A constant auto window N is the fixed interval N (same timeline, same summary), varying
windows close where the replay rule says, measured windows are read from the files
`python -m zfbench.accuracy` writes, and the header and summary.json say what auto
resolved to."""

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from zfbench.sims.costs import SimSettings, SimSettingsError
from oracle import steady_state
from zfbench.sims.simulator import default_skip_steps, simulate, steps_needed
from zfbench.sims.update_windows import AUTO_ASSUMED_WINDOW_STEPS
from zfbench.simulate.command import main

SMALL = ["--model", "qwen2.5-1.5b", "--layers", "2", "--quiet"]


def host_update_steps(s: SimSettings) -> list[int]:
    """Steps at whose end zenflow's host Adam ran (rank 0)."""
    spans = simulate(s, "zenflow").timeline.spans_frame()
    return sorted(spans.query("rank == 0 and op == 'host_optim'")["step"].unique().tolist())


@hsettings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(["tiny", "opt-350m"]), gpus=st.sampled_from([1, 2]),
       U=st.integers(1, 5), W=st.integers(0, 2), overlap=st.booleans(),
       transfers=st.sampled_from(["design", "shipped"]), reselect=st.booleans())
def test_constant_auto_window_is_the_fixed_interval(model, gpus, U, W, overlap, transfers,
                                                    reselect):
    """Same spans, same step intervals, same skip: auto with windows N == update_interval N
    (select_interval 0, or a multiple of N without warm-up, so no reselection cuts a
    window differently)."""
    S = 2 * U if reselect else 0
    W = 0 if reselect else W
    fixed = SimSettings.from_knobs(model=model, layers=1, gpus=gpus, update_interval=U,
                                   full_warm_up_rounds=W, select_interval=S, overlap_step=overlap,
                                   transfers=transfers, steps=W + 4 * U + 1)
    auto = fixed.with_(update_interval="auto", auto_windows=str(U))
    a, b = simulate(fixed, "zenflow").timeline, simulate(auto, "zenflow").timeline
    pd.testing.assert_frame_equal(a.spans_frame(), b.spans_frame())
    pd.testing.assert_frame_equal(a.steps_frame(), b.steps_frame())
    assert default_skip_steps(auto) == default_skip_steps(fixed)
    assert steps_needed(auto) == steps_needed(fixed) == W + 3 * U
    assert steady_state(auto, "zenflow").step_time_s == steady_state(fixed, "zenflow").step_time_s


def test_cli_summary_of_constant_auto_equals_fixed_interval(tmp_path, capsys):
    argv = SMALL + ["--steps", "14", "--full-warm-up-rounds", "1"]
    assert main(argv + ["--update-interval", "3", "--out", str(tmp_path / "u3")]) == 0
    assert main(argv + ["--update-interval", "auto", "--auto-windows", "3",
                        "--out", str(tmp_path / "auto")]) == 0
    fixed = pd.read_csv(tmp_path / "u3" / "summary.csv")
    auto = pd.read_csv(tmp_path / "auto" / "summary.csv")
    pd.testing.assert_frame_equal(fixed, auto)
    assert fixed.set_index("strategy").loc["zenflow", "host_adam_params_per_s"] > 0


def test_varying_windows_close_where_the_replay_rule_says():
    base = SimSettings.from_knobs(model="tiny", layers=1, gpus=1, steps=17, full_warm_up_rounds=1,
                                  update_interval="auto", auto_windows="2,5")
    # warm-up step 0, then windows 2, 5, 2, 5, ... (cycled): ends at 2, 7, 9, 14, 16
    assert host_update_steps(base) == [0, 2, 7, 9, 14, 16]
    assert default_skip_steps(base) == 1 + 2 + 5
    assert steps_needed(base) == 1 + 2 + 5 + 2
    # a reselection (the step before t % 6 == 0) closes a window early; the next window
    # restarts its count, as the engine's tracker does after a flush
    cut = base.with_(full_warm_up_rounds=0, auto_windows="4", select_interval=6, steps=18)
    assert host_update_steps(cut) == [3, 5, 9, 11, 15, 17]
    # the fixed interval keeps its global grid instead: 3, 5, 7, 11, 15, 17
    assert host_update_steps(cut.with_(update_interval=4, auto_windows=None)) == \
        [3, 5, 7, 11, 15, 17]
    with pytest.raises(SimSettingsError, match="one window length"):
        steady_state(base, "zenflow")


def test_auto_without_windows_assumes_a_constant_window_and_says_so(tmp_path, capsys):
    assert main(SMALL + ["--steps", "13", "--strategy", "zenflow", "--update-interval",
                         "auto", "--out", str(tmp_path)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"U=auto -> assumed constant {AUTO_ASSUMED_WINDOW_STEPS}-step windows" in head
    assert "not measured" in head
    summary = json.loads((tmp_path / "summary.json").read_text())
    auto = summary["update_interval_auto"]
    assert auto["source"] == "assumed" and auto["windows_given_steps"] == [4]
    assert auto["windows_in_run_steps"] == [4, 4, 4]  # 13 steps: 3 closed windows
    assert auto["mean_window_steps"] == 4.0
    assert summary["settings"]["update_interval"] == "auto"
    assert summary["settings"]["auto_windows"] is None


@pytest.mark.parametrize("layout", ["figure", "accuracy"])
def test_measured_windows_file_is_replayed(tmp_path, capsys, layout):
    """The two files python -m zfbench.accuracy writes; from auto_intervals.csv the first
    (strategy, seed) pair's windows."""
    if layout == "figure":
        path = tmp_path / "windows.csv"
        path.write_text("window,length_steps,end_step\n0,1,0\n1,3,3\n2,2,5\n")
    else:
        path = tmp_path / "auto_intervals.csv"
        path.write_text("strategy,seed,window,length,end_step\n"
                        "zenflow-k0.1-auto,0,0,1,0\nzenflow-k0.1-auto,0,1,3,3\n"
                        "zenflow-k0.1-auto,0,2,2,5\nzenflow-k0.1-auto,1,0,7,6\n")
    s = SimSettings.from_knobs(model="tiny", layers=1, gpus=1, steps=12, update_interval="auto",
                               auto_windows=str(path))
    assert host_update_steps(s) == [0, 3, 5, 6, 9, 11]  # 1, 3, 2, cycled: 1, 3, 2
    out = tmp_path / "out"
    assert main(SMALL + ["--steps", "12", "--strategy", "zenflow", "--update-interval",
                         "auto", "--auto-windows", str(path), "--out", str(out)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"3 measured windows from {path}" in head and "mean 2.00 steps" in head
    auto = json.loads((out / "summary.json").read_text())["update_interval_auto"]
    assert auto["source"] == str(path) and auto["windows_given_steps"] == [1, 3, 2]
    assert auto["windows_in_run_steps"] == [1, 3, 2, 1, 3, 2]
    assert auto["mean_window_steps"] == 2.0


@pytest.mark.parametrize("knobs, words", [
    ({"update_interval": 4, "auto_windows": "3"}, "only with update_interval auto"),
    ({"update_interval": "auto", "auto_windows": "0"}, "integers >= 1"),
    ({"update_interval": "auto", "auto_windows": "2,1.5"}, "integers >= 1"),
    ({"update_interval": "auto", "auto_windows": "/nope/windows.csv"}, "existing file"),
    ({"update_interval": "sometimes"}, "only string allowed is 'auto'"),
])
def test_bad_auto_settings_are_refused(knobs, words):
    with pytest.raises(SimSettingsError, match=words):
        SimSettings.from_knobs(model="tiny", **knobs)


def test_a_file_without_window_lengths_is_refused(tmp_path):
    path = tmp_path / "w.csv"
    path.write_text("window,steps\n0,3\n")
    with pytest.raises(SimSettingsError, match="not a windows file"):
        SimSettings.from_knobs(model="tiny", update_interval="auto", auto_windows=str(path))
