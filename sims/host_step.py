"""The host's optimizer step on a GPU node: its threads, their sockets, and the rates
that only a measurement can give.

One concept: how fast a rank's host-side optimizer work (DeepSpeed's CPU-Adam over the
rank's partition, the host gradient accumulation) runs on a GPU node, given the cores
the rank's threads run on and where its memory lives. It applies where no profile was
measured (`CostModel.calibration is None`); a profile measures these rates on the very
machine, and this module leaves them alone.

Core binding and sockets. DeepSpeed's launcher binds each rank's threads to its own
cores only with `--bind_cores_to_rank` (off by default); then a rank whose cores fit in
one socket touches only that socket's memory (numactl's local allocation); bound cores past one
socket's put their threads' share of the rank's traffic on the other socket. Unbound, each
rank's OpenMP threads are scheduled on any core of the node, so a rank's threads run on
every socket while its pinned buffers live where they were first touched: of its memory
traffic the share (sockets - 1) / sockets crosses the socket link. Cross-socket traffic streams at
`REMOTE_DRAM_RATE` of a local stream, so the rank's host work runs at
`numa_factor` = 1 / ((1 - f) + f / REMOTE_DRAM_RATE) of its local rate, f the remote share.
(The DeepSpeed core-binding blog measured binding to take Qwen2.5-3B ZeRO-Offload on 2 x
A100 from 2.887 to 2.497 s; DeepSpeed PR #7474 from 3.084 to 2.383 s: this is the
mechanism named there, threads of the ranks contending across the node's cores.)

Achieved CPU-Adam rates. How many parameters per second one core of a given CPU updates
in DeepSpeed's CPU-Adam is not a number a datasheet gives: it depends on the SIMD width,
the clock under all-core load and the memory system. A preset's
`adam_params_per_s_per_core` is therefore taken from one published measurement of that
host (its local rate: the measured rate divided by the measurement's own `numa_factor`),
and that measurement is a calibration row of `python -m zfbench.validate --published`:
`CALIBRATION_ROWS` names it, validate marks it and leaves it out of the error.
`calibrated_adam_rate` is the arithmetic, and tests/test_host_step.py checks that the
presets hold exactly what it gives for their rows.

Host gradient accumulation is memory-bound streaming (one fused multiply-add per element
over ~10 B of DRAM traffic), not CPU-Adam's arithmetic: its per-core rate
`ACCUM_ELEMS_PER_CORE_S` is its own constant, not a multiple of the host's Adam rate.
"""

from __future__ import annotations

# Cross-socket DRAM streaming rate over a local stream (judgment: two-socket x86 servers
# commonly stream about half to two thirds of local bandwidth from the other socket's
# memory, over UPI / Infinity Fabric links; 0.6 taken; no measurement in the dataset sets it).
REMOTE_DRAM_RATE = 0.6
# Host gradient accumulation, elements per second per core (judgment: one core streams
# ~10 GB/s, i.e. ~0.9 G elements/s at ~10 B per element; the value is the earlier
# 30 x 29.5 M/s, unchanged, now independent of the host's Adam rate). DRAM bandwidth
# still caps the sum through the fluid pool.
ACCUM_ELEMS_PER_CORE_S = 30.0 * 29.5e6
# The rows of the bundled published dataset that set a constant, and which:
# row id -> (host preset, field). `python -m zfbench.validate --published` marks them.
CALIBRATION_ROWS = {
    "zo-table4-cpuadam-10b": ("xeon-8168", "adam_params_per_s_per_core"),
    "zf-blog-fig3-llama7b-adam": ("epyc-7763-milan", "adam_params_per_s_per_core"),
}


def remote_share(sockets: int, cores_per_socket: float, cores_per_rank: float,
                 bound: bool) -> float:
    """Share of a rank's host memory traffic that crosses sockets (module docstring)."""
    if sockets <= 1:
        return 0.0
    if bound:  # its threads past one socket's cores reach back to the home socket
        return max(0.0, cores_per_rank - cores_per_socket) / cores_per_rank
    return (sockets - 1) / sockets


def numa_factor(sockets: int, cores_per_socket: float, cores_per_rank: float,
                bound: bool) -> float:
    """A rank's host work rate over its all-local rate."""
    f = remote_share(sockets, cores_per_socket, cores_per_rank, bound)
    return 1.0 / ((1.0 - f) + f / REMOTE_DRAM_RATE)


def calibrated_adam_rate(params: float, seconds: float, cores_per_rank: float,
                         factor: float) -> float:
    """Local CPU-Adam parameters per second per core from one measured optimizer step of
    `params` parameters per rank in `seconds`, the rank on `cores_per_rank` cores whose
    `numa_factor` was `factor` (all ranks updating at the same time, each on its cores)."""
    return params / (seconds * cores_per_rank * factor)
