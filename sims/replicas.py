"""One rank simulated for all of its node's alike ranks, with the very timeline of all of them.

Where a node's ranks are alike (`ranks_alike`: the same costs, no cross-rank waits, only
fixed-duration collectives, every rank in the same place of the node's rate function) the
ranks of a simulation of every rank run in lockstep: each event of rank 0 is followed by
the same event of ranks 1, 2, ... at the same time, before anything else. So one rank is
simulated and stands for the node's `copies` ranks:
- its pool's rate function sees each of its jobs once per rank (`replicated_rates`), in the
  order a simulation of every rank would have them active: the jobs started by one event
  (and the urgent events right after it) of rank 0, then the same jobs of rank 1, ...;
- its spans and step intervals (`ReplicaTimeline`) are held while one event and its
  urgent followers run, then written once per rank, in rank order (`run_replicated`).
The result is the simulation of every rank, span for span and float for float:
tests/test_sim_replicas.py compares the two over strategies and settings, and
`simulate(..., every_rank=True)` (the reference path) simulates every rank.
"""

from __future__ import annotations

from heapq import heappop

import simpy

from zfbench.core.trace import _LANE_SET, _OP_SET, Timeline, check_span
from zfbench.sims import zero3
from zfbench.sims.partitioning import owns_partitions

_NORMAL = simpy.events.NORMAL


def ranks_alike(costs, strategy: str) -> bool:
    """Whether the node's ranks run alike, so that one can stand for all: from presets
    (not a CPU-emulated profile), no ZeRO-2 partition owners (their ranks differ and wait
    for each other: zfbench.sims.partitioning), no NVMe array (a second pool), and the
    node's PCIe switches each holding the same number of its GPUs."""
    g, per_switch = costs.gpus_per_node, costs.node.gpus_per_switch
    return (g > 1 and costs.calibration is None and not owns_partitions(costs, strategy)
            and not zero3.any_nvme(costs) and (per_switch >= g or g % per_switch == 0))


class ReplicaTimeline:
    """The simulated rank's spans and step intervals, held until its event is over, then
    written into `timeline` for each of the `copies` ranks from `first_rank` on."""

    def __init__(self, timeline: Timeline, first_rank: int, copies: int) -> None:
        self.timeline, self.ranks = timeline, range(first_rank, first_rank + copies)
        self.spans: list[tuple] = []
        self.steps: list[tuple] = []

    def add(self, rank: int, lane: str, op: str, step: int, t_start_s: float,
            t_end_s: float, nbytes: int = 0) -> None:
        if lane not in _LANE_SET or op not in _OP_SET or not t_end_s >= t_start_s:
            check_span(lane, op, t_start_s, t_end_s)  # (inlined as in Timeline.add)
        self.spans.append((lane, op, step, t_start_s, t_end_s, int(nbytes)))

    def mark_step(self, rank: int, step: int, t_start_s: float, t_end_s: float) -> None:
        if not t_end_s >= t_start_s:
            raise ValueError(f"step {step} on rank {rank} ends before it starts")
        self.steps.append((step, t_start_s, t_end_s))

    def flush(self) -> None:
        spans, steps = self.spans, self.steps
        if spans:
            out = self.timeline._spans
            if len(spans) == 1:  # most events end one op
                lane, op, step, t0, t1, nbytes = spans[0]
                out.extend([(rank, lane, op, step, t0, t1, nbytes) for rank in self.ranks])
            else:
                for rank in self.ranks:
                    out.extend([(rank, *row) for row in spans])
            spans.clear()
        if steps:
            out = self.timeline._steps
            for rank in self.ranks:
                out.extend([(rank, *row) for row in steps])
            steps.clear()


class _Copy:
    """A job as another rank's copy of it: what a rate function reads."""

    __slots__ = ("kind", "rank", "bytes_per_unit", "units_per_core_s")

    def __init__(self, job, rank: int) -> None:
        self.kind, self.rank = job.kind, rank
        self.bytes_per_unit, self.units_per_core_s = job.bytes_per_unit, job.units_per_core_s


def replicated_rates(rate_fn, env: simpy.Environment, first_rank: int, copies: int):
    """`rate_fn` over the simulated rank's active jobs as every rank's copies of them:
    each group of jobs started by one event (`env._replica_event`, counted by
    `run_replicated`) once per rank, in rank order; the simulated rank's rates back,
    memoized by its jobs' keys and groups (`rate_fn.job_key`, a pure function of those)."""
    job_key = rate_fn.job_key
    memo: dict[tuple, tuple[float, ...]] = {}
    key_ids: dict = {}  # each distinct job key seen -> a small int (cheap to hash)
    others = range(first_rank + 1, first_rank + copies)

    def rates(active: list) -> list[float]:
        event, key, groups, last = env._replica_event, [], [], None
        for job in active:
            started = job.__dict__.get("_replica_event")
            if started is None:  # started by the event running now: its group and key
                started = job._replica_event = event
                job._replica_key = key_ids.setdefault(job_key(job), len(key_ids))
            if started != last:  # a new group begins at this job
                groups.append(len(key))
                last = started
            key.append(job._replica_key)
        groups.append(len(key))
        memo_key = (tuple(key), tuple(groups))
        found = memo.get(memo_key)
        if found is not None:
            return found
        expanded, mine = [], []
        for i, j in zip(groups, groups[1:]):  # one group: the jobs one event started
            group = active[i:j]
            mine.extend(range(len(expanded), len(expanded) + len(group)))
            expanded.extend(group)
            for rank in others:
                expanded.extend([_Copy(job, rank) for job in group])
        everyone = rate_fn(expanded)
        if len(memo) >= 1 << 16:
            memo.clear()
        found = memo[memo_key] = tuple(everyone[k] for k in mine)
        return found

    return rates


def raise_failure(event) -> None:
    """Raise a failed event's exception, as `Environment.step` does for one not defused."""
    exc = type(event._value)(*event._value.args)
    exc.__cause__ = event._value
    raise exc


def run_replicated(env: simpy.Environment, timeline: ReplicaTimeline) -> int:
    """`zfbench.sims.simulator.run_counting` for one rank standing for its node's ranks:
    before each normal-priority event (an event and the urgent ones it schedules at once
    run before any other rank's copy of it) the held spans are written for every rank,
    and the event is counted for `replicated_rates`' groups."""
    queue, pop, flush = env._queue, heappop, timeline.flush
    spans, steps = timeline.spans, timeline.steps  # (cleared in place by flush)
    queued, first_id = len(queue), next(env._eid)
    count = 0
    env._replica_event = 0
    while queue:
        env._now, priority, _, event = pop(queue)
        if priority == _NORMAL:
            if spans or steps:
                flush()
            count += 1
            env._replica_event = count
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            raise_failure(event)
    flush()
    return queued + next(env._eid) - first_id - 1
