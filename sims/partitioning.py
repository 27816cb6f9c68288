"""ZeRO-2 gradient partitions: which rank reduces, copies down and updates which elements.

DeepSpeed's ZeRO stages 1-2 (deepspeed/runtime/zero/stage_1_and_2.py, `stage2.py` in its
2020-2021 releases), the engine under ZeRO-Offload, flatten the 16-bit parameters in
module order and give rank r of N the slice [r P/N, (r+1) P/N) as its partition (fp32
master, moments, gradient). In backward each bucket is reduce-scattered to the owners
of its parts (`average_tensor` with `reduce_scatter` on, the default: (n-1)/n of the bucket
per rank), and with the optimizer offloaded each owner copies its part down
(`copy_grads_in_partition` -> `async_inplace_copy_grad_to_fp32_buffer_from_gpu`) on the
stream that reduced it. So a bucket goes down through the links of the few ranks that own
it, and the next reduction, which every rank joins, waits behind that copy: the
ZeRO-Infinity paper's explanation of its Figure 6c (Rajbhandari et al., SC 2021, arXiv
2104.07857, section 6.1; against its bandwidth-centric partitioning, `zfbench.sims.zero3`).

This module owns the ownership arithmetic (a bucket is a block of the model,
`CostModel.buckets`; `owners`, `owned_numel`), a rank's reduction of a bucket
(`reduce_bucket`), and the cross-rank waits (`reduce_deps`, through one `Sync` per
simulation). Only simulations from presets (`CostModel.calibration` None) partition this
way; a measured profile keeps what zfbench's engine does (real/): it all-reduces every
gradient and each rank copies down and updates a 1/N share of every bucket.
"""

from __future__ import annotations

from heapq import heappush

import simpy

from zfbench.core.strategies import STRATEGY_LIST, ZERO_OFFLOAD_STRATEGIES
from zfbench.sims import zero2_reduce
from zfbench.sims.lanes import call_now

# DeepSpeed's ZeRO-2 strategies (from presets): they reduce-scatter their gradient buckets
# and follow `overlap_comm`; the offloading ones copy their partitions down (`device`,
# ZeRO-2 without offload, copies nothing).
ZERO2_STRATEGIES = tuple(s.name for s in STRATEGY_LIST if s.sim_zero2)
OWNED_STRATEGIES = ZERO_OFFLOAD_STRATEGIES


def owns_partitions(c, strategy: str) -> bool:
    """Do `strategy`'s gradients go to ZeRO-2 partitions under cost model `c`?"""
    return strategy in OWNED_STRATEGIES and c.calibration is None


def reduce_scatters(c, strategy: str) -> bool:
    """Does `strategy` reduce-scatter its gradient buckets (DeepSpeed's ZeRO-2) under `c`,
    rather than all-reduce them (zfbench's engine)?"""
    return strategy in ZERO2_STRATEGIES and c.calibration is None


def serial_reduction(c, strategy: str) -> bool:
    """Do `strategy`'s bucket reductions and copies run on the compute stream under `c`
    (DeepSpeed's ZeRO-2 with `overlap_comm` off: `CostModel.serial_grad_reduction`)?
    ZenFlow's steps, warm-up ones included, keep their side streams."""
    return strategy in ZERO2_STRATEGIES and c.serial_grad_reduction


def bucket_span(c, i: int) -> tuple[float, float]:
    """Bucket i's [start, end) in the flat parameter vector (forward order)."""
    start = float(sum(b.numel for b in c.buckets[:i]))
    return start, start + c.buckets[i].numel


def partition_span(c, rank: int) -> tuple[float, float]:
    """Rank `rank`'s partition [lo, hi) of the flat parameters (P/N each, over all nodes)."""
    size = c.params / c.gpus
    return rank * size, (rank + 1) * size


def owned_numel(c, rank: int, i: int) -> float:
    """Elements of bucket i in rank `rank`'s partition; over all buckets they sum to P/N,
    over all ranks to the bucket's size."""
    start, end = bucket_span(c, i)
    lo, hi = partition_span(c, rank)
    return max(0.0, min(end, hi) - max(start, lo))


def owned_numels(c, rank: int) -> list[float]:
    """`owned_numel` of every bucket, in bucket order."""
    lo, hi = partition_span(c, rank)
    out, start = [], 0.0
    for b in c.buckets:
        out.append(max(0.0, min(start + b.numel, hi) - max(start, lo)))
        start += b.numel
    return out


def owners(c, i: int) -> list[int]:
    """The ranks that own part of bucket i (one, or a few where a bucket is larger than a
    partition or straddles two): those whose partition [r P/N, (r+1) P/N) overlaps it."""
    start, end = bucket_span(c, i)
    size = c.params / c.gpus
    first = min(int(start // size), c.gpus - 1)
    return [r for r in range(first, c.gpus) if r * size < end]


def owned_runs(c, i: int) -> list[float]:
    """Elements of each owner's run of bucket i, in rank order: the slices DeepSpeed's
    `average_tensor` reduces one by one (zfbench.sims.zero2_reduce)."""
    return [owned_numel(c, r, i) for r in owners(c, i)]


def bucket_reduce_s(c, i: int) -> float:
    """Seconds of bucket i's reduction to its owners (`zero2_reduce.bucket_reduce_s` of
    its `owned_runs`), remembered per cost model: a simulation asks once per bucket, rank
    and step, and the runs' arithmetic (O(buckets) each) cost more than the rest of it."""
    memo = c.__dict__.setdefault("_bucket_reduce_s", {})
    seconds = memo.get(i)
    if seconds is None:
        seconds = memo[i] = zero2_reduce.bucket_reduce_s(c, i, owned_runs(c, i))
    return seconds


def reduce_bucket(sim, t: int, i: int, reduced: list, deps=()) -> simpy.Event | None:
    """Rank `sim` (a RankSim) reduces bucket i's gradient once `deps` have fired; the event
    is kept in `reduced` and returned (None on one GPU). DeepSpeed's ZeRO-2
    (`sim.reduce_scatters`, from presets) reduces it to the partitions' owners as the
    settings' DeepSpeed does (`zero2_reduce`: per owner, or all-reduced); zfbench's
    engine all-reduces it."""
    c = sim.costs
    nbytes = c.buckets[i].numel * c.elem_bytes
    if c.gpus == 1:
        red = None
    elif sim.reduce_scatters:  # as the settings' DeepSpeed reduces (sims/zero2_reduce.py)
        red = sim.net.submit(zero2_reduce.REDUCE_OP, t, list(deps),
                             seconds=bucket_reduce_s(c, i),
                             nbytes=int(round(nbytes)))
    else:
        red = sim.collective("allreduce", t, nbytes, list(deps))
    reduced.append(red)
    return red


def reduce_deps(sim, npass: int, i: int, previous: list[int]) -> list:
    """With ZeRO-2 partitions on several GPUs, what bucket i's reduction (a collective)
    waits for on rank `sim`: every rank's arrival at it (ranks differ: only owners copy),
    and the copies down of the bucket reduced before it by that bucket's owners (each copy
    precedes the next reduction on its owner's stream). Symmetric ranks arrive together:
    nothing."""
    c = sim.costs
    if not sim.owned or c.gpus == 1:
        return []
    sync = sim.sync
    sync.arrive(("at_reduce", npass, i, sim.rank))
    # every rank waits for the same events: the first to ask names them for all
    found = sync.waits.get((npass, i))
    if found is None:
        keys = [("at_reduce", npass, i, r) for r in range(c.gpus)]
        if previous:
            last = previous[-1]
            keys += [("down", npass, last, r) for r in sim.owners_of[last]]
        found = sync.waits[(npass, i)] = sync.events(keys)
    return found


class Sync:
    """Named events shared by every rank of one simulation: a rank publishes the event of
    something it did (`publish`), another waits for it by name (`event`), whichever comes
    first."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self._events: dict = {}
        self.waits: dict = {}  # (pass, bucket) -> what its reduction waits for (reduce_deps)

    def event(self, key) -> simpy.Event:
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = self.env.event()
        return ev

    def events(self, keys: list) -> list[simpy.Event]:
        """`event` of each of `keys`, in order."""
        events, out = self._events, []
        for key in keys:
            ev = events.get(key)
            if ev is None:
                ev = events[key] = self.env.event()
            out.append(ev)
        return out

    def arrive(self, key) -> None:
        """`publish(key, event)` of an event that succeeds now: the named event fires
        once that one is processed. The very schedule (one entry in SimPy's queue now,
        at normal priority, whose processing triggers the named event), without making
        the event itself (nothing else waits for it)."""
        call_now(self.env, _Succeed(self.event(key)))

    def publish(self, key, done: simpy.Event) -> None:
        """The event named `key` fires when `done` has fired."""
        shared = self.event(key)
        if done.callbacks is None:  # processed
            shared.succeed()
        else:
            done.callbacks.append(_Succeed(shared))



class _Succeed:
    """`event.succeed()` as a callback, without a closure: triggers `event` and queues it
    (`Event.succeed`, inlined: the same entry at the same place)."""

    __slots__ = ("event",)

    def __init__(self, event: simpy.Event) -> None:
        self.event = event

    def __call__(self, _hop) -> None:
        event = self.event
        if event._value is not _PENDING:
            raise RuntimeError(f"{event} has already been triggered")
        event._ok, event._value = True, None
        env = event.env
        heappush(env._queue, (env._now, _NORMAL, next(env._eid), event))


_PENDING, _NORMAL = simpy.events.PENDING, simpy.events.NORMAL
