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
from zfbench.core.scenario import CPU_LANES, GPU_NODE

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


def gpu_sized(spec, strategies, world: int, args):
    """`zfbench.run` on CUDA with no shape flag: the RunSpec of the run `gpu_default`
    picks (full depth, checked against the GPU's memory), replacing the CPU lane's
    slice; says so on stderr unless --quiet."""
    import sys

    from zfbench.core.memory_model import element_bytes
    from zfbench.core.models import get_model
    from zfbench.core.strategies import buckets_on
    from zfbench.real.memory import InsufficientMemoryError, check_fits
    from zfbench.real.runner import RunSpec

    elem = element_bytes(DEFAULT_PRECISION)
    # (with no config, overlap_comm is on on CUDA: real/runner.py)
    bucketed = buckets_on(DEFAULT_PRECISION, spec.engine_config(strategies[0]).overlap_comm)

    def fits(model: str, batch: int, seq: int) -> bool:
        try:
            check_fits(get_model(model), strategies, batch, seq, elem, True, ranks=world,
                       bucketed=bucketed)
        except InsufficientMemoryError:
            return False
        return True
    pick = gpu_default(fits)
    if not args.quiet:
        print(f"GPU-sized default: {pick['model']} full depth, batch {pick['batch']} x "
              f"seq {pick['seq']}, {pick['precision']} (give --model/--layers/--seq/"
              f"--batch to choose)", file=sys.stderr)
    args.layers = None
    return RunSpec(model=pick["model"], layers=None, batch=pick["batch"], seq=pick["seq"],
                   steps=spec.steps, seed=spec.seed, device=spec.device,
                   device_threads=spec.device_threads, host_threads=spec.host_threads,
                   text=spec.text, precision=pick["precision"], world=world)
