"""Compute on a GPU slowed by the host work beside it, as a GPU profile measured it (issue 44).

At fine-tuning's micro-batches a GPU step is launch-bound: one host thread issues its
~3800 kernels, and host-lane threads busy with AdamW or accumulation slow that thread.
A profile measured on a GPU holds the factor (`compute_factor_when_host_busy`,
zfbench.real.rate_probe.lane_contention: forward+backward alone over beside host AdamW
on the host lane's threads). With it a rank's compute spans run as pool work
(`RankSim.compute`) at that factor of their rate while the rank's host lane holds a
job, and at 1 otherwise: the emulated lanes' rule (zfbench.sims.emulated) for compute.
The host work keeps its rates (the profile's `host_factor_when_compute_busy` is not
applied on a GPU). Presets (no profile) and the CPU-emulated lanes do not use this.
"""

from __future__ import annotations

from zfbench.sims.costs import CostModel
from zfbench.sims.fluid import Job, RateFn


def compute_factor(costs: CostModel) -> float | None:
    """The rate factor of compute while host work runs beside it on a GPU, from the
    profile (`compute_factor_when_host_busy`, below 1); None from presets, on the
    CPU-emulated lanes (their own rate model) and where the profile did not measure it."""
    cal = costs.calibration
    if cal is None or costs.emulated:
        return None
    factor = cal.get("compute_factor_when_host_busy")
    return float(factor) if factor is not None and factor < 1.0 else None


def host_busy_rates(base: RateFn, factor: float) -> RateFn:
    """`base` (the node's rates) for every job but compute (kind "compute": amount in
    seconds at rate 1 alone), which goes at `factor` while its rank has a host job
    active and at 1 otherwise."""

    def rates(active: list[Job]) -> list[float]:
        others = [j for j in active if j.kind != "compute"]
        base_rates = iter(base(others) if others else ())
        host_busy = {j.rank for j in others if j.kind == "host"}
        return [(factor if j.rank in host_busy else 1.0) if j.kind == "compute"
                else next(base_rates) for j in active]
    rates.job_key = base.job_key
    return rates
