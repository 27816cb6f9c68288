"""`python -m zfbench.run`: a small real run end to end, its files, and refusals."""

import json
import re

import pandas as pd
import pytest

from zfbench.real.memory import (SUGGESTION_SHARE, InsufficientMemoryError, check_fits,
                                 estimate)
from zfbench.core.models import get_model
from zfbench.run.command import main

TINY = ["--model", "tiny", "--steps", "12", "--batch", "2", "--seq", "16",
        "--device-threads", "1", "--host-threads", "1", "--quiet"]


@pytest.mark.slow
def test_small_run_writes_summary_jsonl_spans_and_trace(tmp_path, capsys):
    assert main(TINY + ["--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    for name in ("device", "zero-offload", "zero-offload-dpu", "zenflow"):
        assert name in printed
    summary = pd.read_csv(tmp_path / "summary.csv")
    for col in ("step_time_s", "compute_s", "exposed_io_s", "stall_s", "stall_fraction",
                "d2h_bytes_per_step", "h2d_bytes_per_step", "host_busy_fraction",
                "speedup_vs_zero_offload", "d2h_gb_per_s", "h2d_gb_per_s",
                "host_adam_params_per_s", "compute_utilization", "achieved_flops_per_s"):
        assert col in summary.columns, col
    rows = summary.set_index("strategy")
    assert rows.loc["device", "d2h_bytes_per_step"] == 0
    assert rows.loc["zero-offload", "d2h_bytes_per_step"] > 0
    assert rows.loc["zero-offload", "host_adam_params_per_s"] > 0
    lines = (tmp_path / "zenflow.steps.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[0])["step"] == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    lanes = {e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"compute", "d2h", "h2d", "host"} <= lanes
    assert (tmp_path / "zenflow.spans.csv").exists()


@pytest.mark.parametrize("argv, words", [
    (["--model", "gpt5"], ["unknown model 'gpt5'", "llama2-7b"]),
    (["--gpus", "0"], ["--gpus must be >= 1", "got 0"]),
    (["--layers", "40"], ["1..2"]),
    (["--steps", "0"], ["--steps"]),
])
def test_bad_input_is_refused_with_a_reason(tmp_path, capsys, argv, words):
    out = tmp_path / "o"
    assert main(TINY + argv + ["--out", str(out)]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert not out.exists()


def test_config_typo_is_refused(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2,
                               "zero_optimization": {"stage": 2, "offload_optimizer":
                                                     {"device": "cpu"},
                                                     "zenflow": {"topk_ration": 0.1}}}))
    assert main(TINY + ["--config", str(cfg), "--strategy", "zenflow"]) == 2
    assert "did you mean 'topk_ratio'" in capsys.readouterr().err


def test_too_little_memory_names_numbers_and_the_layers_that_fit():
    shape = get_model("llama2-7b")
    need = estimate(shape.with_layers(4), "zenflow", 1, 128, 4).total_bytes
    with pytest.raises(InsufficientMemoryError) as info:  # a suggestion keeps a margin
        check_fits(shape, ["zenflow"], 1, 128, 4, use_cuda=False,
                   host_bytes=need * 1.01 / SUGGESTION_SHARE)
    msg = str(info.value)
    assert "does not fit" in msg and "GiB needed" in msg and "--layers 4 would fit" in msg


def test_memory_cli_refusal_for_a_full_size_model(capsys):
    assert main(["--model", "opt-1.3b", "--layers", "24", "--seq", "64", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "does not fit" in err and "GiB available" in err
    assert re.search(r"--layers \d+ would fit", err), err


def test_default_scenario_shape_and_a_config_keeps_its_precision(tmp_path):
    """No flags: tinyllama-1.1b[1L], batch 1 x seq 4, precision measured; --config decides
    its own precision unless --precision is given."""
    from zfbench.run.command import build_parser, spec_from_args
    spec = spec_from_args(build_parser().parse_args([]))
    assert (spec.model, spec.layers, spec.micro_batch, spec.seq) == ("tinyllama-1.1b", 1, 1, 4)
    assert spec.precision is None  # decided by measurement (test_precision_probe.py)
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                               "zero_optimization": {"stage": 2}}))
    spec = spec_from_args(build_parser().parse_args(["--config", str(cfg)]))
    assert spec.engine_config("device").precision == "fp32"
    spec = spec_from_args(build_parser().parse_args(["--config", str(cfg), "--precision",
                                                     "bf16"]))
    assert spec.engine_config("device").precision == "bf16"


@pytest.mark.slow
def test_a_finished_run_keeps_its_results_but_no_model_sized_memory():
    """Strategies run one after another (the memory check assumes so): a finished run's
    engine drops model, parameters, gradients and optimizer state, keeps its results."""
    from zfbench.real.runner import RunSpec, train
    spec = RunSpec(model="tiny", layers=1, micro_batch=2, seq=8, steps=3, device="cpu",
                   device_threads=1, host_threads=1)
    result = train(spec, "zenflow", progress=False)
    engine = result.engine
    assert engine.model is None and engine.strategy is None
    assert engine.flat_params is None and engine.flat_grads is None
    assert len(engine.step_log) == 3 and len(result.losses) == 3
    assert {s.lane for s in result.timeline.spans} >= {"compute", "d2h", "host"}


def test_memory_check_counts_every_ranks_replica_and_suggests_layers_that_fit():
    """N ranks on one machine: N device replicas (plus the all-gather staging buffer),
    one host state split in shards, N + 1 processes; the suggested --layers fits with N
    ranks and one more layer does not."""
    from zfbench.real.memory import machine_need
    shape = get_model("llama2-7b")
    one = estimate(shape.with_layers(2), "zenflow", 1, 64, 2)
    four = machine_need(shape.with_layers(2), "zenflow", 1, 64, 2, ranks=4,
                        baseline=3e8)
    assert four.device_bytes > one.device_bytes
    assert four.host_bytes == pytest.approx(one.host_bytes + 5 * 3e8)
    total = lambda layers: 4 * machine_need(shape.with_layers(layers), "zenflow", 1, 64,  # noqa: E731
                                            2, ranks=4, baseline=3e8).device_bytes + \
        machine_need(shape.with_layers(layers), "zenflow", 1, 64, 2, ranks=4,
                     baseline=3e8).host_bytes
    # room for 3 layers with 4 ranks and the suggestion's margin, not for 4
    avail = (total(3) + total(4)) / 2 / SUGGESTION_SHARE
    with pytest.raises(InsufficientMemoryError) as info:
        check_fits(shape, ["zenflow"], 1, 64, 2, use_cuda=False, host_bytes=avail, ranks=4,
                   baseline=3e8)
    assert "--layers 3 would fit with 4 ranks" in str(info.value)
    assert "4 ranks, each with its own replica" in str(info.value)
    check_fits(shape.with_layers(3), ["zenflow"], 1, 64, 2, use_cuda=False,
               host_bytes=avail, ranks=4, baseline=3e8)
    # one rank fits where four do not
    check_fits(shape.with_layers(4), ["zenflow"], 1, 64, 2, use_cuda=False,
               host_bytes=avail, ranks=1)


def test_hazard_check_runs_the_cpu_and_the_gpu_schedules(tmp_path, capsys):
    """--hazard-check: every strategy on the CPU lanes under the checker, the offloading
    ones a second time with gradient buckets (the GPU's default schedule), 0 hazards."""
    assert main(["--model", "tiny", "--layers", "1", "--steps", "5", "--device", "cpu",
                 "--hazard-check", "--quiet", "--out", str(tmp_path)]) == 0
    assert "0 hazard(s) in 7 schedule(s)" in capsys.readouterr().out
    rows = json.loads((tmp_path / "hazards.json").read_text())["rows"]
    got = [(r["strategy"], r["buckets"] > 0) for r in rows]
    assert got == [("device", False), ("zero-offload", False), ("zero-offload", True),
                   ("zero-offload-dpu", False), ("zero-offload-dpu", True),
                   ("zenflow", False), ("zenflow", True)]
    for row in rows:
        assert row["hazards"] == 0
        if row["strategy"] != "device":
            assert row["cross_lane_checked"] > 0
        if row["buckets"]:  # several buckets, each waiting for its gradients
            assert row["buckets"] >= 4
            assert "a bucket's d2h waits for its gradients" in row["waits"]


def test_the_memory_check_counts_zenflow_with_the_configs_top_k_ratio(tmp_path):
    """The refusal and the `fits` column use the same top-k ratio: the config's, read
    from each strategy's engine config (MemoryCheck.of_configs)."""
    from zfbench.real.memory import MemoryCheck, estimate
    from zfbench.run.command import build_parser, engine_configs, spec_from_args

    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"},
        "zenflow": {"topk_ratio": 0.5, "update_interval": 4}}}))
    spec = spec_from_args(build_parser().parse_args(["--config", str(cfg), "--model",
                                                     "tiny"]))
    both = engine_configs(spec, ["zero-offload", "zenflow"], 1)
    shape = get_model("tiny")
    check = MemoryCheck.of_configs(both, 8, use_cuda=False, host_bytes=1e12)
    assert check.need(shape, "zenflow") == estimate(shape, "zenflow", 1, 8, 4,
                                                    topk_ratio=0.5)
    assert check.need(shape, "zero-offload") == estimate(shape, "zero-offload", 1, 8, 4)
    assert estimate(shape, "zenflow", 1, 8, 2, topk_ratio=0.5).device_bytes > \
        estimate(shape, "zenflow", 1, 8, 2).device_bytes


def test_a_run_without_out_still_writes_its_results(tmp_path, monkeypatch, capsys):
    """Every measured result is also a file: without --out the run's files land in
    runs/run under the working directory, as the profile lands in runs/profile."""
    monkeypatch.chdir(tmp_path)
    assert main(TINY + ["--strategy", "device"]) == 0
    assert "wrote runs/run/summary.csv" in capsys.readouterr().out
    summary = pd.read_csv(tmp_path / "runs" / "run" / "summary.csv")
    assert summary["strategy"].tolist() == ["device"]
    assert summary.loc[0, "step_time_s"] > 0
    lines = (tmp_path / "runs" / "run" / "device.steps.jsonl").read_text().splitlines()
    assert len(lines) == 12
