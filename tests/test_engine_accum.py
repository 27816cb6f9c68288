"""Config keys the engine applies: gradient accumulation, fp16 loss scaling, the thread
split of pt_reserved_cores_perc, pinned memory; each checked by its effect."""
import os

import pytest
import torch

from zfbench.real.engine import default_thread_split
from zfbench.real.loss_scale import LossScaler
from zfbench.core.config import LossScaleConfig
from tests.engine_helpers import BiasMLP, batches, config, make_engine, params_of


def _accum_run(strategy: str, accum: int, steps: int, **zenflow):
    """Train on `steps` global batches of 8 rows, as `accum` micro-batches of 8 / accum."""
    torch.manual_seed(0)
    model = BiasMLP()
    cfg = config(strategy, clip=0.05, **zenflow)  # clipping sees the gradient's scale
    cfg["train_micro_batch_size_per_gpu"] = 8 // accum
    cfg["gradient_accumulation_steps"] = accum
    engine = make_engine(model, cfg)
    data = batches(batch=8)
    unchanged_between = True
    for _ in range(steps):
        ids, labels = next(data)
        before = params_of(model)
        for i in range(accum):
            rows = slice(i * 8 // accum, (i + 1) * 8 // accum)
            engine.backward(engine(ids[rows], labels[rows]))
            engine.step()
            if i < accum - 1:
                now = params_of(model)
                unchanged_between &= all(torch.equal(now[k], before[k]) for k in now)
    engine.finish()
    engine.close()
    return params_of(model), engine, unchanged_between


@pytest.mark.slow
@pytest.mark.parametrize("strategy, zenflow", [
    ("device", {}), ("zero-offload", {}),
    ("zenflow", {"topk_ratio": 0.25, "update_interval": 2, "select_strategy": "step",
                 "select_interval": 0, "overlap_step": True})])
def test_accumulation_updates_at_the_boundary_like_one_big_batch(strategy, zenflow):
    """4 micro-batches of 2 rows with accumulation 4 = one batch of 8 rows (mean loss):
    parameters change only at the boundary, DeepSpeed's update count (steps, not
    micro-steps), and the result equals the big-batch run."""
    big, big_engine, _ = _accum_run(strategy, 1, 6, **zenflow)
    acc, acc_engine, unchanged = _accum_run(strategy, 4, 6, **zenflow)
    assert unchanged
    assert len(acc_engine.step_log) == len(big_engine.step_log) == 6
    assert acc_engine.t == 6
    for name in big:
        torch.testing.assert_close(acc[name], big[name], rtol=2e-5, atol=2e-6)
    # the logged loss of a step is the mean of its micro-batches' losses
    for a, b in zip(acc_engine.step_log, big_engine.step_log):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.slow
def test_saving_mid_accumulation_is_refused(tmp_path):
    cfg = config("device")
    cfg["gradient_accumulation_steps"] = 2
    engine = make_engine(BiasMLP(), cfg)
    ids, labels = next(batches())
    engine.backward(engine(ids, labels))
    engine.step()
    with pytest.raises(RuntimeError, match="micro-step 1 of 2"):
        engine.save_checkpoint(tmp_path)
    engine.close()


def _scaler(**kw) -> LossScaler:
    return LossScaler(LossScaleConfig(**kw))


def test_dynamic_loss_scale_follows_deepspeeds_rule():
    s = _scaler(initial_scale_power=4, loss_scale_window=3, hysteresis=2)
    seen = []
    for overflow in [True, True, False, False, False, True, True, False]:
        s.update(overflow)
        seen.append(s.scale)
    # 1st overflow uses hysteresis, 2nd halves; the 3rd clean step after the last
    # overflow doubles (and refills hysteresis); then two overflows halve once
    assert seen == [16, 8, 8, 8, 16, 16, 8, 8]
    s = _scaler(initial_scale_power=1, min_loss_scale=1.0, hysteresis=1)
    for _ in range(3):
        s.update(True)
    assert s.scale == 1.0
    static = _scaler(loss_scale=128.0)
    static.update(True)
    static.update(False)
    assert static.scale == 128.0


@pytest.mark.slow
def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    """A loss scale too large for fp16 makes the gradient overflow: the step is skipped
    (parameters untouched), the scale halves, and training goes on once it fits."""
    cfg = config("device", lr=1e-3)
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 40, "hysteresis": 1}
    model = BiasMLP()
    engine = make_engine(model, cfg)
    start = params_of(model)
    data = batches()
    for _ in range(30):
        ids, labels = next(data)
        engine.backward(engine(ids, labels))
        engine.step()
    log = engine.step_log
    scales = [r["loss_scale"] for r in log]
    first_ok = next(i for i, r in enumerate(log) if not r["skipped"])
    assert first_ok > 0 and all(r.get("overflow") for r in log[:first_ok])
    assert scales[:first_ok + 1] == [2.0 ** (40 - i) for i in range(first_ok + 1)]
    assert engine.t == 30 - first_ok
    now = params_of(model)
    assert any(not torch.equal(now[k], start[k]) for k in now)
    engine.close()


def test_pt_reserved_cores_perc_sets_the_zenflow_thread_split(monkeypatch):
    assert default_thread_split(8, 0.25) == (2, 6)
    assert default_thread_split(8) == (4, 4)
    # DeepSpeed's rule (_compute_zf_pt_affinity): ceil, and both sides share every core
    # where the split leaves one side none
    assert default_thread_split(8, 0.3) == (3, 5)  # ceil(2.4); int() gave 2
    assert default_thread_split(2, 0.1) == (1, 1)
    assert default_thread_split(8, 0.0) == (8, 8)
    assert default_thread_split(8, 1.0) == (8, 8)
    assert default_thread_split(1, 0.5) == (1, 1)
    assert default_thread_split(3) == (2, 1)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    cfg = config("zenflow", pt_reserved_cores_perc=0.75)
    import zfbench.real as real
    engine = real.initialize(BiasMLP(), cfg, device="cpu")
    assert (engine.device_threads, engine.host_threads) == (6, 2)
    engine.close()
    engine = real.initialize(BiasMLP(), config("zero-offload"), device="cpu")
    assert (engine.device_threads, engine.host_threads) == (4, 4)
    engine.close()
    torch.set_num_threads(1)


@pytest.mark.slow
def test_accumulated_gradient_is_the_big_batch_gradient():
    """Before the boundary step, the flat gradient of 4 micro-batches (each loss divided
    by 4) equals the gradient of the 8-row batch's mean loss."""
    grads = []
    for accum in (1, 4):
        cfg = config("device")
        cfg["train_micro_batch_size_per_gpu"] = 8 // accum
        cfg["gradient_accumulation_steps"] = accum
        engine = make_engine(BiasMLP(), cfg)
        ids, labels = next(batches(batch=8))
        for i in range(accum):
            rows = slice(i * 8 // accum, (i + 1) * 8 // accum)
            engine.backward(engine(ids[rows], labels[rows]))
            if i < accum - 1:
                engine.step()
        grads.append(engine.flat_grads.clone())
        engine.close()
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)


def test_on_a_gpu_the_host_step_gets_the_cores_deepspeed_gives_it():
    """real/distributed.py `lane_threads`: the CPU lanes split the rank's cores (the
    emulated device needs its share); on a GPU ZeRO-Offload's host step (and its delayed
    update's) runs on all of them, as DeepSpeed's CPU-Adam does, while ZenFlow keeps
    DeepSpeed's pt_reserved_cores_perc split."""
    from zfbench.real.distributed import host_threads_by_strategy, lane_threads
    assert lane_threads(None, False, cores=16) == (8, 8)
    assert lane_threads(0.25, False, cores=16) == (4, 12)
    assert lane_threads(None, True, cores=16) == (16, 16)
    assert lane_threads(0.5, True, cores=16) == (8, 8)
    assert lane_threads(0.25, True, cores=16) == (4, 12)
    # several ranks: each rank's share first (rank_threads), then the same rule
    assert lane_threads(None, True, world=4, active=True, cores=32) == (8, 8)
    assert lane_threads(0.5, True, world=4, active=True, cores=32) == (4, 4)
    assert lane_threads(None, False, world=4, active=True, cores=32) == (4, 4)
    assert host_threads_by_strategy(0.5, cores=16) == {
        "zero-offload": 16, "zero-offload-dpu": 16, "zenflow": 8}
