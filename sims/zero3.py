"""What ZeRO-3 moves and holds: bytes, collectives, NVMe traffic, memory.

This module owns the cost arithmetic of `zero-infinity` (DeepSpeed's ZeRO-3 with
parameters and optimizer state offloaded, Rajbhandari et al. 2021, "ZeRO-Infinity") and
of ZenFlow on ZeRO-3 (`zenflow_*`; its schedule: zfbench.sims.zenflow_zero3), over `CostModel`:

- parameters are partitioned: each rank owns 1/N of every bucket as 16-bit values on the
  host (or NVMe), copies its share up and the ranks all-gather the bucket
  (bandwidth-centric partitioning: every rank's link carries 1/N), once for forward and
  once for backward: 2 x P x b / N bytes up per rank per step;
- each bucket's gradient is reduce-scattered as backward produces it and the rank's share
  goes down (`grad_share_bytes`: fp32 from presets), for the host AdamW; nothing goes up
  at the end of a step, the next step's fetches read the host copy;
- on NVMe (`offload_params="nvme"`, or the optimizer state alone) a fetch first reads the
  share from NVMe, and the host update reads the fp32 state and gradient and writes them
  back with the new 16-bit parameters where those live there (`state_read_bytes`,
  `state_write_bytes`, `grad_swap_bytes`);
- the two placements are separate settings, as DeepSpeed's `offload_param` and
  `offload_optimizer` are (ZeRO-Infinity section 5): `offload_params="none"` keeps each
  rank's 16-bit partition on its GPU (a fetch is the all-gather alone, the new share goes
  up after the update); `SimSettings.optimizer_placement` places the state.

All functions take a `CostModel` and return per-rank quantities unless they say node.
"""

from __future__ import annotations

from zfbench.core.memory_model import FP32_BYTES, HOST_GRAD_BUFFERS, HOST_OPTIMIZER_STATE_BYTES
from zfbench.sims import device_memory

# The fp32 optimizer state per parameter, master weights, momentum and variance, is the
# memory model's HOST_OPTIMIZER_STATE_BYTES (12 B: mixed-precision Adam's K = 12 in
# Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
# Models", section 3.1), the same number the engine's estimate and zero-offload use.
# DeepSpeed's CPU-offloaded ZeRO keeps an fp32 copy of each gradient share for the host
# optimizer: one fp32 gradient buffer per parameter, as the memory model counts zero-offload
# (on NVMe instead where the optimizer state is: `GRAD_SWAP_BYTES_PER_PARAM`).
HOST_GRAD_BYTES_PER_PARAM = HOST_GRAD_BUFFERS["zero-offload"] * FP32_BYTES
# The fp32 gradient swapped out to NVMe with the optimizer state (DeepSpeed's optimizer
# swapper holds gradients in the optimizer's dtype, fp32).
GRAD_SWAP_BYTES_PER_PARAM = FP32_BYTES


def share_bytes(c, i: int) -> int:
    """Bytes of the rank's share of bucket i's 16-bit parameters (or gradient): what one
    fetch moves up, and one gradient down, rounded as a transfer is."""
    return int(round(c.share(c.buckets[i].numel) * c.elem_bytes))


def grad_share_bytes(c, i: int) -> int:
    """Bytes of the rank's share of bucket i's gradient on its way down: fp32 from presets
    (converted on the device before the copy), the 16-bit dtype with a measured profile
    (`CostModel.grad_wire_bytes`). The DeepSpeed ZeRO-Infinity ran converts it on the
    device first (stage3.py's `partition_previous_reduced_grads`, 2021: with the state on
    the host `async_inplace_copy_grad_to_fp32_buffer_from_gpu`, `param.grad.float()` then
    the copy into the fp32 gradient; with the state on NVMe `param.grad.float()` handed to
    the optimizer swapper)."""
    return int(round(c.share(c.buckets[i].numel) * c.grad_wire_bytes))


def grad_swap_bytes(c, i: int) -> float:
    """NVMe bytes of the rank's fp32 gradient share of bucket i: written once it is down
    and read back before its update where the optimizer state is on NVMe (0 elsewhere):
    `swap_out_gradients` writes it, and `swap_in_optimizer_state` swaps in the sub-group's
    gradients with the state after flushing the gradient writes, so the host then holds no
    fp32 gradient buffer for the model (only, with gradient accumulation, the 16-bit sums:
    zfbench.sims.zero_infinity)."""
    if not state_on_nvme(c):
        return 0.0
    return c.share(c.buckets[i].numel) * GRAD_SWAP_BYTES_PER_PARAM


def checkpoint_bytes(c, i: int) -> int:
    """Bytes of bucket i's activation checkpoint that go to the host and back with
    `offload_activations`: a decoder layer's input (micro-batch x seq x hidden in the
    activations' dtype, DeepSpeed checkpointing the layer's input), none otherwise."""
    s = c.settings
    if not s.infinity.offload_activations or c.buckets[i].kind != "decoder":
        return 0
    return s.scenario.micro_batch * s.scenario.seq * c.shape.hidden * c.elem_bytes


def bucket_bytes(c, i: int) -> float:
    """Bytes of bucket i's whole 16-bit parameters: what an all-gather assembles and a
    reduce-scatter reduces."""
    return c.buckets[i].numel * c.elem_bytes


# The span op of a reduce-scatter (ZeRO-3's buckets, ZeRO-2's partitions).
REDUCE_SCATTER_OP = "reduce_scatter"


def reduce_scatter_s(c, nbytes: float) -> float:
    """A ring reduce-scatter of `nbytes`: each rank sends (n-1)/n of them, as an
    all-gather does (NCCL busbw convention, nccl-tests doc/PERFORMANCE.md)."""
    return c.allgather_s(nbytes)


def uses_nvme(c) -> bool:
    """Whether the parameters live on NVMe (each fetch reads them first)."""
    return c.settings.infinity.offload_params == "nvme"


def state_on_nvme(c) -> bool:
    """Whether the optimizer state lives on NVMe (the host update reads and writes it)."""
    return c.settings.infinity.optimizer_placement == "nvme"


def params_on_device(c) -> bool:
    """Whether each rank's 16-bit partition stays on its GPU (nothing is fetched from the
    host; the updated share goes up after the host update)."""
    return c.settings.infinity.offload_params == "none"


def any_nvme(c) -> bool:
    """Whether anything (parameters or optimizer state) lives on NVMe."""
    return uses_nvme(c) or state_on_nvme(c)


def state_read_bytes(c, i: int) -> float:
    """NVMe bytes the host update of bucket i reads first: the fp32 state of the share and
    its fp32 gradient (swapped out after it came down)."""
    return c.share(c.buckets[i].numel) * HOST_OPTIMIZER_STATE_BYTES + grad_swap_bytes(c, i)


def state_write_bytes(c, i: int) -> float:
    """NVMe bytes the host update of bucket i writes back: the fp32 state where it lives
    on NVMe, and the new 16-bit parameters where they do (0: nothing on NVMe)."""
    state = HOST_OPTIMIZER_STATE_BYTES if state_on_nvme(c) else 0.0
    params = c.elem_bytes if uses_nvme(c) else 0.0
    return c.share(c.buckets[i].numel) * (state + params)


def bytes_per_step(c) -> dict[str, float]:
    """Bytes one rank moves per step, by resource (the schedule moves exactly these), a
    step being `grad_accum` micro-steps A."""
    nb, accum = len(c.buckets), c.settings.scenario.grad_accum
    share = sum(share_bytes(c, i) for i in range(nb))
    # fetched up twice (forward, backward) each micro-step; kept on the GPU, the new share
    # goes up once; with accumulation A - 1 16-bit sums come up and go down
    up = share if params_on_device(c) else 2 * accum * share
    down = sum(grad_share_bytes(c, i) for i in range(nb))
    checkpoints = accum * sum(checkpoint_bytes(c, i) for i in range(nb))  # down and up
    out = {"h2d": up + (accum - 1) * share + checkpoints,
           "d2h": down + (accum - 1) * share + checkpoints,
           "nvme_read": 0.0, "nvme_write": 0.0, "allgather": 0.0, "reduce_scatter": 0.0}
    if c.gpus > 1:
        whole = sum(bucket_bytes(c, i) for i in range(nb))
        out["allgather"], out["reduce_scatter"] = 2 * accum * whole, accum * whole
    if uses_nvme(c):
        out["nvme_read"] = 2 * accum * share
    if state_on_nvme(c):
        out["nvme_read"] += sum(int(round(state_read_bytes(c, i))) for i in range(nb))
    out["nvme_write"] = sum(int(round(state_write_bytes(c, i))) + int(round(grad_swap_bytes(c, i)))
                            for i in range(nb))
    return out


def nvme_busy_s_per_step(c) -> float:
    """Seconds the node's drive array is busy per step with every rank's NVMe traffic, at
    the sharing rule of sims/nvme.py: a lower bound on the step time with nvme."""
    if not any_nvme(c):
        return 0.0
    drive, moved = c.settings.machine.nvme_drive(), bytes_per_step(c)
    per_rank = (moved["nvme_read"] / drive.read_bytes_per_s
                + moved["nvme_write"] / drive.write_bytes_per_s)
    return c.gpus_per_node * per_rank / c.settings.machine.nvme_drives  # the node's own drives


def memory(c) -> dict[str, float]:
    """Device bytes per rank, host bytes and NVMe bytes for one node (of `c.nodes`).

    Device: DeepSpeed's ZeRO-3 working set (the module computing, `prefetch_buckets`
    layers fetched ahead up to its live-parameter cap, the reduce bucket:
    `device_memory.zero3_device_bytes`), the activations (with `offload_activations`
    one layer's checkpoint, the rest on the host), and with parameters kept on the GPUs
    the rank's 16-bit partition. Host: an fp32 gradient per parameter (on NVMe where the
    state is), with gradient accumulation the 16-bit sums (`grads_in_partition`), the
    offloaded checkpoints, and the 16-bit parameters and the fp32 state where they are
    not on the GPUs or NVMe (the pinned staging buffers, a few buckets per rank, are left
    out)."""
    p, b = c.params, c.elem_bytes
    largest = max(bk.numel for bk in c.buckets)
    # offloaded activation checkpoints live on the host, but for the one being recomputed
    checkpoints = [checkpoint_bytes(c, i) for i in range(len(c.buckets))]
    offloaded = sum(checkpoints) - max(checkpoints)
    inf = c.settings.infinity
    device = device_memory.zero3_device_bytes(c.shape, largest, inf.prefetch_buckets, b,
                                              c.activation_bytes() - offloaded, inf.tiling)
    host = 0.0 if state_on_nvme(c) else p * HOST_GRAD_BYTES_PER_PARAM
    host += sum(checkpoints) * c.gpus  # every rank's (a node's part taken below)
    if c.settings.scenario.grad_accum > 1:
        host += p * b
    nvme = p * GRAD_SWAP_BYTES_PER_PARAM if state_on_nvme(c) else 0.0
    params, state = p * b, p * HOST_OPTIMIZER_STATE_BYTES
    if params_on_device(c):
        device += c.share(params)
    elif uses_nvme(c):
        nvme += params
    else:
        host += params
    if state_on_nvme(c):
        nvme += state
    else:
        host += state
    return {"device_bytes_per_rank": device, "host_bytes": c.per_node(host),
            "nvme_bytes": c.per_node(nvme)}


# -- ZenFlow on ZeRO-3 (zero_stage 3: zfbench.sims.zenflow_zero3) ------------------------
# Copies of each selected element of the rank's partition on its GPU, each in the
# parameters' 16-bit dtype: Adam's m and v (`torch.zeros_like(selected_param)`), the
# selected gradient (`selected_grad`, a clone) and the selected parameters' copy taken at
# the boundary (`temp_selected_param`): DeepSpeed's `ZenFlowSelectiveAdamW_stage3`
# (deepspeed/ops/adam/zenflow_torch_adam.py) and engine_stage3.py
# `_process_selected_fp32_groups_grad`.
ZENFLOW_SELECTED_COPIES = 4


def zenflow_unselected_share(c, i: int) -> float:
    """Elements of the rank's partition of bucket i that are not selected: what goes down
    every step and up at a boundary (`transfers` full: the whole share)."""
    b = c.buckets[i]
    if c.settings.measurement.transfers == "full":
        return c.share(b.numel)
    return c.share(b.numel - b.selected_numel)


def zenflow_down_bytes(c, i: int, warm_up: bool = False) -> int:
    """Bytes of bucket i's gradient share the rank sends down in a step, rounded as a
    transfer is: the unselected share in 16 bits; in a warm-up step the whole share as
    ZeRO-Offload sends it (`CostModel.grad_wire_bytes`: fp32 from presets)."""
    if warm_up:
        return int(round(c.share(c.buckets[i].numel) * c.grad_wire_bytes))
    return int(round(zenflow_unselected_share(c, i) * c.elem_bytes))


def zenflow_up_bytes(c, i: int, warm_up: bool = False) -> int:
    """Bytes of bucket i's new parameters the rank uploads into its GPU partition at a
    boundary: the unselected share (the whole share in a warm-up step)."""
    numel = c.share(c.buckets[i].numel) if warm_up else zenflow_unselected_share(c, i)
    return int(round(numel * c.elem_bytes))


def zenflow_score_bytes(c) -> int:
    """Bytes of the column scores the ranks all-gather at a selection: every 2-D
    parameter's columns, each rank scoring those of its partition, in the 16-bit dtype
    (engine_stage3.py `update_selected_channels`, its `grad_sum_buffer`)."""
    return sum(m.cols for m in c.shape.matrices()) * c.elem_bytes


def zenflow_bytes_per_step(c, boundary: bool, selection: bool = False,
                           warm_up: bool = False) -> dict[str, float]:
    """Bytes one rank moves in one step of ZenFlow on ZeRO-3 (the schedule moves exactly
    these): every block all-gathered twice (forward, backward) and its gradient
    reduce-scattered once (bytes assembled, as the spans count them; none on one GPU),
    the gradient share down, at a `boundary` the new parameters up; at a `selection` step
    the column scores all-gathered too."""
    nb = len(c.buckets)
    whole = sum(bucket_bytes(c, i) for i in range(nb))
    multi = c.gpus > 1
    out = {"d2h": float(sum(zenflow_down_bytes(c, i, warm_up) for i in range(nb))),
           "h2d": float(sum(zenflow_up_bytes(c, i, warm_up) for i in range(nb))
                        if boundary or warm_up else 0),
           "allgather": 2 * whole if multi else 0.0,
           "reduce_scatter": float(whole) if multi else 0.0}
    if selection and multi and not warm_up:
        out["allgather"] += zenflow_score_bytes(c)
    return out


def zenflow_device_bytes(c) -> float:
    """Device bytes per rank of ZenFlow on ZeRO-3 as DeepSpeed allocates it: ZeRO-3's
    working set (`device_memory.zero3_device_bytes`: the gathered module, the prefetched
    blocks, the reduce bucket, a module's gradient; with the activations), the rank's
    16-bit partition (P/N x b: ZenFlow offloads the optimizer, not the parameters) and the
    selected columns' state of that partition (`ZENFLOW_SELECTED_COPIES` x b per selected
    element: m, v, the selected gradient and parameters' copy)."""
    s, b = c.settings, c.elem_bytes
    largest = max(bk.numel for bk in c.buckets)
    working = device_memory.zero3_device_bytes(c.shape, largest, s.infinity.prefetch_buckets, b,
                                               c.activation_bytes(), s.infinity.tiling)
    return (working + c.share(c.params) * b
            + c.share(c.selected_params) * ZENFLOW_SELECTED_COPIES * b)
