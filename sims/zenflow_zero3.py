"""ZenFlow on ZeRO-3 (`zero_stage` 3): one rank's step as a SimPy process.

This module owns the order and dependencies of a ZenFlow step on DeepSpeed's ZeRO-3
(`ZenFlowZeroOptimizer_Stage3`, deepspeedai/DeepSpeed PR #7516: runtime/zenflow/
engine_stage3.py over runtime/zero/stage3.py), from presets; the bytes and the device
memory are zfbench.sims.zero3's (`zenflow_*`), every other cost `CostModel`'s.
`zenflow_zero3_step(sim, t)` runs on a `RankSim` (its lanes, helpers and per-run `state`)
with the mechanisms of zero-infinity's parameter traffic (zfbench.sims.zero_infinity: the
fetch order, the reduce-scatter) and ZenFlow's selection and windows
(zfbench.core.schedule, zfbench.sims.update_windows). Its docstring states each rule.
A measured profile of zfbench's engine is simulated as that engine runs ZeRO-3 instead
(zfbench.sims.zenflow_zero3_engine).
"""

from __future__ import annotations

from zfbench.core.schedule import is_selection_step, is_warmup
from zfbench.sims import host_step, zero3
from zfbench.sims.lanes import all_done
from zfbench.sims.zenflow_zero3_engine import engine_zero3_step
from zfbench.sims.zero_infinity import op_buckets, reduce_scatter


def gather(sim, step: int, i: int):
    """Bucket i all-gathered from the ranks' 16-bit partitions on their GPUs (net
    `allgather`); None on one GPU, whose partition is the whole model."""
    return sim.collective("allgather", step, zero3.bucket_bytes(sim.costs, i), [])


def host_update(sim, step: int, deps, warm_up: bool):
    """The host's AdamW over the rank's partition, bucket by bucket in backward order,
    each bucket's new parameters up into the rank's GPU partition after it (no all-gather:
    the next use gathers them); returns the last upload's event. A warm-up step runs
    DeepSpeed's ZeRO-3 offload step (clip, CPU-Adam, conversion: zfbench.sims.host_step)
    and uploads the whole share; a window's update runs Adam over the window's fp32
    gradient and uploads the unselected share, as ZenFlow on ZeRO-2 does from presets."""
    c, last = sim.costs, None
    for i in reversed(range(sim.nb)):
        elems = c.share(c.buckets[i].numel)
        if warm_up:
            _, ready = host_step.clip_adam_convert(sim, step, elems, deps)
        else:
            ready = sim.host_work("host_optim", step, elems, deps)
        last = sim.transfer(sim.h2d, "h2d_param", step, zero3.zenflow_up_bytes(c, i, warm_up),
                            [ready])
        deps = ()  # the host lane runs its jobs in order: the first carries the wait
    return last


def zenflow_zero3_step(sim, t: int):
    """Rank `sim`'s step t of ZenFlow on ZeRO-3, its order and dependencies (from
    presets; a profile of zfbench's engine: `engine_zero3_step`):

    - Each rank keeps its 16-bit partition (1/N of every parameter) on its GPU: ZenFlow
      offloads the optimizer, not the parameters (DeepSpeed's `offload_param` none). The
      step computes forward over buckets 0..nb-1, then backward over nb-1..0, each op
      waiting for its bucket's all-gather (`gather`), issued `prefetch_buckets` ops ahead
      in op order as zero-infinity's fetches are (zfbench.sims.zero_infinity); the
      gathered bucket is released after its op. The first all-gather of a step is issued
      when the step starts (DeepSpeed gathers on the first module's pre-forward hook).
    - After each backward op the bucket's gradient is reduce-scattered (net
      `reduce_scatter`: each rank gets the part of its partition) and the rank's
      unselected share goes down (d2h `d2h_grad`, 16-bit; with `transfers` full the whole
      share) once the host has accumulated the previous step's (one staging buffer, as
      on ZeRO-2); the host adds it to the window (`host_accum`).
    - At a selection step each rank scores the columns of its own partition (`select`,
      1/N of the 2-D gradients read) and the ranks all-gather the scores
      (engine_stage3.py `update_selected_channels`), once every reduce-scatter is done.
    - The device updates the selected columns of its partition (`device_optim` over
      1/N of the selected elements: `ZenFlowSelectiveAdamW_stage3`) once every
      reduce-scatter is done; the step ends there.
    - At a window boundary the host runs AdamW over the rank's partition once the
      window's accumulation is done, and the unselected share goes up into the GPU
      partition (`host_update`); with `overlap_step` the device waits for it at the next
      boundary (one window stale), without it at once, as ZenFlow on ZeRO-2.
    - Warm-up steps (`full_warm_up_rounds`) are ZeRO-3 offload steps: the whole share
      down (fp32 from presets), DeepSpeed's host step over the partition, the whole share
      up, and the device waits for it.
    """
    if sim.costs.engine_grad_passes:  # a profile of zfbench's engine: its schedule
        yield from engine_zero3_step(sim, t)
        return
    c, s, st, env = sim.costs, sim.costs.settings, sim.state, sim.env
    warm_up = is_warmup(t, s.zenflow.full_warm_up_rounds)
    ops = op_buckets(sim.nb)
    d = s.infinity.prefetch_buckets
    fetched: dict[int, object] = {}
    issued = 0
    prev_accum = None if warm_up else st.get(("accum", t - 1))
    downs, reduced = [], []
    for k, i in enumerate(ops):
        while issued <= min(k + d, len(ops) - 1):
            fetched[issued] = gather(sim, t, ops[issued])
            issued += 1
        yield from all_done(env, [fetched.pop(k)])
        b = c.buckets[i]
        if k < sim.nb:
            yield from sim.compute("forward", t, b.forward_s)
            continue
        yield from sim.compute("backward", t, b.backward_s)
        red = reduce_scatter(sim, t, i)
        reduced.append(red)
        downs.append(sim.transfer(sim.d2h, "d2h_grad", t,
                                  zero3.zenflow_down_bytes(c, i, warm_up), [red, prev_accum]))
    if warm_up:
        landed = host_update(sim, t, downs, True)
        yield from all_done(env, [*reduced, landed])
        return
    yield from all_done(env, reduced)  # the selection and the update read reduced shares
    if is_selection_step(t, s.zenflow.full_warm_up_rounds, s.zenflow.select_interval):
        yield from sim.compute("select", t, c.select_s() / c.gpus)
        scores = sim.collective("allgather", t, zero3.zenflow_score_bytes(c), [])
        yield from all_done(env, [scores])
    st[("accum", t)] = sim.host_work(
        "host_accum", t, sum(zero3.zenflow_unselected_share(c, i) for i in range(sim.nb)),
        downs)
    st.pop(("accum", t - 1), None)
    if c.is_boundary(t):
        if s.zenflow.overlap_step:
            yield from sim.apply_update(t, st.pop("pending", None))
        landed = host_update(sim, t, [st[("accum", t)]], False)
        if s.zenflow.overlap_step:
            st["pending"] = landed
        else:
            yield from sim.apply_update(t, landed)
    moments = c.offloaded_moment_bytes  # zenflow.offload: the share's m and v up and back
    if moments:
        yield sim.transfer(sim.h2d, "h2d_moments", t, moments, [])
    yield from sim.compute("device_optim", t, c.device_optim_s(c.share(c.selected_params)))
    if moments:
        yield sim.transfer(sim.d2h, "d2h_moments", t, moments, [])
