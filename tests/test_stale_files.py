"""A directory a command writes holds one run's files (zfbench.report `land`, `Owned`):
the files of the command's own names that an earlier run left there and this run did not
write again are removed when it lands; files of other names (a user's notes) stay."""

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, strategies as st

from zfbench.core.strategies import ENGINE_STRATEGIES, SIM_STRATEGIES
from zfbench.predict.command import PREDICTED_FILES
from zfbench.report import TIMELINE_FILES, land, remove_stale
from zfbench.run.command import main as run_main
from zfbench.run.report import PROFILE_FILES, RUN_FILES
from zfbench.simulate.command import main as simulate_main
from zfbench.simulation import SIMULATED_FILES
from zfbench.validate.command import VALIDATE_FILES

TINY = ["--model", "tiny", "--steps", "4", "--batch", "2", "--seq", "16",
        "--device-threads", "1", "--host-threads", "1", "--quiet"]
SMALL_SIM = ["--model", "qwen2.5-1.5b", "--layers", "2", "--steps", "12", "--quiet",
             "--timeline-format", "csv"]
SUMMARY = {"summary.csv", "summary.json", "steps.csv", "trace.json"}
SUFFIXES = [t.replace("{}", "") for t in TIMELINE_FILES]


def files(out: Path) -> set[str]:
    return {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}


def run_files(strategy: str) -> set[str]:
    return {f"{strategy}.spans.csv", f"{strategy}.steps.csv", f"{strategy}.steps.jsonl"}


def test_a_later_run_with_fewer_strategies_leaves_none_of_the_earlier_runs_files(tmp_path):
    """Every strategy with their profiles, then zenflow alone, then device without a
    profile: each time the directory holds that run's files and the user's notes only
    (before, the other strategies' timelines, JSONL and profiles stayed beside them)."""
    out = tmp_path / "run"
    assert run_main(TINY + ["--profile", "--out", str(out)]) == 0
    first = files(out)
    assert set().union(*map(run_files, ENGINE_STRATEGIES)) <= first
    assert {f"profiles/{s}.json" for s in ENGINE_STRATEGIES} <= first
    (out / "notes.txt").write_text("mine\n")
    assert run_main(TINY + ["--profile", "--strategy", "zenflow", "--out", str(out)]) == 0
    assert files(out) == SUMMARY | run_files("zenflow") | {
        "notes.txt", "plan.json", "profile.json", "profiles/zenflow.json"}
    assert set(pd.read_csv(out / "steps.csv")["strategy"]) == {"zenflow"}
    assert run_main(TINY + ["--strategy", "device", "--out", str(out)]) == 0
    assert files(out) == SUMMARY | run_files("device") | {"notes.txt", "plan.json"}
    assert (out / "notes.txt").read_text() == "mine\n"


def test_a_later_simulation_with_fewer_cases_leaves_none_of_the_earlier_ones(tmp_path):
    """A sweep's labelled timelines (and no trace.json), then one strategy unswept."""
    out = tmp_path / "sim"
    assert simulate_main(SMALL_SIM + ["--sweep", "pcie=gen4,gen5", "--out", str(out)]) == 0
    swept = files(out)
    assert "pcie=gen5.zero-infinity.spans.csv" in swept and "trace.json" not in swept
    (out / "notes.txt").write_text("mine\n")
    assert simulate_main(SMALL_SIM + ["--strategy", "zenflow", "--out", str(out)]) == 0
    assert files(out) == SUMMARY | {"notes.txt", "zenflow.spans.csv", "zenflow.steps.csv"}
    assert simulate_main(SMALL_SIM + ["--sweep", "pcie=gen4", "--strategy", "device",
                                      "--out", str(out)]) == 0
    assert files(out) == SUMMARY - {"trace.json"} | {
        "notes.txt", "pcie=gen4.device.spans.csv", "pcie=gen4.device.steps.csv"}


# (name relative to the directory, owned by run, simulate, predict, validate)
NAMES = [
    ("summary.csv", True, True, True, False),
    ("trace.json", True, True, True, False),
    ("plan.json", True, False, False, False),
    ("profile.json", True, False, False, False),
    ("zero-offload-dpu.spans.csv", True, True, True, False),
    ("zenflow.steps.parquet", True, True, True, False),
    ("zenflow.steps.jsonl", True, False, False, False),
    ("profiles/zenflow.json", True, False, False, False),
    ("pcie=gen4,topk_ratio=0.1.zenflow.spans.csv", False, True, True, False),
    ("inferred_hardware.json", False, False, True, False),
    ("inferred_hardware.case2.json", False, False, True, False),
    ("range.csv", False, False, True, False),
    ("validate.csv", False, False, False, True),
    ("profiles/ratio0.45.zenflow.topk0.1-U4.json", False, False, False, True),
    ("traces/ratio2.device.json", False, False, False, True),
    ("notes.txt", False, False, False, False),
    ("zenflow.notes.csv", False, False, False, False),
    ("my-zenflow.spans.csv", False, False, False, False),  # not a strategy's name
    ("zenflow.spans.csv.bak", False, False, False, False),
    ("profiles/mine.json", False, False, False, False),
    ("old/zenflow.spans.csv", False, False, False, False),  # another folder
    ("hazards.json", False, False, False, False),  # --hazard-check's, another mode
    ("paper.csv", False, False, False, False),  # predict --paper's fixed pair
]


@pytest.mark.parametrize("name,run,simulate,predict,validate", NAMES)
def test_each_command_owns_its_names_only(name, run, simulate, predict, validate):
    got = [o.owns(name) for o in (RUN_FILES, SIMULATED_FILES, PREDICTED_FILES,
                                  VALIDATE_FILES)]
    assert got == [run, simulate, predict, validate]


LABEL = st.text(st.characters(blacklist_characters="/\x00"), min_size=1, max_size=20)


@given(LABEL, st.sampled_from(SIM_STRATEGIES), st.sampled_from(SUFFIXES))
def test_a_cases_timeline_is_owned_whatever_its_label(label, strategy, suffix):
    assert SIMULATED_FILES.owns(f"{label}.{strategy}{suffix}")
    assert SIMULATED_FILES.owns(f"{strategy}{suffix}") and RUN_FILES.owns(f"{strategy}{suffix}")
    assert not RUN_FILES.owns(f"{label}.{strategy}{suffix}")  # the run has no cases


@given(LABEL.filter(lambda w: w.rsplit(".", 1)[-1] not in SIM_STRATEGIES),
       st.sampled_from(SUFFIXES))
def test_a_name_without_a_strategy_is_never_owned(stem, suffix):
    for owned in (RUN_FILES, SIMULATED_FILES, PREDICTED_FILES):
        assert not owned.owns(f"{stem}{suffix}")


def test_land_removes_what_this_run_did_not_write_and_keeps_the_rest(tmp_path):
    """The old landing (no `owned`) left the earlier run's zenflow files: the negative
    control; with `RUN_FILES` only this run's files, what it `kept` and notes stay."""
    out, stage = tmp_path / "out", tmp_path / "stage"
    for old in ("zenflow.spans.csv", "zenflow.steps.jsonl", "profiles/zenflow.json",
                "profiles/device.json", "profile.json", "plan.json", "summary.csv",
                "notes.txt", "profiles/mine.json"):
        (out / old).parent.mkdir(parents=True, exist_ok=True)
        (out / old).write_text("old")
    stage.mkdir()
    for new in ("summary.csv", "device.spans.csv"):
        (stage / new).write_text("new")
    before = files(out)
    land(stage, out)
    assert files(out) == before | {"device.spans.csv"}  # the stale files stay
    for new in ("summary.csv", "device.spans.csv"):
        (stage / new).write_text("new")
    gone = land(stage, out, RUN_FILES, ["plan.json", "profiles/device.json"])
    assert sorted(p.relative_to(out).as_posix() for p in gone) == [
        "profile.json", "profiles/zenflow.json", "zenflow.spans.csv", "zenflow.steps.jsonl"]
    assert files(out) == {"summary.csv", "device.spans.csv", "plan.json", "notes.txt",
                          "profiles/device.json", "profiles/mine.json"}
    assert (out / "summary.csv").read_text() == "new"
    assert remove_stale(out, PROFILE_FILES, []) == [out / "profiles" / "device.json"]


@pytest.mark.slow
def test_validate_leaves_none_of_an_earlier_runs_shapes(tmp_path):
    """One quick shape into a directory holding another shape's profile and trace: those
    are removed at the end, every profile and trace left is this run's (`shape_files`)."""
    from zfbench.validate.command import PAIRS, main as validate_main, shape_files

    for old in ("profiles/ratio9.json", "traces/ratio9.zenflow.json", "ops.csv",
                "notes.txt", "traces/mine.txt"):
        (tmp_path / old).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / old).write_text("old")
    assert validate_main(["--quick", "--quiet", "--shapes", "equal", "--out",
                          str(tmp_path)]) in (0, 1)  # 1: a schedule mismatch
    shape = pd.read_csv(tmp_path / "validate.csv")["shape"].iloc[0]
    assert files(tmp_path) == {"validate.csv", "validate_summary.json", "ops.csv",
                               "notes.txt", "traces/mine.txt", *shape_files(shape, PAIRS[:1])}
