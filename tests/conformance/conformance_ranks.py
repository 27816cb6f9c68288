"""The one two-rank spawn of tests/conformance (CPU, gloo, a file store).

Each rank initialises torch.distributed itself and then calls
`zfbench.real.initialize(model, ds_config)` with no `dist` argument, as a DeepSpeed user's
script calls `deepspeed.initialize` inside its launcher's process group. In one run, each
rank does every two-rank job of the folder and saves its results:

- "smoke": test_zf.py's distributed configs (TestZenFlowDistributed, and the later
  TestZenFlowSmallTopKRatio) that zfbench runs, each over DeepSpeed's 20 samples;
- "schedule": every strategy of conformance_schedule.py on its slice of each global batch.

`spawn_two_ranks` returns [rank 0's results, rank 1's]; conftest.py's session fixture
`two_ranks` calls it at most once per session.
"""
from __future__ import annotations

import datetime
import itertools
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conformance_schedule import CLIPS, VARIANTS, run_engine
from conformance_support import SimpleNet, ds_zenflow_config, samples
from engine_helpers import make_engine

WORLD = 2
SAMPLES = 20  # random_dataloader(total_samples=20) in DeepSpeed's tests
STAGES = (1, 2, 3)
WARM_UP = (0, 3)
OFFLOAD = (True, False)
INTERVALS = (("auto", "auto", "auto"), ("step", 10, 3), ("epoch", 1, 4))


def smoke_key(stage, offload, select_strategy, select_interval, update_interval,
              full_warm_up_rounds, topk_ratio=0.2, hidden=10) -> str:
    return (f"stage{stage}-offload{offload}-{select_strategy}-{select_interval}-"
            f"{update_interval}-W{full_warm_up_rounds}-topk{topk_ratio}-h{hidden}")


def smoke_grid():
    """(stage, offload, select_strategy, select_interval, update_interval, W) of
    TestZenFlowSingleGPU / TestZenFlowDistributed, in DeepSpeed's parametrize order."""
    for (sel, si, ui), offload, warm, stage in itertools.product(INTERVALS, OFFLOAD,
                                                                 WARM_UP, STAGES):
        yield stage, offload, sel, si, ui, warm


def runs_in_zfbench(stage, offload) -> bool:
    """zenflow.offload on ZeRO-3 is refused (the documented difference); the rest runs."""
    return stage != 3 or not offload


def smoke_jobs() -> dict[str, tuple[dict, int]]:
    jobs = {}
    for stage, offload, sel, si, ui, warm in smoke_grid():
        if runs_in_zfbench(stage, offload):
            jobs[smoke_key(stage, offload, sel, si, ui, warm)] = (
                ds_zenflow_config(stage, offload, sel, si, ui, warm), 10)
    for stage in (1, 2):  # TestZenFlowSmallTopKRatio (DeepSpeed after 0.19.5)
        jobs[smoke_key(stage, False, "step", 1, 1, 0, 0.01, 50)] = (
            ds_zenflow_config(stage, False, "step", 1, 1, 0, topk_ratio=0.01), 50)
    return jobs


def run_smoke(cfg: dict, hidden: int, rank: int = 0, world: int = 1) -> dict:
    """DeepSpeed's loop: one pass over SAMPLES samples in micro-batches of this rank's
    size (each rank its own rows of each global batch)."""
    model = SimpleNet(hidden)
    start = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    engine = make_engine(model, cfg)
    micro = engine.config.micro_batch
    x, y = samples(SAMPLES * world, hidden)
    losses = []
    for step in range(SAMPLES // micro):
        lo = (step * world + rank) * micro
        loss = engine(x[lo:lo + micro], y[lo:lo + micro])
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
    engine.finish()
    strategy = engine.strategy
    out = {"losses": losses, "micro_batch": micro, "world": engine.dist.world,
           "start": start, "S": strategy.S,
           "final": {n: p.detach().float().clone() for n, p in model.named_parameters()},
           "selected": {n: i.clone() for n, i in strategy.selected.items()}}
    engine.close()
    return out


def _rank_main(rank: int, world: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    results: dict = {"smoke": {}, "schedule": {}}
    try:
        for key, (cfg, hidden) in smoke_jobs().items():
            results["smoke"][key] = run_smoke(cfg, hidden, rank, world)
        for variant, clip in itertools.product(VARIANTS, CLIPS):
            results["schedule"][f"{variant}/{clip}"] = run_engine(variant, clip, rank, world)
        torch.save(results, Path(out, f"rank{rank}.pt"))
    except BaseException:
        Path(out, f"error{rank}.txt").write_text(traceback.format_exc())
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn_two_ranks(tmp: Path, timeout_s: float = 300) -> list[dict]:
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_main, args=(r, WORLD, str(tmp / "store"), str(tmp)))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    errors = {r: (tmp / f"error{r}.txt").read_text() for r in range(WORLD)
              if (tmp / f"error{r}.txt").exists()}
    assert not errors, "a rank failed:\n" + "\n".join(f"rank {r}:\n{e}"
                                                     for r, e in errors.items())
    assert not hung, f"ranks {hung} still running after {timeout_s} s (a hang)"
    codes = [p.exitcode for p in procs]
    assert codes == [0] * WORLD, f"exit codes {codes}"
    return [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]

