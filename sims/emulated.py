"""The strategies on a CPU-emulated accelerator, scheduled as zfbench's engine runs them.

Without CUDA the engine has no copy engines: the device thread itself copies gradients
down after backward (the compute lane idles meanwhile), and the host worker copies
parameters up right after each host Adam chunk (the host lane is busy meanwhile). Applying
an asynchronous update is a device-side copy. A profile measured that way
(`calibration.transfers == "emulated"`) is simulated with `EmulatedRankSim`, so measured
and simulated timelines can be compared span for span (`python -m zfbench.validate`).
The device and host lanes are cores over one DRAM: while a compute span and host-lane work
(host AdamW, accumulation, uploads) run at once, each goes at the rate factor the profile
measured for it (`emulated_rates`; compute runs as work on the fluid pool for that).
"""

from __future__ import annotations

import simpy

from zfbench.sims.fluid import Job, RateFn
from zfbench.sims.lanes import all_done
from zfbench.sims.strategies import RankSim, _fired
from zfbench.core.schedule import is_selection_step, is_warmup


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


class EmulatedRankSim(RankSim):
    def compute(self, op: str, step: int, seconds: float):
        """A compute span as pool work, so host-lane work running beside it slows it."""
        t0 = self.env.now
        if seconds > 0:
            yield self.pool.run(Job("compute", self.rank, seconds))
        self.timeline.add(self.rank, "compute", op, step, t0, self.env.now)

    def backward(self, step: int, after_bucket):
        """Backward, then the engine's non-finite check over every gradient."""
        yield from super().backward(step, after_bucket)
        cal, c = self.costs.calibration, self.costs
        yield from self.compute("device_optim", step, c.params * cal["grad_check_s_per_elem"])

    def after_step(self, t: int):
        """The engine zeroes every gradient at the end of each step."""
        c = self.costs
        yield from self.compute("device_optim", t, c.params * c.calibration["grad_zero_s_per_elem"])

    def transfer(self, lane, op: str, step: int, nbytes: float, deps) -> simpy.Event:
        """Uploads run on the host worker (recorded on the h2d lane)."""
        nbytes = int(round(nbytes))
        if nbytes <= 0:
            return _fired(self.env)
        job = Job(lane.name, self.rank, nbytes)
        if lane is self.h2d:
            return self.host.submit(op, step, deps, seconds=self.latency_s, job=job,
                                    nbytes=nbytes, record_lane="h2d")
        return lane.submit(op, step, deps, seconds=self.latency_s, job=job, nbytes=nbytes)

    def blocking_d2h(self, op: str, step: int, nbytes: float):
        """A copy down run by the device thread: the compute lane waits for it."""
        t0 = self.env.now
        nbytes = int(round(nbytes))
        if nbytes > 0:
            yield self.pool.run(Job("d2h", self.rank, nbytes))
        self.timeline.add(self.rank, "d2h", op, step, t0, self.env.now, nbytes)

    def _grads_down(self, t: int, bytes_of, extra_deps_of=lambda i: ()):
        """Backward, then (once the buffer is free) every gradient down in one copy."""
        self.reduced = []
        yield from self.backward(t, lambda i: None)
        deps = [d for i in range(self.nb) for d in extra_deps_of(i)]
        yield from all_done(self.env, deps)
        yield from self.blocking_d2h("d2h_grad", t, sum(bytes_of(i) for i in range(self.nb)))
        return {0: _fired(self.env)}

    def apply_update(self, t: int, landed, keep_columns: bool = False):
        """Wait for an uploaded update, then copy it into the parameters (device); zenflow
        first keeps its selected columns and puts them back after (a column gather and
        scatter, costed as one step's column I/O)."""
        if landed is None:
            return
        yield from all_done(self.env, [landed])
        keep = self.costs.column_io_s() if keep_columns else 0.0
        yield from self.compute("device_optim", t,
                                self.costs.device_copy_s(self.costs.params) + keep)

    def dpu_step(self, t: int):
        c, st = self.costs, self.state
        yield from self.compute("forward", t, c.forward_s)
        yield from self.backward(t, lambda i: None)
        yield from self.apply_update(t, st.pop("pending", None))
        yield from self.blocking_d2h("d2h_grad", t, c.params * c.elem_bytes)
        st["pending"], _ = self.host_update(t, [], lambda i: c.buckets[i].numel,
                                            lambda i: c.buckets[i].numel * c.elem_bytes)

    def zenflow_step(self, t: int):
        c, s, st = self.costs, self.costs.settings, self.state
        W, S = s.full_warm_up_rounds, s.select_interval
        if is_warmup(t, W):
            yield from self.offload_step(t)
            return
        full = [b.numel for b in c.buckets]
        yield from self.compute("forward", t, c.forward_s)
        yield from self.backward(t, lambda i: None)
        if is_selection_step(t, W, S):
            if t != 0:  # apply what is pending, then re-sync the master from the device
                yield from self.apply_update(t, st.pop("pending", None), True)
                yield from self.blocking_d2h("select", t, c.params * c.elem_bytes)
            yield from self.compute("select", t, c.select_s())
        yield from all_done(self.env, [st.get("accum")])  # the staging buffer is free
        yield from self.blocking_d2h("d2h_grad", t, c.params * c.elem_bytes)
        st["accum"] = self.host_work("host_accum", t, c.params, [])
        if c.is_boundary(t):
            if s.overlap_step:
                yield from self.apply_update(t, st.pop("pending", None), True)
            landed, _ = self.host_update(t, [st["accum"]], lambda i: full[i],
                                         lambda i: full[i] * c.elem_bytes)
            if s.overlap_step:
                st["pending"] = landed
            else:
                yield from self.apply_update(t, landed, True)
        yield from self.compute("device_optim", t,
                                c.device_optim_s(c.selected_params) + c.column_io_s())
