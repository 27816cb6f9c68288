"""The default scenario's fixed settings, shared by the run, its probes and the benches.

The model, depth and seq are the CPU lanes' scenario (`zfbench.core.scenario.CPU_LANES`,
`zfbench.real.runner.RunSpec`'s defaults: tinyllama-1.1b, 1 layer, seq DEFAULT_SEQ); the
precision is measured on the emulated accelerator (`zfbench.run.probe`) and bf16 on CUDA
(DEFAULT_PRECISION, the GPU node's scenario's). On CUDA with no shape flag, `gpu_default` picks a GPU-sized run
instead: the largest of GPU_MODELS that fits at full depth, batch GPU_BATCH x seq GPU_SEQ,
for every strategy asked for (the `device` strategy keeps AdamW's fp32 state on the GPU,
so it decides the size when it runs); `gpu_sized` turns that pick, checked against the
GPU's memory, into the run's RunSpec.
"""
from pathlib import Path

from zfbench.core.scenario import CPU_LANES, GPU_NODE

# where a run's files go without --out: every measured result is also a file
RESULTS_DIR = Path("runs/run")
# the plan a run writes into --out before its first step (zfbench.run.plan)
PLAN_FILE = "plan.json"

DEFAULT_SEQ = CPU_LANES.seq
DEFAULT_PRECISION = GPU_NODE.precision

GPU_MODELS = ("llama2-7b", "qwen2.5-1.5b", "tinyllama-1.1b", "opt-350m")
GPU_SEQ = GPU_NODE.seq
GPU_BATCH = 4


def gpu_default(fits) -> dict:
    """The GPU-sized default: the first of GPU_MODELS for which `fits(model, batch, seq)`
    (full depth, bf16) returns True; the smallest with batch 1 when none does."""
    for model in GPU_MODELS:
        if fits(model, GPU_BATCH, GPU_SEQ):
            return {"model": model, "layers": None, "batch": GPU_BATCH, "seq": GPU_SEQ,
                    "precision": DEFAULT_PRECISION}
    return {"model": GPU_MODELS[-1], "layers": None, "batch": 1, "seq": GPU_SEQ,
            "precision": DEFAULT_PRECISION}


def gpu_sized(spec, strategies, world: int, quiet: bool = False):
    """`zfbench.run` on CUDA with no shape flag: the RunSpec of the run `gpu_default`
    picks (full depth, each strategy's engine config checked against the GPU's memory),
    replacing the CPU lane's slice; says so on stderr unless `quiet`."""
    import sys
    from dataclasses import replace

    from zfbench.real.memory import InsufficientMemoryError, check_configs_fit

    def sized(model: str, batch: int, seq: int):
        # (with no config, overlap_comm is on on CUDA: real/runner.py)
        return replace(spec, model=model, layers=None, micro_batch=batch, seq=seq,
                       precision=DEFAULT_PRECISION, grad_accum=None, config=None,
                       world=world)

    def fits(model: str, batch: int, seq: int) -> bool:
        run = sized(model, batch, seq)
        try:
            check_configs_fit(run.shape(), {s: run.engine_config(s, world)
                                            for s in strategies}, seq, True)
        except InsufficientMemoryError:
            return False
        return True
    pick = gpu_default(fits)
    if not quiet:
        print(f"GPU-sized default: {pick['model']} full depth, batch {pick['batch']} x "
              f"seq {pick['seq']}, {pick['precision']} (give --model/--layers/--seq/"
              f"--batch to choose)", file=sys.stderr)
    return sized(pick["model"], pick["batch"], pick["seq"])
