"""bench/ds_gpu_side.py (issue 45, item 4): the rule both engines' step times are read
under, the shape names it passes on, and its record when DeepSpeed is missing."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ds_gpu_side as side  # noqa: E402


def test_steady_mean_leaves_out_warm_up_and_a_partial_window():
    steps = [9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 100.0]  # warm 2, U 2: windows (1,2) (3,4); 100 cut
    assert side.steady_mean(steps, warm=2, U=2) == pytest.approx(2.5)
    assert side.steady_mean(steps[:3], warm=2, U=2) is None


def test_split_model_turns_a_depth_slice_into_run_flags():
    assert side.split_model("opt-350m[2L]") == ("opt-350m", ["--layers", "2"])
    assert side.split_model("qwen2.5-1.5b") == ("qwen2.5-1.5b", [])


def test_zfbench_steps_reads_rank_zero_of_the_strategy(tmp_path):
    (tmp_path / "steps.csv").write_text(
        "strategy,rank,step,wall_s\nzenflow,0,0,0.5\nzenflow,1,0,0.7\n"
        "zero-offload,0,0,2.0\nzenflow,0,1,0.25\n")
    assert side.zfbench_steps(tmp_path, "zenflow") == [0.5, 0.25]


def test_unknown_engine_is_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        side.main(["--engines", "zero_offload,zenflow_typo", "--out", "unused"])
    assert "zenflow_overlap" in capsys.readouterr().err


def test_a_missing_deepspeed_is_recorded_with_what_is_needed(tmp_path, monkeypatch):
    """ds_wallclock failing (no DeepSpeed) leaves a side_by_side.json naming the error and
    the fix, no zfbench run (there is no config to run it with), and exit code 1."""
    def fake_run(cmd, log, timeout_s, env=None):
        log.write_text("DeepSpeed is not installed.\n")
        return 2
    monkeypatch.setattr(side, "run_logged", fake_run)
    assert side.main(["--device", "cpu", "--out", str(tmp_path)]) == 1
    result = json.loads((tmp_path / "side_by_side.json").read_text())
    assert result["deepspeed_exit_code"] == 2
    assert "not installed" in result["deepspeed_error"]
    assert "wheels-deepspeed" in result["deepspeed_needs"]
    assert [r["note"] for r in result["rows"]] == ["DeepSpeed did not run this engine"] * 2


@pytest.mark.parametrize("given, wanted", [
    ("9.0a", "9.0"), ("8.0;9.0a;10.0f+PTX", "8.0;9.0;10.0+PTX"), ("9.0 9.0a", "9.0"),
    ("7.5;8.6+PTX", "7.5;8.6+PTX")])
def test_the_arch_list_deepspeed_reads_drops_architecture_suffixes(given, wanted):
    """DeepSpeed 0.19.5's builder parses every part of each entry as an int: what it is
    given must hold none of the suffixes a CUDA image may set (the lent H200's did)."""
    cleaned = side.deepspeed_arch_list(given)
    assert cleaned == wanted
    for entry in cleaned.split(";"):  # as deepspeed/ops/op_builder/builder.py sorts them
        assert all(part.isdigit() for part in entry.split("+")[0].split("."))
