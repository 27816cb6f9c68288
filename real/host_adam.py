"""Host AdamW on flat fp32 buffers: the CPU optimizer step of the `host` lane.

This module owns one thing: applying torch.optim.AdamW's math (decoupled weight decay)
with torch's ops in place to 1-D contiguous float32 CPU tensors -- typically views into the big flat
parameter / gradient / moment buffers an offloading engine keeps on the host -- as fast
as torch allows, without ever changing the global thread count (the caller may run it
from a worker thread that set its own `torch.set_num_threads`).

Math, with the caller's global step number `step` (t + 1 for the t-th update, never an
internal counter):

    p *= 1 - lr * wd
    m  = b1 * m + (1 - b1) * g
    v  = b2 * v + (1 - b2) * g * g
    p -= lr / (1 - b1**step) * m / (sqrt(v) / sqrt(1 - b2**step) + eps)

The engine's host chunk calls it through `zfbench.real.kernels.host_adamw_`
(real/host_fused.py), which does the `auto` method's arithmetic, bit for bit, in one
C++ pass that also writes the upload wire and zeroes the window, or calls this function
where that library does not build. The methods (`METHODS`: fused, foreach, inplace,
reference, auto) and the measurements that make `auto` = `fused` are beside `METHODS`.
"""

from __future__ import annotations

import threading

import torch
from torch import Tensor

__all__ = [
    "AUTO_METHOD",
    "DEFAULT_CHUNK_ELEMS",
    "FOREACH_WINDOW_CHUNKS",
    "HostAdamW",
    "METHODS",
    "adamw_reference_",
    "host_adamw_",
    "resolve_method",
]

# Methods (all give torch.optim.AdamW's result to within a few float32 ulps):
#
# * ``fused``   -- torch's fused CPU AdamW kernel (``torch._fused_adamw_``, one vectorized
#   pass over p, g, m, v split across the intra-op threads); the step tensor is set to
#   ``step`` (the kernel does not increment it). ``chunk_elems`` splits it into a list
#   of chunks (measured slower: one parallel region per chunk).
# * ``foreach`` -- torch's foreach AdamW sequence (``torch._foreach_*``) on lists of
#   ``chunk_elems`` chunks, applied window by window (``FOREACH_WINDOW_CHUNKS`` chunks at a
#   time) so the window stays in cache across the seven passes (torch's own foreach math).
# * ``inplace`` -- plain in-place tensor ops on ``chunk_elems`` chunks with a preallocated,
#   per-thread scratch chunk for the denominator (no allocation in steady state).
# * ``reference`` -- ``adamw_reference_``: allocating, obviously correct, for tests.
# * ``auto``    -- ``AUTO_METHOD`` (falls back to ``inplace`` without the fused kernel).
#
# Measured (bench/host_adam.py -> bench/results/host_adam.json, host_adam_thp.json) on the
# 2-core AMD EPYC (Zen 4, KVM, shared: load average 2.6-9.6 from other work during the run),
# torch 2.13 CPU (AVX512), 2 threads; best of 2 rounds x 10 calls, 28 B per parameter:
#
#     numpy STREAM triad (fp64, 2 threads), best       37.6 GB/s (other runs 9-24 GB/s)
#     64M elements              THP=0 best           THP=1 best        medians (0 / 1)
#     fused                     2.02 G/s  56.5 GB/s  2.24 G/s 62.8 GB/s  15.5 / 15.6 GB/s
#     inplace, 1M chunks        0.57 G/s  15.8 GB/s  0.60 G/s 16.9 GB/s   1.7 /  1.1 GB/s
#     inplace, unchunked        0.44 G/s  12.2 GB/s  0.28 G/s  7.9 GB/s   5.0 /  4.8 GB/s
#     foreach, 1M chunks        0.63 G/s  17.7 GB/s  0.12 G/s  3.5 GB/s   1.1 /  1.0 GB/s
#     16M, quietest round: fused 2.01 G/s, inplace 1M 1.04 G/s, foreach 1M 1.03 G/s.
#     small buffers (per call): fused ~10 us at 1-1K elements, 28 us at 64K; inplace 30/95 us.
#
# ``fused`` makes one pass in one parallel region, which reaches 150-167 % of the triad
# figure (STREAM does not count the triad's write-allocate; Adam only rewrites lines it has
# just read). The op-by-op methods make six or seven passes and open a parallel region per
# op per chunk: from cache they reach at best half of ``fused``, and on an oversubscribed
# host every region waits for a descheduled thread, so their medians collapse (1-2 GB/s)
# while ``fused`` holds ~15 GB/s. Chunks of 256K-1M elements beat both 16-64K chunks and
# none in best-of; the foreach window (lists of 1 or 16 chunks) made no difference, and
# unchunked foreach allocates a full-size sqrt temporary per call. THP_MEM_ALLOC_ENABLE=1
# was 5-20 % ahead for ``fused`` in the alternating THP run (64M medians 22.6 vs 19.8 GB/s),
# well inside the 2x round-to-round spread: not a reliable gain here. Hence ``auto`` =
# ``fused`` at every size.
METHODS = ("auto", "fused", "foreach", "inplace", "reference")
AUTO_METHOD = "fused"
#: Chunk for the op-by-op methods: 1M fp32 = 4 MB per array, so p, g, m, v and the scratch
#: chunk (20 MB) stay in the 32 MB L3 across the passes; best measured (above).
DEFAULT_CHUNK_ELEMS = 1 << 20
#: foreach: chunks per list, i.e. the cache window the foreach op sequence runs over.
FOREACH_WINDOW_CHUNKS = 1

_HAS_FUSED = hasattr(torch, "_fused_adamw_")
_local = threading.local()


def resolve_method(method: str) -> str:
    """Map ``method`` (possibly "auto") to a concrete method name, validating it."""
    if method not in METHODS:
        raise ValueError(f"unknown host Adam method {method!r}; choose one of {METHODS}")
    if method == "auto":
        return AUTO_METHOD if (AUTO_METHOD != "fused" or _HAS_FUSED) else "inplace"
    if method == "fused" and not _HAS_FUSED:
        raise ValueError("method 'fused' needs torch._fused_adamw_ (torch >= 2.4)")
    return method


def _check(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, step: int) -> None:
    n = None
    named = (("param", param), ("grad", grad), ("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq))
    for name, t in named:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"host AdamW works on float32 buffers only; {name} is {t.dtype}")
        if t.device.type != "cpu":
            raise ValueError(f"host AdamW works on CPU tensors; {name} is on {t.device}")
        if t.dim() != 1 or not t.is_contiguous():
            raise ValueError(f"{name} must be a 1-D contiguous tensor, got shape {tuple(t.shape)}"
                             f" strides {t.stride()}")
        if n is None:
            n = t.numel()
        elif t.numel() != n:
            raise ValueError(f"{name} has {t.numel()} elements, param has {n}")
    if isinstance(step, bool) or int(step) != step or step < 1:
        raise ValueError(f"step must be an integer >= 1 (the global step number), got {step!r}")


def _scratch(n: int) -> Tensor:
    """A per-thread float32 scratch buffer of at least ``n`` elements, reused across calls
    (a fresh large CPU tensor costs page faults on every call)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.numel() < n:
        buf = torch.empty(n, dtype=torch.float32)
        _local.buf = buf
    return buf[:n]


def _bounds(n: int, chunk: int | None) -> list[tuple[int, int]]:
    if chunk is None or chunk >= n:
        return [(0, n)]
    if chunk < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk}")
    return [(i, min(i + chunk, n)) for i in range(0, n, chunk)]


def _fused(p, g, m, v, step, lr, b1, b2, eps, wd, chunk):
    step_t = torch.tensor(float(step), dtype=torch.float32)  # read, not incremented
    bounds = _bounds(p.numel(), chunk)
    ps = [p[a:b] for a, b in bounds] if len(bounds) > 1 else [p]
    gs = [g[a:b] for a, b in bounds] if len(bounds) > 1 else [g]
    ms = [m[a:b] for a, b in bounds] if len(bounds) > 1 else [m]
    vs = [v[a:b] for a, b in bounds] if len(bounds) > 1 else [v]
    torch._fused_adamw_(ps, gs, ms, vs, [], [step_t] * len(ps), lr=lr, beta1=b1, beta2=b2,
                        weight_decay=wd, eps=eps, amsgrad=False, maximize=False)


def _inplace(p, g, m, v, step, lr, b1, b2, eps, wd, chunk):
    bc1 = 1.0 - b1 ** step
    bc2_sqrt = (1.0 - b2 ** step) ** 0.5
    step_size = lr / bc1
    decay = 1.0 - lr * wd
    n = p.numel()
    chunk = DEFAULT_CHUNK_ELEMS if chunk is None else chunk
    s_all = _scratch(min(chunk, n))
    for a, b in _bounds(n, chunk):
        pc, gc, mc, vc, s = p[a:b], g[a:b], m[a:b], v[a:b], s_all[: b - a]
        if wd != 0.0:
            pc.mul_(decay)
        mc.lerp_(gc, 1.0 - b1)
        vc.mul_(b2).addcmul_(gc, gc, value=1.0 - b2)
        torch.sqrt(vc, out=s)
        s.div_(bc2_sqrt).add_(eps)
        pc.addcdiv_(mc, s, value=-step_size)


def _foreach(p, g, m, v, step, lr, b1, b2, eps, wd, chunk):
    bc1 = 1.0 - b1 ** step
    bc2_sqrt = (1.0 - b2 ** step) ** 0.5
    step_size = lr / bc1
    decay = 1.0 - lr * wd
    chunk = DEFAULT_CHUNK_ELEMS if chunk is None else chunk
    bounds = _bounds(p.numel(), chunk)
    for w in range(0, len(bounds), FOREACH_WINDOW_CHUNKS):
        win = bounds[w : w + FOREACH_WINDOW_CHUNKS]
        ps = [p[a:b] for a, b in win]
        gs = [g[a:b] for a, b in win]
        ms = [m[a:b] for a, b in win]
        vs = [v[a:b] for a, b in win]
        if wd != 0.0:
            torch._foreach_mul_(ps, decay)
        torch._foreach_lerp_(ms, gs, 1.0 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, 1.0 - b2)
        ds = torch._foreach_sqrt(vs)
        torch._foreach_div_(ds, bc2_sqrt)
        torch._foreach_add_(ds, eps)
        torch._foreach_addcdiv_(ps, ms, ds, -step_size)


def adamw_reference_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *,
                     step: int, lr: float, beta1: float, beta2: float, eps: float,
                     weight_decay: float) -> None:
    """Plain, allocating AdamW written straight from the formula (for tests)."""
    _check(param, grad, exp_avg, exp_avg_sq, step)
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    param.mul_(1.0 - lr * weight_decay)
    exp_avg.copy_(beta1 * exp_avg + (1.0 - beta1) * grad)
    exp_avg_sq.copy_(beta2 * exp_avg_sq + (1.0 - beta2) * grad * grad)
    denom = exp_avg_sq.sqrt() / (bias_correction2 ** 0.5) + eps
    param.copy_(param - (lr / bias_correction1) * exp_avg / denom)


def host_adamw_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *,
                step: int, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float, method: str = "auto", chunk_elems: int | None = None) -> None:
    """One in-place AdamW update of ``param``, ``exp_avg``, ``exp_avg_sq`` (``grad`` is
    only read). All four are 1-D contiguous float32 CPU tensors of the same length (views
    into larger flat buffers are fine; nothing outside the view is touched). ``step`` is
    the global step number used for bias correction (1 for the first update).
    ``chunk_elems``: chunk length for the chunked methods (None: the method's default,
    whole tensor for ``fused``). Raises ValueError on a non-float32 tensor."""
    _check(param, grad, exp_avg, exp_avg_sq, step)
    if chunk_elems is not None and chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    m = resolve_method(method)
    step = int(step)
    args = (param, grad, exp_avg, exp_avg_sq, step, float(lr), float(beta1), float(beta2),
            float(eps), float(weight_decay), chunk_elems)
    if param.numel() == 0:
        return
    if m == "fused":
        _fused(*args)
    elif m == "inplace":
        _inplace(*args)
    elif m == "foreach":
        _foreach(*args)
    else:
        adamw_reference_(param, grad, exp_avg, exp_avg_sq, step=step, lr=lr, beta1=beta1,
                         beta2=beta2, eps=eps, weight_decay=weight_decay)


class HostAdamW:
    """AdamW hyper-parameters plus a method choice, applied to caller-owned flat buffers.

    ``step_(param, grad, exp_avg, exp_avg_sq, step)`` performs one update with the global
    step number ``step``; the optimizer keeps no per-parameter state of its own.
    """

    def __init__(self, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2, *, method: str = "auto",
                 chunk_elems: int | None = None) -> None:
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError(f"lr, eps and weight_decay must be >= 0, got {lr}, {eps}, "
                             f"{weight_decay}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        self.lr, self.betas = float(lr), (float(betas[0]), float(betas[1]))
        self.eps, self.weight_decay = float(eps), float(weight_decay)
        self.method = resolve_method(method)
        self.chunk_elems = chunk_elems

    def step_(self, param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
              step: int) -> None:
        b1, b2 = self.betas
        host_adamw_(param, grad, exp_avg, exp_avg_sq, step=step, lr=self.lr, beta1=b1,
                    beta2=b2, eps=self.eps, weight_decay=self.weight_decay,
                    method=self.method, chunk_elems=self.chunk_elems)

    def __repr__(self) -> str:
        return (f"HostAdamW(lr={self.lr}, betas={self.betas}, eps={self.eps}, "
                f"weight_decay={self.weight_decay}, method={self.method!r}, "
                f"chunk_elems={self.chunk_elems})")
