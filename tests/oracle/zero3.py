"""Closed-form steady state of `zero-infinity` (sims/zero_infinity.py), for `oracle.steady`.

This module owns the oracle's form of the zero-infinity step, built like the others from
in-order lanes of fixed durations (`oracle.parts`), never running SimPy:

- Parameters on cpu: a period map from one *boundary* (the device finishing a step's last
  backward, when it submits that step's host update and the next step's first d+1
  fetches) to the next. Carried: the d2h, net, h2d and host lanes' free times relative to
  the boundary, and whether a host update is pending (none before step 0, whose fetches
  start the run). Within the period the device computes the 2 x nb ops, each after its
  fetch (share up, then all-gather), issuing fetch k+d just before waiting for fetch k;
  each backward op's gradient is reduce-scattered and sent down. Iterated from the run's
  start to a fixed point (`_fixed_point`). Exact under the same conditions as the other
  strategies' forms: switch groups move in step (rate/m each), host jobs never DRAM-bound,
  no upload (fetch) overlapping a gradient download unless both link factors are 1. With
  `offload_activations` each decoder layer's checkpoint goes down before its forward and
  comes up before its backward on the same lanes, the device waiting for it.
- Parameters on NVMe: the drive array is processor-shared among every rank's reads and
  writes (sims/nvme.py), which no fixed-duration lane reproduces. The form is then a
  lower bound, never exact: the larger of the step with instant NVMe (the cpu form) and
  the array's busy time per step (`zfbench.sims.zero3.nvme_busy_s_per_step`).
"""

from __future__ import annotations

import math

from zfbench.sims import zero3
from zfbench.sims.zero_infinity import op_buckets

from .parts import (_CONVERGED, _MAX_PERIODS, NEG, _cycle_intervals, _fixed_point,
                    _interferes, _Lane, _Terms)


class _Zero3:
    """Per-op durations of zero-infinity for one switch group (as `_Terms` does)."""

    def __init__(self, T: _Terms) -> None:
        c = self.c = T.c
        self.T, self.n, self.nb = T, T.gpus, len(c.buckets)
        self.d = c.settings.infinity.prefetch_buckets
        self.ops = op_buckets(self.nb)
        self.comp = [c.buckets[i].forward_s for i in range(self.nb)] + \
            [c.buckets[i].backward_s for i in reversed(range(self.nb))]
        self.adam = c.cores_per_rank * c.adam_units_per_core_s

    def _xfer(self, n: int, rate: float):
        return None if n <= 0 else (self.T.lat, n / rate)

    def up(self, i: int):
        return self._xfer(zero3.share_bytes(self.c, i), self.T.rh)

    def down(self, i: int):  # the gradient share, fp32 from presets
        return self._xfer(zero3.grad_share_bytes(self.c, i), self.T.rd)

    def gather(self, i: int):
        return (0.0, self.c.allgather_s(zero3.bucket_bytes(self.c, i)))

    def scatter(self, i: int):
        return (0.0, zero3.reduce_scatter_s(self.c, zero3.bucket_bytes(self.c, i)))

    def checkpoint(self, i: int, rate: float):
        """Bucket i's activation checkpoint copy (offload_activations): staged, so capped
        by the driver's staging copy (zfbench.sims.pageable)."""
        return self._xfer(zero3.checkpoint_bytes(self.c, i),
                          min(rate, self.c.pageable_copy_bytes_per_s))

    def chunk(self, i: int):
        """Bucket i's host update: from presets DeepSpeed's clip, Adam and conversion in
        a row on the host lane (one job's time each, summed), else Adam alone."""
        c, T = self.c, self.T
        elems = c.share(c.buckets[i].numel)
        seconds = elems / self.adam
        if c.deepspeed_host_step:
            seconds += elems * (T.clip_s_per_elem + T.convert_s_per_elem)
        return (0.0, seconds)

    def step(self, carry):
        """One period from a boundary; carry: (update pending, d2h, net, h2d, host free)."""
        pending, d2h_f, net_f, h2d_f, host_f = carry
        d2h, net, h2d, host = _Lane(d2h_f), _Lane(net_f), _Lane(h2d_f), _Lane(host_f)
        gate: dict[int, float] = {}
        if pending:  # the previous step's update: all of its gradients are down by d2h_f
            first = d2h_f
            for i in reversed(range(self.nb)):
                if self.c.buckets[i].numel == 0:  # nothing to update: done at submission
                    gate[i] = 0.0
                    continue
                gate[i], first = host.run(0.0, first, self.chunk(i)), NEG
        ready: dict[int, float] = {}
        last = len(self.ops) - 1

        def issue(first: int, upto: int, at: float) -> int:
            for k in range(first, min(upto, last) + 1):
                i = self.ops[k]
                ready[k] = h2d.run(at, gate.get(i, NEG), self.up(i))
                if self.n > 1:
                    ready[k] = net.run(at, ready[k], self.gather(i))
            return max(first, min(upto, last) + 1)

        issued = issue(0, self.d, 0.0)
        t = 0.0
        for k, i in enumerate(self.ops):
            issued = issue(issued, k + self.d, t)
            # the checkpoint down before a forward, up before a backward; the device waits
            lane, rate = (d2h, self.T.rd) if k < self.nb else (h2d, self.T.rh)
            copied = lane.run(t, t, self.checkpoint(i, rate))
            t = max(t, ready[k], copied) + self.comp[k]
            if k >= self.nb:
                red = net.run(t, t, self.scatter(i)) if self.n > 1 else NEG
                d2h.run(t, red, self.down(i))
        new = (1.0, *(lane.free - t for lane in (d2h, net, h2d, host)))
        latest = max([0.0] + [b for _, b in h2d.busy + d2h.busy])  # may pass the period
        return t, new, (h2d.busy, d2h.busy, latest)


def zero_infinity(T: _Terms):
    """(step, compute, exact, reason, regime, settle periods, cycle periods)."""
    z = _Zero3(T)
    compute = sum(z.comp)
    accum = z.c.settings.scenario.grad_accum
    if accum > 1:  # this form is one micro-step a step: its compute is a lower bound
        return accum * compute, accum * compute, False, "gradient accumulation: this " \
            "form has one micro-step a step (its compute taken as a lower bound)", "", 0, 1
    found = _fixed_point(z.step, (0.0, NEG, NEG, NEG, NEG))
    if found is None:
        return compute, compute, False, "the step map never settles", "", _MAX_PERIODS, 1
    periods, infos, n = found
    cycle, c = sum(periods), len(periods)
    step = cycle / c
    if zero3.params_on_device(z.c):  # fetches are all-gathers; the update goes up
        return step, compute, False, "parameters kept on the GPUs: this form fetches " \
            "from the host", "", n, c
    if zero3.any_nvme(z.c):
        bound = zero3.nvme_busy_s_per_step(z.c)
        regime = "NVMe-bound" if bound > step else "bound by the step without NVMe"
        return max(step, bound), compute, False, "parameters on NVMe: a lower bound " \
            "(the drive array is shared by processor sharing)", regime, n, c
    reach = int(math.ceil(max(i[2] for i in infos) / cycle)) + 1
    if _interferes(T, _cycle_intervals(periods, infos, 0),
                   _cycle_intervals(periods, infos, 1), cycle, reach):
        return step, compute, False, "a fetch (upload) overlaps a gradient download", "", \
            n, c
    regime = "compute-bound" if cycle <= c * compute * (1 + _CONVERGED) else \
        "fetch/host-bound"
    return step, compute, True, "fixed point of the one-step map", regime, n, c
