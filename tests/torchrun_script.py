"""A DeepSpeed user's training script, as torchrun launches it (tests/test_torchrun.py).

It does what such a script does: joins the process group torchrun describes, builds its
model with a seed of its own rank (replicas that start apart: only rank 0's weights may
survive), hands `zfbench.real.initialize` a DeepSpeed config that names the global batch
only (`train_batch_size`), and feeds each rank its slice of every global batch, as many
rows as the engine's resolved micro-batch. Run without torchrun it is the one-rank
reference on the whole batch. Writes `rank<R>.pt` to the folder given: per strategy the
final parameters and the resolved batch triple.

    torchrun --nproc-per-node 2 tests/torchrun_script.py OUT [--init-group]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from engine_helpers import BiasMLP, batches, params_of
import zfbench.real as real

STEPS = 5
GLOBAL_BATCH = 4
ZENFLOW = {"topk_ratio": 0.25, "update_interval": 2, "overlap_step": True,
           "select_strategy": "step", "select_interval": 4}
STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zenflow")


def ds_config(strategy: str) -> dict:
    zero = {"stage": 2 if strategy != "device" else 0}
    if strategy != "device":
        zero["offload_optimizer"] = {"device": "cpu"}
    if strategy == "zenflow":
        zero["zenflow"] = dict(ZENFLOW)
    return {"train_batch_size": GLOBAL_BATCH, "gradient_clipping": 0.5,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.01}},
            "zero_optimization": zero,
            "zfbench": {"strategy": strategy}}


def main(out: Path, init_group: bool) -> None:
    if init_group:  # the script creates the group itself (else initialize does)
        dist.init_process_group("gloo")
    rank = int(os.environ.get("RANK", 0))
    results = {}
    for strategy in STRATEGIES:
        model = BiasMLP(seed=1000 + rank)  # every rank builds different weights
        engine = real.initialize(model, ds_config(strategy), device="cpu",
                                 device_threads=1, host_threads=1)
        cfg = engine.config
        micro = cfg.micro_batch
        data = batches(batch=GLOBAL_BATCH)
        for _ in range(STEPS):
            ids, labels = next(data)
            rows = slice(engine.dist.rank * micro, (engine.dist.rank + 1) * micro)
            engine.backward(engine(ids[rows], labels[rows]))
            engine.step()
        engine.finish()
        engine.close()
        results[strategy] = {"params": params_of(model), "world": engine.dist.world,
                             "batch": (cfg.train_batch_size, micro, cfg.grad_accum)}
    torch.save(results, out / f"rank{rank}.pt")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--init-group" in sys.argv[2:])
