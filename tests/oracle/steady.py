"""Closed-form steady state of each strategy, for inputs where no rate is shared.

This module owns an independent check of the event simulation: from the dependency
structure of `sims/strategies.py` it derives each strategy's steady-state step time from
`CostModel` quantities alone (bucket seconds, bytes, elements, rates) as sums, maxima and
in-order-lane recurrences; it never runs SimPy nor uses the fluid pool or the lanes.

Building block: an in-order lane of fixed durations, item j ending at
`max(ready_j, end_{j-1}) + d_j` (the flow-shop `max_j(ready_j + sum_{i>=j} d_i)` unrolled);
a transfer lasts `latency + bytes/rate`, host work `elements/rate`, a collective its ring
time; a zero-sized transfer or host job is done at submission, as the strategies skip it.

- `device`, `zero-offload`, `zenflow` without `overlap_step`: every step (window) starts
  with all lanes drained, so one step (window) from a clean start is the steady state.
- `zero-offload-dpu`, `zenflow` with `overlap_step`: a period map (one step; one window
  from the device resuming at a boundary) carries the lanes' state to the next period;
  iterated from the run's real start it reaches a fixed point or a short cycle, the
  steady state (the start matters: the zenflow map can have several cycles). Its host
  lane is not first-in-first-out (accumulations go ahead of Adam chunks not yet started):
  the window map merges them by that rule.
- `zero-infinity`: a one-step period map from one step's last backward to the next
  (`tests/oracle/zero3.py`); with parameters on NVMe only a lower bound, never exact.

The lanes, per-op terms, checks and the period-map iteration are in `tests/oracle/parts.py`.

`exact` is True when the closed form is exact for the input: every rank of a switch group
moves the same bytes at the same moments (so m GPUs behind a switch each get rate/m);
host jobs never reach the DRAM limit (`_dram_ok`); no upload overlaps a gradient download
(the bidirectional factor) unless both factors are 1; no two events the merge rule must
order coincide; the period map reaches a fixed point; zenflow uses design transfers and
select_interval 0. It models strategies.py as it stands (e.g. zenflow's device optimizer
does not wait for the gradient all-reduce); a change there needs the same change here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zfbench.sims import partitioning
from zfbench.sims.costs import STRATEGIES, CostModel, SimSettings, SimSettingsError
from zfbench.sims.settings import fixed_interval

from .parts import (_CONVERGED, _MAX_PERIODS, _TIE, NEG, _cycle_intervals, _dram_ok,
                    _fixed_point, _groups, _interferes, _Lane, _Terms)
from .zero3 import zero_infinity


@dataclass(frozen=True)
class OracleResult:
    strategy: str
    step_time_s: float  # steady-state mean wall time per step (zenflow: window / U)
    compute_s: float  # compute-lane busy time per step
    stall_s: float  # step_time_s - compute_s
    exact: bool
    reason: str  # why the closed form is (or is not) exact for this input
    regime: str = ""
    # periods before the steady cycle, from the run's start (dpu: steps; zenflow: windows
    # after the first one); the cycle repeats every `cycle_periods` periods
    settle_periods: int = 0
    cycle_periods: int = 1


# --------------------------------------------------------------------------- strategies
def _device(T: _Terms):
    net = _Lane()
    x = max([T.F + T.B] + [net.run(r, r, T.ar(k)) for k, r in enumerate(T.releases(0.0))])
    o = T.c.device_step_s(T.c.share(T.c.params))
    y = x + o
    if T.gpus > 1:
        y = net.run(y, y, (0.0, T.c.allgather_s(T.c.model_bytes)))
    return y, T.F + T.B + o, True, "compute and fixed-time collectives only", "", 0, 1


def _offload_chunks(T: _Terms, host: _Lane, submit: float, first_ready: float):
    return [host.run(submit, first_ready if k == 0 else NEG, ch)
            for k, ch in enumerate(T.chunk)]


def _offload_update(T: _Terms, host: _Lane, sub: float, ready: float, h2d: _Lane,
                    net: _Lane):
    """The host update and upload: (each bucket's host end, the last event)."""
    if T.deepspeed:  # with copy engines nothing waits for the host's use of a bucket
        _, landed = T.deepspeed_update(host, sub, ready, h2d, net)
        return [NEG] * len(T.order), landed
    ends = _offload_chunks(T, host, sub, ready)
    return ends, T.update_up(sub, ends, T.numel, h2d, net)


def _zero_offload(T: _Terms):
    net, d2h, h2d = _Lane(), _Lane(), _Lane()
    downs = T.grads_down(0.0, net, d2h, T.numel, wire=T.wire)
    sub = T.F + T.B
    _, landed = _offload_update(T, _Lane(), sub, max(downs + [sub]), h2d, net)
    return max(sub, landed), sub, True, "synchronous: every step starts drained", "", 0, 1


def _dpu_step(T: _Terms, carry):
    """One dpu step from its start; carry: landed(t-1), chunk ends of t-1, lane frees."""
    nb = len(T.order)
    land1, chunk_prev = carry[0], carry[1:1 + nb]
    d2h, host, h2d, net = (_Lane(f) for f in carry[1 + nb:])
    downs = T.grads_down(0.0, net, d2h, T.numel, chunk_prev, T.wire)
    sub = T.F + T.B
    ends, landed = _offload_update(T, host, sub, max(downs + [sub]), h2d, net)
    end = max(sub, land1)
    new = tuple(v - end for v in (landed, *ends, d2h.free, host.free, h2d.free, net.free))
    return end, new, (h2d.busy, d2h.busy, landed)


def _dpu(T: _Terms):
    P = T.F + T.B
    found = _fixed_point(lambda cr: _dpu_step(T, cr), (NEG,) * (len(T.order) + 5))
    if found is None:
        return P, P, False, "the step map never settles", "", _MAX_PERIODS, 1
    periods, infos, n = found
    cycle, c = sum(periods), len(periods)
    reach = int(math.ceil(max(i[2] for i in infos) / cycle)) + 1
    if _interferes(T, _cycle_intervals(periods, infos, 0),
                   _cycle_intervals(periods, infos, 1), cycle, reach):
        return cycle / c, P, False, "an upload overlaps a gradient download", "", n, c
    regime = "compute-bound" if cycle <= c * P * (1 + _CONVERGED) else "host/link-bound"
    return cycle / c, P, True, "fixed point of the one-step map", regime, n, c


def _zen_sequential(T: _Terms):
    """Without overlap a window drains at its boundary: one clean window is the period."""
    U, P = T.U, T.P_zen
    net, d2h, host, h2d = _Lane(), _Lane(), _Lane(), _Lane()
    A, acc_start = NEG, []
    for s in range(U):
        downs = T.grads_down(s * P, net, d2h, T.unsel, (A,) * len(T.order))
        sub = s * P + T.F + T.B
        A = host.run(sub, max(downs + [sub]), T.acc)
        acc_start.append(A - T.acc[1] if T.acc else math.inf)
    ends = _offload_chunks(T, host, sub, A)
    landed = T.update_up(sub, ends, T.unsel, h2d, net)
    window = max(sub, landed) + T.o_sel
    if max(ends) > window + acc_start[0]:
        return window, U * P, False, "host Adam outlives its window (nothing to wait for)", \
            "", 0, 1
    if _interferes(T, h2d.busy, d2h.busy):
        return window, U * P, False, "an upload overlaps a gradient download", "", 0, 1
    return window, U * P, True, "the window drains at its boundary", "sequential", 0, 1


def _zen_first_window(T: _Terms) -> tuple:
    """The first window after warm-up, from drained lanes: selection (and the score
    all-reduce) at its first step, no pending update at its boundary. Returns the carry
    of `_zen_frame` at that boundary: the map has several cycles, the start picks one."""
    nb, net, d2h, host = len(T.order), _Lane(), _Lane(), _Lane()
    t0, A, t = 0.0, NEG, 0.0
    for s in range(T.U):
        downs = T.grads_down(t0, net, d2h, T.unsel, (A,) * nb)
        t = t0 + T.F + T.B
        if s == 0:
            t += T.c.select_s()
            if T.gpus > 1:
                cols = sum(m.cols for m in T.c.shape.matrices())
                t = net.run(t, t, (0.0, T.c.allreduce_s(4 * cols)))
        A = host.run(t, max(downs + [t]), T.acc)
        t0 = t + T.o_sel
    return tuple(v - t for v in (host.free, A, d2h.free, NEG, net.free))


def _zen_frame(T: _Terms, carry):
    """One overlap window. Time 0: the device resumes at boundary k-1 and submits window
    k-1's host Adam; it runs that boundary's device optimizer and the U steps of window k,
    then waits at boundary k for window k-1's update (tau'). carry, relative to 0: host
    lane free, end of the accumulation of boundary k-1, d2h / h2d / net lane frees."""
    U, P, nb = T.U, T.P_zen, len(T.order)
    hf, acc_last = carry[0], carry[1]
    d2h, h2d, net = _Lane(carry[2]), _Lane(carry[3]), _Lane(carry[4])
    chunk_end = [0.0] * nb
    scale = U * P + sum(ch[1] for ch in T.chunk)
    tie = False

    def step_ready(s: int, gate: float) -> float:  # accumulation of step s of window k
        t0 = T.o_sel + (s - 1) * P
        downs = T.grads_down(t0, net, d2h, T.unsel, (gate,) * nb)
        return max(downs + [t0 + T.F + T.B])

    if T.gpus > 1:  # window k's all-reduces queue behind window k-1's all-gathers, which
        # follow its uploads and chunks: no accumulation of window k can slip in between
        hf = max(hf, 0.0, acc_last)
        for j, ch in enumerate(T.chunk):
            hf = chunk_end[j] = hf + ch[1]
        landed = T.update_up(0.0, chunk_end, T.unsel, h2d, net)
    gate = acc_last
    j = 0
    for s in range(1, U + 1):
        r = step_ready(s, gate)
        if T.acc is None:
            gate = r
            continue
        if T.gpus == 1:  # merge: at each free moment a ready accumulation goes first
            while j < nb:
                avail = max(0.0, acc_last) if j == 0 else NEG
                start = max(hf, avail)
                tie |= abs(r - start) <= _TIE * scale
                if r <= start:
                    break
                hf = chunk_end[j] = start + T.chunk[j][1]
                j += 1
        elif r < hf:
            tie = True  # cannot happen: the all-gathers gate window k's downloads
        hf = gate = max(hf, r) + T.acc[1]
    if T.gpus == 1:
        for j in range(j, nb):
            hf = chunk_end[j] = max(hf, 0.0 if j else max(0.0, acc_last)) + T.chunk[j][1]
        landed = T.update_up(0.0, chunk_end, T.unsel, h2d, net)
    arrival = T.o_sel + (U - 1) * P + T.F + T.B
    tau = max(arrival, landed)
    new = tuple(v - tau for v in (hf, gate, d2h.free, h2d.free, net.free))
    return tau, new, (h2d.busy, d2h.busy, tie, landed > arrival)


def _zen_overlap(T: _Terms):
    U, P = T.U, T.P_zen
    found = _fixed_point(lambda cr: _zen_frame(T, cr), _zen_first_window(T))
    if found is None:
        return U * P, U * P, False, "the window map never settles", "overlap", \
            _MAX_PERIODS, 1
    periods, infos, n = found
    cycle = sum(periods)
    waits = any(i[3] for i in infos)
    regime = "overlap, host slower" if waits else "overlap, host faster"
    window = cycle / len(periods)
    if any(i[2] for i in infos):
        why = "host lane order ambiguous (an accumulation ready as a chunk ends)"
        return window, U * P, False, why, regime, n, len(periods)
    if _interferes(T, _cycle_intervals(periods, infos, 0),
                   _cycle_intervals(periods, infos, 1), cycle, 3):
        return window, U * P, False, "an upload overlaps a gradient download", regime, n, \
            len(periods)
    return window, U * P, True, "fixed point of the one-window map", regime, n, len(periods)


def _zenflow(T: _Terms):
    s = T.c.settings
    if s.measurement.transfers != "design":
        why = "shipped transfers (the accumulator round trip meets downloads)"
    elif s.zenflow.select_interval != 0:
        why = "periodic reselection (select_interval != 0)"
    else:
        return _zen_overlap(T) if s.zenflow.overlap_step else _zen_sequential(T)
    return T.U * T.P_zen, T.U * T.P_zen, False, why, "", 0, 1


_STRATEGY_FN = {"device": _device, "zero-offload": _zero_offload,
                "zero-offload-dpu": _dpu, "zenflow": _zenflow, "zero-infinity": zero_infinity}


def steady_state(settings: SimSettings, strategy: str) -> OracleResult:
    """Steady-state mean step time, compute and stall per step of `strategy` on
    `settings`, in closed form, with whether that form is exact for this input."""
    if strategy not in STRATEGIES:
        raise SimSettingsError(f"unknown strategy {strategy!r}; choose one of: "
                               f"{', '.join(STRATEGIES)}")
    # Nodes are identical and share nothing but the collectives, whose costs (two-level
    # over the nodes, zfbench.sims.collectives) are fixed per rank: one node's mean is the run's.
    costs = CostModel(settings)
    rs = partitioning.reduce_scatters(costs, strategy)
    groups = [(ranks, _STRATEGY_FN[strategy](_Terms(costs, m, rs)))
              for m, ranks in _groups(settings)]
    div = settings.machine.gpus_on_node * (fixed_interval(settings) if strategy == "zenflow" else 1)
    step = sum(r * g[0] for r, g in groups) / div
    compute = sum(r * g[1] for r, g in groups) / div
    exact = all(g[2] for _, g in groups)
    reason = " | ".join(dict.fromkeys(g[3] for _, g in groups))
    if strategy != "device" and not _dram_ok(costs, strategy):
        exact, reason = False, "host jobs may be DRAM-bound; " + reason
    if settings.machine.ranks > 1 and partitioning.owns_partitions(costs, strategy):
        # ZeRO-2 partitions (zfbench.sims.partitioning): ranks copy different parts of
        # each bucket and each reduction waits for other ranks' copies; this form is one
        # symmetric rank
        exact, reason = False, "several GPUs: ZeRO-2 partitions make ranks differ and " \
            "wait for each other; " + reason
    elif settings.machine.ranks > 1 and strategy in ("zero-offload-dpu", "zenflow"):
        # the simulator issues each all-gather when its parameters are up (so the net
        # lane's order depends on timing) and zenflow's device update waits for the
        # gradient all-reduces; this form keeps submission order and no such wait
        exact, reason = False, "several GPUs: all-gathers join the net lane when ready " \
            "and the device update waits for reduced gradients; " + reason
    return OracleResult(strategy, step, compute, step - compute, exact, reason,
                        groups[0][1][4], max(g[5] for _, g in groups),
                        math.lcm(*(g[6] for _, g in groups)))
