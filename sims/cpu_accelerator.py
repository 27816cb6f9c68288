"""DeepSpeed on its CPU accelerator: ZenFlow's work as the training thread's.

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
prices (the fitted d2h rate); they are not here. Two more pieces of ZenFlow's work hold
that thread, priced from a probe of their ops on the host (bench/zenflow_cpu_ops.py, into
the link's `thread_*` fields): `layout_s`, an embedding table's gradient across layouts in
backward, and `selective_s`, the selective optimizer's step on the "device" (the comments
at each name DeepSpeed's code).
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


# ZenFlow keeps every 2-D weight column-major (runtime/zenflow/zenflow_utils.py,
# `_flatten_dense_tensors` / `_unflatten_dense_tensors`: the flat buffer holds each
# matrix's transpose). A linear layer's gradient comes out in its weight's layout; an
# embedding table's (a gather's backward) comes out row-major, so autograd copies it into
# the weight's layout, or, where the table is tied to the head, sums the head's
# column-major contribution with it across layouts. ZeRO-Offload's row-major tables pay
# neither (the trace in bench/results/predict_deepspeed_trace/).
TABLE_KINDS = ("embedding", "position")


def layout_s(costs: CostModel) -> float:
    """Seconds backward spends, on DeepSpeed's CPU accelerator under ZenFlow, beyond
    ZeRO-Offload because the embedding tables are column-major: each table's backward
    extra at the thread's `thread_layout_copy_elems_per_s` (the gradient copied into the
    layout), a table tied to the head (the shape's `tied_embeddings`, its token table) at
    `thread_layout_add_extra_elems_per_s` (both contributions summed across layouts); the
    probe measures each as the column-major backward's extra over the row-major one. A
    table whose rate the link lacks (a real link, or no probe) adds 0."""
    link, tied = costs.node.link, costs.shape.tied_embeddings
    seconds = 0.0
    for m in costs.shape.matrices():
        if m.kind not in TABLE_KINDS:
            continue
        rate = (link.thread_layout_add_extra_elems_per_s if tied and m.kind == "embedding"
                else link.thread_layout_copy_elems_per_s)
        seconds += 0.0 if rate is None else m.numel / rate
    return seconds


# The selective optimizer's ops per parameter (DeepSpeed 0.19.5, offload off, one rank).
# Every step, `_process_selected_fp32_groups_grad` (runtime/zenflow/zenflow_stage_1_and_2.py)
# gathers a matrix's selected rows of its transposed gradient into the flat buffer (a row
# gather, a copy) and clones them out (a copy); a vector's narrow is copied and cloned.
# Inside a window (not the accumulation boundary) it then calls
# `ZenFlowSelectiveAdamW.group_step` (ops/adam/zenflow_torch_adam.py): the weight's
# selected columns gathered, the single-tensor AdamW (`_single_tensor_adamw`: on a CPU
# `adamw` takes neither foreach nor fused) on them, and the columns put back. At the
# boundary it calls `temp_copy_param` (columns gathered, cloned) and the engine's step
# `_step_without_offload` (columns gathered, the saved columns copied in, AdamW, put back).
STEP_OPS = {"matrix": {"gather_rows": 1, "copy": 2, "gather_cols": 1, "adamw": 1,
                       "scatter_cols": 1},
            "vector": {"copy": 2, "adamw": 1}}
BOUNDARY_OPS = {"matrix": {"gather_rows": 1, "copy": 4, "gather_cols": 2, "adamw": 1,
                           "scatter_cols": 1},
                "vector": {"copy": 4, "adamw": 1}}


def selected_elems(rows: int, cols: int, topk_ratio: float) -> int:
    """A matrix's selected elements as DeepSpeed counts them on one rank: `rows` times
    `int(topk_ratio * cols)` input columns (`_process_selected_fp32_groups_grad`'s
    `num_select`)."""
    return rows * int(topk_ratio * cols)


def selective_s(costs: CostModel, boundary: bool) -> float | None:
    """Seconds of one step's selective optimizer on DeepSpeed's CPU accelerator: per
    parameter (every matrix with its selected elements, every vector whole, each rank
    updating all of them), `op_s + elems / elems_per_s` of the link's probed
    `thread_selective_step_*` (inside a window) or `thread_selective_boundary_*`; None
    where the link has no such rates (the device's AdamW of the presets then stands)."""
    link, which = costs.node.link, "boundary" if boundary else "step"
    op_s = getattr(link, f"thread_selective_{which}_op_s")
    rate = getattr(link, f"thread_selective_{which}_elems_per_s")
    if op_s is None or rate is None:
        return None
    topk = costs.settings.zenflow.topk_ratio
    elems = [selected_elems(m.rows, m.cols, topk) for m in costs.shape.matrices()]
    elems += [v.numel for v in costs.shape.vectors()]
    return sum(op_s + e / rate for e in elems)
