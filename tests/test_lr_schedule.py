"""The lr of every step (issue 46): DeepSpeed's WarmupLR / WarmupDecayLR arithmetic, and
every strategy's device and host AdamW really running at the scheduled lr.

The schedules are checked against DeepSpeed 0.19.5's documented formula written out
here by hand; the strategies against plain torch AdamW (device, zero-offload, one step
late for zero-offload-dpu) and against tests/zenflow_reference.py (ZenFlow's both sides)
fed the same per-step lr. Before issue 46 `scheduler` was ignored: the lr stayed at
optimizer.params.lr and every comparison here failed from the first step."""

import math

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps
from zenflow_reference import ReferenceZenFlow
from zfbench.core.config import ConfigError, load_config
from zfbench.real.lr_schedule import EngineOptimizer, WarmupDecayLR, WarmupLR

LO, HI, WARM, TOTAL = 1e-3, 2e-2, 4, 10
WARMUP_DECAY = {"type": "WarmupDecayLR", "params": {
    "warmup_min_lr": LO, "warmup_max_lr": HI, "warmup_num_steps": WARM,
    "total_num_steps": TOTAL, "warmup_type": "linear"}}


def deepspeed_lr(k: int, kind: str = "log", decay: bool = False, lo=LO, hi=HI, warm=WARM,
                 total=TOTAL) -> float:
    """The lr of optimizer step k (0-based) as DeepSpeed runs it: the schedule is built at
    iteration -1 (min) and stepped after every step, so step k sees iteration k - 1."""
    i = k - 1
    if i < 0:
        return lo
    if i < warm:
        gamma = math.log(i + 1) / math.log(warm) if kind == "log" else i / warm
    elif decay:
        gamma = max(0.0, (total - i) / max(1.0, total - warm))
    else:
        gamma = 1.0
    return lo + (hi - lo) * gamma


def _opt():
    p = torch.nn.Parameter(torch.zeros(2))
    return EngineOptimizer([p], load_config({}).optimizer, lambda: None)


@pytest.mark.parametrize("kind", ["log", "linear"])
def test_warmup_lr_follows_deepspeeds_formula(kind):
    opt = _opt()
    sched = WarmupLR(opt, LO, HI, WARM, kind)
    for k in range(8):
        assert opt.lr == pytest.approx(deepspeed_lr(k, kind), rel=1e-12, abs=0), k
        sched.step()
    assert opt.lr == HI


def test_warmup_decay_lr_falls_to_min_at_total_num_steps():
    opt = _opt()
    sched = WarmupDecayLR(opt, TOTAL, LO, HI, WARM, "linear")
    seen = []
    for k in range(TOTAL + 3):
        seen.append(opt.lr)
        assert opt.lr == pytest.approx(deepspeed_lr(k, "linear", decay=True)), k
        sched.step()
    assert seen[WARM + 1] == pytest.approx(HI) and seen[TOTAL + 1] == pytest.approx(LO)
    # a warm-up shorter than 2 is DeepSpeed's 2 (log(1) would divide by zero)
    assert WarmupLR(_opt(), warmup_num_steps=0).warmup_num_steps == 2


def test_a_schedule_state_restores_its_lr():
    opt = _opt()
    sched = WarmupLR(opt, LO, HI, WARM)
    for _ in range(3):
        sched.step()
    other = _opt()
    fresh = WarmupLR(other, LO, HI, WARM)
    fresh.load_state_dict(sched.state_dict())
    assert other.lr == opt.lr == pytest.approx(deepspeed_lr(3))


@pytest.mark.parametrize("section, match", [
    ({"type": "OneCycle"}, r"scheduler.type: got 'OneCycle'; zfbench does not implement"),
    ({"type": "WarmupDecayLR", "params": {}}, r"total_num_steps: missing"),
    ({"type": "WarmupLR", "params": {"last_batch_iteration": 5}}, r"last_batch_iteration"),
    ({"type": "WarmupLR", "params": {"warmup_type": "cosine"}}, r"warmup_type: got"),
    ({"type": "WarmupLR", "params": {"cycle_min_lr": 1}}, r"unknown key"),
    ({"params": {}}, r"scheduler.type: missing"),
])
def test_a_schedule_zfbench_cannot_run_is_refused_in_one_line(section, match):
    with pytest.raises(ConfigError, match=match) as info:
        load_config({"scheduler": section})
    assert "\n" not in str(info.value)


def scheduled(strategy: str, **zf) -> dict:
    cfg = config(strategy, **zf)
    cfg["scheduler"] = WARMUP_DECAY
    return cfg


def torch_reference(steps: int, late: bool = False) -> dict:
    """torch AdamW with the lr of each step set from DeepSpeed's formula by hand; with
    `late` each update reaches the model one step after its gradient (dpu)."""
    model, master = BiasMLP(), BiasMLP()
    opt = torch.optim.AdamW(master.parameters(), lr=1.0, weight_decay=0.01)
    data = batches()
    for k in range(steps):
        ids, labels = next(data)
        model(ids, labels).backward()
        snapshot = [p.detach().clone() for p in master.parameters()]
        for mp, p in zip(master.parameters(), model.parameters()):
            mp.grad, p.grad = p.grad.clone(), None
        opt.param_groups[0]["lr"] = deepspeed_lr(k, "linear", decay=True)
        opt.step()
        with torch.no_grad():
            for p, s in zip(model.parameters(), snapshot if late else master.parameters()):
                p.copy_(s)
    return params_of(model)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu"])
def test_every_strategy_updates_at_the_scheduled_lr(strategy):
    model = BiasMLP()
    engine = make_engine(model, scheduled(strategy))
    train_steps(engine, batches(), 12)
    got = params_of(model)  # dpu: before finish(), the last update is still pending
    engine.close()
    assert [r["lr"] for r in engine.step_log] == pytest.approx(
        [deepspeed_lr(k, "linear", decay=True) for k in range(12)])
    want = torch_reference(12, late=strategy == "zero-offload-dpu")
    for name, p in got.items():
        assert torch.allclose(p, want[name], rtol=1e-5, atol=1e-6), name
    # the constant lr of the config's optimizer section ends elsewhere
    flat = BiasMLP()
    plain = make_engine(flat, config(strategy))
    train_steps(plain, batches(), 12)
    plain.close()
    assert not torch.allclose(params_of(flat)["up.weight"], got["up.weight"], atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_zenflow_device_and_host_sides_update_at_the_scheduled_lr(overlap):
    zf = dict(topk_ratio=0.25, update_interval=3, select_strategy="step",
              select_interval=6, full_warm_up_rounds=1, overlap_step=overlap)
    cfg = scheduled("zenflow", **zf)
    model = BiasMLP()
    parsed = load_config(cfg)
    ref = ReferenceZenFlow(list(params_of(model).items()), parsed.zenflow, parsed.optimizer)
    engine = make_engine(model, cfg)
    data, k = batches(), 0
    worst = 0.0
    for k in range(14):
        lr = deepspeed_lr(k, "linear", decay=True)
        train_steps(engine, data, 1, on_grads=lambda g, lr=lr: ref.step(g, lr=lr))
        got = params_of(model)
        worst = max(worst, max(float((got[n].double() - w).abs().max())
                               for n, w in ref.params().items()))
    engine.finish()
    engine.close()
    assert worst < 2e-5, worst
    # the host windows (boundaries at 3, 6 (reselect), 9, 12) ran at lrs that differ
    assert len({round(r["lr"], 9) for r in engine.step_log}) > 5
