"""`zfbench.run --config FILE` runs exactly the file's settings; the flags override only
when given; bad input is one line, exit code 2, nothing written."""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from zfbench.real.runner import RunSpec
from zfbench.run.command import main

K05 = {"train_micro_batch_size_per_gpu": 2,
       "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "weight_decay": 0.0}},
       "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                             "zenflow": {"topk_ratio": 0.05, "select_strategy": "step",
                                         "select_interval": 8, "update_interval": 8,
                                         "overlap_step": False}}}
FAST = ["--model", "tiny", "--layers", "1", "--seq", "8", "--device-threads", "1",
        "--host-threads", "1", "--quiet"]


@pytest.fixture
def k05(tmp_path):
    path = tmp_path / "k05.json"
    path.write_text(json.dumps(K05))
    return str(path)


def test_runspec_with_a_config_path_keeps_the_files_zenflow_and_batch(k05):
    spec = RunSpec(config=k05)
    cfg = spec.engine_config("zenflow")
    zf = cfg.zenflow
    assert (zf.topk_ratio, zf.select_interval, zf.update_interval, zf.overlap_step) == \
        (0.05, 8, 8, False)
    assert spec.micro_batch == 2 and cfg.micro_batch == 2 and cfg.optimizer.lr == 3e-4
    assert cfg.notes == ()
    # a value given here overrides, as a flag does
    assert RunSpec(config=k05, micro_batch=3).engine_config("zenflow").micro_batch == 3


@pytest.mark.slow
def test_run_with_a_config_records_the_files_settings_in_summary(k05, tmp_path):
    out = tmp_path / "out"
    assert main(FAST + ["--config", k05, "--strategy", "zenflow", "--steps", "2",
                        "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    cfg = summary["configs"]["zenflow"]
    assert cfg["micro_batch"] == 2 and cfg["grad_accum"] == 1
    assert {k: cfg["zenflow"][k] for k in ("topk_ratio", "select_interval",
                                           "update_interval", "overlap_step")} == \
        {"topk_ratio": 0.05, "select_interval": 8, "update_interval": 8,
         "overlap_step": False}
    assert cfg["optimizer"]["lr"] == 3e-4 and cfg["precision"] == "fp32"
    assert summary["settings"]["micro_batch"] == 2
    assert summary["command_line"].startswith("python -m zfbench.run --model tiny")
    assert summary["machine"]["cpu_count"] >= 1 and summary["torch_version"]
    row = summary["rows"][0]
    # 2 steps cannot hold zenflow's 2 skipped windows of 8 plus one measured window
    assert row["too_short"] is True and row["steps_needed"] == 24


@pytest.mark.slow
def test_grad_accum_flag_and_update_count(tmp_path):
    out = tmp_path / "out"
    assert main(FAST + ["--strategy", "device", "--steps", "4", "--batch", "1",
                        "--grad-accum", "3", "--out", str(out)]) == 0
    lines = (out / "device.steps.jsonl").read_text().splitlines()
    assert len(lines) == 4  # optimizer steps, each of 3 micro-steps
    spans = (out / "device.spans.csv").read_text()
    assert spans.count(",forward,") == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["configs"]["device"]["train_batch_size"] == 3


def test_a_batch_flag_that_contradicts_the_files_train_batch_size(tmp_path, capsys):
    path = tmp_path / "zf.json"
    path.write_text(json.dumps({"train_batch_size": 32, "gradient_accumulation_steps": 1,
                                "zero_optimization": {"stage": 2}}))
    assert main(FAST + ["--config", str(path), "--batch", "2", "--out",
                        str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train_batch_size" in err[0] and "--batch" in err[0]
    assert not (tmp_path / "o").exists()


def test_out_naming_a_file_and_a_missing_text_fail_before_any_work(tmp_path, capsys):
    file = tmp_path / "taken"
    file.write_text("x")
    assert main(FAST + ["--out", str(file)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert file.read_text() == "x"
    assert main(FAST + ["--text", str(tmp_path / "missing.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err and "Traceback" not in err


BAD_VALUES = {
    "--steps": ["0", "-3", "x"], "--batch": ["0", "-1", "1.5"], "--seq": ["0", "abc"],
    "--layers": ["0", "-2", "99"], "--grad-accum": ["0", "two"], "--gpus": ["0", "-1"],
    "--model": ["gpt5", ""], "--strategy": ["fastest"], "--precision": ["fp8"],
    "--device": ["tpu"], "--device-threads": ["0"], "--host-threads": ["-1"],
    "--config": ["/nonexistent/ds.json"], "--text": ["/nonexistent/t.txt"],
    "--seed": ["x"],
}


def exit_code(argv) -> int:
    """main's return value, or the code of argparse's SystemExit."""
    try:
        return main(argv)
    except SystemExit as stop:
        return stop.code


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(BAD_VALUES)).flatmap(
    lambda flag: st.tuples(st.just(flag), st.sampled_from(BAD_VALUES[flag]))))
def test_bad_flag_values_are_one_line_exit_2_nothing_written(tmp_path_factory, capsys,
                                                             flag_value):
    flag, value = flag_value
    out = tmp_path_factory.mktemp("bad") / "out"
    assert exit_code(FAST + ["--steps", "1", f"{flag}={value}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert not out.exists()


@pytest.mark.slow
def test_deepspeed_examples_zenflow_config_runs_from_the_cli(tmp_path):
    """DeepSpeedExamples' ZenFlow fine-tuning config, as written (train_batch_size 32,
    bf16, pinned offload, zenflow topk 0.1 / U 4 / overlap, clipping 1.0)."""
    from tests.test_config_keys import DS_EXAMPLES_ZENFLOW
    path = tmp_path / "zf_config.json"
    path.write_text(json.dumps(DS_EXAMPLES_ZENFLOW))
    out = tmp_path / "out"
    assert main(FAST + ["--config", str(path), "--strategy", "zenflow", "--steps", "3",
                        "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    cfg = summary["configs"]["zenflow"]
    assert (cfg["micro_batch"], cfg["train_batch_size"], cfg["precision"]) == \
        (32, 32, "bf16")
    assert (cfg["zenflow"]["update_interval"], cfg["zenflow"]["overlap_step"],
            cfg["gradient_clipping"]) == (4, True, 1.0)
    assert cfg["notes"] == ["zero_allow_untested_optimizer: ignored (zfbench's "
                            "optimizers are all tested)"]


def test_the_gpu_default_is_the_largest_model_that_fits_at_full_depth():
    from zfbench.run.defaults import GPU_MODELS, GPU_SEQ, gpu_default
    asked = []

    def fits(model, batch, seq):
        asked.append(model)
        return model == GPU_MODELS[1]
    pick = gpu_default(fits)
    assert asked == list(GPU_MODELS[:2])
    assert pick == {"model": GPU_MODELS[1], "layers": None, "batch": 4, "seq": GPU_SEQ,
                    "precision": "bf16"}
    assert gpu_default(lambda *a: False)["batch"] == 1
