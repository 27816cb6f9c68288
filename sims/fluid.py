"""Fluid sharing of a node's host-side resources between concurrent jobs.

PCIe transfers (each direction of each GPU's link, the switch upstream that GPUs share)
and host optimizer work (CPU cores, DRAM bandwidth) are not fixed-duration operations:
how fast one runs depends on what else runs at the same time. `FluidPool` keeps the set
of active jobs, gives each a rate from a rate function of that set, and recomputes every
rate whenever a job starts or ends (processor sharing). A job's duration is therefore
exact for piecewise-constant sharing, not an estimate frozen at its start.

The rate function for a node lives in `node_rates`: per-direction link caps slowed by the
bidirectional-interference factor, the switch upstream split between the GPUs behind it,
and host jobs limited by their rank's cores and by the DRAM bandwidth the transfers leave.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from heapq import heappush
from typing import Callable, Sequence

import simpy

# A job is finished when less than this fraction of its work remains (float round-off).
_REL_EPS = 1e-9
# Memoized rate vectors a pool keeps at most (dropped all at once past this).
_MEMO_MAX = 1 << 16
_INF = float("inf")
_NORMAL = simpy.events.NORMAL


@dataclass(eq=False)
class Job:
    """Work on the pool: `amount` units (bytes for transfers, elements for host work)."""

    kind: str  # "d2h" | "h2d" | "host"
    rank: int
    amount: float
    bytes_per_unit: float = 1.0  # DRAM bytes touched per unit (transfers: per byte moved)
    # host work: units one core completes per second; a transfer: a cap on its rate in
    # bytes/s (a pageable copy's staging copy, zfbench.sims.pageable), 0 for none
    units_per_core_s: float = 0.0
    done: simpy.Event | None = None
    remaining: float = field(init=False)
    rate: float = field(init=False, default=0.0)

    def __init__(self, kind: str, rank: int, amount: float, bytes_per_unit: float = 1.0,
                 units_per_core_s: float = 0.0, done: simpy.Event | None = None) -> None:
        # the dataclass's own __init__ and __post_init__ in one call (a run makes ~10^5)
        self.kind, self.rank, self.amount = kind, rank, amount
        self.bytes_per_unit, self.units_per_core_s, self.done = (bytes_per_unit,
                                                                 units_per_core_s, done)
        self.remaining, self.rate = float(amount), 0.0


RateFn = Callable[[list[Job]], Sequence[float]]


class _Timer:
    """The pool's wake-up at the soonest completion: a bare SimPy heap entry (processed
    exactly like a `Timeout`, without the `Event` machinery the pool does not need). It
    always succeeds with no value (class attributes); its pool's timers share one
    callbacks list (SimPy's loop reads it, never changes it)."""

    __slots__ = ("callbacks", "version")
    _ok, _value = True, None


_new_timer = _Timer.__new__
_Event = simpy.Event
_new_event = _Event.__new__


class FluidPool:
    """Processor-sharing pool: active jobs progress at rates recomputed on every change.

    A rate function with a `job_key` attribute declares its rates a pure function of the
    active jobs' keys, in order; the pool then memoizes them (a step repeats itself, so
    the distinct active sets are few) and the same key always gives the very same floats.
    """

    def __init__(self, env: simpy.Environment, rate_fn: RateFn) -> None:
        self.env = env
        self.rate_fn = rate_fn
        self.active: list[Job] = []
        self._last = 0.0
        self._version = 0
        self._queue, self._eid = env._queue, env._eid  # SimPy's own schedule, inlined below
        self._job_key = getattr(rate_fn, "job_key", None)
        self._key_ids: dict = {}  # each distinct job_key seen -> a small int (cheap to hash)
        self._keys: list = []  # that int for each active job (None without a job_key)
        self._memo: dict[tuple, tuple[float, ...]] = {}
        self._timer_callbacks = [self._on_timer]

    def run(self, job: Job) -> simpy.Event:
        """Start `job` now; the returned event fires when its work is done."""
        done = job.done = _new_event(_Event)  # simpy.Event(env), inlined
        done.env, done.callbacks = self.env, []
        if job.amount <= 0:
            job.done.succeed()
            return job.done
        self._advance()
        self.active.append(job)
        if self._job_key is None:
            self._keys.append(None)
        else:
            key = self._job_key(job)
            self._keys.append(self._key_ids.setdefault(key, len(self._key_ids)))
        self._reschedule()
        return job.done

    def _advance(self) -> None:
        now = self.env._now
        dt = now - self._last
        if dt > 0:
            for job in self.active:
                job.remaining -= job.rate * dt
        self._last = now

    def _reschedule(self) -> None:
        self._version += 1
        active = self.active
        if not active:
            return
        if self._job_key is None:
            rates = self.rate_fn(active)
        else:
            key = tuple(self._keys)
            rates = self._memo.get(key)
            if rates is None:
                if len(self._memo) >= _MEMO_MAX:
                    self._memo.clear()
                rates = self._memo[key] = tuple(self.rate_fn(active))
        soonest = _INF
        for job, rate in zip(active, rates):
            if not rate > 0:
                raise RuntimeError(f"fluid pool gave a {job.kind} job a rate of {rate}")
            job.rate = rate
            left = job.remaining
            if left < 0.0:
                left = 0.0
            left /= rate
            if left < soonest:  # min(): the first of equal values wins, as here
                soonest = left
        # As `env.timeout(soonest)` would: same time, priority and place in the queue.
        timer = _new_timer(_Timer)
        timer.callbacks, timer.version = self._timer_callbacks, self._version
        heappush(self._queue, (self.env._now + soonest, _NORMAL, next(self._eid), timer))

    def _on_timer(self, timer: _Timer) -> None:
        if timer.version != self._version:
            return  # the active set changed since this timer was set
        self._advance()
        still, still_keys = [], []
        now, queue, eid = self.env._now, self._queue, self._eid
        # a job whose time left is below what the clock can still add to `now` is done:
        # past ~8192 s the float spacing exceeds 1e-12 s, and such a job's timer would
        # fire at the same `now` forever (issue 26)
        resolution = max(1e-12, 2 * math.ulp(now))
        for job, key in zip(self.active, self._keys):
            if job.remaining <= _REL_EPS * job.amount or job.remaining / job.rate < resolution:
                job.remaining = 0.0
                done = job.done  # done.succeed(), inlined: only the pool triggers it
                done._ok, done._value = True, None
                heappush(queue, (now, _NORMAL, next(eid), done))
            else:
                still.append(job)
                still_keys.append(key)
        self.active, self._keys = still, still_keys
        self._reschedule()


@dataclass(frozen=True)
class NodeCapacities:
    """The numbers `node_rates` shares out, per rank and per node."""

    d2h_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_factor_when_h2d_busy: float
    h2d_factor_when_d2h_busy: float
    upstream_d2h_bytes_per_s: float
    upstream_h2d_bytes_per_s: float
    gpus_per_switch: int
    cores_per_rank: float
    dram_bytes_per_s: float
    # Host work never gets less than this share of DRAM bandwidth, however busy the link.
    dram_floor_fraction: float = 0.1
    # A measured profile's contention between the host's memory and the upload link
    # (zfbench.real.rate_probe `link_host_contention`): an h2d copy's rate while host work
    # runs on the node, and host work's rate while an h2d copy runs (1: they share nothing
    # but the DRAM bandwidth above).
    h2d_factor_when_host_busy: float = 1.0
    host_factor_when_h2d_busy: float = 1.0
    # The node's first global rank: its ranks' switches count from there (several nodes).
    first_rank: int = 0


def job_rate_key(job: Job) -> tuple:
    """Everything about a job that `node_rates` reads."""
    return (job.kind, job.rank, job.bytes_per_unit, job.units_per_core_s)


def node_rates(caps: NodeCapacities) -> RateFn:
    """Rate function for one node: links first, then host work on what DRAM is left.

    The rates are a pure function of the active jobs' `job_rate_key`s, in order, which
    its `job_key` attribute tells a `FluidPool` (that memoizes them)."""

    def rates(active: list[Job]) -> list[float]:
        busy = {("d2h", j.rank) for j in active if j.kind == "d2h"}
        busy |= {("h2d", j.rank) for j in active if j.kind == "h2d"}
        per_switch: dict[tuple[str, int], int] = {}
        for kind, rank in busy:
            key = (kind, (rank - caps.first_rank) // caps.gpus_per_switch)
            per_switch[key] = per_switch.get(key, 0) + 1
        switch_both = {}
        for kind, sw in per_switch:
            other = "h2d" if kind == "d2h" else "d2h"
            switch_both[(kind, sw)] = (other, sw) in per_switch
        same_lane: dict[tuple[str, int], int] = {}
        for job in active:
            if job.kind != "host":
                same_lane[(job.kind, job.rank)] = same_lane.get((job.kind, job.rank), 0) + 1
        out = [0.0] * len(active)
        transfer_total = 0.0
        host_busy = any(j.kind == "host" for j in active)
        h2d_busy = any(j.kind == "h2d" for j in active)
        for i, job in enumerate(active):
            if job.kind == "host":
                continue
            if job.kind == "d2h":
                cap, up = caps.d2h_bytes_per_s, caps.upstream_d2h_bytes_per_s
                factor, other = caps.d2h_factor_when_h2d_busy, "h2d"
            else:
                cap, up = caps.h2d_bytes_per_s, caps.upstream_h2d_bytes_per_s
                factor, other = caps.h2d_factor_when_d2h_busy, "d2h"
            if (other, job.rank) in busy:
                cap *= factor
            if job.kind == "h2d" and host_busy:
                cap *= caps.h2d_factor_when_host_busy
            sw = (job.rank - caps.first_rank) // caps.gpus_per_switch
            if switch_both[(job.kind, sw)]:
                up *= factor
            rank_rate = min(cap, up / per_switch[(job.kind, sw)])
            out[i] = rank_rate / same_lane[(job.kind, job.rank)]
            if job.units_per_core_s > 0:  # a pageable copy: the driver's staging copy caps
                out[i] = min(out[i], job.units_per_core_s)  # it (zfbench.sims.pageable)
            transfer_total += out[i] * job.bytes_per_unit  # DRAM bytes per byte moved
        hosts = [i for i, j in enumerate(active) if j.kind == "host"]
        if hosts:
            dram_left = max(caps.dram_bytes_per_s - transfer_total,
                            caps.dram_floor_fraction * caps.dram_bytes_per_s)
            dram_each = dram_left / len(hosts)
            per_rank: dict[int, int] = {}
            for i in hosts:
                per_rank[active[i].rank] = per_rank.get(active[i].rank, 0) + 1
            for i in hosts:
                job = active[i]
                cores = caps.cores_per_rank / per_rank[job.rank]
                out[i] = min(cores * job.units_per_core_s, dram_each / job.bytes_per_unit)
                if h2d_busy:
                    out[i] *= caps.host_factor_when_h2d_busy
        return out

    rates.job_key = job_rate_key
    return rates
