"""Run by test_checkpoint.py in fresh processes: train, save, or resume and continue;
under torchrun each rank trains on its own rows of every batch and writes `OUT.rank<R>`."""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from engine_helpers import BiasMLP, batches, config, make_engine, train_steps  # noqa: E402

DONE_MARK = "checkpoint_worker: done, rank"
ZENFLOW = dict(topk_ratio=0.25, update_interval=4, overlap_step=True,
               select_strategy="step", select_interval=8)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="zenflow")
    p.add_argument("--skip", type=int, default=0, help="batches already consumed")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--load")
    p.add_argument("--save")
    p.add_argument("--out", required=True)
    p.add_argument("--bf16", action="store_true", help="bf16 weights on the device")
    args = p.parse_args()
    zf = ZENFLOW if args.strategy == "zenflow" else {}
    model = BiasMLP()
    cfg = config(args.strategy, **zf)
    if args.bf16:
        cfg["bf16"] = {"enabled": True}
    engine = make_engine(model, cfg)
    if args.load:
        engine.load_checkpoint(args.load)
    rank, world = engine.dist.rank, engine.dist.world
    data = ((ids[rank * 4:(rank + 1) * 4], labels[rank * 4:(rank + 1) * 4])
            for ids, labels in batches(batch=4 * world))
    for _ in range(args.skip):
        next(data)
    train_steps(engine, data, args.steps)
    if args.save:
        engine.save_checkpoint(args.save)
    else:
        engine.finish()
    out = {n: p.detach().clone() for n, p in model.named_parameters()}
    strategy = engine.strategy
    out["host master"] = strategy.host.master.clone()
    for n, v in getattr(strategy, "vector_values", {}).items():  # zenflow's fp32 values
        out[f"fp32 {n}"] = v.clone()
    for n, w in getattr(strategy, "selected_values", {}).items():
        out[f"fp32 selected {n}"] = w.values.clone()
    torch.save(out, args.out + (f".rank{rank}" if "RANK" in os.environ else ""))
    engine.close()
    # everything of this rank is done: what follows is the interpreter's teardown
    print(f"{DONE_MARK} {rank}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
