"""ZeRO-3 in the engine: each rank owns a shard of the 16-bit parameters; the modules
gather theirs before use and release them after (docs/zenflow.md, "ZenFlow on ZeRO-3").

`Zero3Params(engine)` holds `owned`, this rank's shard [lo, hi) of the flat parameter
buffer (the persistent copy: every update writes it, checkpoints carry it); the engine's
full `flat_params` is dropped. A gathered unit's parameters are views into a buffer of
its own; released, each is one NaN element seen at its shape (the buffer freed), so
anything that reads a released parameter gets NaN (a test checks it). A unit is a module with parameters of its
own (`_parameters`, tied ones included, and those `register_external_parameter` names);
hooks gather a unit's elements from every rank's shard before its forward and before its
backward (one `net` all-gather span each, padded pieces) and release them after. The first forward traces the units' order; from then on
the units after the one in use are gathered ahead, asynchronously, while their elements
stay within `stage3_prefetch_bucket_size` (reversed order in backward). After backward
the gradients are reduce-scattered (`reduce_scatter` span): this rank's shard of
`flat_grads` holds the mean and the rest is zeroed. `gathered()` assembles the whole model
(after `Engine.finish` it stays assembled).
"""

from __future__ import annotations

import dataclasses
import warnings
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist

from zfbench.real.distributed import allreduce_sum_, run_collective
from zfbench.real.flat import FlatLayout


def register_external_parameter(module: torch.nn.Module, owner: torch.nn.Module,
                                name: str) -> None:
    """`module`'s forward reads `owner.<name>`, a parameter another module owns (a tied
    weight): ZeRO-3 gathers it with `module` too (DeepSpeed's
    `deepspeed.zero.register_external_parameter`; by owner and name, so a parameter
    re-created by `to_empty` is still found); nothing changes on other stages."""
    module.__dict__.setdefault("_zero3_external", []).append((owner, name))


class Zero3Params:
    """This rank's shard of the parameters, the units' hooks, gathers and releases."""

    def __init__(self, engine) -> None:
        self.e, self.B, self.ctx = engine, engine.backend, engine.dist
        self.lo, self.hi = engine.shard_lo, engine.shard_hi
        flat = engine.flat_params
        self.owned = self.B.name(flat[self.lo:self.hi].detach().clone(), "owned_params")
        self.nan = torch.full((1,), float("nan"), dtype=flat.dtype, device=flat.device)
        self.prefetch_elems = engine.config.prefetch_elems
        slot_of = {id(p): s for s, (_, p) in zip(engine.layout.slots, engine.named_params)}
        self.param_of = {s.offset: p for s, (_, p) in zip(engine.layout.slots,
                                                          engine.named_params)}
        self.units: list[list] = []  # each unit's slots
        self.modules = []
        for module in engine.model.modules():
            used = list(module._parameters.values()) + [
                getattr(owner, name) for owner, name in module.__dict__.get(
                    "_zero3_external", [])]
            mine = [slot_of[id(p)] for p in used if p is not None and id(p) in slot_of]
            if mine:
                self.units.append(sorted(set(mine), key=lambda s: s.offset))
                self.modules.append(module)
        self.holders = {s.offset: 0 for s in engine.layout.slots}  # live units per slot
        self.trace: list[int] = []  # unit order of the first forward
        self.traced = False
        self.order: list[int] = []  # the pass being run: units in the order expected
        self.pos = 0
        self.inflight: dict[int, tuple] = {}  # unit -> (work, out, pieces, t0) prefetched
        self.ahead = 0  # gathers issued ahead of their unit's use (prefetches)
        self.hooks = []
        for i, module in enumerate(self.modules):
            self.hooks += [
                module.register_forward_pre_hook(lambda m, a, i=i: self.use(i, "forward", a)),
                module.register_forward_hook(lambda m, a, o, i=i: self.done(i)),
                module.register_full_backward_pre_hook(
                    lambda m, g, i=i: self.use(i, "backward")),
                module.register_full_backward_hook(
                    lambda m, gi, go, i=i: self.done(i, "backward"))]
        self.late = [False] * len(self.units)
        self.pass_name = None

    # -- a pass (forward or backward) -------------------------------------------------
    @contextmanager
    def pass_of(self, name: str):
        """A forward or backward pass of the model (`begin` ... `end`)."""
        self.begin(name)
        try:
            with warnings.catch_warnings():  # the hook firing early: handled by `late`
                warnings.filterwarnings("ignore", "Full backward hook is firing")
                yield
        finally:
            self.end()

    def begin(self, name: str) -> None:
        """A forward or backward pass starts: its units are expected in traced order."""
        self.pass_name = name
        self.order = (self.trace if name == "forward" else self.trace[::-1]) \
            if self.traced else []
        self.pos = 0

    def end(self) -> None:
        """The pass ended: unused prefetches are drained, every unit released."""
        for i in list(self.inflight):
            self._finish_gather(i, self.e.t, unpack=False)
        if self.pass_name == "forward" and not self.traced:
            self.traced = True
        for offset in self.holders:
            self.holders[offset] = 0
        self.release_all()
        self.pass_name = None

    def use(self, i: int, why: str, args=()) -> None:
        if why == "forward":
            if not self.traced:
                self.trace.append(i)
            # no input needs a gradient: PyTorch fires the unit's backward hook before its
            # backward ran, so it is released at the end of backward instead
            self.late[i] = not any(isinstance(a, torch.Tensor) and a.requires_grad
                                   for a in args)
        t = self.e.t
        if i in self.inflight:
            self._finish_gather(i, t)
        else:
            self._gather(i, t)
        for slot in self.units[i]:
            self.holders[slot.offset] += 1
        if self.order and self.pos < len(self.order) and self.order[self.pos] == i:
            self.pos += 1
            self._prefetch(t)

    def done(self, i: int, why: str = "forward") -> None:
        if why == "backward" and self.late[i]:
            return
        free = []
        for slot in self.units[i]:
            self.holders[slot.offset] = max(0, self.holders[slot.offset] - 1)
            if self.holders[slot.offset] == 0:
                free.append(slot)
        self._release(free)

    def _prefetch(self, t: int) -> None:
        budget = self.prefetch_elems
        for j in self.order[self.pos:]:
            size = sum(s.numel for s in self.units[j])
            if size > budget:
                break
            budget -= size
            if j not in self.inflight:
                self.inflight[j] = self._start(j, t, async_op=True)
                self.ahead += 1

    # -- gathering ----------------------------------------------------------------------
    def _pieces(self, slots, rank: int) -> list[tuple]:
        """The elements of `slots` in rank `rank`'s shard, as (slot, a, b): flat [a, b)."""
        total, ctx = self.e.layout.total, self.ctx
        lo = min(total, rank * ctx.shard) if ctx.active else 0
        hi = min(total, lo + ctx.shard) if ctx.active else total
        return [(s, max(lo, s.offset), min(hi, s.offset + s.numel)) for s in slots
                if max(lo, s.offset) < min(hi, s.offset + s.numel)]

    def _start(self, i: int, t: int, async_op: bool):
        slots = self.units[i]
        t0 = self.e.recorder.now()
        if not self.ctx.active:
            return None, None, None, t0
        world = self.ctx.world
        pieces = [self._pieces(slots, r) for r in range(world)]
        width = max(sum(b - a for _, a, b in p) for p in pieces)
        send = self.owned.new_zeros(width)
        at = 0
        for _, a, b in pieces[self.ctx.rank]:
            send[at:at + b - a].copy_(self.owned[a - self.lo:b - self.lo])
            at += b - a
        out = self.owned.new_empty(width * world)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        work = run_collective(self.ctx, "allgather", lambda: gather(
            out, send, group=self.ctx.group, async_op=async_op))
        return work, out, pieces, t0

    def _finish_gather(self, i: int, t: int, unpack: bool = True) -> None:
        work, out, pieces, t0 = self.inflight.pop(i)
        self._complete(i, t, work, out, pieces, t0, unpack)

    def _gather(self, i: int, t: int) -> None:
        self._complete(i, t, *self._start(i, t, async_op=False), unpack=True)

    def _complete(self, i, t, work, out, pieces, t0, unpack) -> None:
        """The unit's elements into a fresh buffer of its own, its parameters' storage."""
        slots = self.units[i]
        nbytes = sum(s.numel for s in slots) * self.owned.element_size()
        if work is not None:
            run_collective(self.ctx, "allgather", work.wait)
        if out is not None:  # one rank moves nothing: no span
            self.e.recorder.add("net", "allgather", t, t0, self.e.recorder.now(), nbytes)
        if not unpack:  # a prefetch the pass did not use: its bytes moved all the same
            return
        local, at = {}, 0
        for s in slots:
            local[s.offset], at = at, at + s.numel
        buf = self.B.name(self.owned.new_empty(at), f"gathered[{i}]")
        self.B.access("net", "allgather", reads=(self.owned,), writes=(buf,))
        if out is None:  # one rank: its shard is the whole model
            for s in slots:
                buf[local[s.offset]:local[s.offset] + s.numel].copy_(
                    self.owned[s.offset - self.lo:s.offset + s.numel - self.lo])
        else:
            width = out.numel() // self.ctx.world
            for r, ranges in enumerate(pieces):
                at = r * width
                for s, a, b in ranges:
                    start = local[s.offset] + a - s.offset
                    buf[start:start + b - a].copy_(out[at:at + b - a])
                    at += b - a
        for s in slots:
            self.param_of[s.offset].data = FlatLayout._view(
                buf, dataclasses.replace(s, offset=local[s.offset]))

    # -- releasing ----------------------------------------------------------------------
    def _release(self, slots) -> None:
        """The slots' parameters lose their storage: each becomes one NaN element seen
        at its shape (stride 0), so the gathered buffer is freed and a read gets NaN."""
        for s in slots:
            p = self.param_of[s.offset]
            p.data = self.nan.expand(p.shape)

    def release_all(self) -> None:
        """Every parameter released; `owned` keeps them."""
        self._release(self.e.layout.slots)

    def owned_view(self, name: str) -> torch.Tensor:
        """Parameter `name` as this rank's shard holds it (laid out as the parameter; the
        shard must hold all of it: one rank, or a parameter inside the shard), as
        DeepSpeed's `ds_tensor` is the rank's partition."""
        slot = self.e.layout.by_name[name]
        if slot.offset < self.lo or slot.offset + slot.numel > self.hi:
            raise ValueError(f"{name} is not wholly in this rank's shard "
                             f"[{self.lo}, {self.hi}); gather it with gathered()")
        return FlatLayout._view(self.owned, dataclasses.replace(slot,
                                                                offset=slot.offset - self.lo))

    @contextmanager
    def gathered(self):
        """The whole model assembled in the working space, released after."""
        self.gather_all(self.e.t)
        try:
            yield
        finally:
            self.release_all()

    def gather_all(self, t: int) -> None:
        """Every unit gathered (the whole model), left in place."""
        for i in range(len(self.units)):
            self._gather(i, t)

    # -- gradients ----------------------------------------------------------------------
    def reduce_scatter(self, t: int, grads: torch.Tensor, dtype: torch.dtype) -> None:
        """The mean over ranks of this rank's shard of `grads` into it (in `dtype` on the
        wire); every other element zeroed (released)."""
        ctx = self.ctx
        world, shard = ctx.world, ctx.shard
        padded = torch.zeros(shard * world, dtype=dtype, device=grads.device)
        padded[:grads.numel()].copy_(grads)
        mine = torch.empty(shard, dtype=dtype, device=grads.device)
        with self.B.op("net", "reduce_scatter", t, reads=(grads,), writes=(grads,),
                       nbytes=padded.numel() * padded.element_size()):
            run_collective(ctx, "reduce_scatter", lambda: dist.reduce_scatter_tensor(
                mine, padded, group=ctx.group))
            mine.div_(world)
            grads.zero_()
            grads[self.lo:self.hi].copy_(mine[:self.hi - self.lo])

    def agree_bad(self, bad: list[str]) -> list[str]:
        """This rank's non-finite parameters, or, when only another rank's shard has one,
        a line saying so: every rank skips (or raises on) the same steps."""
        if not self.ctx.active:
            return bad
        # on the gradients' device: the main group is NCCL's on CUDA
        votes = torch.tensor([1.0 if bad else 0.0], device=self.owned.device)
        allreduce_sum_(self.ctx, votes)
        if votes.item() > 0 and not bad:
            return [f"a parameter of another rank's shard ({int(votes.item())} rank(s))"]
        return bad

    @staticmethod
    def around(zero3, name: str):
        """`zero3.pass_of(name)`, or nothing without ZeRO-3."""
        return nullcontext() if zero3 is None else zero3.pass_of(name)

    def close(self) -> None:
        for h in self.hooks:
            h.remove()
        self.hooks = []
