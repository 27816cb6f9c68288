"""DeepSpeed's overlapped ZenFlow window end on a GPU: its one blocking, converting copy.

One concept: with `overlap_step`, DeepSpeed 0.19.5 ends each update window (from the
second on) by waiting for its optimizer process, then copying the whole fp32 master
snapshot from host memory into the 16-bit weights on the GPU with one blocking `copy_`
on the training process's main thread. PyTorch runs that copy as a conversion on the
host into a fresh pageable 16-bit temporary (the training process's threads), then a
pageable host-to-device copy the driver stages (zfbench.sims.pageable). The device waits
for both. `window_copy(sim, t)` runs it on a `RankSim` (zfbench.sims.zenflow_zero2, the
shipped data path); `parts_s` is its closed form where nothing else runs. Sources, file
and lines, beside the constants below. The fresh temporary's pages are faulted in at
its first touch, every window end (`fresh_page_s`): its bytes at the host's measured
`fresh_page_bytes_per_s` (a profile's probe, zfbench.real.rate_probe FRESH_PAGE_KEY, or a
hardware file's), none where no rate was measured (presets, older profiles). Not
modelled: the optimizer process's fp32 snapshot memcpy (overlapped with compute on the
optimizer's cores). The CPU-emulated accelerator keeps its
own boundary copy (zfbench.sims.strategies `apply_update`); from presets, DeepSpeed's CPU
accelerator (a host memcpy there) takes this path, its staging cap an approximation.
"""

from __future__ import annotations

from zfbench.core.config_zenflow import split_cores
from zfbench.sims import host_traffic
from zfbench.sims.fluid import Job
from zfbench.sims.host_step import CONVERT_BYTES_PER_ELEM
from zfbench.sims.lanes import all_done

# Sources (read for issues 44/45, 2026-11-28):
# - DeepSpeed v0.19.5, deepspeed/runtime/zenflow/zenflow_stage_1_and_2.py:
#   `ZenFlowZeroOptimizerParallel.wait_last_update_and_copy` (lines 682-726): skipped at
#   the first window after warm-up (`first_update_round_after_warmup`), else
#   `_wait_for_optimizer_process()` then, per parameter group, under
#   `optimizer_transmit_time`, `bit16_partitions[partition_id].data.copy_(fp32_partition)`
#   with `fp32_partition = ...['params'][0].stale_param.data` (whole partition, blocking:
#   no `non_blocking`), then the all-gather. `step` (lines 750-793) calls it at every
#   accumulation boundary, and engine.py (lines 65-70, 93-113) sets
#   gradient_accumulation_steps = update_interval: once a window.
# - The snapshot's memory: zenflow_utils.py `start_optimizer_process` (lines 138-190):
#   `param.stale_param = torch.zeros_like(param.data, ...)` then `.share_memory_()`:
#   shared memory, never page-locked, whatever `offload_optimizer.pin_memory` says
#   (offload_config.py line 75, default True, governs the fp32 master and gradient
#   buffers: stage_1_and_2.py lines 488-504, zenflow_stage_1_and_2.py line 612). The
#   optimizer process fills it, slice by slice after Adam (csrc/adam/cpu_adam_impl.cpp
#   lines 593-610, `std::memcpy(sp + ..., pp + ..., ...)`). The training process runs on
#   ceil(pt_reserved_cores_perc x cores) cores after the split (zenflow_utils.py
#   `_split_affinity`, lines 73-81; `start_optimizer_process`'s `cpu_affinity(pt_affinity)`).
# - PyTorch (main as stored, commit 007aa8ae; the tag of the H200 run's torch 2.11 was not
#   read, judged the same: this branch is long-standing), aten/src/ATen/native/cuda/Copy.cu
#   `copy_kernel_cuda`: a CPU -> CUDA copy that changes dtype needs temporaries
#   (`copy_requires_temporaries`: same dtype and contiguous is the only direct case); with
#   `non_blocking` false the conversion device is the CPU ("For blocking transfers
#   conversions are performed on CPU to avoid allocating extra GPU memory"), so
#   `src.to(dst dtype)` runs on the host (aten/src/ATen/native/cpu/CopyKernel.cpp, split
#   over the process's intra-op threads by TensorIterator) into a new CPU tensor
#   (TensorConversions.cpp `_to_copy`: `pin_out` only for non-blocking copies out of
#   CUDA, so pageable), then a same-dtype copy of it: `at::cuda::memcpy_and_sync`, a
#   `cudaMemcpyAsync` from pageable memory and a stream synchronisation. fp32 weights need
#   no temporary: the same pageable memcpy_and_sync of 4 bytes an element.

# The training side's streaming rate per core (judgment): the bytes per second the host's
# CPU-Adam streams per core (zfbench.sims.host_traffic `lane_stream_bytes_per_s`), the rate
# predict's fit measured for the host's lane; DeepSpeed's split gives the training process
# as many cores as its optimizer process at the default pt_reserved_cores_perc 0.5.


def training_cores(costs) -> float:
    """Cores the training process's conversion runs on: DeepSpeed's training share of the
    rank's cores (`split_cores`) where ZenFlow's cores are pinned from presets, else as many
    as the rank's host lane (the default 0.5 split: equal halves)."""
    if costs.zenflow_pinned:
        rank = costs.node.host.cores / costs.gpus_per_node
        return float(split_cores(int(rank), costs.settings.zenflow.pt_reserved_cores_perc)[0])
    return costs.cores_per_rank


def convert_units_per_core_s(costs) -> float:
    """Elements per second per host-lane core of the conversion, scaled so that the host
    lane's `cores_per_rank` cores give `training_cores` cores' rate."""
    per_core = host_traffic.lane_stream_bytes_per_s(costs.adam_units_per_core_s)
    return per_core / CONVERT_BYTES_PER_ELEM * training_cores(costs) / costs.cores_per_rank


def converts(costs) -> bool:
    """Whether the copy converts (16-bit weights from the fp32 snapshot)."""
    return costs.elem_bytes != 4


def fresh_page_s(costs) -> float:
    """Seconds the conversion's fresh 16-bit temporary takes to be faulted in (PyTorch's
    CPU allocator maps it anew each time: zfbench.real.rate_probe `fresh_page_seconds`):
    its bytes at the host's `fresh_page_bytes_per_s`, measured on the probe's threads and
    taken as it is (not scaled to the training cores); 0 where no rate was measured or
    nothing is converted."""
    rate = costs.node.host.fresh_page_bytes_per_s
    if rate is None or not converts(costs):
        return 0.0
    return costs.share(costs.params) * costs.elem_bytes / rate


def parts_s(costs) -> tuple[float, float]:
    """(conversion, upload) seconds of one window end with nothing else running: the fp32
    partition converted at the training cores' streaming rate (capped by DRAM) into a
    fresh temporary (`fresh_page_s`), then its 16-bit bytes up at the lesser of the link's
    rate and the staging copy's."""
    elems = costs.share(costs.params)
    convert = 0.0
    if converts(costs):
        rate = min(costs.cores_per_rank * convert_units_per_core_s(costs),
                   costs.node.host.dram_bytes_per_s / CONVERT_BYTES_PER_ELEM)
        convert = elems / rate + fresh_page_s(costs)
    up = elems * costs.elem_bytes / min(costs.node.link.h2d_bytes_per_s,
                                        costs.pageable_copy_bytes_per_s)
    return convert, up + costs.node.link.setup_latency_s


def window_copy(sim, step: int):
    """The window end's copy on `sim` (a `RankSim`): the conversion on the host lane (the
    training process's threads; the compute lane waits for it), its fresh temporary's
    faults first (a fixed time: kernel work, not shared DRAM streaming), then the pageable
    copy up, then, with several GPUs, the all-gather; the device waits for all of it."""
    c = sim.costs
    elems = c.share(c.params)
    ready = []
    if converts(c):
        ready = [sim.host.submit("host_convert", step, [], seconds=fresh_page_s(c), job=Job(
            "host", sim.rank, elems, CONVERT_BYTES_PER_ELEM, convert_units_per_core_s(c)))]
    up = sim.transfer(sim.h2d, "h2d_param", step, elems * c.elem_bytes, ready,
                      pageable_buffer=True)
    yield from all_done(sim.env, [sim.gather_when_ready(step, c.model_bytes, up) or up])
