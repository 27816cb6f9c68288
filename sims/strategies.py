"""The strategies as SimPy processes, one per rank, each emitting a span for every op.

Each rank's process is its compute stream: it runs forward, backward (bucket by bucket, in
reverse) and device optimizer ops itself and submits transfers, host work and collectives
to its lanes with the dependencies the real engine has. This module owns those schedules
(`RankSim`, one step method per strategy: `device`, `zero-offload`, `zero-offload-dpu`;
ZenFlow's are `sims/zenflow_zero2.py` and `sims/zenflow_zero3.py`, zero-infinity's
`sims/zero_infinity.py`, each a function of a `RankSim`), gradient accumulation's
micro-steps (`accumulate`, as DeepSpeed's ZeRO-2 CPU offload accumulates), and the
variants for pageable buffers, `overlap_comm` off and the CPU-emulated accelerator.
`RankSim`'s docstring states each strategy's schedule; the costs come from `CostModel`,
ZeRO-2's partitions from `sims/partitioning.py`, DeepSpeed's host step from
`sims/host_step.py`, the emulated rate model from `sims/emulated.py`.

A step's wall interval runs from its forward's start to the moment the next forward may
start; the stall the analysis reports is that interval minus the compute lane's busy time.
"""

from __future__ import annotations

import functools
import math

import simpy

from zfbench.sims.costs import (ACCUM_BYTES_PER_ELEMENT, ACCUM_FIRST_BYTES_PER_ELEMENT,
                                ADAM_BYTES_PER_PARAM, CostModel)
from zfbench.sims.emulated import device_thread_op, grad_check_s, grad_zero_s
from zfbench.sims import host_busy, host_step, host_traffic, pageable, partitioning
from zfbench.sims.fluid import FluidPool, Job
from zfbench.sims.host_step import CLIP_BYTES_PER_ELEM, CONVERT_BYTES_PER_ELEM
from zfbench.sims.lanes import Lane, all_done, all_of, run_compute
from zfbench.sims.zenflow_zero2 import zenflow_zero2_step
from zfbench.sims.zenflow_zero3 import zenflow_zero3_step
from zfbench.sims.zero_infinity import zero_infinity_step
from zfbench.core import engine_host_bytes
from zfbench.core.strategies import (STRATEGY_LIST, device_adamw, offloads_params,
                                     zero_stage_chosen, zero_stage_of)
from zfbench.core.trace import Timeline


# The strategies whose step runs with gradient accumulation (grad_accum > 1).
GRAD_ACCUM_STRATEGIES = tuple(s.name for s in STRATEGY_LIST if s.sim_grad_accum)


class RankSim:
    """One rank: its lanes, its costs, and the strategy step functions.

    Each strategy's schedule, with the dependencies the real engine has:

    - `device`: forward, backward, gradient reduction (from presets DeepSpeed ZeRO-2's
      reduce-scatter, `sims/partitioning.py`; with a measured profile the engine's
      all-reduce), the device step (Adam and, from presets, DeepSpeed's passes beside it:
      `sims/device_step.py`), parameter all-gather.
    - `zero-offload`: each bucket's gradient goes down as soon as backward produced it; from
      presets it is reduce-scattered to the ranks whose ZeRO-2 partitions it overlaps and only
      they copy their part, the next reduction waiting for those copies
      (`sims/partitioning.py`; with a measured profile: all-reduced, each rank a 1/N share) (from
      presets as fp32, DeepSpeed's `.float()` before the copy: `CostModel.grad_wire_bytes`;
      the accumulation micro-steps' copies stay 16-bit); after
      the last, the host runs DeepSpeed's step (simulations from presets,
      zfbench/sims/host_step.py): unscale/clip, CPU-Adam and the fp32 -> 16-bit conversion over
      the rank's whole partition, then the partition goes up in one copy and is all-gathered;
      with a measured profile (zfbench's engine) Adam runs chunk by chunk, each chunk's
      parameters up as soon as it is done. The next forward waits for all of them.
    - `zero-offload-dpu`: the same ops, but forward t+1 waits only for the update of step
      t-1 (one step stale); the buckets land in one of two alternating host buffers, so none
      waits for the host to consume the previous step's gradient (emulated: the one copy
      down waits for it).
    - `zero-infinity`: ZeRO-3 with parameters (and optimizer state) offloaded: every bucket
      fetched before its forward and again before its backward, gradients reduce-scattered
      and sent down, host Adam, no upload (`sims/zero_infinity.py`).
    - `zenflow`: zfbench.sims.zenflow_zero2 (ZeRO-2), zfbench.sims.zenflow_zero3 (ZeRO-3).

    With gradient accumulation (`grad_accum` A > 1; device, zero-offload and zero-offload-dpu
    here, zero-infinity in zfbench.sims.zero_infinity the same way) a step is A micro-steps:
    A - 1 accumulation micro-steps (`accumulate`), then the strategy's own step as the last.
    A micro-step runs forward and backward, each bucket's gradient all-reduced (device: the
    ZeRO-2 reduction happens every micro-step). The offloading
    strategies accumulate as DeepSpeed's ZeRO-2 CPU offload does
    (`async_accumulate_grad_in_cpu_via_gpu` in its stage_1_and_2.py): the rank's share of
    each bucket lives in a pinned 16-bit host buffer between micro-steps; from the second
    micro-step on it first comes up (h2d, recorded as `h2d_param`, as zenflow's shipped round
    trip is) to be added to the new gradient on the device, and every micro-step but the
    last sends the sum down (d2h `d2h_grad`); the last sends it down as the step's gradient.
    The add itself (one read-read-write of the share in HBM, milliseconds against seconds of
    compute) is left out. No host compute is spent on accumulation.

    With pageable host buffers (`pin_memory` False, from presets) every copy is staged by the
    driver and a gradient's copy down during backward holds the compute lane until it has
    landed (`sims/pageable.py`). Without `overlap_comm` (from presets; device, zero-offload
    and zero-offload-dpu) each bucket's reduction and copy run on the compute stream, so the
    compute lane waits for both (`CostModel.serial_grad_reduction`).

    The same schedules run on a CPU-emulated accelerator (`RankSim.emulated`, from the cost
    model: a profile measured without CUDA; what differs there is in `sims/emulated.py`). The
    engine has no copy engines there, so: compute spans are pool work slowed by host work
    beside them; after backward (and the engine's gradient check) the device thread itself
    copies every gradient down in one copy; uploads run on the host worker; applying an
    uploaded update is a device copy, which `zero-offload-dpu` does right before its
    gradients go down (not at the end of the step) and `zenflow` at its boundaries; zenflow's
    selection steps after step 0 first apply what is pending and copy the parameters down
    (the master re-synced from the device), and its device update adds the selected columns'
    gather and scatter; every step ends with the engine zeroing the gradients.
    """

    def __init__(self, env: simpy.Environment, timeline: Timeline, pool: FluidPool,
                 costs: CostModel, rank: int, sync: partitioning.Sync | None = None) -> None:
        self.env, self.timeline, self.costs, self.rank = env, timeline, costs, rank
        # events shared with the other ranks (zfbench.sims.partitioning)
        self.sync = sync if sync is not None else partitioning.Sync(env)
        self.pool = pool
        self.emulated = costs.emulated  # a CPU-emulated accelerator (sims/emulated.py)
        # compute as pool work, slowed by host work beside it: emulated, or on a GPU
        # whose profile measured the slowdown (sims/host_busy.py)
        self.compute_on_pool = self.emulated or host_busy.compute_factor(costs) is not None
        self.d2h = Lane(env, timeline, pool, rank, "d2h")
        self.h2d = Lane(env, timeline, pool, rank, "h2d")
        self.host = Lane(env, timeline, pool, rank, "host", priority_ops=("host_accum",))
        self.net = Lane(env, timeline, pool, rank, "net")
        self.latency_s = costs.node.link.setup_latency_s
        self.nb = len(costs.buckets)
        # set by `run` for its strategy: ZeRO-2's reduction on the compute stream, its
        # reduce-scatter and its partitions (zfbench.sims.partitioning)
        self.serial_reduction = self.reduce_scatters = self.owned = False

    # -- op helpers -------------------------------------------------------------------
    def compute(self, op: str, step: int, seconds: float):
        if self.compute_on_pool:  # pool work, so host-lane work beside it slows it
            return device_thread_op(self, "compute", op, step, seconds)
        return run_compute(self.env, self.timeline, self.rank, op, step, seconds)

    def transfer(self, lane: Lane, op: str, step: int, nbytes: float, deps,
                 pageable_buffer: bool | None = None) -> simpy.Event:
        """A copy on `lane` once `deps` have fired; emulated, uploads run on the host
        worker (recorded on the h2d lane). `pageable_buffer`: whether its host buffer is pageable
        (default: as the offload's buffers, `CostModel.pageable_copies`)."""
        nbytes = int(round(nbytes))
        if nbytes <= 0:
            return _fired(self.env)
        job = self.copy_job(lane.name, nbytes, pageable_buffer)
        if self.emulated and lane is self.h2d:
            return self.host.submit(op, step, deps, seconds=self.latency_s, job=job,
                                    nbytes=nbytes, record_lane="h2d")
        return lane.submit(op, step, deps, seconds=self.latency_s, job=job, nbytes=nbytes)

    def copy_job(self, kind: str, nbytes: int, pageable_buffer: bool | None = None) -> Job:
        """The pool job of a copy of `nbytes` ("d2h" or "h2d"): from pageable host buffers
        (`pageable_buffer`, default `CostModel.pageable_copies`), capped by the driver's
        staging copy and three DRAM bytes per byte (zfbench.sims.pageable)."""
        c = self.costs
        if c.pageable_copies if pageable_buffer is None else pageable_buffer:
            return Job(kind, self.rank, nbytes, pageable.DRAM_BYTES_PER_BYTE,
                       c.pageable_copy_bytes_per_s)
        return Job(kind, self.rank, nbytes)

    def copy_down_now(self, op: str, step: int, nbytes: float):
        """Emulated: a copy down run by the device thread (the compute lane waits for it)."""
        nbytes = int(round(nbytes))
        return device_thread_op(self, "d2h", op, step, nbytes, nbytes)

    def host_work(self, op: str, step: int, elems: float, deps,
                  convert_elems: float = 0.0, zero_elems: float = 0.0,
                  from_wire_elems: float = 0.0, first: bool = False) -> simpy.Event:
        """Host-lane work; a host AdamW chunk also converts `convert_elems` elements of
        the wires its AdamW rate leaves out (the gradients into fp32; the parameters go
        into the device's dtype within the engine's AdamW pass, in profiles from issue 45
        on) where the profile measured the conversions
        (zfbench.sims.costs.CostModel.convert_units_per_core_s), and zeroes `zero_elems`
        gradient elements (ZenFlow's window, as the engine clears it) where the profile
        measured what zeroing adds (`zero_units_per_core_s`). From presets with the
        engine's host job (`CostModel.engine_host_job`) the AdamW chunk is one job of the
        engine's bytes (zfbench.core.engine_host_bytes): its wire, `from_wire_elems`
        gradient elements widened from the d2h wire, `zero_elems` zeroed. Where the engine
        zeroes no window (`CostModel.window_first_write`) `zero_elems` is moot, and a
        window's `first` accumulation writes it (`accum_first_units_per_core_s`)."""
        if elems <= 0:
            return _fired(self.env)
        c = self.costs
        if c.window_first_write:
            zero_elems = 0.0
        if op == "host_optim" and c.engine_host_job:
            b = engine_host_bytes.host_job_bytes(c.elem_bytes, from_wire_elems / elems,
                                                 zero_elems / elems, c.engine_clips)
            job = Job("host", self.rank, elems, b, host_traffic.engine_job_units_per_s(
                c.adam_units_per_core_s, b))
        elif op == "host_optim":
            units = c.adam_units_per_core_s
            convert, zero = c.convert_units_per_core_s, c.zero_units_per_core_s
            seconds_per_elem = 1.0 / units  # each pass's seconds per element add up
            if convert_elems > 0 and convert is not None:
                seconds_per_elem += convert_elems / elems / convert
            if zero_elems > 0 and zero is not None:
                seconds_per_elem += zero_elems / elems / zero
            units = 1.0 / seconds_per_elem
            job = Job("host", self.rank, elems, ADAM_BYTES_PER_PARAM, units)
        elif op in ("host_clip", "host_convert"):
            b = CLIP_BYTES_PER_ELEM if op == "host_clip" else CONVERT_BYTES_PER_ELEM
            job = Job("host", self.rank, elems, b, c.stream_units_per_core_s(b))
        elif first and c.window_first_write:
            job = Job("host", self.rank, elems, ACCUM_FIRST_BYTES_PER_ELEMENT,
                      c.accum_first_units_per_core_s)
        else:
            job = Job("host", self.rank, elems, ACCUM_BYTES_PER_ELEMENT,
                      c.accum_units_per_core_s)
        return self.host.submit(op, step, deps, job=job)

    def collective(self, op: str, step: int, nbytes: float, deps) -> simpy.Event | None:
        c = self.costs
        if c.gpus == 1:
            return None
        seconds = c.allreduce_s(nbytes) if op == "allreduce" else c.allgather_s(nbytes)
        if self.emulated and c.collectives_measured:
            # gloo on the CPU: its rank's device thread does it, so it shares the cores
            return self.net.submit(op, step, deps, job=Job("net", self.rank, seconds),
                                   nbytes=int(round(nbytes)))
        return self.net.submit(op, step, deps, seconds=seconds, nbytes=int(round(nbytes)))

    def backward(self, step: int, after_bucket, reduce: bool = True, grad_check: bool = True):
        """Backward bucket by bucket (last block first); `after_bucket(i)` runs after each
        (with copy engines); the copy (or reduction) event it returns, if any, holds the
        compute lane when the host buffers are pageable (zfbench.sims.pageable) or, for
        DeepSpeed's ZeRO-2 strategies without `overlap_comm`, always
        (`CostModel.serial_grad_reduction`). Emulated, as the
        engine there: with several ranks the device thread all-reduces the whole gradient
        buffer (`reduce`: at the accumulation boundary). With a profile of zfbench's engine
        (`CostModel.engine_grad_passes`, on a CPU lane or a GPU), it then checks every
        gradient for non-finite values, as the engine does."""
        for i in reversed(range(self.nb)):
            yield from self.compute("backward", step, self.costs.buckets[i].backward_s)
            if not self.emulated:
                copy = after_bucket(i)
                if copy is not None and (self.costs.pageable_copies or self.serial_reduction):
                    # into pageable memory the copy blocks the thread that launches
                    # backward's kernels (zfbench.sims.pageable); without overlap_comm
                    # the bucket's reduction and copy run on the compute stream
                    yield from all_done(self.env, [copy])
        if self.emulated and reduce:
            yield from all_done(self.env, [self.collective(
                "allreduce", step, self.costs.model_bytes, [])])
        if self.costs.engine_grad_passes:  # with the check riding the copy down, the
            # engine's span of reading its verdict stays, its pass does not
            yield from self.compute("device_optim", step,
                                    grad_check_s(self.costs) if grad_check else 0.0)

    def apply_update(self, step: int, landed, keep_columns: bool = False):
        """Wait for an uploaded update (None: none pending). Emulated, the device then
        copies it into the parameters; zenflow (`keep_columns`) first keeps its selected
        columns and puts them back after (costed as one step's column I/O)."""
        if landed is None:
            return
        yield from all_done(self.env, [landed])
        if self.emulated:
            c = self.costs
            yield from self.compute("device_optim", step, c.device_copy_s(c.params) + (
                self.column_io_s() if keep_columns else 0.0))

    def column_io_s(self, every_column: bool = False) -> float:
        """Emulated: zenflow's gather and scatter of the selected columns, per step (on a
        GPU it is inside the device update's cost; `every_column`: `CostModel.column_io_s`)."""
        return self.costs.column_io_s(every_column) if self.emulated else 0.0

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

    def host_update(self, step: int, deps, elems_of, up_bytes_of, convert_of=None,
                    zero_of=None, gather: bool = True, from_wire_of=None):
        """Host Adam chunk by chunk, each chunk's parameters up (and, with `gather`,
        all-gathered: not on ZeRO-3, whose next use gathers them) after it;
        returns the event of the last upload and each bucket's host event (its last
        chunk's: with a profile of the engine each bucket is cut into the engine's host
        chunks, `CostModel.host_chunk_elems`). `convert_of(i)`:
        elements of chunk i whose wires the host converts (default none); `zero_of(i)`:
        gradient elements of chunk i zeroed with its Adam (default none); `from_wire_of(i)`:
        its gradient elements widened from the d2h wire (the engine's host job from
        presets, `CostModel.engine_host_job`; default none)."""
        c = self.costs
        last, chunks = None, {}
        for i in reversed(range(self.nb)):
            elems = elems_of(i)
            # the engine's chunks (a profile of it), else one job per bucket
            pieces = max(1, math.ceil(elems / c.host_chunk_elems)) if c.host_chunk_elems \
                else 1
            for _ in range(pieces):
                chunks[i] = self.host_work(
                    "host_optim", step, elems / pieces, deps,
                    (convert_of(i) if convert_of else 0.0) / pieces,
                    (zero_of(i) if zero_of else 0.0) / pieces,
                    (from_wire_of(i) if from_wire_of else 0.0) / pieces)
                up = self.transfer(self.h2d, "h2d_param", step, up_bytes_of(i) / pieces,
                                   [chunks[i]])
                deps = ()
            # emulated, the engine gathers the whole buffer once every chunk is up
            last = (up if self.emulated or not gather else
                    self.gather_when_ready(step, c.buckets[i].numel * c.elem_bytes, up) or up)
        if self.emulated and gather:
            last = self.gather_when_ready(step, c.model_bytes, last) or last
        return last, chunks

    def offload_update(self, step: int, deps):
        """ZeRO-Offload's host update and upload: DeepSpeed's whole-partition step on a
        node from presets, zfbench's engine's chunked one with a measured profile."""
        c = self.costs
        if c.deepspeed_host_step:
            return host_step.deepspeed_update(self, step, deps)
        shard = lambda i: c.share(c.buckets[i].numel)  # noqa: E731
        return self.host_update(step, deps, shard, self.shard_bytes, shard,
                                from_wire_of=shard)

    # -- strategies -------------------------------------------------------------------
    def run(self, strategy: str, steps: int):
        step_fn = functools.partial(step_function(strategy, self.costs.settings.zenflow.zero_stage),
                                    self)
        self.state: dict = {}
        self.serial_reduction = partitioning.serial_reduction(self.costs, strategy)
        self.reduce_scatters = partitioning.reduce_scatters(self.costs, strategy)
        self.owned = partitioning.owns_partitions(self.costs, strategy)
        if self.owned:
            self.owned_numels = partitioning.owned_numels(self.costs, self.rank)
            self.owners_of = [partitioning.owners(self.costs, i) for i in range(self.nb)]
        # zero-infinity runs its micro-steps inside its step (zfbench.sims.zero_infinity)
        accum = 1 if offloads_params(strategy) else self.costs.settings.scenario.grad_accum
        for t in range(steps):
            start = self.env.now
            for micro in range(accum - 1):
                yield from self.accumulate(strategy, t, micro)
            yield from step_fn(t)
            yield from self.after_step(t, strategy)
            self.timeline.mark_step(self.rank, t, start, self.env.now)

    def after_step(self, t: int, strategy: str):
        """Device work that closes every step: with a profile of zfbench's engine, which
        zeroes the gradients (`CostModel.engine_grad_passes`; `grad_zero_s`: those
        backward does not write over), unless its device AdamW did
        (`CostModel.zero_rides_device_adam`)."""
        c = self.costs
        if c.engine_grad_passes and not (device_adamw(strategy) and c.zero_rides_device_adam):
            yield from self.compute("device_optim", t, grad_zero_s(c, strategy))

    def accumulate(self, strategy: str, t: int, micro: int):
        """Micro-step `micro` of step t that ends in no update: forward, backward, each
        bucket reduced; offloading, each share summed through the host buffer (module
        docstring)."""
        c, st = self.costs, self.state
        yield from self.compute("forward", t, c.forward_s)
        if device_adamw(strategy):  # nothing goes down: each bucket is reduced in place
            reduced = []
            yield from self.backward(t, lambda i: partitioning.reduce_bucket(self, t, i, reduced),
                                     reduce=False)
            yield from all_done(self.env, reduced)
            return
        deps_of = self._accumulated_up(t, micro)
        down = yield from self.grads_down(t, self.shard_bytes, deps_of, reduce=False)
        yield from self.copy_grads_down(t, self.shard_bytes)
        st["accum_down"] = down
        yield from all_done(self.env, self.reduced)

    def _accumulated_up(self, t: int, micro: int):
        """`extra_deps_of` for a micro-step's gradients going down: from the second
        micro-step on, bucket i's accumulated share first comes up, once the previous
        micro-step's copy of it has landed on the host."""
        if micro == 0 or self.emulated:
            return lambda i: ()
        previous = self.state.get("accum_down", {})
        return lambda i: [self.transfer(self.h2d, "h2d_param", t, self.shard_bytes(i),
                                        [previous.get(i)])]

    def _final_micro_deps(self, t: int):
        """The last micro-step's `extra_deps_of` (nothing without accumulation)."""
        accum = self.costs.settings.scenario.grad_accum
        if accum == 1:
            return lambda i: ()
        deps = self._accumulated_up(t, accum - 1)
        self.state.pop("accum_down", None)
        return deps

    def device_step(self, t: int):
        c = self.costs
        yield from self.compute("forward", t, c.forward_s)
        reduced = []
        yield from self.backward(t, lambda i: partitioning.reduce_bucket(self, t, i, reduced))
        yield from all_done(self.env, reduced)
        if self.emulated:  # the engine's device strategy updates every parameter, no gather
            yield from self.compute("device_optim", t, c.device_step_s(c.params))
            return
        yield from self.compute("device_optim", t, c.device_step_s(c.share(c.params)))
        gathered = self.collective("allgather", t, c.model_bytes, [])
        yield from all_done(self.env, [gathered])

    def _shard_numel(self, i: int) -> float:
        """Elements of bucket i this rank copies down and updates: with ZeRO-2 partitions
        (`self.owned`) the part of bucket i inside its partition
        (zfbench.sims.partitioning), else its 1/N share of every bucket."""
        c = self.costs
        if self.owned:
            return self.owned_numels[i]
        return c.share(c.buckets[i].numel)

    def shard_bytes(self, i: int) -> float:
        """Bytes of this rank's share of bucket i's gradient or parameters."""
        return self._shard_numel(i) * self.costs.elem_bytes

    def _grad_wire_bytes(self, i: int) -> float:
        """Bytes of this rank's share of bucket i's gradient as ZeRO-Offload sends it down
        at the step's end (`CostModel.grad_wire_bytes`: fp32 from presets)."""
        return self._shard_numel(i) * self.costs.grad_wire_bytes

    def grads_down(self, t: int, bytes_of, extra_deps_of=lambda i: (), reduce=True,
                   grad_check: bool = True):
        """Backward with each bucket's gradient reduced, then sent down (`bytes_of(i)`)
        once `extra_deps_of(i)` have fired too; returns each bucket's event. Emulated:
        backward only (returns none); `copy_grads_down` sends them. `grad_check` False:
        the engine's non-finite check rides that copy (`CostModel.check_rides_d2h`)."""
        down: dict[int, simpy.Event] = {}
        self.reduced = []
        # every rank runs the same backward passes, so the count names them alike
        npass = self.state["passes"] = self.state.get("passes", 0) + 1
        previous: list[int] = []

        def after(i: int) -> simpy.Event:
            red = partitioning.reduce_bucket(self, t, i, self.reduced,
                                             partitioning.reduce_deps(self, npass, i, previous))
            previous.append(i)
            deps = [ev for ev in (red, *extra_deps_of(i)) if ev is not None]
            nbytes = bytes_of(i)
            if round(nbytes) > 0:
                sent = down[i] = self.transfer(self.d2h, "d2h_grad", t, nbytes, deps)
            else:  # a rank owning none of the bucket copies nothing
                sent = down[i] = all_of(self.env, deps)
            if self.owned and self.costs.gpus > 1:
                self.sync.publish(("down", npass, i, self.rank), sent)
            return sent
        yield from self.backward(t, (lambda i: None) if self.emulated else after, reduce,
                                 grad_check)
        return down

    def copy_grads_down(self, t: int, bytes_of, extra_deps_of=lambda i: ()):
        """Emulated: every gradient down in one copy by the device thread, once every
        `extra_deps_of(i)` has fired (the staging buffer is free); with copy engines
        `grads_down` has sent them already."""
        if not self.emulated:
            return
        deps = dict.fromkeys(d for i in range(self.nb) for d in extra_deps_of(i))
        yield from all_done(self.env, list(deps))
        yield from self.copy_down_now("d2h_grad", t, sum(bytes_of(i) for i in range(self.nb)))

    def offload_step(self, t: int):
        c = self.costs
        yield from self.compute("forward", t, c.forward_s)
        down = yield from self.grads_down(t, self._grad_wire_bytes, self._final_micro_deps(t),
                                          grad_check=not c.check_rides_d2h)
        yield from self.copy_grads_down(t, self._grad_wire_bytes)
        landed, _ = self.offload_update(t, list(down.values()))
        yield from all_done(self.env, [landed])

    def dpu_step(self, t: int):
        c, st = self.costs, self.state
        stale = st.pop(("landed", t - 1), None)  # the update of step t-1
        yield from self.compute("forward", t, c.forward_s)
        prev_chunks = st.pop(("chunks", t - 1), {})

        def consumed(i: int) -> list:  # the host is done with step t-1's gradient of i
            return [prev_chunks.get(i)]
        # with copy engines the buckets land in the other of two alternating buffers
        # (real/strategies.py), free since the update of step t-2 was applied
        down = yield from self.grads_down(t, self._grad_wire_bytes, self._final_micro_deps(t))
        if self.emulated:  # the device thread applies it before its gradients go down
            yield from self.apply_update(t, stale)
            stale = None
        yield from self.copy_grads_down(t, self._grad_wire_bytes, consumed)
        last, chunks = self.offload_update(t, list(down.values()))
        st[("chunks", t)], st[("landed", t)] = chunks, last
        # The next forward needs the update of step t-1: the step ends when it has landed.
        yield from self.apply_update(t, stale)


def _fired(env: simpy.Environment) -> simpy.Event:
    event = env.event()
    event.succeed()
    return event


# The simulator's registry: each step function (rank, t) under the zfbench.core.strategies
# record's name it simulates (tests/test_strategy_record.py: exactly SIM_STRATEGIES).
STEP_FUNCTIONS = {"device": RankSim.device_step, "zero-offload": RankSim.offload_step,
                  "zero-offload-dpu": RankSim.dpu_step, "zenflow": zenflow_zero2_step,
                  "zero-infinity": zero_infinity_step}

# ZeRO-3 steps of the strategies whose stage the `zero_stage` knob chooses
# (zfbench.core.strategies.zero_stage_chosen; tests/test_strategy_record.py holds the keys
# to the record).
ZERO3_STEP_FUNCTIONS = {"zenflow": zenflow_zero3_step}


def step_function(strategy: str, zero_stage: int):
    """The step function (rank, t) that simulates `strategy` with the `zero_stage` knob."""
    if zero_stage_chosen(strategy) and zero_stage_of(strategy, zero_stage) == 3:
        return ZERO3_STEP_FUNCTIONS[strategy]
    return STEP_FUNCTIONS[strategy]
