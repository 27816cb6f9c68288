"""The strategies as SimPy processes, one per rank, each emitting a span for every op.

Each rank's process is its compute stream: it runs forward, backward (bucket by bucket, in
reverse) and device optimizer ops itself and submits transfers, host work and collectives
to its lanes with the dependencies the real engine has:

- `device`: forward, backward, gradient all-reduce, device Adam, parameter all-gather.
- `zero-offload`: each bucket's gradient goes down as soon as backward produced it; after
  the last, the host runs Adam over the rank's partition chunk by chunk, each chunk's
  parameters go up as soon as it is done; the next forward waits for all of them.
- `zero-offload-dpu`: the same ops, but forward t+1 waits only for the update of step
  t-1 (one step stale), and a bucket's gradient waits for the host to have consumed the
  previous step's gradient of that bucket.
- `zero-infinity`: ZeRO-3 with parameters (and optimizer state) offloaded: every bucket
  fetched before its forward and again before its backward, gradients reduce-scattered
  and sent down, host Adam, no upload (`sims/zero_infinity.py`).
- `zenflow`: warm-up steps are zero-offload steps; then every step sends the unselected
  share of each gradient down and accumulates it on the host while the device updates
  the selected columns; at each update boundary the host Adam runs over the window and its
  parameters go up. With `overlap_step` the device waits, at the next boundary, for the
  previous window's update only (one window stale); without it, at once.

A step's wall interval runs from its forward's start to the moment the next forward may
start; the stall the analysis reports is that interval minus the compute lane's busy time.
"""

from __future__ import annotations

import simpy

from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, ADAM_BYTES_PER_PARAM, CostModel
from zfbench.sims.fluid import FluidPool, Job
from zfbench.sims.lanes import Lane, all_done, run_compute
from zfbench.sims.zero_infinity import zero_infinity_step
from zfbench.core.schedule import is_selection_step, is_warmup
from zfbench.core.trace import Timeline


class RankSim:
    """One rank: its lanes, its costs, and the strategy step functions."""

    def __init__(self, env: simpy.Environment, timeline: Timeline, pool: FluidPool,
                 costs: CostModel, rank: int) -> None:
        self.env, self.timeline, self.costs, self.rank = env, timeline, costs, rank
        self.pool = pool
        self.d2h = Lane(env, timeline, pool, rank, "d2h")
        self.h2d = Lane(env, timeline, pool, rank, "h2d")
        self.host = Lane(env, timeline, pool, rank, "host", priority_ops=("host_accum",))
        self.net = Lane(env, timeline, pool, rank, "net")
        self.latency_s = costs.node.link.setup_latency_s
        self.nb = len(costs.buckets)

    # -- op helpers -------------------------------------------------------------------
    def compute(self, op: str, step: int, seconds: float):
        return run_compute(self.env, self.timeline, self.rank, op, step, seconds)

    def transfer(self, lane: Lane, op: str, step: int, nbytes: float, deps) -> simpy.Event:
        nbytes = int(round(nbytes))
        if nbytes <= 0:
            return _fired(self.env)
        job = Job(lane.name, self.rank, nbytes)
        return lane.submit(op, step, deps, seconds=self.latency_s, job=job, nbytes=nbytes)

    def host_work(self, op: str, step: int, elems: float, deps) -> simpy.Event:
        if elems <= 0:
            return _fired(self.env)
        c = self.costs
        if op == "host_optim":
            job = Job("host", self.rank, elems, ADAM_BYTES_PER_PARAM, c.adam_units_per_core_s)
        else:
            job = Job("host", self.rank, elems, ACCUM_BYTES_PER_ELEMENT,
                      c.accum_units_per_core_s)
        return self.host.submit(op, step, deps, job=job)

    def collective(self, op: str, step: int, nbytes: float, deps) -> simpy.Event | None:
        c = self.costs
        if c.gpus == 1:
            return None
        seconds = c.allreduce_s(nbytes) if op == "allreduce" else c.allgather_s(nbytes)
        return self.net.submit(op, step, deps, seconds=seconds, nbytes=int(round(nbytes)))

    def backward(self, step: int, after_bucket):
        """Backward bucket by bucket (last block first); `after_bucket(i)` runs after each."""
        for i in reversed(range(self.nb)):
            yield from self.compute("backward", step, self.costs.buckets[i].backward_s)
            after_bucket(i)

    def gather_when_ready(self, step: int, nbytes: float, ready: simpy.Event) -> simpy.Event | None:
        """All-gather updated parameters once `ready` fires: the collective joins the net
        lane in the order parameters become ready, not blocking collectives issued before."""
        if self.costs.gpus == 1:
            return None
        done = self.env.event()

        def issue():
            yield ready
            yield self.collective("allgather", step, nbytes, [])
            done.succeed()
        self.env.process(issue())
        return done

    def host_update(self, step: int, deps, elems_of, up_bytes_of):
        """Host Adam chunk by chunk, each chunk's parameters up (and all-gathered) after it;
        returns the event of the last upload and each chunk's host event."""
        c = self.costs
        last, chunks = None, {}
        for i in reversed(range(self.nb)):
            chunks[i] = self.host_work("host_optim", step, elems_of(i), deps)
            up = self.transfer(self.h2d, "h2d_param", step, up_bytes_of(i), [chunks[i]])
            last = self.gather_when_ready(step, c.buckets[i].numel * c.elem_bytes, up) or up
            deps = ()
        return last, chunks

    # -- strategies -------------------------------------------------------------------
    def run(self, strategy: str, steps: int):
        step_fn = {"device": self.device_step, "zero-offload": self.offload_step,
                   "zero-offload-dpu": self.dpu_step, "zenflow": self.zenflow_step,
                   "zero-infinity": lambda t: zero_infinity_step(self, t)}[strategy]
        self.state: dict = {}
        for t in range(steps):
            start = self.env.now
            yield from step_fn(t)
            yield from self.after_step(t)
            self.timeline.mark_step(self.rank, t, start, self.env.now)

    def after_step(self, t: int):
        """Device work that closes every step (none here; the emulated engine zeroes
        gradients)."""
        return iter(())

    def device_step(self, t: int):
        c = self.costs
        yield from self.compute("forward", t, c.forward_s)
        reduced = []
        yield from self.backward(t, lambda i: reduced.append(self.collective(
            "allreduce", t, c.buckets[i].numel * c.elem_bytes, [])))
        yield from all_done(self.env, reduced)
        yield from self.compute("device_optim", t, c.device_optim_s(c.share(c.params))
                                + c.master_copy_s(c.share(c.params)))
        gathered = self.collective("allgather", t, c.model_bytes, [])
        yield from all_done(self.env, [gathered])

    def _grads_down(self, t: int, bytes_of, extra_deps_of=lambda i: ()):
        """Backward with each bucket's gradient reduced then sent down; returns the events."""
        c = self.costs
        down: dict[int, simpy.Event] = {}
        self.reduced = []

        def after(i: int) -> None:
            red = self.collective("allreduce", t, c.buckets[i].numel * c.elem_bytes, [])
            self.reduced.append(red)
            down[i] = self.transfer(self.d2h, "d2h_grad", t, bytes_of(i),
                                    [red, *extra_deps_of(i)])
        yield from self.backward(t, after)
        return down

    def offload_step(self, t: int):
        c = self.costs
        yield from self.compute("forward", t, c.forward_s)
        down = yield from self._grads_down(t, lambda i: c.share(c.buckets[i].numel) * c.elem_bytes)
        landed, _ = self.host_update(t, list(down.values()),
                                     lambda i: c.share(c.buckets[i].numel),
                                     lambda i: c.share(c.buckets[i].numel) * c.elem_bytes)
        yield from all_done(self.env, [landed])

    def dpu_step(self, t: int):
        c, st = self.costs, self.state
        yield from all_done(self.env, [st.get(("landed", t - 2))])
        yield from self.compute("forward", t, c.forward_s)
        prev_chunks = st.get(("chunks", t - 1), {})
        down = yield from self._grads_down(
            t, lambda i: c.share(c.buckets[i].numel) * c.elem_bytes,
            lambda i: [prev_chunks.get(i)])
        last, chunks = self.host_update(t, list(down.values()),
                                        lambda i: c.share(c.buckets[i].numel),
                                        lambda i: c.share(c.buckets[i].numel) * c.elem_bytes)
        st[("chunks", t)], st[("landed", t)] = chunks, last
        st.pop(("chunks", t - 1), None)
        # The next forward needs the update of step t-1: the step ends when it has landed.
        yield from all_done(self.env, [st.pop(("landed", t - 1), None)])

    def zenflow_step(self, t: int):
        c, s, st = self.costs, self.costs.settings, self.state
        W, S = s.full_warm_up_rounds, s.select_interval
        if is_warmup(t, W):
            yield from self.offload_step(t)
            return
        shipped = s.transfers == "shipped"
        unselected = [b.numel - b.selected_numel for b in c.buckets]
        if s.transfers == "full":  # the whole gradient down, whole parameters up
            unselected = [b.numel for b in c.buckets]
        window_start = st.get("window_start", t)
        st["window_start"] = window_start
        round_trip = {}
        if shipped and t > window_start:  # the shipped path brings the accumulator back up
            for i in reversed(range(self.nb)):
                round_trip[i] = self.transfer(self.h2d, "h2d_param", t, c.share(
                    c.buckets[i].numel) * c.elem_bytes, [st.get(("down", t - 1, i))])
        yield from self.compute("forward", t, c.forward_s)
        prev_accum = st.get(("accum", t - 1))
        if shipped:
            down = yield from self._grads_down(
                t, lambda i: c.share(c.buckets[i].numel) * c.elem_bytes,
                lambda i: [round_trip.get(i)])
        else:
            down = yield from self._grads_down(
                t, lambda i: c.share(unselected[i]) * c.elem_bytes, lambda i: [prev_accum])
        for i, event in down.items():
            st[("down", t, i)] = event
            st.pop(("down", t - 1, i), None)
        if is_selection_step(t, W, S):
            yield from self.compute("select", t, c.select_s())
            scores = self.collective("allreduce", t, 4 * sum(
                m.cols for m in c.shape.matrices()), [])
            yield from all_done(self.env, [scores])
        if not shipped:
            st[("accum", t)] = self.host_work("host_accum", t, c.share(sum(unselected)),
                                              list(down.values()))
        st.pop(("accum", t - 1), None)
        if c.is_boundary(t):
            window_deps = [st.get(("accum", t))] if not shipped else list(down.values())
            if shipped:  # fp32 window gradient down at the boundary
                window_deps = [self.transfer(self.d2h, "d2h_grad", t,
                                             c.share(c.params) * 4, window_deps)]
            up_elems = unselected if not shipped else [b.numel for b in c.buckets]
            if s.overlap_step:
                yield from all_done(self.env, [st.pop("pending", None)])
            landed, _ = self.host_update(t, window_deps,
                                         lambda i: c.share(c.buckets[i].numel),
                                         lambda i: c.share(up_elems[i]) * c.elem_bytes)
            if s.overlap_step:
                st["pending"] = landed
            else:
                yield from all_done(self.env, [landed])
            st.pop("window_start", None)
        yield from all_done(self.env, self.reduced)  # selected columns need reduced grads
        yield from self.compute("device_optim", t, c.device_optim_s(c.selected_params))


def _fired(env: simpy.Environment) -> simpy.Event:
    event = env.event()
    event.succeed()
    return event
