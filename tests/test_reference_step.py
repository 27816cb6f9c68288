"""bench/reference_step.py and bench/op_efficiency.py on the CPU: the plain-PyTorch step is
the engine's `device` step written without the engine (the same parameters after the same
steps), and the census's FLOP and byte counts are the formulas it states."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import device_step_ops as dso  # noqa: E402
import kernel_census as kc  # noqa: E402
import op_efficiency as oe  # noqa: E402
import reference_step as rs  # noqa: E402


def _train(mode: str, steps: int, dtype=torch.float32) -> list[torch.Tensor]:
    trainer = rs.Trainer(mode, "tiny", 2, torch.device("cpu"), dtype, seed=3)
    ids, labels = rs.synthetic_tokens(trainer.model.shape.vocab, 2, 16, "cpu", seed=5)
    losses = [float(trainer.step(ids, labels).detach()) for _ in range(steps)]
    params = [p.clone() for p in trainer.parameters()]
    trainer.close()
    return params, losses


def test_plain_adamw_takes_the_engine_device_strategys_steps():
    plain, plain_losses = _train("plain_adamw", 3)
    engine, engine_losses = _train("engine_device", 3)
    untrained, _ = _train("forward_backward", 1)
    assert plain_losses == pytest.approx(engine_losses, rel=1e-5)
    moved = max(float((a - b).abs().max()) for a, b in zip(plain, untrained))
    assert moved > 1e-5  # the steps changed the weights
    for a, b in zip(plain, engine):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_plain_adamw_keeps_fp32_masters_of_bf16_weights_as_the_engine_does():
    plain, plain_losses = _train("plain_adamw", 3, torch.bfloat16)
    engine, engine_losses = _train("engine_device", 3, torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in plain)
    assert plain_losses == pytest.approx(engine_losses, rel=1e-3)
    for a, b in zip(plain, engine):  # the same fp32 update, rounded to bf16 (1 ulp)
        torch.testing.assert_close(a.float(), b.float(), rtol=8e-3, atol=1e-5)


def test_reference_step_writes_a_row_per_mode_and_batch(tmp_path):
    """Every mode on the engine's device-lane threads, the caller's count restored."""
    from zfbench.real.distributed import lane_threads

    out = tmp_path / "ref"
    before = torch.get_num_threads()
    assert rs.main(["--model", "tiny", "--seq", "16", "--micro-batches", "1,2", "--steps",
                    "2", "--warmup", "1", "--device", "cpu", "--dtype", "bf16", "--traces",
                    "--out", str(out)]) == 0
    assert torch.get_num_threads() == before
    frame = pd.read_csv(out / "reference_step.csv")
    assert (frame["cpu_threads"] == lane_threads(None, cuda=False)[0]).all()
    assert (frame["step_cpu_s_median"] > 0).all()
    assert (frame.loc[frame["mode"] == "plain_adamw", "cpu_over_plain_adamw"] == 1.0).all()
    assert sorted(zip(frame["mode"], frame["micro_batch"])) == sorted(
        (m, b) for m in rs.MODES for b in (1, 2))
    assert (frame.loc[frame["mode"] == "plain_adamw", "over_plain_adamw"] == 1.0).all()
    assert (frame["step_s_median"] > 0).all()
    assert (frame["dtype"] == "bfloat16").all()
    assert (out / "ops_engine_device_mb2.csv").exists()
    assert sorted(p.name for p in out.glob("trace_*")) == [
        "trace_engine_device_mb1.json.gz", "trace_plain_adamw_mb1.json.gz"]


@pytest.mark.parametrize("threads", ["0", "two"])
def test_bad_threads_is_one_clear_error(threads, capsys):
    with pytest.raises(SystemExit) as exit_info:
        rs.main(["--threads", threads, "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "--threads must be 'lane' or a positive integer" in capsys.readouterr().err


def test_census_counts_flops_as_stated():
    assert oe.gemm_flops(3, 5, 7) == 2 * 3 * 5 * 7
    assert oe.attention_flops(2, 4, 8, 16) == 4 * 2 * 4 * 8 * 8 * 16 / 2
    assert oe.attention_flops(2, 4, 8, 16, causal=False) == 4 * 2 * 4 * 8 * 8 * 16


def test_census_lists_each_distinct_layer_matrix_and_the_head():
    from zfbench.core.models import get_model

    shape = get_model("qwen2.5-1.5b")
    kinds = {k: (o, i) for k, o, i in oe.layer_matrices("qwen2.5-1.5b")}
    assert kinds["q_proj"] == (shape.hidden, shape.hidden)
    assert kinds["k_proj"] == (shape.kv_dim, shape.hidden)
    assert kinds["down_proj"] == (shape.hidden, shape.intermediate)
    assert kinds["lm_head"] == (shape.vocab, shape.hidden)  # tied: the embedding table


def test_census_runs_on_the_cpu(tmp_path):
    assert oe.main(["--quick", "--device", "cpu", "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "op_efficiency.csv")
    assert set(frame["kind"]) == {"gemm", "attention", "elementwise"}
    gemm = frame[frame["kind"] == "gemm"]
    assert (gemm["flops"] == 2 * gemm["m"] * gemm["n"] * gemm["k"]).all()
    assert (gemm["tflops_per_s"] * 1e12 * gemm["seconds"]).round(0).equals(gemm["flops"].round(0))


def test_kernel_census_takes_one_layer_as_the_difference_of_two_slices():
    frame = pd.DataFrame([
        {"model": "m", "mode": "forward", "micro_batch": 1, "layers": n,
         "kernels_per_step": 10 + 40 * n, "step_s_median": 0.001 + 0.002 * n,
         "kernel_busy_s_per_step": 0.0001 * n} for n in (1, 2)])
    got = kc.per_layer(frame).iloc[0]
    assert (got["layer_kernels"], got["rest_kernels"]) == (40, 10)
    assert got["layer_step_s"] == pytest.approx(0.002)
    assert got["layer_s_per_kernel"] == pytest.approx(0.002 / 40)
    assert kc.features("qwen2.5-1.5b") == {"style": "llama", "grouped_kv": True,
                                           "qkv_bias": True}
    assert kc.features("llama2-7b") == {"style": "llama", "grouped_kv": False,
                                        "qkv_bias": False}


def test_preset_device_step_holds_the_lent_gpus_measurements():
    """bench/device_step_check.py on the committed reference_step results: the preset
    device step (with the host's launch floor) within 15% of every measured plain-PyTorch
    step and forward+backward, where without the floor micro-batch 1 was 59-76% fast."""
    import device_step_check as dsc

    frame = dsc.check(dsc.ROOT / "bench" / "results" / "gpu", "xeon-8480-spr")
    assert set(frame["mode"]) == {"forward_backward", "plain_adamw"}
    assert set(frame["micro_batch"]) >= {1, 4}
    assert (frame["error"].abs() <= 0.15).all(), frame[["micro_batch", "mode", "error"]]
    mb1 = frame[frame["micro_batch"] == 1]
    assert (mb1["error_no_floor"] < -0.5).all()
    assert (frame.loc[frame["mode"] == "plain_adamw", "engine_overhead_s"] > 0).all()


def test_device_step_ops_times_each_linear_matrix_of_a_layer_and_the_head(tmp_path):
    """bench/device_step_ops.py: its matrices are the model's (one layer's linear weights
    and the head's, by shape), a row per GEMM variant and matrix and per pass."""
    from torch import nn

    from zfbench.core.models import get_model
    from zfbench.real.model import build_model

    model = build_model(get_model("tiny[1L]"), seed=0)
    shapes = sorted(tuple(m.weight.shape) for m in model.modules() if isinstance(m, nn.Linear))
    assert sorted((o, i) for _, o, i in dso.matrices("tiny[1L]")) == shapes
    before = torch.get_num_threads()
    assert dso.main(["--model", "tiny[1L]", "--tokens", "4", "--repeats", "2",
                     "--out", str(tmp_path)]) == 0
    assert torch.get_num_threads() == before
    frame = pd.read_csv(tmp_path / "device_step_ops.csv")
    assert len(frame) == len(dso.GEMMS) * len(shapes) + len(dso.PASSES)
    assert (frame["cpu_s"] >= 0).all() and (frame["threads"] == 1).all()
