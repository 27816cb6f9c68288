"""ZenFlow on ZeRO-2: one rank's step as a SimPy process.

`zenflow_zero2_step(sim, t)` runs on a `RankSim` (zfbench.sims.strategies: its lanes,
helpers and per-run `state`); ZenFlow on ZeRO-3 is zfbench.sims.zenflow_zero3's. The
schedule: warm-up steps (`full_warm_up_rounds`) are zero-offload steps; then every step
sends the unselected share of each gradient down and accumulates it on the host while the
device updates the selected columns; at each update boundary the host AdamW runs over the
window and its parameters go up. With `overlap_step` the device waits, at the next
boundary, for the previous window's update only (one window stale); without it, at once.
`transfers` "full" sends whole gradients and parameters (the engine's data path);
"shipped" is DeepSpeed's (the accumulator's round trip up, the fp32 window down at the
boundary; with `overlap_step` on a GPU the window end's blocking converting copy up,
zfbench.sims.window_copy). With pageable buffers (`pin_memory` false) DeepSpeed v0.19.5's
backward hook copies each gradient's accumulator up, adds, copies it down and, at the
boundary, the fp32 gradient down, each a copy that holds the hook's thread
(stage_1_and_2.py `copy_grads_in_partition`, `async_accumulate_grad_in_cpu_via_gpu`,
lines 1489-1533, 1623-1641; zfbench.sims.pageable): there each round trip is issued at
its bucket's turn and backward waits for all of them. On DeepSpeed's CPU accelerator the
round trip (after the tables' layout copies), the boundary's window copy and the device
step (the selective optimizer's probed ops) hold the training thread (sims.cpu_accelerator).
On the CPU-emulated accelerator, selection steps after step 0 first apply what is pending
and copy the parameters down (the master re-synced from the device).
`zenflow.offload` moves the selected columns' moments up before the device AdamW and
back after it, in line with the update as DeepSpeed copies them on its stream.
"""

from __future__ import annotations

from zfbench.core.schedule import is_selection_step, is_warmup
from zfbench.sims.cpu_accelerator import layout_s, round_trip_s, selective_s, thread_rate
from zfbench.sims.lanes import all_done, all_of
from zfbench.sims.window_copy import window_copy


def zenflow_zero2_step(sim, t: int):
    """Rank `sim`'s step t of ZenFlow on ZeRO-2 (its schedule: the module's docstring)."""
    c, s, st = sim.costs, sim.costs.settings, sim.state
    W, S = s.zenflow.full_warm_up_rounds, s.zenflow.select_interval
    if is_warmup(t, W):
        yield from sim.offload_step(t)
        return
    shipped = s.measurement.transfers == "shipped"
    unselected = [b.numel - b.selected_numel for b in c.buckets]
    if s.measurement.transfers == "full":  # the whole gradient down, whole parameters up
        unselected = [b.numel for b in c.buckets]
    window_start = st.get("window_start", t)
    st["window_start"] = window_start
    round_trip = {}
    # into pageable buffers DeepSpeed's backward hook runs each bucket's round trip
    # itself, up, add, down, each copy holding its thread (`in_hook`; the module docstring)
    in_hook = shipped and c.pageable_copies
    # on DeepSpeed's CPU accelerator the round trip is the training thread's own memory
    # passes after backward, not copies (zfbench.sims.cpu_accelerator)
    on_thread = shipped and thread_rate(c) is not None

    def up(i: int):  # the shipped path brings the accumulator back up
        if i not in round_trip and t > window_start:
            round_trip[i] = sim.transfer(sim.h2d, "h2d_param", t, c.share(
                c.buckets[i].numel) * c.elem_bytes, [st.get(("down", t - 1, i))])
        return round_trip.get(i)
    if shipped and not in_hook and not on_thread:
        for i in reversed(range(sim.nb)):
            up(i)
    yield from sim.compute("forward", t, c.forward_s)
    prev_accum = st.get(("accum", t - 1))
    if c.engine_grad_passes and not sim.emulated and not shipped and prev_accum:
        # zfbench's engine on a GPU sends each bucket down during backward into the
        # one staging buffer the last accumulation reads: its main thread waits for
        # that accumulation before it launches backward (real/zenflow.py
        # `grads_landing`); DeepSpeed's schedule (presets) holds only the copies
        yield prev_accum
    # Not shipped: the staging buffer is free once the host accumulated the last one.
    bytes_of = (lambda i: 0) if on_thread else sim.shard_bytes if shipped else (
        lambda i: c.share(unselected[i]) * c.elem_bytes)
    deps_of = (lambda i: []) if on_thread else (lambda i: [up(i)]) if shipped else (
        lambda i: [prev_accum])
    # the engine's check riding the copy down (CostModel.check_rides_d2h): that copy runs
    # right after backward, before a selection step's work
    early = c.check_rides_d2h
    down = yield from sim.grads_down(t, bytes_of, deps_of, grad_check=not early)
    if early:
        yield from sim.copy_grads_down(t, bytes_of, deps_of)
    if on_thread:
        # the embedding tables' gradients put into ZenFlow's column-major layout: the
        # end of backward (those gradients come last), then the round trip
        if layout_s(c) > 0:
            yield from sim.compute("backward", t, layout_s(c))
        yield from sim.compute("host_accum", t, round_trip_s(c, t == window_start))
    for i, event in down.items():
        st[("down", t, i)] = event
        st.pop(("down", t - 1, i), None)
    if is_selection_step(t, W, S):
        if sim.emulated and t != 0:  # apply what is pending, re-sync the master
            yield from sim.apply_update(t, st.pop("pending", None), True)
            yield from sim.copy_down_now("select", t, c.share(c.params) * c.elem_bytes)
        yield from sim.compute("select", t, c.select_s())
        scores = sim.collective("allreduce", t, 4 * sum(
            m.cols for m in c.shape.matrices()), [])
        yield from all_done(sim.env, [scores])
    if not early:
        yield from sim.copy_grads_down(t, bytes_of, deps_of)
    if not shipped:  # a window's first accumulation writes it (`CostModel.window_first_write`)
        st[("accum", t)] = sim.host_work("host_accum", t, c.share(sum(unselected)),
                                          list(down.values()), first=t == window_start)
    st.pop(("accum", t - 1), None)
    if c.is_boundary(t):
        window_deps = [st.get(("accum", t))] if not shipped else list(down.values())
        if shipped:  # fp32 window gradient down at the boundary
            window_deps = [sim.transfer(sim.d2h, "d2h_grad", t,
                                         c.share(c.params) * 4, window_deps)]
            if in_hook or on_thread:  # the hooks' (or training thread's) own work
                yield from all_done(sim.env, window_deps)
        up_elems = unselected if not shipped else [b.numel for b in c.buckets]
        # DeepSpeed's overlapped window end on a GPU: the optimizer process uploads
        # nothing; the training thread waits for it, then copies the fp32 snapshot into
        # the 16-bit weights itself (zfbench.sims.window_copy)
        ds_copy = shipped and s.zenflow.overlap_step and not sim.emulated
        if ds_copy:
            pending = st.pop("pending", None)
            if pending is not None:
                yield from all_done(sim.env, [pending])
                yield from window_copy(sim, t)
        elif s.zenflow.overlap_step:
            yield from sim.apply_update(t, st.pop("pending", None), True)
        # the window is fp32 already: only the parameters going up are converted,
        # one of the two conversions the profile times together; the engine clears
        # the window chunk by chunk after its Adam (not the shipped path: DeepSpeed's)
        landed, chunks = sim.host_update(t, window_deps,
                                          lambda i: c.share(c.buckets[i].numel),
                                          lambda i: 0 if ds_copy else
                                          c.share(up_elems[i]) * c.elem_bytes,
                                          lambda i: 0.5 * c.share(up_elems[i]),
                                          None if shipped else
                                          (lambda i: c.share(c.buckets[i].numel)),
                                          gather=not ds_copy)
        if ds_copy:  # the update is done when the optimizer process is
            st["pending"] = all_of(sim.env, list(chunks.values()))
        elif s.zenflow.overlap_step:
            st["pending"] = landed
        else:
            yield from sim.apply_update(t, landed, True)
        st.pop("window_start", None)
    yield from all_done(sim.env, sim.reduced)  # selected columns need reduced grads
    moments = c.offloaded_moment_bytes  # zenflow.offload: m and v up, then back
    if moments:  # in line with the update, as DeepSpeed copies them on its stream
        yield sim.transfer(sim.h2d, "h2d_moments", t, moments, [])
    # on DeepSpeed's CPU accelerator the selective optimizer's probed ops (where probed)
    device_optim = selective_s(c, c.is_boundary(t)) if on_thread else None
    if device_optim is None:
        device_optim = c.device_optim_s(c.selected_params)
    yield from sim.compute("device_optim", t, device_optim + sim.column_io_s())
    if moments:
        yield sim.transfer(sim.d2h, "d2h_moments", t, moments, [])
