"""Run one strategy on one simulated node: build the SimPy world, run it, return the timeline.

`simulate(settings, strategy)` wires a `CostModel` to a SimPy environment: one fluid pool
per node (its links and its host, shared by that node's ranks only), one `RankSim` per
GPU, and runs every rank's strategy process for `settings.measurement.steps` steps. Over several
nodes, where the ranks of every node repeat node 0's exactly (`nodes_repeat`: nodes
share only the collectives, whose durations are fixed, and nothing makes a rank depend
on its node's index), only node 0's ranks are simulated: the other nodes' timelines would
be copies (a 512-GPU ZeRO-Infinity run in seconds instead of minutes); `every_node=True`
simulates them all. Likewise within the node: where its ranks run alike, rank 0 alone is
simulated and stands for them all, with the very spans of a simulation of every rank
(zfbench.sims.replicas; `every_rank=True` simulates each). The result carries the
timeline (spans and step intervals) and the per-step quantities the summary needs that a
timeline alone does not hold (FLOPs per step, host optimizer parameters per step). Same input, same output:
SimPy breaks ties in scheduling order, and nothing here is random.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from heapq import heappop

import simpy

from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings, SimSettingsError
from zfbench.sims.fluid import FluidPool, NodeCapacities, node_rates
from zfbench.sims import partitioning
from zfbench.sims.partitioning import Sync
from zfbench.sims.emulated import emulated_rates
from zfbench.sims.host_busy import compute_factor, host_busy_rates
from zfbench.sims.replicas import (ReplicaTimeline, raise_failure, ranks_alike,
                                   replicated_rates, run_replicated)
from zfbench.sims.strategies import GRAD_ACCUM_STRATEGIES, RankSim
from zfbench.core.schedule import measurement_window
from zfbench.core.strategies import device_adamw, has_windows
from zfbench.core.trace import Timeline


@dataclass
class SimResult:
    strategy: str
    settings: SimSettings
    costs: CostModel
    timeline: Timeline
    sim_events: int
    wall_s: float

    @property
    def skip_steps(self) -> int:
        return default_skip_steps(self.settings)

    def host_optim_params_per_step(self) -> float:
        """Parameters the rank's host Adam updates per step, on average."""
        c, s = self.costs, self.settings
        if device_adamw(self.strategy):
            return 0.0
        if has_windows(self.strategy):
            return c.share(c.params) / c.windows.mean_window_steps(
                s.measurement.steps, s.zenflow.full_warm_up_rounds, s.zenflow.select_interval)
        return c.share(c.params)

    def flops_per_step(self) -> float:
        s, shape = self.settings, self.costs.shape
        tokens = s.scenario.seq * s.scenario.micro_batch * s.scenario.grad_accum
        fwd = shape.forward_flops_per_token(s.scenario.seq) * tokens
        return fwd + shape.backward_flops_per_token(s.scenario.seq) * tokens


def default_skip_steps(settings: SimSettings, windowed: bool = True) -> int:
    """Steps left out of steady-state averages (zfbench.core.schedule.measurement_window),
    never all of them: by default ZenFlow's windowed rule for every strategy, so that the
    strategies of one simulation are averaged over the same steps; `windowed` False: the
    fixed rule (zfbench.validate's rows of strategies measured that way)."""
    skip, _ = measurement_window(windowed, settings.zenflow.full_warm_up_rounds,
                                 settings.window_plan().lengths)
    return max(0, min(skip, settings.measurement.steps - 2))


def steps_needed(settings: SimSettings) -> int:
    """Steps a run needs to contain what is measured: warm-up, the two update windows
    `default_skip_steps` leaves out, and one full window after them; a shorter run's
    averages are start-up transients (e.g. no host update at all in 2 steps)."""
    return settings.window_plan().steps_needed(settings.zenflow.full_warm_up_rounds)


def capacities(costs: CostModel, node_index: int = 0) -> NodeCapacities:
    node = costs.node
    link = node.link
    return NodeCapacities(
        d2h_bytes_per_s=link.d2h_bytes_per_s, h2d_bytes_per_s=link.h2d_bytes_per_s,
        d2h_factor_when_h2d_busy=link.d2h_factor_when_h2d_busy,
        h2d_factor_when_d2h_busy=link.h2d_factor_when_d2h_busy,
        upstream_d2h_bytes_per_s=link.d2h_bytes_per_s,
        upstream_h2d_bytes_per_s=link.h2d_bytes_per_s,
        gpus_per_switch=node.gpus_per_switch,
        cores_per_rank=costs.cores_per_rank,
        dram_bytes_per_s=node.host.dram_bytes_per_s,
        first_rank=node_index * costs.gpus_per_node,
        **costs.link_host_factors)


def nodes_repeat(costs: CostModel, strategy: str) -> bool:
    """Whether every node's ranks run exactly as node 0's: from presets, on GPU nodes, for
    strategies whose ranks are alike (not ZeRO-2's partitions, whose owners differ
    across the whole run and wait for each other: zfbench.sims.partitioning)."""
    # (a CPU-emulated run has a profile: calibration is not None)
    return costs.calibration is None and not partitioning.owns_partitions(costs, strategy)


def simulate(settings: SimSettings, strategy: str, every_node: bool = False,
             every_rank: bool = False) -> SimResult:
    if strategy not in STRATEGIES:
        raise SimSettingsError(f"unknown strategy {strategy!r}; choose one of: "
                               f"{', '.join(STRATEGIES)}")
    if settings.scenario.grad_accum > 1 and strategy not in GRAD_ACCUM_STRATEGIES:
        raise SimSettingsError(f"grad_accum {settings.scenario.grad_accum} is simulated for "
                               f"{', '.join(GRAD_ACCUM_STRATEGIES)}, not {strategy} (its "
                               f"accumulation path is not modelled); use grad_accum 1")
    started = time.perf_counter()
    costs = CostModel(settings, strategy)
    # Time starts at 0.0, not SimPy's int 0, so every span's times are floats (the same
    # values: 0 + x == 0.0 + x) and a timeline's files hold one type per column.
    env = simpy.Environment(initial_time=0.0)
    simulated_nodes = settings.machine.nodes
    if settings.machine.nodes > 1 and not every_node and nodes_repeat(costs, strategy):
        simulated_nodes = 1
    timeline = Timeline("simulated", meta={"strategy": strategy, **settings.as_dict(),
                                           "ranks": settings.machine.ranks,
                                           "simulated_nodes": simulated_nodes})

    # One rank stands for its node's where they run alike (zfbench.sims.replicas), unless
    # `every_rank` (the reference path, span for span the same).
    per_node = costs.gpus_per_node
    replicas = None
    if simulated_nodes == 1 and not every_rank and ranks_alike(costs, strategy):
        replicas = ReplicaTimeline(timeline, 0, per_node)

    def node_pool(index: int) -> FluidPool:
        rate_fn = node_rates(capacities(costs, index))
        if costs.emulated:
            rate_fn = emulated_rates(rate_fn, *costs.lane_contention,
                                     *costs.shared_cores, ranks=costs.gpus_per_node)
        elif compute_factor(costs) is not None:  # a GPU profile (sims/host_busy.py)
            rate_fn = host_busy_rates(rate_fn, compute_factor(costs))
        if replicas is not None:
            rate_fn = replicated_rates(rate_fn, env, 0, per_node)
        return FluidPool(env, rate_fn)
    # One host per node: each node's ranks share its own pool (PCIe switches, cores, DRAM);
    # ranks of different nodes share nothing but the collectives' fixed durations.
    pools = [node_pool(k) for k in range(simulated_nodes)]
    sync = Sync(env)  # the ranks' cross-rank waits (zfbench.sims.partitioning)
    ranks = 1 if replicas is not None else simulated_nodes * per_node
    for rank in range(ranks):  # CPU-emulated: costs.emulated
        env.process(RankSim(env, replicas or timeline, pools[rank // per_node], costs, rank,
                            sync).run(strategy, settings.measurement.steps))
    # The run allocates millions of short-lived objects and creates no reference cycles
    # (each is freed as soon as it is done with), so the cyclic collector, which would
    # otherwise spend a tenth of the run rescanning the growing timeline, is paused.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        events = run_counting(env) if replicas is None else run_replicated(env, replicas)
    finally:
        if gc_was_enabled:
            gc.enable()
    return SimResult(strategy, settings, costs, timeline, events,
                     time.perf_counter() - started)


def run_counting(env: simpy.Environment) -> int:
    """`env.run()` until the queue is empty; returns how many events were processed.

    The body of `Environment.step` inlined (same order: pop the earliest (time, priority,
    id) entry, call its callbacks, refuse an undefused failure), to save a call per event.
    """
    queue, pop = env._queue, heappop
    # Every event is pushed with the next id and popped once, so the count is the events
    # queued now plus the ids handed out until the queue is empty.
    queued, first_id = len(queue), next(env._eid)
    while queue:
        env._now, _, _, event = pop(queue)
        callbacks, event.callbacks = event.callbacks, None
        for callback in callbacks:
            callback(event)
        if not event._ok and not hasattr(event, "_defused"):
            raise_failure(event)
    return queued + next(env._eid) - first_id - 1
