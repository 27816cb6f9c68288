"""The event simulation agrees with the closed-form oracle (tests/oracle/) wherever the
oracle says its form is exact: steady-state mean step time, compute and stall per step,
to 1e-6 relative. Hand-picked cases assert exactness directly (so the check cannot pass
vacuously), and a seeded sample of the hypothesis space shows exactness is common."""

import random

import pytest
from hypothesis import HealthCheck, assume, given, settings as hsettings, strategies as st

from zfbench.analysis.breakdown import summarize
from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings
from oracle import steady_state
from zfbench.sims.simulator import simulate

REL = 1e-6
MODELS = {"tiny": 2, "opt-350m": 4, "qwen2.5-1.5b": 4}  # name -> most layers drawn


def measure(s: SimSettings, strategy: str, oracle, windows: int = 2) -> dict:
    """Simulate enough steps to pass the oracle's transient, then average whole cycles."""
    per = s.zenflow.update_interval if strategy == "zenflow" else 1
    warm = s.zenflow.full_warm_up_rounds if strategy == "zenflow" else 0
    # zenflow: the map starts at the first boundary (window 0); dpu: at step 0
    skip = max(s.zenflow.full_warm_up_rounds + 2 * s.zenflow.update_interval,
               warm + (oracle.settle_periods + 2) * per)
    steps = skip + per * oracle.cycle_periods * windows
    result = simulate(s.with_(steps=steps), strategy)
    assert result.skip_steps <= skip
    return summarize(result.timeline.spans_frame(), result.timeline.steps_frame(), skip)


def assert_agrees(s: SimSettings, strategy: str):
    oracle = steady_state(s, strategy)
    got = measure(s, strategy, oracle)
    scale = got["step_time_s"]
    assert got["step_time_s"] == pytest.approx(oracle.step_time_s, rel=REL), oracle
    assert got["compute_s"] == pytest.approx(oracle.compute_s, rel=REL, abs=REL * scale)
    assert got["stall_s"] == pytest.approx(oracle.stall_s, rel=REL, abs=REL * scale)
    return oracle


@st.composite
def sim_settings(draw) -> SimSettings:
    model = draw(st.sampled_from(sorted(MODELS)))
    gpus = draw(st.sampled_from([1, 1, 1, 2, 3, 4]))
    return SimSettings.from_knobs(
        model=model, layers=draw(st.integers(1, MODELS[model])), gpus=gpus,
        gpus_per_switch=draw(st.sampled_from([1, 2])),
        micro_batch=draw(st.sampled_from([1, 2, 4, 8])),
        seq=draw(st.sampled_from([128, 512, 2048])),
        host_cores=draw(st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128])),
        bandwidth_scale=draw(st.sampled_from([0.05, 0.25, 0.5, 1.0, 2.0, 4.0])),
        topk_ratio=draw(st.sampled_from([0.01, 0.05, 0.1, 0.3, 0.7, 1.0])),
        update_interval=draw(st.integers(1, 6)), overlap_step=draw(st.booleans()),
        full_warm_up_rounds=draw(st.integers(0, 3)), steps=1)


@hsettings(max_examples=80, deadline=None,
           suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(s=sim_settings(), strategy=st.sampled_from(STRATEGIES))
def test_simulation_matches_oracle_where_exact(s, strategy):
    assume(steady_state(s, strategy).exact)
    assert_agrees(s, strategy)


# -- hand-picked exact cases, one per strategy and regime ---------------------------------
# (host_cores 32-42 where 16 gave the regime at the earlier 29.5 M/core: the Milan
# preset's calibrated rate with its unbound threads is 11.4 M/core, sims/host_step.py)
# A flat MFU (0.50, the A100 judgment before the op census): the regimes were picked at
# it, and a 350M model's compute by shape (zfbench.sims.op_curve) is slower, which would
# move them
OPT1 = dict(model="opt-350m", layers=1, gpus=1, mfu=0.5)
CASES = {
    "device, 1 GPU": ("device", SimSettings.from_knobs(**OPT1), ""),
    "device, 4 GPUs (net)": ("device", SimSettings.from_knobs(model="opt-350m", layers=2, gpus=4), ""),
    "zero-offload, 1 GPU": ("zero-offload", SimSettings.from_knobs(**OPT1, host_cores=32), ""),
    "zero-offload-dpu, compute-bound": ("zero-offload-dpu", SimSettings.from_knobs(
        **OPT1, micro_batch=32, seq=2048, host_cores=30), "compute-bound"),
    "zero-offload-dpu, host-bound cycle": ("zero-offload-dpu", SimSettings.from_knobs(
        model="tiny", layers=2, gpus=1, micro_batch=4, seq=2048, host_cores=29, mfu=0.5),
        "host/link-bound"),
    "zenflow sequential, host slow": ("zenflow", SimSettings.from_knobs(
        **OPT1, seq=512, host_cores=4, bandwidth_scale=0.25, update_interval=1,
        overlap_step=False), "sequential"),
    "zenflow sequential, host fast": ("zenflow", SimSettings.from_knobs(
        **OPT1, micro_batch=16, seq=2048, host_cores=16, update_interval=2,
        overlap_step=False, full_warm_up_rounds=1), "sequential"),
    "zenflow overlap, host slower": ("zenflow", SimSettings.from_knobs(
        **OPT1, seq=512, host_cores=4, update_interval=2), "overlap, host slower"),
    "zenflow overlap, host faster": ("zenflow", SimSettings.from_knobs(
        **OPT1, micro_batch=16, seq=2048, host_cores=32, update_interval=2,
        full_warm_up_rounds=2), "overlap, host faster"),
}


def test_oracle_declines_multi_gpu_zenflow_and_dpu():
    """With several GPUs the simulator issues all-gathers when ready, zenflow's device
    update waits for the reduced gradients and ZeRO-Offload's ranks own different
    partitions: timing-dependent or asymmetric, so not claimed exact."""
    s = SimSettings.from_knobs(model="opt-350m", layers=2, gpus=4, host_cores=64, update_interval=3,
                               overlap_step=False)
    for strategy in ("zenflow", "zero-offload-dpu", "zero-offload"):
        oracle = steady_state(s, strategy)
        assert not oracle.exact and "several GPUs" in oracle.reason
    # ZeRO-2 partitions (sims/partitioning.py) are not in the one-rank closed form
    assert "ZeRO-2 partitions" in steady_state(s, "zero-offload").reason


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_picked_exact_cases(name):
    strategy, s, regime = CASES[name]
    oracle = steady_state(s, strategy)
    assert oracle.exact, oracle.reason
    assert oracle.regime == regime
    assert_agrees(s, strategy)


def test_regimes_mean_what_they_say():
    fast = steady_state(CASES["zenflow overlap, host faster"][1], "zenflow")
    slow = steady_state(CASES["zenflow overlap, host slower"][1], "zenflow")
    assert fast.stall_s == 0.0 and slow.stall_s > 0.5 * slow.step_time_s
    bound = steady_state(CASES["zero-offload-dpu, compute-bound"][1], "zero-offload-dpu")
    assert bound.stall_s == 0.0


def test_device_closed_form_by_hand():
    s = SimSettings.from_knobs(model="qwen2.5-1.5b", layers=3, gpus=1)
    c = CostModel(s)
    # the fused Adam (28 B/param) and DeepSpeed's passes beside it (26 B/param with 16-bit
    # weights: zfbench.sims.device_step), each at 0.8 of the HBM bandwidth
    hbm = c.node.gpu.hbm_bytes_per_s * 0.8
    by_hand = sum(b.forward_s + b.backward_s for b in c.buckets) + c.params * (28 + 26) / hbm
    assert steady_state(s, "device").step_time_s == pytest.approx(by_hand, rel=1e-12)


def test_zero_offload_closed_form_by_hand():
    """One bucket pipeline on one GPU: fp32 gradients down in backward order, then DeepSpeed's
    host step after the last (clip, Adam, conversion over the whole partition), then the
    parameters up in one copy (zfbench.sims.host_step)."""
    s = SimSettings.from_knobs(model="tiny", layers=1, gpus=1, host_cores=8)
    c = CostModel(s)
    link, lat = c.node.link, c.node.link.setup_latency_s
    rate = c.cores_per_rank * c.adam_units_per_core_s
    t = c.forward_s
    down_end = -1.0
    for b in reversed(c.buckets):
        t += b.backward_s
        # each gradient goes down as fp32 (4 B per element, DeepSpeed's `.float()`)
        down_end = max(t, down_end) + lat + b.numel * 4 / link.d2h_bytes_per_s
    stream = c.cores_per_rank * 30 * 29.5e6 * 10 * c.numa_factor  # bytes/s, core-bound
    host = down_end + c.params * 8 / stream + c.params / rate + c.params * 6 / stream
    up = host + lat + c.params * 2 / link.h2d_bytes_per_s
    assert steady_state(s, "zero-offload").step_time_s == pytest.approx(up, rel=1e-12)
    assert_agrees(s, "zero-offload")


def _sample_space(n: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(n):
        model = rng.choice(sorted(MODELS))
        yield SimSettings.from_knobs(
            model=model, layers=rng.randint(1, MODELS[model]),
            gpus=rng.choice([1, 1, 1, 2, 3, 4]), gpus_per_switch=rng.choice([1, 2]),
            micro_batch=rng.choice([1, 2, 4, 8]), seq=rng.choice([128, 512, 2048]),
            host_cores=rng.choice([1, 2, 4, 8, 16, 32, 64, 128]),
            bandwidth_scale=rng.choice([0.05, 0.25, 0.5, 1.0, 2.0, 4.0]),
            topk_ratio=rng.choice([0.01, 0.05, 0.1, 0.3, 0.7, 1.0]),
            update_interval=rng.randint(1, 6), overlap_step=rng.random() < 0.5,
            full_warm_up_rounds=rng.randint(0, 3), steps=1)


def test_oracle_is_exact_on_a_large_share_of_the_drawn_space():
    """The property test's `assume` keeps most draws: per strategy, the share of a seeded
    sample of the same space where the oracle is exact (cheap: no simulation)."""
    sample = list(_sample_space(150))
    share = {k: sum(steady_state(s, k).exact for s in sample) / len(sample)
             for k in STRATEGIES}
    assert share["device"] == 1.0
    assert share["zero-offload"] > 0.25, share  # 1-GPU draws (ZeRO-2 partitions on more)
    assert share["zenflow"] > 0.15, share  # 1-GPU draws with DRAM to spare
    assert share["zero-offload-dpu"] > 0.0, share  # narrow: hand-picked cases assert it
    one_gpu_overlap = [s for s in sample if s.machine.gpus == 1 and s.zenflow.overlap_step]
    regimes = {steady_state(s, "zenflow").regime for s in one_gpu_overlap
               if steady_state(s, "zenflow").exact}
    assert {"overlap, host slower", "overlap, host faster"} <= regimes
