"""Copies between the GPU and pageable (not pinned) host buffers: what DeepSpeed's
`pin_memory: false` costs.

One concept: where an offloading run keeps its host buffers in pageable memory, a copy
between them and the GPU is (1) synchronous with respect to the host thread that issues it,
so the device lane that thread drives cannot proceed while the copy runs, and (2) staged
by the CUDA driver through a small pinned buffer, so one host thread copies every byte a
second time and the node's DRAM sees three bytes per byte moved. `SimSettings.pin_memory`
(True: pinned, no cost here) selects it; a measured profile (zfbench's engine, whose host
buffers are pinned) and the CPU-emulated accelerator never take it. The sources (CUDA's
sync behaviour, the driver's staging buffer, DeepSpeed's `pin_memory` defaults and which
buffers the flag governs per version) are beside the constants below.

The model (`CostModel.pageable_copies`): a gradient going down during backward holds the
compute lane until its copy has landed (ZeRO-2's right after its bucket's reduction,
`RankSim.backward`; ZeRO-3's one bucket later, as stage3.py's `reduce_ipg_grads` copies
the previous bucket first, zfbench.sims.zero_infinity); with parameters in pageable CPU
memory a zero-infinity fetch's copy up holds the compute lane until it lands. The GPU's
launch-ahead of queued kernels (milliseconds against copies of hundreds) is left out
(judgment). The copy's rate is `staging_copy_bytes_per_s`.
"""

from __future__ import annotations

from zfbench.sims.host_step import CORE_STREAM_BYTES_PER_S

# Sources (checked for issue 26):
# - CUDA, "API synchronization behavior" of the CUDA 11.0 documentation, the CUDA of 2020-21
#   (https://docs.nvidia.com/cuda/archive/11.0_GA/cuda-driver-api/api-sync-behavior.html),
#   for the asynchronous memcpy functions: "For transfers from device memory to pageable
#   host memory, the function will return only once the copy has completed." For pageable
#   host memory to the device (synchronous form) it returns "once the pageable buffer has
#   been copied to the staging memory for DMA transfer", after "a stream sync": the whole
#   copy but its last staging chunk. Today's page
#   (https://docs.nvidia.com/cuda/cuda-runtime-api/api-sync-behavior.html) says "might be
#   synchronous with respect to host" for both directions. PyTorch's
#   `copy_(src, non_blocking=True)` between a CUDA tensor and an unpinned CPU tensor is such
#   a `cudaMemcpyAsync`.
# - The driver's staging buffer: a small fixed pinned buffer of the driver (about 4 MB),
#   larger copies broken into chunks through it (NVIDIA developer forums, "Does pageable
#   memory have higher memory consumption than pinned memory?",
#   https://forums.developer.nvidia.com/t/does-pageable-memory-have-higher-memory-consumption-than-pinned-memory/188328).
# - DeepSpeed's defaults: `offload_optimizer.pin_memory` and `offload_param.pin_memory`
#   default to False in DeepSpeed 2021 (microsoft/DeepSpeed
#   deepspeed/runtime/zero/offload_constants.py, `OFFLOAD_OPTIMIZER_PIN_MEMORY_DEFAULT =
#   False`, `OFFLOAD_PARAM_PIN_MEMORY_DEFAULT = False`; before it, `cpu_offload_use_pin_memory`,
#   also False) and until deepspeedai/DeepSpeed PR #8207 (merged Aug 2026, "fix(zero3): async
#   grad offload + pinned offload buffers by default") made both True: its description
#   says the prior False "silently selected the slow staged pageable copy" with "no overlap
#   against backward compute".
# - Which buffers the flag governs, per version:
#   - ZeRO-3 (ZeRO-Infinity) of 2021 (stage3.py, `initialize_optimizer_states`): the fp32
#     gradient partition on the host is `torch.zeros(..., device='cpu')`, pinned only
#     `if self.cpu_offload_use_pin_memory`; the gradients go down into it with
#     `fp32_grad_tensor.copy_(src_tensor, non_blocking=True)`
#     (`async_inplace_copy_grad_to_fp32_buffer_from_gpu`), issued from the backward hooks
#     (`reduce_ipg_grads` -> `partition_previous_reduced_grads`) on the thread that launches
#     backward's kernels. Parameters offloaded to the CPU are pinned only with
#     `offload_param.pin_memory`. With NVMe offload both go through the swapper's pinned
#     buffers instead (not pageable).
#   - ZeRO-2 (ZeRO-Offload) of 2020-2021 (microsoft/DeepSpeed
#     deepspeed/runtime/zero/stage2.py, `initialize_optimizer_states`): the fp32 gradient
#     partition is `single_grad_partition.pin_memory() if self.cpu_offload`: pinned
#     whenever the optimizer is offloaded, whatever the config says. Later
#     stage_1_and_2.py pins it only `if self.cpu_offload_pin_memory`
#     (`offload_optimizer.pin_memory`), so a ZeRO-Offload run of DeepSpeed before PR #8207
#     without `pin_memory: true` copies into pageable memory.

# DRAM traffic of the staging copy per byte moved: read one buffer, write the other.
STAGING_BYTES_PER_BYTE = 2.0
# DRAM traffic per byte of a pageable copy: the DMA's byte into (or out of) the staging
# buffer plus the staging copy's read and write. A pinned copy's is 1.
DRAM_BYTES_PER_BYTE = 1.0 + STAGING_BYTES_PER_BYTE


def staging_copy_bytes_per_s(numa_factor: float) -> float:
    """Bytes per second of one rank's pageable copy as the driver's staging copy allows:
    one core streaming `STAGING_BYTES_PER_BYTE` per byte, at the rank's NUMA factor.

    The driver thread's second copy between the staging buffer and pageable memory streams
    at one core's rate, reading and writing each byte: `CORE_STREAM_BYTES_PER_S` / 2 times
    the rank's NUMA factor (zfbench.sims.host_step), about 3.3 GB/s on an unbound DGX-2
    Xeon (judgment: the per-core streaming rate is host_step.py's judgment; that the driver
    pipelines its chunks, so the copy runs at the lesser of the link's rate and the staging
    copy's rather than the sum of their times, is a judgment too: the forum answer in the
    sources above reports pageable copies close to pinned ones where the host's memory
    keeps up). The pool caps the copy at this rate (zfbench.sims.fluid `node_rates`) and
    counts `DRAM_BYTES_PER_BYTE` of DRAM per byte."""
    return CORE_STREAM_BYTES_PER_S / STAGING_BYTES_PER_BYTE * numa_factor
