"""The `device` strategy's optimizer step as DeepSpeed's ZeRO-2 runs it on the GPU, beside Adam.

One concept: the memory-bound passes a mixed-precision device step makes over the rank's
partition besides the fused Adam kernel (`CostModel.device_optim_s`,
`ADAM_BYTES_PER_PARAM`). With 16-bit weights and no offload, DeepSpeed's ZeRO-2 `step()`
(deepspeedai/DeepSpeed, deepspeed/runtime/zero/stage_1_and_2.py, the branch that is not
`cpu_offload`) runs per parameter group, one pass after the other:

1. the global gradient norm over the reduced 16-bit gradients (`scaled_global_norm`,
   for clipping and the overflow check): reads 2 B per element;
2. `self.flatten(self.averaged_gradients[i]).to(fp32)`: the partition's 16-bit
   gradients are flattened (a `cat`: read 2 B, write 2 B) and converted into a new fp32
   gradient partition (read 2 B, write 4 B);
3. `unscale_and_clip_grads` (`grad.data.mul_(1 / combined_scale)` in place over the fp32
   gradient, every step): read 4 B, write 4 B;
4. `_optimizer_step`: FusedAdam over the fp32 master, its fp32 gradient, m and v
   (`CostModel.device_optim_s`);
5. `bit16_partitions[partition_id].data.copy_(fp32_partition.data)`: the fp32 master into
   the 16-bit weights: read 4 B, write 2 B;

then the all-gather of the 16-bit partitions. The simulator's fused Adam already counts
reading a 16-bit gradient and writing a 16-bit copy (2 B each) inside the kernel; DeepSpeed's
FusedAdam reads the fp32 gradient (4 B) and writes no 16-bit copy. So the passes beside
Adam add `BESIDE_ADAM_BYTES_PER_ELEM` = 2 + 4 + 6 + 8 + 6 + (4 - 2) - 2 = 26 bytes per
element over the partition: the five passes, the fp32 gradient read in Adam in place of a
16-bit one (2 B more), no 16-bit copy written in Adam (2 B less: the copy-back pass counts
it). Each is an elementwise kernel
over HBM at `DEVICE_OPTIM_HBM_EFFICIENCY` of peak, the same judgment as the fused Adam.

The same passes stand for a plain PyTorch mixed-precision step with fp32 master weights
(apex amp O2 / FP16_Optimizer: the master gradients converted from the model's, unscaled,
their norm, Adam, the master copied back into the 16-bit model), which the ZeRO-Offload
paper's PyTorch bars ran (a judgment: the paper does not list its baseline's passes).

It applies to simulations from presets with 16-bit weights. A measured profile keeps its
own device-side costs (`master_copy_s_per_elem`); with fp32 weights the partition is the
master and steps 2 and 5 do not exist (the passes are then not counted: a judgment, the
fp32 path was not traced).
"""

from __future__ import annotations

# Bytes per element of the 16-bit device step's passes beside the fused Adam (module
# docstring; stage_1_and_2.py, ZeRO-2 `step()` without offload).
NORM_BYTES_PER_ELEM = 2.0          # read the 16-bit gradient
FLATTEN_BYTES_PER_ELEM = 4.0       # cat: read 2, write 2
TO_FP32_BYTES_PER_ELEM = 6.0       # .to(fp32): read 2, write 4
CLIP_BYTES_PER_ELEM = 8.0          # mul_ in place over fp32: read 4, write 4
COPY_BACK_BYTES_PER_ELEM = 6.0     # fp32 master into the 16-bit weights: read 4, write 2
# What the simulator's fused-Adam count (ADAM_BYTES_PER_PARAM) has that DeepSpeed's
# FusedAdam does not (16-bit gradient read 2 B, 16-bit copy written 2 B) and lacks (the
# fp32 gradient read 4 B): +4 - 4 = 0 net, kept explicit so the arithmetic can be checked.
ADAM_GRAD_READ_DELTA = 4.0 - 2.0
ADAM_COPY_WRITE_DELTA = -2.0
BESIDE_ADAM_BYTES_PER_ELEM = (NORM_BYTES_PER_ELEM + FLATTEN_BYTES_PER_ELEM
                              + TO_FP32_BYTES_PER_ELEM + CLIP_BYTES_PER_ELEM
                              + COPY_BACK_BYTES_PER_ELEM + ADAM_GRAD_READ_DELTA
                              + ADAM_COPY_WRITE_DELTA)


def beside_adam_s(elems: float, hbm_bytes_per_s: float, precision: str) -> float:
    """Seconds of the device step's passes beside the fused Adam over `elems` elements
    (module docstring) at `hbm_bytes_per_s` achieved; 0 with fp32 weights."""
    if precision == "fp32":
        return 0.0
    return elems * BESIDE_ADAM_BYTES_PER_ELEM / hbm_bytes_per_s
