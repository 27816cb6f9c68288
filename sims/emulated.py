"""The CPU-emulated accelerator: what differs there from a GPU, for `sims/strategies.py`.

Without CUDA the engine has no copy engines: its device thread (a few CPU cores) computes
and itself copies gradients down, and the host worker uploads parameters right after each
host Adam chunk. A profile measured that way (`calibration.transfers == "emulated"`,
`CostModel.emulated`) is simulated with a GPU's schedules (`RankSim`, which asks
`RankSim.emulated` where the engine differs), so measured and simulated timelines compare
span for span (`python -m zfbench.validate`). This module owns only what differs:

- the rate model (`emulated_rates`, `cpu_share`): a rank's compute and host-lane work
  running at once each go at the rate factor the profile measured (two lanes of cores
  over one DRAM); where ranks share the cores (`zfbench.run --gpus 4` on 2 cores) and the
  busy lanes want more threads than there are cores, each goes at cores / busy threads;
- the collectives: gloo on the CPU, measured by the run (zfbench.real.collective_probe) as
  a fixed and a per-byte part (`CostModel.allreduce_s`), run by the device thread after
  backward over the whole gradient buffer, as the engine's `reduce_grads` does;
- `device_thread_op`: the device thread's ops (compute, the gradient copy down) as work
  on the node's fluid pool, so the rate model applies to them;
- the engine's per-step passes over the gradients (`grad_check_s`, `grad_zero_s`).
"""

from __future__ import annotations

from zfbench.core.strategies import gradient_buckets_apply, zero_stage_of
from zfbench.sims.costs import CostModel
from zfbench.sims.fluid import Job, RateFn


_HOST_SIDE = ("host", "h2d")  # kinds of pool work the host worker does on a CPU lane
_FIXED_RATE = ("compute", "net")  # amounts in seconds at rate 1 alone, not the node's


def cpu_share(active: list[Job], device_threads: int, host_threads: int,
              cores: float | None) -> float:
    """The share of its rate alone that every busy lane gets: cores / the threads of the
    busy lanes (a rank's device lane, `device_threads`, while it computes or copies down;
    its host lane, `host_threads`, while it runs host work or uploads), at most 1; 1 where
    the machine's `cores` are not known (profiles before the multi-rank expectation)."""
    if not cores:
        return 1.0
    busy = {(j.rank, j.kind in _HOST_SIDE) for j in active}
    threads = sum(host_threads if host else device_threads for _, host in busy)
    return min(1.0, cores / threads) if threads else 1.0


def collective_share(ranks: int, device_threads: int, cores: float | None) -> float:
    """`cpu_share` while every rank is in a collective and nothing else runs: how the
    collectives were measured (zfbench.real.collective_probe), so their measured time is
    their time at this share."""
    if not cores:
        return 1.0
    return min(1.0, cores / (ranks * device_threads))


def emulated_rates(base: RateFn, compute_factor: float, host_factor: float,
                   threads: tuple[int, int] = (1, 1), cores: float | None = None,
                   ranks: int = 1) -> RateFn:
    """`base` (the node's rates) for transfers and host work, plus compute and measured
    collective jobs (kind "net"; amount in seconds, rate 1 alone); while a rank's compute
    and its host-side work overlap, the compute goes at `compute_factor` and the host-side
    work at `host_factor` of its rate; every rate is then scaled by `cpu_share`
    (`threads`: a rank's device and host lane threads; `cores`: the machine's cores the
    `ranks` share), a collective's relative to `collective_share`, the share at which it
    was measured (a collective occupies its rank's device thread)."""
    measured_at = collective_share(ranks, threads[0], cores)

    def rates(active: list[Job]) -> list[float]:
        share = cpu_share(active, *threads, cores)
        # a collective no faster than measured: it cannot end before its peers' part
        return [r * (min(1.0, share / measured_at) if job.kind == "net" else share)
                for r, job in zip(lane_rates(active), active)]

    def lane_rates(active: list[Job]) -> list[float]:
        others = [j for j in active if j.kind not in _FIXED_RATE]
        base_rates = iter(base(others) if others else ())
        host_busy = {j.rank for j in others if j.kind in _HOST_SIDE}
        computing = {j.rank for j in active if j.kind == "compute"}
        out = []
        for job in active:
            if job.kind == "net":
                out.append(1.0)
                continue
            if job.kind == "compute":
                out.append(compute_factor if job.rank in host_busy else 1.0)
                continue
            rate = next(base_rates)
            out.append(rate * host_factor if job.kind in _HOST_SIDE and job.rank in computing
                       else rate)
        return out
    rates.job_key = base.job_key
    return rates


def device_thread_op(sim, lane: str, op: str, step: int, amount: float, nbytes: int = 0):
    """Run one op on the device thread of `sim` (a `RankSim`) as pool work and record it
    on `lane`: a compute span (`lane` "compute", `amount` in seconds at rate 1) or a copy
    down (`lane` "d2h", `amount` = `nbytes`); the strategy process waits for it."""
    t0 = sim.env.now
    if amount > 0:
        yield sim.pool.run(Job(lane, sim.rank, amount))
    sim.timeline.add(sim.rank, lane, op, step, t0, sim.env.now, nbytes)


def grad_check_s(costs: CostModel) -> float:
    """The engine's non-finite check over every gradient, after each backward."""
    return costs.params * costs.calibration["grad_check_s_per_elem"]


def grad_zero_s(costs: CostModel, strategy: str) -> float:
    """The engine zeroing the gradients at the end of each step of `strategy`: all of them,
    or, where it leaves the slots backward writes over (real/engine.py `defer_zero`: not
    with gradient buckets, which an offloading strategy has here on a GPU as in
    zfbench.sims.rank_memory, nor on ZeRO-3), the rest, as the profile timed it
    (`grad_zero_deferred_s_per_elem`; all of them where its in-place gradient path was
    off). A profile from before that key prices the whole zeroing, as it did then."""
    cal = costs.calibration
    whole = cal["grad_zero_s_per_elem"]
    deferred = not (zero_stage_of(strategy, costs.settings.zenflow.zero_stage) == 3
                    or gradient_buckets_apply(strategy, costs.settings.scenario.precision,
                                              not costs.emulated))
    return costs.params * (cal.get("grad_zero_deferred_s_per_elem", whole) if deferred
                           else whole)
