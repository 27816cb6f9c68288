"""The `zero-infinity` schedule: one rank's step as a SimPy process (ZeRO-3, offloaded).

This module owns the order and dependencies of a zero-infinity step; the bytes and
seconds come from `zfbench.sims.zero3` and `CostModel`. `zero_infinity_step(sim, t)` runs
on a `RankSim` (its lanes, helpers and per-run `state`): forward then backward over the
buckets, each op's parameters fetched `prefetch_buckets` ahead (up from the host or NVMe,
then all-gathered), each backward op's gradient reduce-scattered and its share sent down,
then the host's update bucket by bucket as DeepSpeed's ZeRO-3 `step()` runs it (clip,
CPU-Adam, conversion to 16 bits), with the variants for pageable buffers, NVMe-resident
parameters and optimizer state, gradient accumulation, parameters kept on the GPUs and
offloaded activation checkpoints. `zero_infinity_step`'s docstring states each rule and
its DeepSpeed source (stage3.py); the helpers (`fetch`, `copy_down`, `send_grad`,
`host_update`, `checkpoint_copy`) each run one part.
"""

from __future__ import annotations

from zfbench.sims import host_step, nvme, zero3
from zfbench.sims.fluid import Job
from zfbench.sims.lanes import all_done, all_of
from zfbench.sims.pageable import DRAM_BYTES_PER_BYTE as STAGED_DRAM_BYTES_PER_BYTE

# Host-update buckets whose NVMe state buffers are in use at once (double buffering: the
# state read of one bucket overlaps the update of the one before; judgment after
# DeepSpeed's optimizer swapper with pipeline_read / pipeline_write on).
STATE_BUFFERS = 2


def op_buckets(nb: int) -> list[int]:
    """The bucket each compute op of a step uses, in order: forward, then backward."""
    return list(range(nb)) + list(reversed(range(nb)))


def _nvme_lanes(sim):
    """The rank's NVMe (read, write) lanes on the node's array, made on first use."""
    lanes = sim.state.get("nvme_lanes")
    if lanes is None:
        node = nvme.node_nvme(sim.env, sim.timeline, sim.costs, sim.rank)
        lanes = sim.state["nvme_lanes"] = node.lanes(sim.rank)
    return lanes


def pageable(c) -> bool:
    """Whether this run's gradient and parameter copies are pageable (zfbench.sims.pageable):
    without `pin_memory`, with CPU offload; NVMe offload copies through the swapper's
    pinned buffers (the optimizer state or the parameters on NVMe)."""
    return c.pageable_copies and not zero3.any_nvme(c)


def fetch(sim, step: int, i: int, deps, blocking: list | None = None):
    """Bucket i's parameters onto the device: (NVMe read,) share up, all-gather; with the
    partitions kept on the GPUs the all-gather alone. With pageable buffers the share's
    copy up is appended to `blocking`: the issuing thread waits for it."""
    c = sim.costs
    if zero3.params_on_device(c):
        done = sim.collective("allgather", step, zero3.bucket_bytes(c, i), list(deps))
        return done or all_of(sim.env, [d for d in deps if d is not None])
    if zero3.uses_nvme(c):
        read, _ = _nvme_lanes(sim)
        deps = [nvme.submit(read, nvme.READ, sim.rank, step, zero3.share_bytes(c, i), deps)]
    up = sim.transfer(sim.h2d, "h2d_param", step, zero3.share_bytes(c, i), deps)
    if blocking is not None and pageable(c):
        blocking.append(up)
    return sim.collective("allgather", step, zero3.bucket_bytes(c, i), [up]) or up


def checkpoint_copy(sim, lane, op: str, step: int, i: int):
    """Bucket i's activation checkpoint to the host (`d2h_act`, before its forward) or
    back (`h2d_act`, before its backward recomputes it) with `offload_activations`; the
    event, None where the bucket has no checkpoint. DeepSpeed's checkpointing copies it
    with `.to(device)` between the GPU and an unpinned CPU tensor on the thread that
    launches the layer's kernels: a staged copy (zfbench.sims.pageable) the device waits
    for, pinned buffers or not."""
    c = sim.costs
    nbytes = zero3.checkpoint_bytes(c, i)
    if nbytes <= 0:
        return None
    job = Job(lane.name, sim.rank, nbytes, STAGED_DRAM_BYTES_PER_BYTE,
              c.pageable_copy_bytes_per_s)
    return lane.submit(op, step, [], seconds=sim.latency_s, job=job, nbytes=nbytes)


def reduce_scatter(sim, step: int, i: int):
    """Bucket i's gradient reduce-scattered; its event (None on one GPU)."""
    c = sim.costs
    if c.gpus == 1:
        return None
    nbytes = zero3.bucket_bytes(c, i)
    return sim.net.submit(zero3.REDUCE_SCATTER_OP, step, [],
                          seconds=zero3.reduce_scatter_s(c, nbytes),
                          nbytes=int(round(nbytes)))


def copy_down(sim, step: int, i: int, deps: list):
    """The rank's share of bucket i's gradient down once `deps` have fired (in fp32
    from presets: zfbench.sims.zero3.grad_share_bytes), then, where the optimizer state
    is on NVMe, written there; the event after which the share is where the update
    reads it."""
    c = sim.costs
    down = sim.transfer(sim.d2h, "d2h_grad", step, zero3.grad_share_bytes(c, i), deps)
    swap = zero3.grad_swap_bytes(c, i)
    if swap <= 0:
        return down
    _, write = _nvme_lanes(sim)
    return nvme.submit(write, nvme.WRITE, sim.rank, step, swap, [down])


def send_grad(sim, step: int, i: int, reduced, micro: int, held: dict):
    """The rank's reduced share of bucket i in micro-step `micro` of the step, as
    DeepSpeed's ZeRO-3 accumulates (`async_accumulate_grad_in_cpu_via_gpu`, the same
    round trip as ZeRO-2's: `zero_infinity_step`): from the second micro-step on the 16-bit
    sum held on the host comes up first (once its last copy down has landed) to be
    added on the device; every micro-step but the last sends the sum down in 16 bits
    (`held[i]`: the event it is on the host); the last sends the step's gradient
    (`copy_down`). Returns the event of the copy down."""
    c = sim.costs
    deps = [reduced]
    if micro > 0:  # recorded as `h2d_param`, as ZeRO-2's accumulation round trip is
        deps = [sim.transfer(sim.h2d, "h2d_param", step, zero3.share_bytes(c, i),
                             [reduced, held.get(i)])]
    if micro < c.settings.scenario.grad_accum - 1:
        held[i] = sim.transfer(sim.d2h, "d2h_grad", step, zero3.share_bytes(c, i), deps)
        return held[i]
    return copy_down(sim, step, i, deps)


def unrecorded_fetch(sim, i: int, gate, net_free):
    """Wait as long as fetching bucket i would (after `gate`, its all-gather after
    `net_free`, the net lane's last op) on the same shared resources, recording nothing:
    the last step's wait for a next step that never runs. At that moment every lane the
    fetch uses is idle but the net lane, so the wait equals the recorded fetch's."""
    c, env = sim.costs, sim.env
    nbytes = 0 if zero3.params_on_device(c) else zero3.share_bytes(c, i)
    if zero3.params_on_device(c):
        yield from all_done(env, [gate])
    if nbytes > 0:  # as `transfer`: an empty one is done at once
        yield from all_done(env, [gate])
        if zero3.uses_nvme(c):
            yield nvme.node_nvme(env, sim.timeline, c, sim.rank).pool.run(
                Job(nvme.READ, sim.rank, nbytes))
        yield env.timeout(sim.latency_s)
        yield sim.pool.run(Job("h2d", sim.rank, nbytes))
    if c.gpus > 1:
        yield from all_done(env, [net_free])
        yield env.timeout(c.allgather_s(zero3.bucket_bytes(c, i)))


def host_update(sim, step: int, downs) -> dict:
    """DeepSpeed's host step on the rank's share (unscale/clip, AdamW, the conversion to
    16 bits), bucket by bucket in backward order, after every gradient is down; returns,
    per bucket, the event after which its host copy (or its NVMe copy, or with the
    partitions on the GPUs the device's copy, uploaded after the update) holds the new
    parameters. The state is read from and written back to NVMe
    where it lives there."""
    c = sim.costs
    ready, writes = {}, []
    deps = list(downs)
    for j, i in enumerate(reversed(range(sim.nb))):
        elems = c.share(c.buckets[i].numel)
        work_deps = deps
        if zero3.state_on_nvme(c):
            read, _ = _nvme_lanes(sim)
            free = writes[j - STATE_BUFFERS] if j >= STATE_BUFFERS else None
            work_deps = [*deps, nvme.submit(read, nvme.READ, sim.rank, step,
                                            zero3.state_read_bytes(c, i), [free])]
        if c.deepspeed_host_step:  # from presets: DeepSpeed's passes beside Adam
            _, ready[i] = host_step.clip_adam_convert(sim, step, elems, work_deps)
        else:
            ready[i] = sim.host_work("host_optim", step, elems, work_deps)
        back = zero3.state_write_bytes(c, i)
        if back > 0:  # the state and/or the new parameters back to NVMe
            _, write = _nvme_lanes(sim)
            writes.append(nvme.submit(write, nvme.WRITE, sim.rank, step, back, [ready[i]]))
            ready[i] = writes[-1]
        if zero3.params_on_device(c):  # the new share up to the rank's GPU partition
            ready[i] = sim.transfer(sim.h2d, "h2d_param", step, zero3.share_bytes(c, i),
                                    [ready[i]])
        if elems > 0:  # the first real chunk carries the wait for the gradients
            deps = ()
    return ready


def zero_infinity_step(sim, t: int):
    """Rank `sim`'s step t of the zero-infinity schedule, its order and dependencies:

    - The step computes 2 x nb ops: forward of buckets 0..nb-1, then backward of nb-1..0.
      Each op needs its bucket's parameters fetched: the rank's share up (h2d `h2d_param`),
      then all-gathered (net `allgather`; none on one GPU). Fetches are issued in op order,
      `prefetch_buckets` ahead of the op the device is about to compute (the device issues
      fetch k+d just before waiting for fetch k), so at most d+1 buckets are in flight.
    - After each backward op the bucket's gradient is reduce-scattered (net,
      `reduce_scatter`) and the rank's share goes down (d2h `d2h_grad`; in fp32 from
      presets, zfbench.sims.zero3 `grad_share_bytes`).
    - Once every gradient is down (with the optimizer state on NVMe: once every gradient
      share, written to NVMe as it came down, is there: DeepSpeed flushes its gradient
      writes before the first swap-in), the host updates the rank's share bucket by bucket
      in backward order (host lane, shared with the other ranks' as in zero-offload) as
      DeepSpeed's ZeRO-3 `step()` does each sub-group (stage3.py, with the optimizer
      offloaded): `unscale_and_clip_grads` (`host_clip`: the fp32 gradient's `mul_` in place,
      every step), CPU-Adam (`host_optim`), then the fp32 master into the 16-bit parameters
      (`host_convert`: `_reassign_or_swap_out_partitioned_parameters` copies it into the
      host's 16-bit partition, or into the NVMe swapper's 16-bit buffers; with the
      partitions on the GPUs a blocking `copy_` from the host fp32 tensor converts on the host
      before the copy up). The two streaming passes run at zfbench.sims.host_step's rates,
      as zero-offload's; simulations from a measured profile (`CostModel.deepspeed_host_step`
      False) run Adam alone. Nothing goes up: the next step's fetch of bucket i reads the
      host copy, so it waits for bucket i's update (bucket 0, needed first, is updated last).
    - The step ends when the next step may start: once the device has issued the next
      step's first d+1 fetches (they belong to step t+1) and the first has landed. The last
      step waits exactly as long, for a fetch of bucket 0 that it does not record (there is
      no step t+1 to charge it to), so every steady step is alike; that fetch waits for the
      last update, so all of the run's work is done when it ends.
    - With pageable host buffers (`pin_memory` False, CPU offload: `sims/pageable.py`) the
      copies block the thread that issues the device's work. Gradients as DeepSpeed's ZeRO-3
      of 2021 sends them (stage3.py `reduce_ipg_grads`: `reduction_stream.synchronize()`,
      then `partition_previous_reduced_grads` copies the previous bucket down, then the
      current bucket's reduction is issued): after the backward op of bucket i the device
      waits for the previous bucket's copy down (issued once its reduce-scatter is done),
      and only then is bucket i's reduce-scatter issued; after the last backward op, the
      last bucket's copy (the epilogue's). Each fetch's copy up holds the device from the
      moment it is issued until it has landed.
    - With `offload_params="nvme"` every fetch first reads the share from NVMe; with the
      optimizer state on NVMe (`offload_optimizer`, by default where the parameters are) the
      host update of each bucket reads its fp32 state and fp32 gradient from NVMe before it
      and writes the state (and the new 16-bit parameters, where they live there too) back
      after it
      (double-buffered: a bucket's read waits for the write-back of the bucket two before
      it); the next fetch of a bucket waits for its write. The drives are the array of the
      rank's node (`zfbench.sims.nvme`: one per node, shared by that node's ranks).
    - With gradient accumulation (`grad_accum` A > 1) the step is A micro-steps, each
      fetching every bucket for its forward and its backward (the parameters do not change
      between them); the micro-steps' reduced shares are summed as DeepSpeed's ZeRO-3 of
      2021 does (stage3.py `partition_previous_reduced_grads` ->
      `async_accumulate_grad_in_cpu_via_gpu`, into `grads_in_partition`, a 16-bit host buffer
      of the rank's partition that exists only with accumulation): from the second
      micro-step on a share's 16-bit sum comes up and is added on the device, every
      micro-step but the last sends the sum down in 16 bits, and the last sends the step's
      gradient as above (`send_grad`). The add on the device is left out (as zero-offload's).
    - With `offload_params="none"` each rank's 16-bit partition stays on its GPU: a fetch is
      the bucket's all-gather alone, and after the host update of a bucket its new share
      goes up (h2d), which the next fetch of that bucket waits for.
    - With `offload_activations` (DeepSpeed's `cpu_checkpointing`) each decoder layer's
      checkpoint goes down (`d2h_act`) before the layer's forward and comes back up
      (`h2d_act`) before its backward op recomputes it, each a staged copy into or out of an
      unpinned CPU tensor that the device waits for (`checkpoint_copy`).
    """
    c, st, env = sim.costs, sim.state, sim.env
    accum, per_micro = c.settings.scenario.grad_accum, 2 * sim.nb
    ops = op_buckets(sim.nb) * accum  # every micro-step's forward, then its backward
    d = c.settings.infinity.prefetch_buckets
    fetched = st.pop(("fetched", t), {})  # fetches of this step the previous one issued
    issued = max(fetched, default=-1) + 1
    ready = st.pop(("ready", t - 1), {})  # the previous step's updates, per bucket

    def issue(upto: int, step: int, into: dict, first: int, gates: dict,
              blocking: list | None = None) -> int:
        """Fetches first..upto of `step` (each after its bucket's update in `gates`)."""
        last = min(upto, len(ops) - 1)
        for k in range(first, last + 1):
            into[k] = fetch(sim, step, ops[k], [gates.get(ops[k])], blocking)
        return max(first, last + 1)

    downs, reduced, pending, held = [], None, None, {}

    def send(i: int, reduced, micro: int):
        sent = send_grad(sim, t, i, reduced, micro, held)
        if micro == accum - 1:  # the step's gradient, which the host update waits for
            downs.append(sent)
        return sent

    for k, i in enumerate(ops):
        blocking: list = []  # pageable copies up the device's thread waits for
        issued = issue(k + d, t, fetched, issued, ready, blocking)
        micro, position = divmod(k, per_micro)
        forward = position < sim.nb
        blocking.append(checkpoint_copy(sim, sim.d2h if forward else sim.h2d,
                                        "d2h_act" if forward else "h2d_act", t, i))
        yield from all_done(env, [*blocking, fetched.pop(k)])
        b = c.buckets[i]
        if forward:
            yield from sim.compute("forward", t, b.forward_s)
            continue
        yield from sim.compute("backward", t, b.backward_s)
        if pageable(c):  # the previous bucket's copy first, blocking (docstring)
            if pending is not None:
                yield from all_done(env, [send(*pending)])
            reduced = reduce_scatter(sim, t, i)
            pending = (i, reduced, micro)
            if position == per_micro - 1:  # the epilogue's copy of the last bucket
                yield from all_done(env, [send(*pending)])
                pending = None
        else:
            reduced = reduce_scatter(sim, t, i)
            send(i, reduced, micro)
    updated = host_update(sim, t, downs)
    if t + 1 < c.settings.measurement.steps:
        nxt: dict = {}
        issue(d, t + 1, nxt, 0, updated)
        st[("fetched", t + 1)], st[("ready", t)] = nxt, updated
        yield from all_done(env, [nxt[0]])
    else:  # every step ends alike: the last one as if a next step fetched bucket 0
        yield from unrecorded_fetch(sim, ops[0], updated.get(ops[0]), reduced)
