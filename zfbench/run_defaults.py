"""The default scenario's fixed settings, shared by the run, its probes and the benches.

The model and depth are `zfbench.real.runner.RunSpec`'s defaults (tinyllama-1.1b, 1 layer);
the precision is measured on the emulated accelerator (`zfbench.run_probe`) and bf16 on
CUDA (DEFAULT_PRECISION). On CUDA with no shape flag, `gpu_default` picks a GPU-sized run
instead: the largest of GPU_MODELS that fits at full depth, batch GPU_BATCH x seq GPU_SEQ,
for every strategy asked for (the `device` strategy keeps AdamW's fp32 state on the GPU,
so it decides the size when it runs).
"""
DEFAULT_SEQ = 4
DEFAULT_PRECISION = "bf16"

GPU_MODELS = ("llama2-7b", "qwen2.5-1.5b", "tinyllama-1.1b", "opt-350m")
GPU_SEQ = 1024
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
