"""ZeRO-Offload's device memory as DeepSpeed allocates it (zfbench.sims.device_memory)."""

import pytest

from zfbench.sims import device_memory as dm
from zfbench.sims.costs import CostModel, SimSettings

GPT2_10B = "gpt2:layers=50,hidden=4096,heads=16"


def test_two_reduce_buckets_not_a_full_gradient():
    # 10e9 params, fp16: 20 GB of parameters + 2 x 5e8 x 2 B = 2 GB of buckets + activations
    assert dm.zero_offload_device_bytes(10_000_000_000, 2, 1e9) == pytest.approx(23e9)
    # a model smaller than one bucket holds at most two gradients of itself
    assert dm.zero_offload_device_bytes(1000, 2, 0.0) == 1000 * 2 + 2 * 1000 * 2


def test_paper_10b_gpt2_fits_a_32gb_v100_with_zero_offload():
    s = SimSettings.from_knobs(gpu="v100-sxm3-32g", pcie="gen3-dgx2", precision="fp16", model=GPT2_10B,
                               micro_batch=10, seq=1024, activation_checkpointing=True, gpus=1)
    c = CostModel(s)
    fit = c.fits("zero-offload")
    expected = c.params * 2 + 2 * dm.REDUCE_BUCKET_ELEMS * 2 + c.activation_bytes()
    assert fit["device_bytes_per_rank"] == pytest.approx(expected)
    assert 28e9 < fit["device_bytes_per_rank"] < 30e9 and fit["fits"]
    assert c.fits("zero-offload-dpu")["device_bytes_per_rank"] == pytest.approx(expected)


@pytest.mark.parametrize("precision, elem", [("bf16", 2), ("fp16", 2)])
def test_activations_are_one_count_for_the_engine_and_the_simulator(precision, elem):
    """Korthikanti et al.'s per-layer count (34 sbh + 5 a s^2 b, 16-bit): the simulator
    with recomputation keeps each layer's input and one layer's set; the engine keeps
    every layer's set and the fp32 logits, softmax and gradient."""
    from zfbench.core.models import get_model
    from zfbench.real.memory import activation_bytes as engine_activations

    shape = get_model("llama2-7b")
    b, s, h, a, L = 2, 512, shape.hidden, shape.heads, shape.layers
    whole = s * b * h * 34 + 5 * a * s * s * b
    c = CostModel(SimSettings.from_knobs(model="llama2-7b", micro_batch=b, seq=s, precision=precision))
    assert c.activation_bytes() == pytest.approx((L * 2 * s * b * h + whole) * elem / 2)
    c = CostModel(SimSettings.from_knobs(model="llama2-7b", micro_batch=b, seq=s, precision=precision,
                                         activation_checkpointing=False))
    assert c.activation_bytes() == pytest.approx(L * whole * elem / 2)
    assert engine_activations(shape, b, s, 4) == pytest.approx(
        L * whole * 2 + b * s * shape.vocab * 12)


@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu", "zenflow"])
def test_a_measured_profile_is_simulated_with_the_engines_own_device_buffers(strategy):
    """One rule for the engine's device bytes (zfbench.core.memory_model): the memory
    check before a run and the simulator with a profile of that run agree."""
    from pathlib import Path

    from zfbench.core.models import get_model
    from zfbench.real.memory import HEADROOM, estimate

    profile = Path(__file__).resolve().parents[1] / "bench/results/noflag_run_expect/profile.json"
    s = SimSettings.from_knobs(model="tinyllama-1.1b", layers=1, micro_batch=1, seq=4,
                               precision="bf16", profile=str(profile))
    simulated = CostModel(s).memory_per_rank(strategy)["device_bytes_per_rank"]
    engine = estimate(get_model("tinyllama-1.1b").with_layers(1), strategy, 1, 4, 2,
                      topk_ratio=s.zenflow.topk_ratio).device_bytes / HEADROOM
    assert simulated == pytest.approx(engine)


def test_zero2_step_peak_counts_the_flattened_and_fp32_gradients():
    # 16-bit: params, the partition's 16-bit gradients, fp32 master/m/v, then the step's
    # flattened 16-bit copy and its fp32 conversion: 2 + 2 + 12 + 2 + 4 = 22 B per element
    assert dm.device_strategy_bytes(1000, 1000, 2, 0.0) == 22 * 1000
    # over 4 ranks the 16-bit model stays whole, the rest is a quarter
    assert dm.device_strategy_bytes(1000, 250, 2, 5.0) == 2 * 1000 + 20 * 250 + 5.0
    # fp32 weights: no step copies counted (zfbench.sims.device_step counts no passes)
    assert dm.device_strategy_bytes(1000, 1000, 4, 0.0) == 20 * 1000


def test_largest_gpt2_without_offload_on_a_v100_is_the_papers_1_4b():
    """The ZeRO-Offload paper (abstract): 1.4B parameters is the largest model PyTorch
    trains on one 32 GB V100 without running out of memory. Not a row of the dataset."""
    fitting = []
    for layers in range(16, 41, 2):
        s = SimSettings.from_knobs(gpu="v100-sxm3-32g", pcie="gen3-dgx2", precision="fp16",
                                   model=f"gpt2:layers={layers},hidden=2048,heads=16", micro_batch=4,
                                   seq=1024, activation_checkpointing=True, gpus=1)
        c = CostModel(s)
        if c.fits("device")["fits"]:
            fitting.append(c.params)
    assert 1.25e9 < max(fitting) < 1.55e9
