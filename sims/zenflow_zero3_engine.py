"""ZenFlow on ZeRO-3 as zfbench's engine runs it, from a measured profile: one rank's step.

`zenflow_zero3_step` (zfbench.sims.zenflow_zero3) hands a profile of zfbench's engine
(`CostModel.engine_grad_passes`) to `engine_zero3_step(sim, t)`, which follows
real/zero3.py and real/zenflow_zero3.py as they run on the CPU-emulated lanes (and, with a
GPU profile, on its copy engines): the engine's data path (the rank's whole gradient shard
down each step, `transfers` full), its host chunks, its one-rank gathers (copies of the
rank's shard into each unit's buffer). Its docstring states each rule; the rate model of
the emulated lanes is zfbench.sims.emulated's, every cost `CostModel`'s, the host chunks
`RankSim.host_update`'s.
"""

from __future__ import annotations

from zfbench.core.schedule import is_selection_step, is_warmup
from zfbench.sims import zero3
from zfbench.sims.emulated import device_thread_op, grad_check_s
from zfbench.sims.fluid import Job
from zfbench.sims.lanes import all_done


def engine_zero3_step(sim, t: int):
    """Rank `sim`'s step t of the engine's ZenFlow on ZeRO-3 (real/zenflow_zero3.py):

    - Forward, then backward, each over the blocks in order (reversed in backward): a
      block is first gathered (real/zero3.py: one rank copies its shard into the unit's
      buffer, several all-gather it, `net` `allgather`, the next block's gather issued as
      the block starts, as the engine prefetches the next units); the hooks' and
      copies' seconds as the profile measured them (`gather_overhead_s`) inside the
      block's compute span, as the hooks run inside the engine's.
    - After backward, with several ranks, the whole gradient buffer is reduce-scattered
      (`net` `reduce_scatter`, costed as an all-gather of it, zfbench.sims.zero3) on the
      device thread; then the engine's non-finite check.
    - At a selection step: after step 0 the pending update is applied and the rank's
      shard (fp32 weights) or the selected elements' fp32 values (16-bit weights, after
      warm-up) go down (d2h `select`); the ranks sum their column scores (`allreduce`),
      the device selects (`select`), and the selected elements' fp32 values come up
      from the host master (h2d `select`); every copy blocks the device thread.
    - Every step the rank's gradient shard goes down (d2h `d2h_grad`) once the host has
      accumulated the last one (one staging buffer), then the host adds it to the window
      (`host_accum`).
    - At a window's close the host runs AdamW over the shard in its chunks, each
      chunk's parameters up into the shard-sized `upload` (nothing all-gathered); with
      `overlap_step` the previous window's update is applied first (one window stale),
      without it this one at once. Applying is a device copy of the shard with the
      selected elements kept (`device_optim`).
    - The device updates the selected elements of its shard (`device_optim`: AdamW on the
      rank's share of the selected elements, and its share of the column gather and
      scatter), with `zenflow.offload` between their moments' copies up and back.
    - Warm-up steps (`full_warm_up_rounds`) are synchronous offload steps: the shard down,
      the host's chunks with each chunk up into the shard, the device waiting for them.
    """
    c, s, st = sim.costs, sim.costs.settings, sim.state
    yield from _pass(sim, t, "forward", range(sim.nb))
    yield from _pass(sim, t, "backward", reversed(range(sim.nb)))
    if c.gpus > 1:
        yield from all_done(sim.env, [_reduce_scatter(sim, t)])
    yield from sim.compute("device_optim", t, grad_check_s(c))
    shard = c.share(c.params)
    if is_warmup(t, s.zenflow.full_warm_up_rounds):
        down = yield from _copy_down(sim, "d2h_grad", t, shard * c.elem_bytes, [])
        landed, _ = sim.host_update(t, [down], _share_of(c), _share_bytes_of(c),
                                    _share_of(c), gather=False)
        yield from all_done(sim.env, [landed])
        return
    if is_selection_step(t, s.zenflow.full_warm_up_rounds, s.zenflow.select_interval):
        yield from _select(sim, t)
    unselected = _unselected(c)
    prev_accum = st.pop(("accum", t - 1), None)
    down = yield from _copy_down(sim, "d2h_grad", t, c.share(sum(unselected)) * c.elem_bytes,
                                 [prev_accum])
    # a window's first accumulation writes it (`CostModel.window_first_write`)
    st[("accum", t)] = sim.host_work("host_accum", t, c.share(sum(unselected)), [down],
                                     first=st.pop("window_open", None) is None)
    st["window_open"] = True
    if c.is_boundary(t):
        st.pop("window_open", None)
        if s.zenflow.overlap_step:
            yield from _apply(sim, t, st.pop("pending", None))
        # as ZeRO-2's engine window: fp32 already, only the parameters going up are
        # converted; the window is cleared chunk by chunk after its AdamW
        landed, _ = sim.host_update(t, [st[("accum", t)]], _share_of(c),
                                    lambda i: c.share(unselected[i]) * c.elem_bytes,
                                    lambda i: 0.5 * c.share(unselected[i]), _share_of(c),
                                    gather=False)
        if s.zenflow.overlap_step:
            st["pending"] = landed
        else:
            yield from _apply(sim, t, landed)
    moments = c.offloaded_moment_bytes  # zenflow.offload: the share's m and v up and back
    if moments:
        yield sim.transfer(sim.h2d, "h2d_moments", t, moments, [])
    yield from sim.compute("device_optim", t, c.device_optim_s(c.share(c.selected_params))
                           + _column_io_s(sim))
    if moments:
        yield sim.transfer(sim.d2h, "d2h_moments", t, moments, [])


def _pass(sim, t: int, op: str, order):
    """Forward or backward over the blocks in `order`, each gathered first (with several
    ranks the next one's gather issued as a block starts), what the gathers add to the
    block's pass (`gather_overhead_s`) inside its compute."""
    c = sim.costs
    order = list(order)
    gathers = {order[0]: _gather(sim, t, order[0])}
    for k, i in enumerate(order):
        if k + 1 < len(order):
            gathers[order[k + 1]] = _gather(sim, t, order[k + 1])
        yield from all_done(sim.env, [gathers.pop(i)])
        b = c.buckets[i]
        yield from sim.compute(op, t, (b.forward_s if op == "forward" else b.backward_s)
                               + gather_overhead_s(c, b, op))


def gather_overhead_s(c, bucket, op: str) -> float:
    """What the engine's ZeRO-3 gather and release add to `bucket`'s `op` ("forward" or
    "backward") on the device thread: as the profile measured them per block kind
    (`zero3_hooks`: each unit's hooks and the copy of its shard into a buffer of its own,
    zfbench.real.profile), else (profiles before them) the copy alone."""
    hooks = c.calibration.get("zero3_hooks")
    if hooks is None:
        return c.device_copy_s(bucket.numel)
    return hooks[bucket.kind][f"{op}_s"]


def _gather(sim, t: int, i: int):
    """Block i all-gathered from the ranks' shards (None on one rank: a copy, costed in
    the block's compute)."""
    return sim.collective("allgather", t, zero3.bucket_bytes(sim.costs, i), [])


def _reduce_scatter(sim, t: int):
    """The whole gradient buffer reduce-scattered (real/zero3.py `reduce_scatter`)."""
    c = sim.costs
    seconds = zero3.reduce_scatter_s(c, c.model_bytes)
    if sim.emulated and c.collectives_measured:  # gloo on the rank's device thread
        return sim.net.submit(zero3.REDUCE_SCATTER_OP, t, [], job=Job("net", sim.rank, seconds),
                              nbytes=int(c.model_bytes))
    return sim.net.submit(zero3.REDUCE_SCATTER_OP, t, [], seconds=seconds,
                          nbytes=int(c.model_bytes))


def _select(sim, t: int):
    """A selection step's device-thread work (`engine_zero3_step`)."""
    c, st = sim.costs, sim.state
    low = c.elem_bytes < 4
    if t != 0:
        yield from _apply(sim, t, st.pop("pending", None))
        if not low:
            yield from _copy_down(sim, "select", t, c.share(c.params) * 4, [])
        elif t > c.settings.zenflow.full_warm_up_rounds:
            yield from _copy_down(sim, "select", t, c.share(c.selected_params) * 4, [])
    scores = sim.collective("allreduce", t, 4 * sum(m.cols for m in c.shape.matrices()), [])
    yield from all_done(sim.env, [scores])
    yield from sim.compute("select", t, c.select_s())
    nbytes = c.share(c.selected_params) * 4
    if sim.emulated:
        yield from device_thread_op(sim, "h2d", "select", t, int(round(nbytes)),
                                    int(round(nbytes)))
    else:
        yield sim.transfer(sim.h2d, "select", t, nbytes, [])


def _copy_down(sim, op: str, t: int, nbytes: float, deps):
    """A copy down once `deps` fired: the device thread's on the emulated lanes (the
    compute waits for it), else on the d2h engine; returns its event."""
    yield from all_done(sim.env, deps)
    if sim.emulated:
        yield from sim.copy_down_now(op, t, nbytes)
        return sim.env.timeout(0)
    return sim.transfer(sim.d2h, op, t, nbytes, [])


def _apply(sim, t: int, landed):
    """Wait for an uploaded update (None: none pending); emulated, the device then copies
    `upload` into its shard, keeping the selected elements."""
    if landed is None:
        return
    yield from all_done(sim.env, [landed])
    if sim.emulated:
        c = sim.costs
        yield from sim.compute("device_optim", t, c.device_copy_s(c.share(c.params))
                               + _column_io_s(sim))


def _column_io_s(sim) -> float:
    """Emulated: the rank's share of the gather and scatter of the selected elements (every
    one: ZeRO-3's device update gathers them all, real/zenflow_zero3.py)."""
    return sim.column_io_s(every_column=True) / sim.costs.gpus


def _unselected(c) -> list[float]:
    """Elements of each block that go down per step: all of them with `transfers` full
    (the engine's path), the unselected ones with `transfers` design."""
    if c.settings.measurement.transfers == "full":
        return [b.numel for b in c.buckets]
    return [b.numel - b.selected_numel for b in c.buckets]


def _share_of(c):
    return lambda i: c.share(c.buckets[i].numel)


def _share_bytes_of(c):
    return lambda i: c.share(c.buckets[i].numel) * c.elem_bytes
