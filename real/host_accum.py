"""The host lane's gradient accumulation with torch's ops: `window += alpha * grads`.

ZenFlow accumulates each step's unselected gradients into an fp32 window on the host
(real/zenflow.py) through `zfbench.real.kernels.accumulate_` (real/host_fused.py), which
runs a one-pass C++ loop with this function's bits where its library builds and this
function where not; `zfbench.real.rate_probe` times the same call for the simulator.
With 16-bit weights the gradients land in their own dtype (the d2h wire), and torch's
in-place add of a bf16 tensor into an fp32 one takes a slow, unvectorized path on some
CPUs: on a 2-core AMD EPYC (Zen 4, torch 2.13 CPU build) 50M elements took 0.25 s mixed
against 0.027 s same-dtype, one thread (issue 25 measured 8x on 175M). `accumulate_`
therefore converts mixed-dtype input chunk by chunk into a small fp32 scratch buffer
that stays in cache, then adds same-dtype (0.039 s on that machine); same-dtype input is
one `add_`. A chunk is CHUNK_ELEMS per thread of the calling thread's torch pool: torch
splits each op over its threads, so a chunk of one fixed size leaves every thread a
smaller share as threads grow, and the per-chunk Python and thread-sync costs dominate
(an H200 machine's 8 host threads accumulated at 2.9 G elements/s in a run, slower than
its host AdamW at 3.2 G parameters/s; alone, 256M elements: 4.85 G/s with one fixed
chunk, 8.04 G/s per-thread, bench/results/gpu/NVIDIA-H200/). bench/kernels.py measures
both paths side by side on the machine at hand.
"""

from __future__ import annotations

import torch

# elements converted per chunk and thread: 1 MiB of fp32 each, within a core's L2 on
# current x86 and Arm server cores (judgment; on a 2-core Zen 4 EPYC, 128M elements at
# 2 threads: 2.5, 3.8, 4.0 and 2.3 G elements/s at 64K, 256K, 1M and 4M per thread;
# bench/kernels.py times it beside the mixed-dtype add_)
CHUNK_ELEMS = 1 << 18


def chunk_elems_here() -> int:
    """The default chunk for the calling thread: CHUNK_ELEMS per thread of its torch pool
    (the host lane's worker sets its own)."""
    return CHUNK_ELEMS * max(1, torch.get_num_threads())


def accumulate_(window: torch.Tensor, grads: torch.Tensor, alpha: float = 1.0,
                chunk_elems: int | None = None, fresh: bool = False) -> torch.Tensor:
    """`window += alpha * grads` in place (1-D, same length); returns `window`.
    `chunk_elems` (default CHUNK_ELEMS per thread of this thread's torch pool) bounds
    the fp32 scratch of mixed-dtype input. With `fresh` (a window's first accumulation)
    the window is zeroed first, chunk by chunk where the input is converted: the result
    does not depend on what the window held (NaN included)."""
    if window.shape != grads.shape:
        raise ValueError(f"window {tuple(window.shape)} and gradients "
                         f"{tuple(grads.shape)} differ in shape")
    if grads.dtype == window.dtype:
        if fresh:
            window.zero_()
        return window.add_(grads, alpha=alpha)
    if chunk_elems is None:
        chunk_elems = chunk_elems_here()
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    n = window.numel()
    scratch = torch.empty(min(n, chunk_elems), dtype=window.dtype, device=window.device)
    for lo in range(0, n, chunk_elems):
        hi = min(n, lo + chunk_elems)
        part = scratch[:hi - lo]
        part.copy_(grads[lo:hi])
        if fresh:
            window[lo:hi].zero_()
        window[lo:hi].add_(part, alpha=alpha)
    return window
