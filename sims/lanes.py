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
from heapq import heappush
from typing import Sequence

import simpy

from zfbench.sims.fluid import FluidPool, Job
from zfbench.core.trace import Timeline


@dataclass(eq=False, slots=True)
class Op:
    op: str
    step: int
    deps: Sequence[simpy.Event]
    seconds: float = 0.0  # fixed-duration work (net collectives, setup latency)
    job: Job | None = None  # shared-rate work on the node's fluid pool
    nbytes: int = 0
    done: simpy.Event | None = None
    lane: str | None = None  # record the span on this lane instead (h2d run by the host)


class _Hop:
    """A bare entry in SimPy's event queue: `env.step()` processes it like any event (it
    calls the callbacks once), without the `Event`/`Process`/`Condition` machinery. It
    always succeeds with no value (class attributes, read as an event's)."""

    __slots__ = ("callbacks",)
    _ok, _value = True, None

    def __init__(self, callback) -> None:
        self.callbacks = [callback]


def call_now(env: simpy.Environment, callback) -> None:
    """`callback(None)` from SimPy's loop at this instant, after what is queued for it:
    the schedule an event succeeding now gets (one entry at normal priority), without the
    event (for a callback nothing else waits on)."""
    heappush(env._queue, (env._now, _NORMAL, next(env._eid), _Hop(callback)))


class _Wait(_Hop):
    """The lane worker waiting for a submit or for a queue head's dependency.

    It stands for the `AnyOf` condition a generator worker would yield: the wait itself
    (callable: its check) is registered where that condition's check would be, and the
    first check schedules the wait (as the condition schedules itself), whose processing
    resumes the worker. Being its own check, it is hooked and unhooked by identity, with
    no bound method made for either.
    """

    __slots__ = ("lane", "pending", "woken", "deps")

    def __call__(self, _event) -> None:
        if self.pending:
            self.pending = False
            lane = self.lane
            heappush(lane._queue, (lane.env._now, _NORMAL, next(lane._eid), self))


_URGENT, _NORMAL = simpy.events.URGENT, simpy.events.NORMAL
_PENDING = simpy.events.PENDING
_new_wait = _Wait.__new__
_Event = simpy.Event
_new_event = _Event.__new__


class Lane:
    """One in-order worker lane of one rank (d2h, h2d, host or net).

    The worker is a small state machine driven by event callbacks rather than a generator
    process: where a generator worker would yield an event, it registers a callback on
    that very event, and every SimPy event such a worker schedules (its start, its wake-up
    on submit, its any-of wait, latency timeouts) is scheduled here at the same moment, with
    the same time and priority, so the simulation unfolds in exactly the same order. A
    wake-up that would find the worker busy does nothing and is not scheduled at all.
    """

    def __init__(self, env: simpy.Environment, timeline: Timeline, pool: FluidPool,
                 rank: int, name: str, priority_ops: tuple[str, ...] = ()) -> None:
        self.env, self.timeline, self.pool = env, timeline, pool
        self.rank, self.name = rank, name
        self.priority_ops = priority_ops
        self._urgent: deque[Op] = deque()
        self._normal: deque[Op] = deque()
        self._wait: _Wait | None = None  # set while the worker waits
        self._item: Op | None = None  # the op running
        self._t0 = 0.0
        self.busy_s = 0.0
        self._queue, self._eid = env._queue, env._eid  # SimPy's own schedule, inlined
        # One op runs at a time, so one latency hop, re-armed for each op, serves them all;
        # the callback lists below are never mutated, so every wait can share one.
        self._delay_hop, self._delay_callbacks = _Hop(self._on_delay), [self._on_delay]
        self._wait_callbacks = [self._on_wait]
        # The worker starts as a process would: an urgent event at the current time.
        env.schedule(_Hop(self._on_start), _URGENT)

    def submit(self, op: str, step: int, deps: Sequence[simpy.Event] = (),
               seconds: float = 0.0, job: Job | None = None, nbytes: int = 0,
               record_lane: str | None = None) -> simpy.Event:
        """Queue an op; the returned event fires when it has finished. `record_lane`
        names the lane its span belongs to when this worker runs another lane's op."""
        done = _new_event(_Event)  # simpy.Event(env), inlined
        done.env, done.callbacks = self.env, []
        deps = tuple(deps) if None not in deps else tuple([d for d in deps if d is not None])
        item = Op(op, step, deps, seconds, job, nbytes, done, record_lane)
        if op in self.priority_ops:
            self._urgent.append(item)
        else:
            self._normal.append(item)
        wait = self._wait
        if wait is not None and wait.pending and not wait.woken:
            # A waiting worker is woken through one event, as by a wake-up `Event`.
            wait.woken = True
            heappush(self._queue, (self.env._now, _NORMAL, next(self._eid), _Hop(wait)))
        return done

    # -- the worker: run ops in order until none is ready, then wait -----------------
    def _on_start(self, _event) -> None:
        self._run()

    def _on_wait(self, wait: _Wait) -> None:
        self._wait = None
        for dep in wait.deps:  # as a condition does: unhook from events yet to fire
            callbacks = dep.callbacks
            if callbacks is not None:
                callbacks.remove(wait)
        self._run()

    def _on_delay(self, _event) -> None:
        job = self._item.job
        if job is not None and job.amount > 0:
            self.pool.run(job).callbacks.append(self._on_job)
            return
        self._finish()
        self._run()

    def _on_job(self, _event) -> None:
        self._finish()
        self._run()

    def _finish(self) -> None:
        item, t0, t1 = self._item, self._t0, self.env._now
        self.busy_s += t1 - t0
        self.timeline.add(self.rank, item.lane or self.name, item.op, item.step, t0, t1,
                          item.nbytes)
        done = item.done  # done.succeed(), inlined: only this lane ever triggers it
        done._ok, done._value = True, None
        heappush(self._queue, (t1, _NORMAL, next(self._eid), done))

    def _run(self) -> None:
        """Start ops until one must wait for time or work, or none is ready. The next op
        is the urgent queue's head if its dependencies have all been triggered, else the
        normal queue's head if its have."""
        urgent, normal = self._urgent, self._normal
        while True:
            item = None
            if urgent:
                for dep in urgent[0].deps:
                    if dep._value is _PENDING:
                        break
                else:
                    item = urgent.popleft()
            if item is None and normal:
                for dep in normal[0].deps:
                    if dep._value is _PENDING:
                        break
                else:
                    item = normal.popleft()
            if item is None:
                self._start_wait()
                return
            now = self._t0 = self.env._now
            self._item = item
            if item.seconds > 0:  # as `yield env.timeout(item.seconds)` would
                hop = self._delay_hop
                hop.callbacks = self._delay_callbacks
                heappush(self._queue, (now + item.seconds, _NORMAL, next(self._eid), hop))
                return
            job = item.job
            if job is not None and job.amount > 0:
                self.pool.run(job).callbacks.append(self._on_job)
                return
            self._finish()

    def _start_wait(self) -> None:
        wait = self._wait = _new_wait(_Wait)
        wait.callbacks, wait.lane = self._wait_callbacks, self
        wait.pending, wait.woken = True, False
        wait.deps = hooked = []  # the dependencies it is registered on (as its check)
        if self._urgent:
            for dep in self._urgent[0].deps:
                if dep._value is _PENDING:
                    dep.callbacks.append(wait)
                    hooked.append(dep)
        if self._normal:
            for dep in self._normal[0].deps:
                if dep._value is _PENDING:
                    dep.callbacks.append(wait)
                    hooked.append(dep)


def run_compute(env: simpy.Environment, timeline: Timeline, rank: int, op: str, step: int,
                seconds: float):
    """Run one op on the compute lane (the calling strategy process) and record it."""
    t0 = env._now
    if seconds > 0:  # `yield env.timeout(seconds)`: the same queue entry, a bare one
        timeout = _new_timeout(_Timeout)
        timeout.callbacks = []
        heappush(env._queue, (t0 + seconds, _NORMAL, next(env._eid), timeout))
        yield timeout
    timeline.add(rank, "compute", op, step, t0, env._now)


class _Timeout(_Hop):
    """`env.timeout(seconds)` as a process waits on it: a bare queue entry that succeeds
    with no value, to whose callbacks the waiting process adds its resumption."""

    __slots__ = ()


_new_timeout = _Timeout.__new__


class _AllFired(simpy.Event):
    """`env.all_of(events)` without the condition's value (nothing here reads it): it
    checks each event where the condition would and triggers at the same moment (the
    last one processed, or at once) with the same `succeed`, so the run unfolds in the
    same order, without the condition's bookkeeping (its tuple, its value's dict)."""

    def __init__(self, env: simpy.Environment, events: Sequence[simpy.Event]) -> None:
        self.env, self.callbacks, self._value = env, [], _PENDING
        self._left = len(events)
        if not events:
            self.succeed()
        check = self._check
        for event in events:
            if event.callbacks is None:
                check(event)
            else:
                event.callbacks.append(check)

    def _check(self, event: simpy.Event) -> None:
        if self._value is not _PENDING:
            return
        self._left -= 1
        if not event._ok:  # as a condition does: take over the failure
            event._defused = True
            self.fail(event._value)
        elif self._left == 0:
            self.succeed()


def all_of(env: simpy.Environment, events: Sequence[simpy.Event]) -> simpy.Event:
    """An event that fires once every one of `events` has (`env.all_of`'s timing)."""
    return _AllFired(env, events)


def all_done(env: simpy.Environment, events: Sequence[simpy.Event | None]):
    """Wait until every event in `events` has fired (None entries are ignored)."""
    pending = [e for e in events if e is not None and e._value is _PENDING]
    if pending:
        yield _AllFired(env, pending)
