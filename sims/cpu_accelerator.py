"""DeepSpeed on its CPU accelerator: the gradient round trip as the training thread's passes.

On DeepSpeed's CPU accelerator the "device" is the host: there is no link, and what the
GPU schedules call copies are memory passes of the training thread, one after another
with its compute. A hardware file marks such a node by the link's
`training_thread_bytes_per_s` (read from the run's own log by zfbench.predict:
`zfbench.predict.inputs.deepspeed_pass_rate`); `thread_rate` gives it, None on a real link.

What this module prices is ZenFlow's per-step round trip, which DeepSpeed v0.19.5 runs for
every parameter in `copy_grads_in_partition` (stage_1_and_2.py lines 1623-1641) on every
step of a window (ZenFlow's accumulation boundary is its update boundary):
`async_accumulate_grad_in_cpu_via_gpu` (lines 1489-1533) copies the host accumulator into
the temporary buffer and adds it into the gradient (`accumulate_gradients`, only when
`micro_step_id > 0`: every step of a window but its first, the id being reset by `step`
and raised by `setup_buckets` once a backward), then copies the gradient back into the
accumulator (`copy_gradients_to_cpu`). The boundary's norm, non-finite check and copy into
the fp32 partition are ZeRO-Offload's every-step `bwd_allreduce` work, which the fit
prices (the fitted d2h rate); they are not here.
"""

from __future__ import annotations

from zfbench.sims.costs import CostModel

# Bytes an element moves in each pass of the round trip (fp32): a copy reads and writes 4
# B, the add reads two and writes one.
COPY_BYTES, ADD_BYTES = 8, 12


def thread_rate(costs: CostModel) -> float | None:
    """The training thread's memory-pass rate (bytes/s) where the accelerator is the
    host's CPU; None on a real link."""
    return costs.node.link.training_thread_bytes_per_s


def round_trip_bytes_per_elem(first_of_window: bool) -> int:
    """Bytes an element moves in one step's round trip: the copy back into the host
    accumulator, and on every step but the window's first also the copy up and the add."""
    return COPY_BYTES if first_of_window else 2 * COPY_BYTES + ADD_BYTES


def round_trip_s(costs: CostModel, first_of_window: bool) -> float:
    """Seconds the training thread spends on one step's round trip over this rank's share
    of the gradient; 0 on a real link (there the copies are the link's)."""
    rate = thread_rate(costs)
    if rate is None:
        return 0.0
    return costs.share(costs.params) * round_trip_bytes_per_elem(first_of_window) / rate
