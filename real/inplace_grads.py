"""Weight gradients written straight into the engine's flat gradient buffer.

Autograd computes each weight gradient into a fresh tensor and then adds it into
`p.grad`. On a CPU "device" that fresh, model-sized allocation dominates backward
(measured on opt-350m[2L], batch 1 x seq 8, one thread: `mm` into a fresh 16 MB output
5.4 ms vs `addmm_` into an existing one 1.7 ms; the dense embedding gradient allocates
and fills a vocab x width tensor every step). DeepSpeed points gradients into contiguous
buffers for the same reason on GPUs.

`InplaceGrads(params)` is a `TorchFunctionMode` the engine enters around the model's
forward. Every `F.linear` and `F.embedding` whose weight is one of the engine's
parameters, with its `.grad` already a view into the flat buffer, is routed through an
autograd function whose backward accumulates the weight (and bias) gradient into that
view (`addmm_`, `index_add_`; for the engine's column-major 2-D slots the transposed
`addmm_` and an accumulating `index_put_`; a plain `mm` into a slot the engine has just
zeroed: the slot is not read, 12% less time at 64 tokens on one thread,
bench/results/reference_step_cpu/device_step_ops.csv) and hands autograd no weight
gradient. The input gradient and every other op go through plain autograd,
which accumulates into the same views in place. The sums are autograd's, in a possibly
different order (rounding-level differences). What is not routed, and the bookkeeping
for real/grad_buckets.py, is in `InplaceGrads`' docstring.
"""

from __future__ import annotations

import functools
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["InplaceGrads", "wanted"]


def wanted(configured: bool | None, on_cuda: bool) -> bool:
    """Whether the engine routes weight gradients here: `zfbench.inplace_grads` where the
    config sets it, else on for the CPU lanes (the allocation it saves dominates backward
    there) and off on CUDA, where each routed linear's Python backward costs the host
    more than the copy it saves: the device strategy's step of qwen2.5-1.5b (bf16, seq
    1024, one H200, bench/reference_step.py, 2026-11-27) took 0.231 s with it and 0.167 s
    without at micro-batch 4, 0.196 and 0.200 s at micro-batch 1
    (bench/results/gpu/NVIDIA-H200/2026-11-27/call2/reference_step)."""
    return (not on_cuda) if configured is None else bool(configured)


def _accumulate(param: torch.Tensor, grad_fn, mode=None, writes: bool = True):
    """Add grad_fn(param.grad, first) into param.grad in place when it is set (and tell
    `mode.notify`); else return grad_fn(None, False) for autograd. `first`: the slot is
    known to hold zeros (`InplaceGrads.first_write`), so the contribution may be written
    instead of added; a grad_fn that always adds (`writes` False) gets a stale slot
    zeroed first."""
    if param.grad is None:
        return grad_fn(None, False)
    first = mode is not None and mode.first_write(param, writes)
    grad_fn(param.grad, first)
    if mode is not None and mode.notify is not None:
        mode.notify(param)
    return None


class _LinearIntoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, mode):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.mode = bias, mode
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, gy):
        x, weight = ctx.saved_tensors
        gx = gy.matmul(weight) if ctx.needs_input_grad[0] else None
        g2 = gy.reshape(-1, gy.shape[-1])
        x2 = x.reshape(-1, x.shape[-1])

        def weight_grad(out, first):
            if out is None:
                return g2.t().mm(x2)
            if not out.is_contiguous() and out.t().is_contiguous():  # column-major slot
                # the same sum, written into contiguous memory: over zeros a plain `mm`
                # (beta 0: the slot is not read; the bits of addmm_ into zeros, tested)
                if first:
                    return torch.mm(x2.t(), g2, out=out.t())
                out.t().addmm_(x2.t(), g2)
                return out
            if first and out.is_contiguous():
                return torch.mm(g2.t(), x2, out=out)
            if first:  # neither layout: the slot may be stale (`zeroed(stale=...)`)
                out.zero_()
            return out.addmm_(g2.t(), x2)

        def bias_grad(out, first):
            return g2.sum(0) if out is None else out.add_(g2.sum(0))

        gw = _accumulate(weight, weight_grad, ctx.mode) if ctx.needs_input_grad[1] else None
        gb = None
        if ctx.bias is not None and ctx.needs_input_grad[2]:
            gb = _accumulate(ctx.bias, bias_grad, ctx.mode, writes=False)
        return gx, gw, gb, None


class _EmbeddingIntoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, padding_idx, mode):
        ctx.save_for_backward(ids)
        ctx.weight, ctx.padding_idx, ctx.mode = weight, padding_idx, mode
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx, gy):
        (ids,) = ctx.saved_tensors
        weight = ctx.weight
        flat_ids = ids.reshape(-1)
        rows = gy.reshape(-1, gy.shape[-1])
        if ctx.padding_idx is not None:  # the padding row gets no gradient, as in torch
            keep = flat_ids != ctx.padding_idx
            flat_ids, rows = flat_ids[keep], rows[keep]

        def weight_grad(out, first):  # rows of one id add up: always accumulated
            if out is None:
                out = torch.zeros_like(weight)
            if not out.is_contiguous():  # column-major: index_add_ has no fast path here
                # (bf16: 1 s for 4 rows of a 32000 x 2048 table, vs 0.1 ms this way)
                return out.index_put_((flat_ids,), rows.to(out.dtype), accumulate=True)
            return out.index_add_(0, flat_ids, rows.to(out.dtype))

        return None, _accumulate(weight, weight_grad, ctx.mode, writes=False), None, None


def _settle_one(ref, stale: set, grad=None):
    """Zero the `.grad` of the parameter behind weakref `ref` if its id is in `stale`
    (a tensor hook: `grad` is autograd's, passed through untouched)."""
    p = ref()
    if p is not None and id(p) in stale:
        stale.discard(id(p))
        if p.grad is not None:
            p.grad.zero_()


def _arg(args, kwargs, i, name, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


class InplaceGrads(TorchFunctionMode):
    """Route `F.linear` / `F.embedding` on the given parameters through in-place
    gradient accumulation (the module docstring).

    Not routed, so plain autograd handles them: embeddings with `max_norm`, `sparse` or
    `scale_grad_by_freq`, weights that are not leaf parameters of the engine (a transposed
    or sliced weight) and any parameter whose `.grad` is None (set to none by the caller;
    not when the owner set them all to None and binds them before backward: `unbound`).
    Gradient hooks registered on a routed weight do not fire (the gradient never passes
    through autograd); turn the mode off with `zfbench.inplace_grads: false` for such models.
    For the engine's own bookkeeping (real/grad_buckets.py: is a parameter's gradient
    complete?) the mode counts, in each forward, the routed uses of every parameter (`uses`)
    and notes the parameters that other ops use (`plain`: autograd accumulates those, and its
    hook fires), and `notify(param)` is called after each routed contribution in backward.

    The first routed contribution after the owner zeroed the gradients and said so
    (`zeroed()`) is written, not added (`first_write`): a plain `mm` into the slot instead
    of `addmm_` (the same bits; the slot's old zeros are not read). Any other write into a
    `.grad` that autograd makes (another op's use of the parameter) marks it as written
    through a post-accumulate hook, so the routed contribution then adds to it; code that
    writes into a routed `.grad` by hand between `zeroed()` and backward must not use this.
    The owner may leave the slots of `deferrable()` parameters unzeroed (`zeroed(stale=)`):
    the first write covers them, autograd's first add zeroes one first (a tensor hook),
    and `settle()` zeroes those backward did not write.
    """

    def __init__(self, params) -> None:
        super().__init__()
        params = list(params)
        self.ids = {id(p) for p in params}
        # parameter ids whose .grad holds the zeros the owner wrote, unwritten since
        self.clean: set[int] = set()
        clean = self.clean  # the hooks hold the sets, not the mode
        # parameter ids whose .grad the owner left unzeroed (`zeroed(stale=...)`): they
        # read as zeros once written, or once `settle()` zeroed them
        self.stale: set[int] = set()
        stale = self.stale
        for p in params:
            if p.requires_grad and p.is_leaf:
                p.register_post_accumulate_grad_hook(lambda q: clean.discard(id(q)))
                # before autograd adds into a stale .grad, it is zeroed
                p.register_hook(functools.partial(_settle_one, weakref.ref(p), stale))
        self.params = {id(p): weakref.ref(p) for p in params}
        # ever routed as a linear weight / as an add-only contribution (bias, embedding) /
        # ever used by another op (plain autograd)
        self.linear_weights: set[int] = set()
        self.routed_adds: set[int] = set()
        self.other: set[int] = set()
        self.routed = 0  # calls routed in the last forward (tests read it)
        self.uses: dict[int, int] = {}  # routed uses per parameter id, this forward
        self.plain: set[int] = set()  # parameter ids other ops used, this forward
        self.notify = None  # called with a parameter after each routed contribution
        # the owner set every `.grad` to None and binds each to its slot again before
        # backward (real/engine.py `_release_grads`): a forward routes them all the same
        self.unbound = False

    def zeroed(self, stale=()) -> None:
        """The owner has just zeroed every parameter's `.grad` but those of `stale` (ids
        from `deferrable()`: left as they were, read as zeros): the next routed
        contribution to each may be written instead of added."""
        self.clean.clear()
        self.clean.update(self.ids)
        self.stale.clear()
        self.stale.update(stale)

    def deferrable(self) -> frozenset[int]:
        """Ids of the routed linear weights no plain op used: backward writes each one's
        first contribution over its slot, so zeroing it can wait. That includes a tied
        embedding (the head's linear weight, also routed as an embedding: its add-only
        contribution zeroes a stale slot first, so any order is right), whose slot is then
        never zeroed, as the head's backward comes first and writes over it. A bias or an
        untied embedding is not: deferring it would only move its zeroing into backward."""
        return frozenset(self.linear_weights - self.other)

    def first_write(self, param: torch.Tensor, writes: bool = True) -> bool:
        """Whether `param.grad` still holds the zeros of `zeroed()` (then no longer: the
        caller writes it now; one that only adds, `writes` False, gets it zeroed)."""
        if id(param) in self.clean:
            self.clean.discard(id(param))
            if not writes:
                _settle_one(self.params[id(param)], self.stale)
            self.stale.discard(id(param))
            return True
        return False

    def settle(self) -> None:
        """Zero the stale gradients backward did not write (at the end of backward,
        before anything reads the gradients)."""
        for i in list(self.stale):
            _settle_one(self.params[i], self.stale)

    def reset(self) -> None:
        """Before a forward: clear the counts."""
        self.routed = 0
        self.uses = {}
        self.plain = set()

    def _route(self, *params) -> None:
        self.routed += 1
        for p in params:
            if p is not None:
                self.uses[id(p)] = self.uses.get(id(p), 0) + 1

    def _note_plain(self, args, kwargs) -> None:
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor) and id(a) in self.ids:
                self.plain.add(id(a))
                self.other.add(id(a))
            elif isinstance(a, (list, tuple)):
                self._note_plain(a, {})

    def _ours(self, w) -> bool:
        return (isinstance(w, torch.Tensor) and id(w) in self.ids and w.requires_grad
                and (w.grad is not None or self.unbound) and torch.is_grad_enabled())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
            b = _arg(args, kwargs, 2, "bias")
            if self._ours(w) and (b is None or id(b) in self.ids):
                self._route(w, b)
                self.linear_weights.add(id(w))
                if b is not None:
                    self.routed_adds.add(id(b))
                return _LinearIntoGrad.apply(x, w, b, self)
        elif func is F.embedding:
            ids, w = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 1, "weight")
            pad = _arg(args, kwargs, 2, "padding_idx")
            plain = (_arg(args, kwargs, 3, "max_norm") is None
                     and not _arg(args, kwargs, 5, "scale_grad_by_freq", False)
                     and not _arg(args, kwargs, 6, "sparse", False))
            if plain and self._ours(w):
                if pad is not None and pad < 0:
                    pad += w.shape[0]
                self._route(w)
                self.routed_adds.add(id(w))
                return _EmbeddingIntoGrad.apply(ids, w, pad, self)
        self._note_plain(args, kwargs)
        return func(*args, **kwargs)
