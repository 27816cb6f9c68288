"""The host's optimizer step on a GPU node: its threads, their sockets, and the rates
that only a measurement can give.

One concept: how fast a rank's host-side optimizer work (DeepSpeed's CPU-Adam over the
rank's partition, the host gradient accumulation) runs on a GPU node, given the cores
the rank's threads run on and where its memory lives, and in what order DeepSpeed's
ZeRO-2 offload step runs it (`deepspeed_update`, called by `sims/strategies.py`). It
applies where no profile was measured (`CostModel.calibration is None`); a profile
measures these rates on the very machine, and this module leaves them alone.

It owns: the NUMA model of core binding (`remote_share`, `numa_factor`,
`REMOTE_DRAM_RATE`); the streaming passes beside CPU-Adam (clip, 16-bit conversion) and
host accumulation's own per-core rate (`ACCUM_ELEMS_PER_CORE_S`); how a host preset's
CPU-Adam rate is derived from one published measurement (`calibrated_adam_rate`,
`CALIBRATION_ROWS`, checked by tests/test_host_step.py); the order of DeepSpeed's
offload step today (`deepspeed_update`: clip, CPU-Adam, blocking conversion, one upload)
and DeepSpeed 0.3-0.8's fused fp16 upload (`fused_update`, `SimSettings.fused_param_upload`).
Each function's docstring gives its DeepSpeed source lines.
"""

from __future__ import annotations

# Cross-socket DRAM streaming rate over a local stream (judgment: two-socket x86 servers
# commonly stream about half to two thirds of local bandwidth from the other socket's
# memory, over UPI / Infinity Fabric links; 0.6 taken; no measurement in the dataset sets it).
REMOTE_DRAM_RATE = 0.6
# Host gradient accumulation, elements per second per core (judgment: one core streams
# ~10 GB/s, i.e. ~0.9 G elements/s at ~10 B per element; the value is the earlier
# 30 x 29.5 M/s, unchanged, now independent of the host's Adam rate). Accumulation is
# memory-bound streaming (one fused multiply-add per element over ~10 B of DRAM traffic),
# not CPU-Adam's arithmetic, so its rate is not a multiple of the host's Adam rate. DRAM
# bandwidth still caps the sum through the fluid pool.
ACCUM_ELEMS_PER_CORE_S = 30.0 * 29.5e6
# Bytes per element of the host's passes beside Adam (stage_1_and_2.py, `deepspeed_update`):
# unscale/clip reads and writes the fp32 gradient (mul_ in place); the conversion reads the
# fp32 master and writes the 16-bit copy.
CLIP_BYTES_PER_ELEM = 8.0
CONVERT_BYTES_PER_ELEM = 6.0
# Bytes per element of a ZeRO-Offload gradient on the link: fp32 (twice the 16-bit
# gradient's bytes, for ZeRO-Offload and its delayed update alike: they share
# `copy_grads_in_partition`), as
# `async_inplace_copy_grad_to_fp32_buffer_from_gpu` in DeepSpeed's stage_1_and_2.py sends
# it (`src_tensor.float()` on the device, then `dest_tensor.copy_(src_tensor)` into the
# host's fp32 gradient partition), unless fp16_master_weights_and_gradients is set.
GRAD_WIRE_BYTES = 4.0
# The fused upload (`fused_update`): elements per tile, csrc/includes/cpu_adam.h of
# DeepSpeed 0.3 (`#define TILE (1024 * 1024 * 1024)`); bytes per element on the link, the
# fp32 tile buffer that `launch_param_update` reads (the device converts to fp16).
FUSED_TILE_ELEMS = 1024 ** 3
FUSED_WIRE_BYTES = 4.0
# One core's streaming rate in bytes/s, the judgment behind ACCUM_ELEMS_PER_CORE_S (~10 B
# per accumulated element): a pass of b bytes per element runs at this / b elements/s.
CORE_STREAM_BYTES_PER_S = ACCUM_ELEMS_PER_CORE_S * 10.0
# The rows of the bundled published dataset that set a constant, and which:
# row id -> (host preset, field). `python -m zfbench.validate --published` marks them.
CALIBRATION_ROWS = {
    "zo-table4-cpuadam-10b": ("xeon-8168", "adam_params_per_s_per_core"),
    "zf-blog-fig3-llama7b-adam": ("epyc-7763-milan", "adam_params_per_s_per_core"),
}


def remote_share(sockets: int, cores_per_socket: float, cores_per_rank: float,
                 bound: bool) -> float:
    """Share of a rank's host memory traffic that crosses sockets.

    DeepSpeed's launcher binds each rank's threads to its own cores only with
    `--bind_cores_to_rank` (off by default); then a rank whose cores fit in one socket
    touches only that socket's memory (numactl's local allocation), and bound cores past
    one socket's put their threads' share of the rank's traffic on the other socket.
    Unbound, each rank's OpenMP threads run on every socket of the node while its pinned
    buffers live where they were first touched: (sockets - 1) / sockets of its traffic
    crosses the socket link, at `REMOTE_DRAM_RATE` of a local stream (`numa_factor`). The
    DeepSpeed core-binding blog measured binding to take Qwen2.5-3B ZeRO-Offload on 2 x
    A100 from 2.887 to 2.497 s, DeepSpeed PR #7474 from 3.084 to 2.383 s: this is the
    mechanism named there, the ranks' threads contending across the node's cores."""
    if sockets <= 1:
        return 0.0
    if bound:  # its threads past one socket's cores reach back to the home socket
        return max(0.0, cores_per_rank - cores_per_socket) / cores_per_rank
    return (sockets - 1) / sockets


def numa_factor(sockets: int, cores_per_socket: float, cores_per_rank: float,
                bound: bool) -> float:
    """A rank's host work rate over its all-local rate: 1 / ((1 - f) + f /
    REMOTE_DRAM_RATE), f the remote share."""
    f = remote_share(sockets, cores_per_socket, cores_per_rank, bound)
    return 1.0 / ((1.0 - f) + f / REMOTE_DRAM_RATE)


def stream_units_per_core_s(bytes_per_elem: float) -> float:
    """Elements per second one core streams through a pass of `bytes_per_elem` (local)."""
    return CORE_STREAM_BYTES_PER_S / bytes_per_elem


def streaming_pass_s(elems: float, bytes_per_elem: float, cores_per_rank: float,
                     factor: float, dram_bytes_per_s: float, ranks_on_node: int) -> float:
    """Seconds of one rank's streaming pass over `elems` elements while every rank of the
    node runs the same pass and nothing else touches DRAM: the fluid pool's host rate
    (zfbench.sims.fluid.node_rates), its cores at `factor` or its share of DRAM."""
    rate = min(cores_per_rank * stream_units_per_core_s(bytes_per_elem) * factor,
               dram_bytes_per_s / ranks_on_node / bytes_per_elem)
    return elems / rate


def beside_adam_s(elems: float, cores_per_rank: float, factor: float,
                  dram_bytes_per_s: float, ranks_on_node: int) -> float:
    """Seconds of DeepSpeed's clip and conversion passes over a rank's partition of
    `elems` elements (`deepspeed_update`), every rank at once."""
    return sum(streaming_pass_s(elems, b, cores_per_rank, factor, dram_bytes_per_s,
                                ranks_on_node)
               for b in (CLIP_BYTES_PER_ELEM, CONVERT_BYTES_PER_ELEM))


def calibrated_adam_rate(params: float, seconds: float, cores_per_rank: float,
                         factor: float, other_s: float = 0.0) -> float:
    """Local CPU-Adam parameters per second per core from one measured optimizer step of
    `params` parameters per rank in `seconds`, of which `other_s` is host work beside Adam
    (`beside_adam_s` where the measurement covers the whole host step), the rank on
    `cores_per_rank` cores whose `numa_factor` was `factor` (all ranks updating at the same
    time, each on its cores).

    How many parameters per second one core updates in DeepSpeed's CPU-Adam is not a
    datasheet number (SIMD width, all-core clock, memory system), so a host preset's
    `adam_params_per_s_per_core` is taken from one published measurement of that host
    (its local rate: the measured rate over the measurement's own `numa_factor`); that
    row is a calibration row of `validate --published` (`CALIBRATION_ROWS`: marked, left
    out of the error), and tests/test_host_step.py checks the presets hold what this gives.
    The ZenFlow blog's Figure 3 "CPU parameter update 4600 ms" covers the host's whole
    step, clip + CPU-Adam + conversion (judgment: the figure shows the GPU idle from the
    gradients' arrival to the parameters' upload, 500 ms, with no other host phase), so
    its row measures `host_step_time_s` and the two streaming passes' seconds
    (`streaming_pass_s`, every rank of the node at once) are `other_s`. Table 4 of the
    ZeRO-Offload paper times CPU-Adam alone (a microbenchmark): nothing is taken out of
    its 2.57 s."""
    return params / ((seconds - other_s) * cores_per_rank * factor)


def fused_tiles(elems: float) -> list[float]:
    """The tiles, in elements, that the fused CPU-Adam walks a partition of `elems` in."""
    whole, rest = divmod(float(elems), FUSED_TILE_ELEMS)
    return [float(FUSED_TILE_ELEMS)] * int(whole) + ([rest] if rest > 0 else [])


def clip_adam_convert(sim, step: int, elems: float, deps):
    """DeepSpeed's host passes over `elems` elements of the rank's partition, one after
    the other on its host lane (`deepspeed_update`): unscale/clip, CPU-Adam, the fp32 master
    into 16 bits; returns the Adam event (the gradient is consumed) and the conversion's
    (the 16-bit parameters are ready). ZeRO-2's offload step runs them over the whole
    partition, ZeRO-3's (zfbench.sims.zero_infinity) bucket by bucket."""
    clip = sim.host_work("host_clip", step, elems, deps)
    adam = sim.host_work("host_optim", step, elems, [clip])
    return adam, sim.host_work("host_convert", step, elems, [adam])


def deepspeed_update(sim, step: int, deps):
    """DeepSpeed's ZeRO-2 offload step on the host of `sim` (a `RankSim`): unscale/clip over the rank's fp32 gradient partition, CPU-Adam over all of
    it, the fp32 master into the 16-bit pinned buffer, then the partition up in one copy
    and the all-gather (or, with `fused_param_upload`, `fused_update`); returns the event
    of the gather (or upload) and, per bucket, the Adam event (the host is done with the
    gradient there).

    With the optimizer offloaded, DeepSpeed's ZeRO-2 `step()` (deepspeedai/DeepSpeed,
    stage_1_and_2.py, the `cpu_offload` branch) runs, per parameter group, over the
    rank's whole partition one after the other: `unscale_and_clip_grads`
    (`grad.data.mul_(1 / combined_scale)` over the fp32 gradient: every step, also at
    loss scale 1), `_optimizer_step` (CPU-Adam; its `fp16_param_groups` path that writes
    the 16-bit copy inside Adam is commented out there, "Disabled, this is not currently
    working"), `bit16_partition_buffer.data.copy_(fp32_partition.data)` (on the CPU,
    blocking), only then one non-blocking copy of that buffer up, and the all-gather
    after every group. So the conversion does not overlap Adam and nothing goes up before
    the whole partition is updated. Gradients cost the host no conversion on arrival:
    `async_inplace_copy_grad_to_fp32_buffer_from_gpu` converts on the device
    (`src_tensor.float()`), so each crosses PCIe as fp32 (`GRAD_WIRE_BYTES`). The clip and
    the conversion are streaming passes (`CLIP_BYTES_PER_ELEM`, `CONVERT_BYTES_PER_ELEM`)
    at host accumulation's per-core streaming rate, capped by DRAM like every host job."""
    c = sim.costs
    part = c.share(c.params)
    if c.settings.runtime.fused_param_upload:
        return fused_update(sim, step, part, sim.host_work("host_clip", step, part, deps))
    adam, convert = clip_adam_convert(sim, step, part, deps)
    up = sim.transfer(sim.h2d, "h2d_param", step, part * c.elem_bytes, [convert])
    landed = sim.gather_when_ready(step, c.model_bytes, up) or up
    return landed, dict.fromkeys(range(sim.nb), adam)


def fused_update(sim, step: int, part: float, clip):
    """DeepSpeed 0.3 to 0.8's fp16 CPU-Adam: tile by tile, each tile's
    fp32 parameters up (converted on the device) while the next tile's Adam runs, a
    tile's buffer reused two tiles later; the all-gather after the last.

    From ZeRO-Offload's release (deepspeedai/DeepSpeed PRs #365 and #367, September 2020)
    until PR #3097 ("Disable Stage 1&2 CPUAdam pathways", March 2023), ZeRO-2's offload
    step called `optimizer.step(fp16_param_groups=...)` with fp16 weights: the C++ CPU-Adam
    (csrc/adam/cpu_adam.cpp, `Adam_Optimizer::Step`) walks the partition in tiles of
    `FUSED_TILE_ELEMS`, writes each tile's new fp32 parameters into one of two pinned
    buffers and launches `launch_param_update` (a device kernel that reads that buffer over
    PCIe and writes the fp16 weights) on a stream before the next tile. So there is no host
    conversion pass and the wire carries fp32 (`FUSED_WIRE_BYTES`). The ZeRO-Offload
    paper's rows (fp16, 2020) ran this path; DeepSpeed today (and bf16 always) runs
    `deepspeed_update`'s blocking conversion."""
    adam, ups = clip, []
    for k, elems in enumerate(fused_tiles(part)):
        reuse = [ups[k - 2]] if k >= 2 else []  # its buffer's previous tile is up
        adam = sim.host_work("host_optim", step, elems, [adam] + reuse)
        ups.append(sim.transfer(sim.h2d, "h2d_param", step, elems * FUSED_WIRE_BYTES, [adam]))
    landed = sim.gather_when_ready(step, sim.costs.model_bytes, ups[-1]) or ups[-1]
    return landed, dict.fromkeys(range(sim.nb), adam)
