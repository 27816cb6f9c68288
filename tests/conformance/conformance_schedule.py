"""Every strategy's weights against a plain-PyTorch reference of its schedule.

DeepSpeed's ZenFlow engine tests only check that training runs. These runs check the
numbers: the engine trains BiasMLP (tests/engine_helpers.py) for `STEPS` steps; its
gradients of each step (averaged over the ranks, as the engine averages them) drive an
independent float64 reference of the same schedule, and the engine's parameters after
every step, and after `finish()`, must equal the reference's to `TOL`:

- `device`, `zero-offload`: torch.optim.AdamW on the whole model every step (the
  gradient clipped by its global L2 norm, torch.nn.utils.clip_grad_norm_).
- `zero-offload-dpu`: the same AdamW sequence, each result reaching the device one step
  late (after step t the device holds update t-1; `finish()` applies the last).
- `zenflow`, with and without `overlap_step`: tests/zenflow_reference.py (ReferenceZenFlow:
  AdamW on the selected columns and 1-D parameters every step, the accumulated host
  update every U steps, one window late with overlap; itself checked against
  torch.optim.AdamW in tests/test_zenflow_reference.py). Warm-up, windows cut short by a
  reselection, and reselections happen inside the run.

The reference is driven by the engine's own gradients (open loop), so a difference shows
at the step where an update differs, and rounding does not compound through the model.
Used in one process for one rank (test_schedule_reference.py) and inside the two-rank
spawn (conformance_ranks.py).
"""
from __future__ import annotations

import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of
from zenflow_reference import ReferenceZenFlow
from zfbench.core.config import load_config

STEPS = 13
TOL = 1e-5
GLOBAL_BATCH = 4
LR, WD = 1e-2, 0.01
# gradient_clipping off, and on at a norm most steps' (and windows') gradients exceed
CLIPS = (0.0, 0.2)
# W=1 (t=0 is warm-up), first selection at t=1, U=2, reselection every 6 steps: windows
# [1,2] [3,4] [5] [6] [7,8] [9,10] [11] [12] (a reselection cuts [5] and [11] short)
ZF = dict(topk_ratio=0.25, update_interval=2, select_strategy="step", select_interval=6,
          full_warm_up_rounds=1)
VARIANTS = {
    "device": ("device", {}),
    "zero-offload": ("zero-offload", {}),
    "zero-offload-dpu": ("zero-offload-dpu", {}),
    "zenflow": ("zenflow", dict(ZF, overlap_step=False)),
    "zenflow-overlap": ("zenflow", dict(ZF, overlap_step=True)),
}


def schedule_config(variant: str, clip: float) -> dict:
    """The variant's config, with the global batch as DeepSpeed users write it
    (train_batch_size; the micro-batch per rank is derived from the world size)."""
    strategy, zf = VARIANTS[variant]
    cfg = config(strategy, lr=LR, wd=WD, clip=clip, **zf)
    cfg.pop("train_micro_batch_size_per_gpu")
    cfg["train_batch_size"] = GLOBAL_BATCH
    return cfg


def run_engine(variant: str, clip: float, rank: int = 0, world: int = 1,
               steps: int = STEPS) -> dict:
    """Train on this rank's rows of each global batch; every step's local gradients (read
    after backward, before the engine averages them) and parameters."""
    model = BiasMLP()
    engine = make_engine(model, schedule_config(variant, clip))
    data = batches(batch=GLOBAL_BATCH)
    per = GLOBAL_BATCH // world
    grads, params = [], []
    for _ in range(steps):
        ids, labels = next(data)
        rows = slice(rank * per, (rank + 1) * per)
        engine.backward(engine(ids[rows], labels[rows]))
        grads.append({n: p.grad.detach().clone() for n, p in engine.named_params})
        engine.step()
        params.append(params_of(model))
    engine.finish()
    out = {"grads": grads, "params": params, "final": params_of(model),
           "selected": {n: i.clone() for n, i in
                        getattr(engine.strategy, "selected", {}).items()},
           "micro_batch": engine.config.micro_batch, "world": engine.dist.world}
    engine.close()
    return out


def mean_grads(runs: list[dict]) -> list[dict]:
    """Step by step, the average of the ranks' local gradients."""
    steps = len(runs[0]["grads"])
    return [{n: sum(r["grads"][t][n] for r in runs) / len(runs) for n in runs[0]["grads"][t]}
            for t in range(steps)]


def reference_run(variant: str, clip: float, grads: list[dict]) -> dict:
    """The float64 reference of `variant` driven by `grads`: parameters after every step,
    after finish(), and (zenflow) the selected columns."""
    strategy, _ = VARIANTS[variant]
    parsed = load_config(schedule_config(variant, clip))
    init = params_of(BiasMLP())
    if strategy == "zenflow":
        ref = ReferenceZenFlow(list(init.items()), parsed.zenflow, parsed.optimizer,
                               gradient_clipping=parsed.gradient_clipping)
        after = []
        for g in grads:
            ref.step(g)
            after.append(ref.params())
        ref.finish()
        return {"params": after, "final": ref.params(), "selected": ref.selected}
    opt_cfg = parsed.optimizer
    master = {n: torch.nn.Parameter(p.double()) for n, p in init.items()}
    opt = torch.optim.AdamW(master.values(), lr=opt_cfg.lr, betas=opt_cfg.betas,
                            eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay)
    history = [{n: p.detach().clone() for n, p in master.items()}]
    for g in grads:
        for n, p in master.items():
            p.grad = g[n].double()
        if parsed.gradient_clipping > 0:
            torch.nn.utils.clip_grad_norm_(list(master.values()), parsed.gradient_clipping)
        opt.step()
        history.append({n: p.detach().clone() for n, p in master.items()})
    late = strategy == "zero-offload-dpu"
    after = history[:-1] if late else history[1:]
    return {"params": after, "final": history[-1], "selected": {}}


def worst_difference(engine_run: dict, ref: dict) -> tuple[float, str]:
    """Largest |engine - reference| over every step's parameters and the final ones."""
    worst, where = 0.0, ""
    pairs = [(f"step {t}", e, r) for t, (e, r) in
             enumerate(zip(engine_run["params"], ref["params"]))]
    pairs.append(("after finish()", engine_run["final"], ref["final"]))
    for label, got, want in pairs:
        for name, value in want.items():
            diff = float((got[name].double() - value).abs().max())
            if diff > worst:
                worst, where = diff, f"{label}, {name}"
    return worst, where


def check_against_reference(variant: str, clip: float, runs: list[dict]) -> None:
    """Every rank's run of `variant` equals the reference driven by the mean gradients."""
    ref = reference_run(variant, clip, mean_grads(runs))
    for rank, run in enumerate(runs):
        assert run["world"] == len(runs) and run["micro_batch"] == GLOBAL_BATCH // len(runs)
        worst, where = worst_difference(run, ref)
        assert worst < TOL, f"{variant}, clip {clip}, rank {rank}: {worst:.3g} at {where}"
        assert set(run["selected"]) == set(ref["selected"])
        for name, idx in ref["selected"].items():
            assert run["selected"][name].tolist() == idx.tolist(), (variant, rank, name)
