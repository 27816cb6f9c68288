"""SimPy lanes: in-order streams that run submitted ops after their dependencies.

A lane is what a CUDA stream or a host worker thread is to the real engine: ops run one at
a time, in the order they were submitted, each once the events it depends on have fired.
The host lane has two classes of work: gradient accumulation, which runs as soon as its
gradients are down, goes ahead of optimizer chunks not yet started (the CPU interleaves
them, as the real worker does between Adam sub-groups). Every op records one span.

The compute lane is not a worker here: each rank's strategy process *is* its compute
stream, running its forward/backward/optimizer ops in program order with `run_compute`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence

import simpy

from sims.fluid import FluidPool, Job
from zfbench.trace import Timeline


@dataclass(eq=False)
class Op:
    op: str
    step: int
    deps: Sequence[simpy.Event]
    seconds: float = 0.0  # fixed-duration work (net collectives, setup latency)
    job: Job | None = None  # shared-rate work on the node's fluid pool
    nbytes: int = 0
    done: simpy.Event | None = None


class Lane:
    """One in-order worker lane of one rank (d2h, h2d, host or net)."""

    def __init__(self, env: simpy.Environment, timeline: Timeline, pool: FluidPool,
                 rank: int, name: str, priority_ops: tuple[str, ...] = ()) -> None:
        self.env, self.timeline, self.pool = env, timeline, pool
        self.rank, self.name = rank, name
        self.priority_ops = priority_ops
        self._urgent: deque[Op] = deque()
        self._normal: deque[Op] = deque()
        self._wakeup = env.event()
        self.busy_s = 0.0
        env.process(self._worker())

    def submit(self, op: str, step: int, deps: Sequence[simpy.Event] = (),
               seconds: float = 0.0, job: Job | None = None, nbytes: int = 0) -> simpy.Event:
        """Queue an op; the returned event fires when it has finished."""
        item = Op(op, step, tuple(d for d in deps if d is not None), seconds, job, nbytes,
                  self.env.event())
        (self._urgent if op in self.priority_ops else self._normal).append(item)
        if not self._wakeup.triggered:
            self._wakeup.succeed()
        return item.done

    def _next_ready(self) -> Op | None:
        for queue in (self._urgent, self._normal):
            if queue and all(d.triggered for d in queue[0].deps):
                return queue.popleft()
        return None

    def _worker(self):
        env = self.env
        while True:
            item = self._next_ready()
            if item is None:
                if self._wakeup.triggered:
                    self._wakeup = env.event()
                waits = [self._wakeup]
                for queue in (self._urgent, self._normal):
                    if queue:
                        waits.extend(d for d in queue[0].deps if not d.triggered)
                yield env.any_of(waits)
                continue
            t0 = env.now
            if item.seconds > 0:
                yield env.timeout(item.seconds)
            if item.job is not None and item.job.amount > 0:
                yield self.pool.run(item.job)
            t1 = env.now
            self.busy_s += t1 - t0
            self.timeline.add(self.rank, self.name, item.op, item.step, t0, t1, item.nbytes)
            item.done.succeed()


def run_compute(env: simpy.Environment, timeline: Timeline, rank: int, op: str, step: int,
                seconds: float):
    """Run one op on the compute lane (the calling strategy process) and record it."""
    t0 = env.now
    if seconds > 0:
        yield env.timeout(seconds)
    timeline.add(rank, "compute", op, step, t0, env.now)


def all_done(env: simpy.Environment, events: Sequence[simpy.Event | None]):
    """Wait until every event in `events` has fired (None entries are ignored)."""
    pending = [e for e in events if e is not None and not e.triggered]
    if pending:
        yield env.all_of(pending)
