"""The `device` strategy's optimizer step as DeepSpeed's ZeRO-2 runs it on the GPU, beside Adam.

One concept: the memory-bound passes a mixed-precision device step makes over the rank's
partition besides the fused Adam kernel (`CostModel.device_optim_s`,
`ADAM_BYTES_PER_PARAM`). With 16-bit weights and no offload, DeepSpeed's ZeRO-2 `step()`
(deepspeed/runtime/zero/stage_1_and_2.py, the branch that is not `cpu_offload`) runs the
gradient norm, the flatten and fp32 conversion of the gradients, the unscale/clip, Adam,
and the copy of the fp32 master back into the 16-bit weights, one pass after the other;
`BESIDE_ADAM_BYTES_PER_ELEM` (26 B per element, derived pass by pass beside the
constants) is what those passes add to the simulator's fused Adam. Each is an elementwise
kernel over HBM at `DEVICE_OPTIM_HBM_EFFICIENCY` of peak, the same judgment as the Adam.

The same passes stand for a plain PyTorch mixed-precision step with fp32 master weights
(apex amp O2 / FP16_Optimizer), which the ZeRO-Offload paper's PyTorch bars ran (a
judgment: the paper does not list its baseline's passes). It applies to simulations from
presets with 16-bit weights: a measured profile keeps its own device-side costs
(`master_copy_s_per_elem`); with fp32 weights the partition is the master and the passes
are not counted (a judgment, the fp32 path was not traced).
"""

from __future__ import annotations

# Bytes per element of the 16-bit device step's passes beside the fused Adam. DeepSpeed's
# ZeRO-2 `step()` without offload (deepspeedai/DeepSpeed, stage_1_and_2.py) runs, per
# parameter group, one pass after the other:
# 1. the global norm over the reduced 16-bit gradients (`scaled_global_norm`, for clipping
#    and the overflow check): read 2 B;
# 2. `self.flatten(self.averaged_gradients[i]).to(fp32)`: a `cat` (read 2, write 2), then a
#    new fp32 gradient partition (read 2, write 4);
# 3. `unscale_and_clip_grads` (`grad.data.mul_(1 / combined_scale)` in place over the fp32
#    gradient, every step): read 4, write 4;
# 4. `_optimizer_step`: FusedAdam over the fp32 master, its fp32 gradient, m and v
#    (`CostModel.device_optim_s`);
# 5. `bit16_partitions[partition_id].data.copy_(fp32_partition.data)`: read 4, write 2;
# then the all-gather of the 16-bit partitions. The simulator's fused Adam already counts a
# 16-bit gradient read and a 16-bit copy written (2 B each); DeepSpeed's FusedAdam reads the
# fp32 gradient (4 B) and writes no 16-bit copy. So the passes beside Adam add
# 2 + 4 + 6 + 8 + 6 + (4 - 2) - 2 = 26 bytes per element over the partition.
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
    (the constants above) at `hbm_bytes_per_s` achieved; 0 with fp32 weights."""
    if precision == "fp32":
        return 0.0
    return elems * BESIDE_ADAM_BYTES_PER_ELEM / hbm_bytes_per_s
