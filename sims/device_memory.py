"""Device memory of ZeRO-Offload (and its delayed-update variant) as DeepSpeed allocates it.

DeepSpeed's ZeRO-2 with the optimizer offloaded (`offload_optimizer: cpu`, stage_1_and_2.py)
keeps on each GPU the whole 16-bit model, but never a whole gradient: backward hooks copy
each parameter's gradient into an "ipg" (independent partition gradient) bucket of
`reduce_bucket_size` elements, the full bucket is reduced to its owners and copied to the
host's fp32 partition, and the parameters' `.grad` are released. With `overlap_comm` the
bucket is double-buffered (one filling while the other is reduced), so the gradient memory
is `GRAD_BUCKETS x min(REDUCE_BUCKET_ELEMS, P)` 16-bit elements, not P. The fp32 master,
momentum, variance and the fp32 gradient partition live on the host.

    device = P x b (16-bit parameters) + GRAD_BUCKETS x min(REDUCE_BUCKET_ELEMS, P) x b
             + activations

This is how the ZeRO-Offload paper (Ren et al., arXiv 2101.06840, Figure 8 / Table 3) fits
10-13B GPT-2 shapes on one 32 GB V100. It applies to simulations from presets (DeepSpeed's
layout); a profile of zfbench's own engine keeps the engine's full gradient buffer
(CostModel.memory_per_rank).
"""

from __future__ import annotations

# DeepSpeed's default `reduce_bucket_size` (elements): 5e8 (DeepSpeed configuration docs,
# zero_optimization.reduce_bucket_size, "Default: 5e8").
REDUCE_BUCKET_ELEMS = 500_000_000
# ipg buffers with overlap_comm: two (DeepSpeed stage_1_and_2.py allocates `ipg_buffer` as
# two bucket-sized tensors and alternates `ipg_index` when overlap_comm is on).
GRAD_BUCKETS = 2


def zero_offload_device_bytes(params: int, elem_bytes: int, activation_bytes: float) -> float:
    """Device bytes per rank of ZeRO-Offload / DPU (module docstring's formula)."""
    grads = GRAD_BUCKETS * min(REDUCE_BUCKET_ELEMS, params) * elem_bytes
    return params * elem_bytes + grads + activation_bytes
