"""ZenFlow on ZeRO-3 in the engine: each rank updates what it owns (docs/zenflow.md).

With `zero_optimization.stage: 3` the engine holds this rank's shard of the 16-bit
parameters in `engine.zero3.owned` (real/zero3.py) and its gradients arrive
reduce-scattered: only the shard [lo, hi) of `flat_grads` is the mean over ranks. The
schedule is ZeRO-2's (`ZenFlowStrategy`: selection, windows, warm-up, overlap, adaptive
windows), with every device-side piece restricted to the shard:
- selection: the columns' scores are summed over the ranks from each shard's part (one
  all-reduce, as on ZeRO-2), so every rank agrees on the top k of every weight; the rank's
  device then owns `pos`, the shard positions of the selected columns' elements and of
  the 1-D parameters' elements in its shard, with fp32 values and AdamW moments for
  exactly those elements;
- device update: AdamW on those elements (grad / U), rounded into `owned`;
- host: the shard's gradient accumulated per window and the host AdamW of the shard, whose
  result goes up into a shard-sized `upload` and then into `owned` (the kept positions
  keep their device values); nothing is all-gathered: the next forward's gathers bring it;
- a reselection exchanges the fp32 values of `pos` with the rank's own host master.
AdamW is elementwise, so on the same gradients this is ZeRO-2's ZenFlow element for
element; the checkpoint carries `owned`.
"""

from __future__ import annotations

import torch

from zfbench.real import kernels
from zfbench.real.distributed import allreduce_sum_
from zfbench.real.zenflow import ZenFlowStrategy
from zfbench.real.zenflow_shard import _positions, exchange_scores, shard_column_scores
from zfbench.core.schedule import topk_count


def shard_positions(slots_and_columns, vector_slots, lo: int, hi: int) -> torch.Tensor:
    """Shard-relative positions (int64, ascending within each weight) of the elements of
    the selected columns (`(slot, idx)` pairs, idx ascending) and of the 1-D slots that
    lie in [lo, hi); a weight wholly in the shard comes laid out as `selected_shape`."""
    return torch.cat([torch.zeros(0, dtype=torch.long)] + _pieces(
        slots_and_columns, vector_slots, lo, hi))


def _selected_shape(slot, k: int) -> tuple[int, int]:
    """`selected_shape` of the slot's weight, from its layout (the parameter itself may be
    released): [k, rows] for a column-major matrix, [rows, k] otherwise."""
    rows, cols = slot.shape
    return (k, rows) if slot.column_major and rows > 1 and cols > 1 else (rows, k)


def _pieces(slots_and_columns, vector_slots, lo: int, hi: int) -> list[torch.Tensor]:
    parts = []
    for slot, idx in slots_and_columns:
        pos = _positions(slot, idx).reshape(-1)
        parts.append(pos[(pos >= lo) & (pos < hi)].sort().values - lo)
    for slot in vector_slots:
        a, b = max(lo, slot.offset), min(hi, slot.offset + slot.numel)
        parts.append(torch.arange(max(a, lo) - lo, max(a, b) - lo))
    return parts


class ZenFlowZero3Strategy(ZenFlowStrategy):
    """ZenFlow whose device state is this rank's shard only (the module docstring)."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        z3 = engine.zero3
        self.owned = z3.owned
        self.upload = self.B.name(torch.zeros_like(self.owned), "upload")
        self.pos = torch.zeros(0, dtype=torch.long, device=self.owned.device)
        self.counts: list[int] = []  # elements of each weight in `pos` (entry_names' order)
        self._fresh_state(0)

    def _fresh_state(self, n: int) -> None:
        dev = self.owned.device
        self.values = self.B.name(torch.zeros(n, dtype=torch.float32, device=dev),
                                  "selected_values")
        self.m = torch.zeros_like(self.values)
        self.v = torch.zeros_like(self.values)
        self.g = torch.zeros_like(self.values)
        self.scratch = torch.zeros_like(self.values)
        # each weight's moments as views (shaped as its selection when the shard holds
        # the whole weight), as ZeRO-2's strategy names them
        self.dm, self.dv, at = {}, {}, 0
        for name, count in zip(self.entry_names, self.counts if n else ()):
            p = self.by_name[name]
            whole = count == (p.shape[0] * self.selected[name].numel() if p.dim() == 2
                              else p.numel())
            shape = (_selected_shape(self.e.layout.by_name[name],
                                     self.selected[name].numel()) if p.dim() == 2
                     else tuple(p.shape)) if whole else (count,)
            self.dm[name] = self.m[at:at + count].view(shape)
            self.dv[name] = self.v[at:at + count].view(shape)
            at += count

    # -- the host's result goes into the shard-sized buffers ------------------------------
    def params_up(self, t, target, a, b, wire) -> None:
        src = self.host.master[a:b] if wire is None else wire
        self.B.copy("h2d", "h2d_param", t, target[a:b], src)

    def params_target(self) -> torch.Tensor:
        return self.owned

    def apply_pending(self, t: int) -> None:
        """`owned` takes the host's values but at `pos`, which keeps the device's."""
        e = self.e
        if not self._collect_pending(t):  # (nothing is gathered on ZeRO-3)
            return
        with e.compute("device_optim", t, reads=(self.upload, self.owned),
                       writes=(self.owned,)):
            kept = self.owned.index_select(0, self.pos)
            kernels.copy_(self.owned, self.upload)
            self.owned.index_copy_(0, self.pos, kept)
        self.pending, self.pending_ready = None, False

    # -- selection ------------------------------------------------------------------------
    def select(self, t: int) -> None:
        e, B, host = self.e, self.B, self.host
        if t != 0:
            self.apply_pending(t)
            if not self.low or t > self.W:  # the device has values newer than the master
                B.wait("d2h", B.record("compute"), "select's d2h waits for the weights")
            if not self.low:  # fp32 weights: the shard is exact
                with B.op("d2h", "select", t, reads=(self.owned,), writes=(host.master,),
                          nbytes=self.owned.numel() * 4, blocking=True):
                    host.master.copy_(self.owned)
            elif t > self.W:
                with B.op("d2h", "select", t, reads=(self.values,), writes=(host.master,),
                          nbytes=self.values.numel() * 4, blocking=True):
                    host.master[self.pos.cpu()] = self.values.cpu()
        scores = None
        if e.dist.active:
            scores = exchange_scores(e, self.matrices, self.column_scores, t)
        slots = e.layout.by_name
        with e.compute("select", t, reads=(e.flat_grads,)):
            for name, p in self.matrices:
                s = scores[name] if scores is not None else self.column_scores(p.grad)
                self.selected[name] = kernels.top_columns(s, topk_count(p.shape[1],
                                                                        self.zf.topk_ratio))
            pieces = _pieces([(slots[n], self.selected[n]) for n, _ in self.matrices],
                             [slots[n] for n, _ in self.vectors], host.lo, host.hi)
            pos = torch.cat([torch.zeros(0, dtype=torch.long)] + pieces)
            self.counts = [piece.numel() for piece in pieces]
            self.pos = pos.to(self.owned.device)
            self._fresh_state(self.pos.numel())  # the moments start at zero
        B.access("compute", "select", writes=(self.pos, self.values, self.m, self.v))
        B.wait("h2d", B.record("compute"), "select's h2d waits for the selection")
        with B.op("h2d", "select", t, reads=(host.master, self.pos), writes=(self.values,),
                  nbytes=self.values.numel() * 4, blocking=True):
            self.values.copy_(host.master[pos])

    def observe(self, t: int) -> None:
        """Adaptive windows: per 2-D weight (|g| total, |g| of the selected columns), from
        the shard's part, summed over the ranks."""
        e = self.e
        with e.compute("select", t, reads=(e.flat_grads,)):
            rows = []
            for name, _ in self.matrices:
                cols = shard_column_scores(e.flat_grads, e.layout.by_name[name],
                                           self.host.lo, self.host.hi, square=False)
                rows.append(torch.stack([cols.sum(), cols[self.selected[name]].sum()]))
            # on the gradients' device: the main group is NCCL's on CUDA
            sums = (torch.stack(rows).double() if rows
                    else torch.zeros(0, 2, dtype=torch.float64, device=e.flat_grads.device))
        if e.dist.active and rows:
            with self.B.op("net", "allreduce", t, nbytes=sums.numel() * 8):
                allreduce_sum_(e.dist, sums)
        self.auto_boundary_next = self.tracker.observe([tuple(r) for r in sums.tolist()])

    # -- the device update ----------------------------------------------------------------
    def device_update(self, t: int) -> None:
        e = self.e
        self.device_count += 1
        with e.compute("device_optim", t, reads=(e.flat_grads,),
                       writes=(self.owned, self.values)):
            shard = e.flat_grads[self.host.lo:self.host.hi]
            kernels.copy_(self.g, shard.index_select(0, self.pos))
            self.g.div_(self.grad_divisor)
            self._device_adam([self.values], [self.g], [self.m], [self.v],
                              [self.device_count], [self.scratch])
            self.owned.index_copy_(0, self.pos, self.values.to(self.owned.dtype))

    # -- checkpoint -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {**self.schedule_state(), "owned": self.owned, "pos": self.pos,
                "counts": self.counts, "values": self.values, "m": self.m, "v": self.v}

    def load_state_dict(self, state: dict) -> None:
        self.load_schedule_state(state)  # (the engine checked the stage and size)
        self.owned.copy_(state["owned"])
        self.pos = state["pos"].to(self.owned.device)
        self.counts = list(state["counts"])
        self._fresh_state(self.pos.numel())
        for name in ("values", "m", "v"):
            getattr(self, name).copy_(state[name])
