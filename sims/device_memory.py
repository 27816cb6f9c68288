"""Device memory of ZeRO-2 without offload (`device`), ZeRO-Offload (and its delayed-update
variant) and ZeRO-3 (zero-infinity) as DeepSpeed allocates it.

P parameters, b bytes per 16-bit element, S the rank's partition (each function's
docstring gives the allocation it follows in DeepSpeed and the check against the papers):

- `device_strategy_bytes`, ZeRO-2 without offload at its step's peak, the step's flattened
  16-bit and new fp32 gradient partitions alive at once:
  P x b + S x (b + 12) + S x (b + 4) + activations (16-bit weights);
- `zero_offload_device_bytes`, ZeRO-2 with the optimizer offloaded: the 16-bit model and
  two "ipg" reduce buckets, never a whole gradient:
  P x b + GRAD_BUCKETS x min(REDUCE_BUCKET_ELEMS, P) x b + activations;
- `zero3_device_bytes`, ZeRO-3's working set: the module in use (M) and the prefetched
  layers up to `stage3_max_live_parameters`, one reduce bucket and a module's gradient.

These apply to simulations from presets (DeepSpeed's layout); a profile of zfbench's own
engine keeps the engine's full gradient buffer (CostModel.memory_per_rank).
"""

from __future__ import annotations

from zfbench.core import models

# DeepSpeed's default `reduce_bucket_size` (elements): 5e8 (DeepSpeed configuration docs,
# zero_optimization.reduce_bucket_size, "Default: 5e8").
REDUCE_BUCKET_ELEMS = 500_000_000
# Extra bytes per partition element at the peak of ZeRO-2's device step with 16-bit weights
# (`device_strategy_bytes`): the flattened 16-bit gradients (b) and the fp32 gradient (4).
FP32_GRAD_BYTES = 4


def device_strategy_bytes(params: int, partition: float, elem_bytes: int,
                          activation_bytes: float) -> float:
    """Device bytes per rank of ZeRO-2 without offload at its step's peak.

    ZeRO-2 without offload keeps the whole 16-bit model and the rank's partition S of the
    16-bit gradients, fp32 master, momentum and variance. Its `step()` (stage_1_and_2.py,
    the branch that is not `cpu_offload`; the passes are zfbench.sims.device_step's) then
    flattens the partition's 16-bit gradients (a `cat`: a new 16-bit tensor) and converts
    that into a new fp32 gradient partition (`.to(fp32)`), both alive at once with
    everything above before the 16-bit gradients are released:

        device = P x b + S x (b + 12) + S x (b + 4) + activations       (16-bit weights)

    A plain PyTorch mixed-precision step (apex amp O2 / FP16_Optimizer: the fp32 master's
    own fp32 gradients beside the model's 16-bit ones) holds at least the fp32 gradient
    too. With fp32 weights neither copy is counted, as zfbench.sims.device_step counts none
    of their passes (a judgment: that path was not traced): P x 4 + S x (4 + 12). On one
    32 GB V100 this puts the largest GPT-2 that fits without offload between 1.3 and 1.5 G
    parameters, where the ZeRO-Offload paper (abstract and section 1) states 1.4B for
    PyTorch; without the step's copies it would be 1.7B."""
    step_copies = 0 if elem_bytes == 4 else elem_bytes + FP32_GRAD_BYTES
    return (params * elem_bytes + partition * (elem_bytes + 12) + partition * step_copies
            + activation_bytes)


# ipg buffers with overlap_comm: two (DeepSpeed stage_1_and_2.py allocates `ipg_buffer` as
# two bucket-sized tensors and alternates `ipg_index` when overlap_comm is on).
GRAD_BUCKETS = 2


def zero_offload_device_bytes(params: int, elem_bytes: int, activation_bytes: float) -> float:
    """Device bytes per rank of ZeRO-Offload / DPU.

    DeepSpeed's ZeRO-2 with the optimizer offloaded (`offload_optimizer: cpu`,
    stage_1_and_2.py) keeps on each GPU the whole 16-bit model but never a whole gradient:
    backward hooks copy each parameter's gradient into an "ipg" (independent partition
    gradient) bucket of `reduce_bucket_size` elements, the full bucket is reduced to its
    owners and copied to the host's fp32 partition, and the parameters' `.grad` are
    released. With `overlap_comm` the bucket is double-buffered, so the gradient memory is
    `GRAD_BUCKETS x min(REDUCE_BUCKET_ELEMS, P)` 16-bit elements, not P; the fp32 master,
    moments and gradient partition live on the host:

        device = P x b + GRAD_BUCKETS x min(REDUCE_BUCKET_ELEMS, P) x b + activations

    This is how the ZeRO-Offload paper (Ren et al., arXiv 2101.06840, Figure 8 / Table 3)
    fits 10-13B GPT-2 shapes on one 32 GB V100."""
    grads = GRAD_BUCKETS * min(REDUCE_BUCKET_ELEMS, params) * elem_bytes
    return params * elem_bytes + grads + activation_bytes


# DeepSpeed's default `stage3_max_live_parameters` (elements): 1e9 (DeepSpeed configuration
# docs, zero_optimization.stage3_max_live_parameters, "Default: 1e9"; the same default in
# the 2021 stage3.py that ZeRO-Infinity shipped in).
MAX_LIVE_PARAMETERS = 1_000_000_000


# Matrices that are lookups, not Linear layers: memory-centric tiling leaves them whole.
UNTILED_KINDS = ("embedding", "position")


def largest_module_numel(shape: models.ModelShape, tiling: int = 1) -> int:
    """The most parameters ZeRO-3 gathers for one module: a weight matrix (Linear or
    embedding) with its bias; with `tiling` T every Linear is T modules (DeepSpeed's
    TiledLinear), each 1/T of it (rounded up)."""
    biases = {v.name: v.numel for v in shape.vectors()}
    sizes = []
    for m in shape.matrices():
        numel = m.numel + biases.get(f"{m.name}.bias", 0)
        sizes.append(numel if m.kind in UNTILED_KINDS else -(-numel // tiling))
    return max(sizes)


def zero3_device_bytes(shape: models.ModelShape, layer_numel: int, prefetch_layers: int,
                       elem_bytes: int, activation_bytes: float, tiling: int = 1) -> float:
    """Device bytes per rank of ZeRO-3's working set, without any parameter partition
    kept on the device (M with `tiling`).

    ZeRO-3 (stage3.py) keeps no whole model on the device: its coordinator gathers a
    module's parameters (a Linear's weight and bias, the embedding) before the module runs
    and frees them after it, prefetching the next modules' while one computes but never
    past `stage3_max_live_parameters` live beyond the module in use; each gradient goes
    into one reduce bucket (`reduce_bucket_size`, one per communication dtype) once
    produced, a parameter's own gradient whole until it is moved there:

        device = (M + min(d x L, MAX_LIVE)) x b + (min(REDUCE_BUCKET_ELEMS, P) + M) x b
                 + activations

    with M the largest module (with memory-centric tiling a Linear's tile), L the largest
    decoder layer (the simulator fetches a layer at a time) and d `prefetch_buckets`. So a
    layer wider than the GPU (a trillion-parameter shape: 7.9 G parameters a layer at
    hidden 25600) still fits as the ZeRO-Infinity paper trains it; the schedule's timing
    stays per layer (docs/design.md)."""
    module = largest_module_numel(shape, tiling)
    params = module + min(prefetch_layers * layer_numel, MAX_LIVE_PARAMETERS)
    grads = min(REDUCE_BUCKET_ELEMS, shape.total_params) + module
    return (params + grads) * elem_bytes + activation_bytes
