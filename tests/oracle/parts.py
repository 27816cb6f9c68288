"""The oracle's building blocks: in-order lanes of fixed durations, per-op terms, checks.

This module owns what every closed form of `oracle/steady.py` (and `oracle/zero3.py`)
is built from: `_Lane` (an in-order lane, item j ending at `max(ready_j, end_{j-1}) + d_j`),
`_Terms` (each op's duration for one switch group moving in step), the exactness checks
(`_dram_ok`, `_interferes`) and the period-map iteration (`_fixed_point`,
`_cycle_intervals`). Split out of steady.py for size; it never runs SimPy either.
"""

from __future__ import annotations

import math

from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, ADAM_BYTES_PER_PARAM, CostModel, SimSettings
from zfbench.sims import partitioning, zero2_reduce
from zfbench.sims.settings import fixed_interval
from zfbench.sims.host_step import CLIP_BYTES_PER_ELEM, CONVERT_BYTES_PER_ELEM

NEG = float("-inf")
_TIE = 1e-9  # relative: events closer than this are a tie whose order SimPy decides
_CONVERGED = 1e-13  # relative: carried state equal from one period to the next
_MAX_PERIODS = 200


class _Lane:
    """An in-order lane with fixed durations; remembers the rate-limited intervals."""

    def __init__(self, free: float = NEG) -> None:
        self.free, self.busy = free, []  # busy: (start after latency, end)

    def run(self, submit: float, ready: float, item: tuple[float, float] | None) -> float:
        """Submit at `submit` an item `(latency, seconds)` needing `ready`; None = skipped."""
        if item is None:
            return submit
        start = max(submit, ready, self.free)
        self.free = start + item[0] + item[1]
        self.busy.append((start + item[0], self.free))
        return self.free


class _Terms:
    """Per-rank durations of every op, for one switch group of `m` GPUs moving in step."""

    def __init__(self, costs: CostModel, m: int, reduce_scatter: bool = False) -> None:
        c, node, link = costs, costs.node, costs.node.link
        self.c, self.gpus, self.U = c, c.gpus, fixed_interval(c.settings)
        self.reduce_scatter = reduce_scatter
        self.order = list(reversed(range(len(c.buckets))))  # backward (= host chunk) order
        self.F = c.forward_s
        self.bwd = [c.buckets[i].backward_s for i in self.order]
        self.B = sum(self.bwd)
        self.lat = link.setup_latency_s
        self.rd = min(link.d2h_bytes_per_s, node.upstream_bytes_per_s("d2h") / m)
        self.rh = min(link.h2d_bytes_per_s, node.upstream_bytes_per_s("h2d") / m)
        self.numel = [c.buckets[i].numel for i in self.order]
        self.unsel = [c.buckets[i].numel - c.buckets[i].selected_numel for i in self.order]
        cores = c.cores_per_rank
        adam = cores * c.adam_units_per_core_s
        self.chunk = [(0.0, c.share(n) / adam) for n in self.numel]
        # DeepSpeed's host step from presets (zfbench.sims.host_step): clip, Adam over the
        # whole partition, conversion, one upload, one all-gather
        self.deepspeed = c.deepspeed_host_step
        self.wire = c.grad_wire_bytes  # ZeRO-Offload's gradient bytes on the link (fp32)
        part = c.share(c.params)
        # seconds per element of each streaming pass beside Adam, alone on a rank's cores
        self.clip_s_per_elem = 1 / (cores * c.stream_units_per_core_s(CLIP_BYTES_PER_ELEM))
        self.convert_s_per_elem = 1 / (cores * c.stream_units_per_core_s(
            CONVERT_BYTES_PER_ELEM))
        self.clip = (0.0, part * self.clip_s_per_elem)
        self.adam_all = (0.0, part / adam)
        self.convert = (0.0, part * self.convert_s_per_elem)
        acc = c.share(sum(self.unsel))
        self.acc = (0.0, acc / (cores * c.accum_units_per_core_s)) if acc > 0 else None
        self.o_sel = c.device_optim_s(c.selected_params)
        self.P_zen = self.F + self.B + self.o_sel

    def _xfer(self, numel: float, rate: float, wire: float = 2):  # this rank's share of
        n = int(round(self.c.share(numel) * wire))  # elements of `wire` bytes (16-bit)
        return None if n <= 0 else (self.lat, n / rate)

    def down(self, numel: float, wire: float = 2):
        return self._xfer(numel, self.rd, wire)

    def up(self, numel: float):
        return self._xfer(numel, self.rh)

    def ar(self, k: int):
        """Bucket k's reduction: DeepSpeed's ZeRO-2 reduction to the owners where the
        strategy has it (`reduce_scatter`, set by steady_state; its seconds by the
        settings' `zero2_reduce`, zfbench.sims.zero2_reduce, checked by hand in
        tests/test_zero2_reduce.py), else an all-reduce."""
        if self.gpus == 1:
            return None
        if self.reduce_scatter:
            i = self.order[k]  # k counts in backward order
            return (0.0, zero2_reduce.bucket_reduce_s(self.c, i,
                                                      partitioning.owned_runs(self.c, i)))
        return (0.0, self.c.allreduce_s(self.numel[k] * 2))

    def ag(self, k: int):
        return None if self.gpus == 1 else (0.0, self.c.allgather_s(self.numel[k] * 2))

    def releases(self, t0: float) -> list[float]:
        """Ends of each backward bucket of a step whose forward starts at t0."""
        out = [t0 + self.F]
        for b in self.bwd:
            out.append(out[-1] + b)
        return out[1:]

    def grads_down(self, t0, net: _Lane, d2h: _Lane, numel, gate=None, wire: float = 2):
        """Backward from t0: each bucket all-reduced (net) then sent down after
        `gate[k]`, `wire` bytes per element; the end times."""
        downs = []
        for k, r in enumerate(self.releases(t0)):
            red = net.run(r, r, self.ar(k)) if self.gpus > 1 else NEG
            g = NEG if gate is None else gate[k]
            downs.append(d2h.run(r, max(red, g), self.down(numel[k], wire)))
        return downs

    def deepspeed_update(self, host: _Lane, submit: float, ready: float, h2d: _Lane,
                         net: _Lane) -> tuple[float, float]:
        """Clip, Adam, conversion on the host lane, then the partition up and the model
        all-gathered: (the Adam end, the last event)."""
        clip = host.run(submit, ready, self.clip)
        adam = host.run(submit, clip, self.adam_all)
        conv = host.run(submit, adam, self.convert)
        last = h2d.run(submit, conv, self._xfer(self.c.params, self.rh))
        if self.gpus > 1:
            last = net.run(submit, last, (0.0, self.c.allgather_s(self.c.model_bytes)))
        return adam, last

    def update_up(self, submit, chunk_end, up_numel, h2d: _Lane, net: _Lane) -> float:
        """Each chunk's parameters up then all-gathered; the last event (the step waits)."""
        last = submit
        for k, e in enumerate(chunk_end):
            last = h2d.run(submit, e, self.up(up_numel[k]))
            if self.gpus > 1:
                last = net.run(submit, last, self.ag(k))
        return last


# ----------------------------------------------------------------------------- checks
def _groups(settings: SimSettings) -> list[tuple[int, int]]:
    """(GPUs behind one switch, ranks in such groups) for one node's switch layout."""
    gpus = settings.machine.gpus_on_node
    gps = min(settings.machine.gpus_per_switch, gpus)
    full, rem = divmod(gpus, gps)
    return [(gps, full * gps)] + ([(rem, rem)] if rem else [])


def _dram_ok(costs: CostModel, strategy: str) -> bool:
    """Host jobs stay core-bound even with every rank's job running while every switch
    upstream moves data both ways at full rate (conservative); only zenflow accumulates."""
    node, link = costs.node, costs.node.link
    gpus = costs.gpus_per_node  # one node's host serves only its own ranks
    switches = math.ceil(gpus / min(costs.settings.machine.gpus_per_switch, gpus))
    left = node.host.dram_bytes_per_s - switches * (link.d2h_bytes_per_s + link.h2d_bytes_per_s)
    cores = costs.cores_per_rank
    need = cores * costs.adam_units_per_core_s * ADAM_BYTES_PER_PARAM
    if strategy == "zenflow":
        need = max(need, cores * costs.accum_units_per_core_s * ACCUM_BYTES_PER_ELEMENT)
    if costs.deepspeed_host_step and strategy in ("zero-offload", "zero-offload-dpu",
                                                  "zenflow", "zero-infinity"):  # clip, conversion
        need = max(need, cores * costs.stream_units_per_core_s(CLIP_BYTES_PER_ELEM)
                   * CLIP_BYTES_PER_ELEM)
    return gpus * need <= left


def _interferes(T: _Terms, ups, downs, period: float = 0.0, reach: int = 0) -> bool:
    """Whether an upload overlaps a download, the downloads repeating every `period`."""
    link = T.c.node.link
    if link.h2d_factor_when_d2h_busy == 1.0 and link.d2h_factor_when_h2d_busy == 1.0:
        return False
    tol = _TIE * max([abs(x) for iv in ups + downs for x in iv] + [period, 1e-30])
    return any(a0 < b1 + j * period - tol and b0 + j * period < a1 - tol
               for j in range(-reach, reach + 1) for a0, a1 in ups for b0, b1 in downs)


def _fixed_point(period_map, carry: tuple, max_cycle: int = 4):
    """Iterate `period_map(carry) -> (period, carry', info)` from a clean carry until the
    carry repeats after c periods (c <= max_cycle: a max-plus system may settle into a
    cycle, not a point); returns (the c periods, their infos, periods needed) or None."""
    seen, out = [carry], []
    for n in range(_MAX_PERIODS):
        period, carry, info = period_map(carry)
        out.append((period, info))
        seen.append(carry)
        for c in range(1, min(max_cycle, n + 1) + 1):  # carry_n == carry_{n-c}: the
            tol = _CONVERGED * max(p for p, _ in out[-c:])  # last c periods repeat
            if all(a == b or abs(a - b) <= tol for a, b in zip(carry, seen[-1 - c])):
                cycle = out[-c:]
                return [p for p, _ in cycle], [i for _, i in cycle], n - c + 1
    return None


def _cycle_intervals(periods, infos, which: int):
    """Intervals `which` of every period of a cycle, on one clock starting with it."""
    out, t0 = [], 0.0
    for period, info in zip(periods, infos):
        out += [(a + t0, b + t0) for a, b in info[which]]
        t0 += period
    return out
