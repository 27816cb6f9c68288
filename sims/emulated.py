"""The CPU-emulated accelerator: what differs there from a GPU, for `sims/strategies.py`.

Without CUDA the engine has no copy engines: its device thread (a few CPU cores) computes
and itself copies gradients down, and the host worker uploads parameters right after each
host Adam chunk. A profile measured that way (`calibration.transfers == "emulated"`, read
as `CostModel.emulated`) is simulated with the same schedules as a GPU (`RankSim` in
`sims/strategies.py`, which asks `RankSim.emulated` where the engine differs), so measured
and simulated timelines can be compared span for span (`python -m zfbench.validate`).

This module owns only what is genuinely different:

- the rate model: the device and host lanes are cores over one DRAM, so while a compute
  span and host-lane work (host AdamW, accumulation, uploads) of one rank run at once,
  each goes at the rate factor the profile measured for it (`emulated_rates`);
- how the device thread runs an op: as work on the node's fluid pool, so that rate model
  applies to it (`device_thread_op`: compute spans and the gradient copy down);
- the engine's per-step passes over every gradient the profile measured (`grad_check_s`
  after backward, `grad_zero_s` at the end of the step).
"""

from __future__ import annotations

from zfbench.sims.costs import CostModel
from zfbench.sims.fluid import Job, RateFn


_HOST_SIDE = ("host", "h2d")  # kinds of pool work the host worker does on a CPU lane


def emulated_rates(base: RateFn, compute_factor: float, host_factor: float) -> RateFn:
    """`base` (the node's rates) for transfers and host work, plus compute jobs (amount in
    seconds, rate 1 alone); while a rank's compute and its host-side work overlap, the
    compute goes at `compute_factor` and the host-side work at `host_factor` of its rate."""

    def rates(active: list[Job]) -> list[float]:
        others = [j for j in active if j.kind != "compute"]
        base_rates = iter(base(others) if others else ())
        host_busy = {j.rank for j in others if j.kind in _HOST_SIDE}
        computing = {j.rank for j in active if j.kind == "compute"}
        out = []
        for job in active:
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


def grad_zero_s(costs: CostModel) -> float:
    """The engine zeroing every gradient at the end of each step."""
    return costs.params * costs.calibration["grad_zero_s_per_elem"]
