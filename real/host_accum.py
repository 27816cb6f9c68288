"""The host lane's gradient accumulation: `window += alpha * grads`, as fast on every CPU.

ZenFlow accumulates each step's unselected gradients into an fp32 window on the host
(real/zenflow.py) and `zfbench.real.rate_probe` times the same call for the simulator.
With 16-bit weights the gradients land in their own dtype (the d2h wire), and torch's
in-place add of a bf16 tensor into an fp32 one takes a slow, unvectorized path on some
CPUs: on a 2-core AMD EPYC (Zen 4, torch 2.13 CPU build) 50M elements took 0.25 s mixed
against 0.027 s same-dtype, one thread (issue 25 measured 8x on 175M). `accumulate_`
therefore converts mixed-dtype input chunk by chunk into a small fp32 scratch buffer
that stays in cache, then adds same-dtype (0.039 s on that machine); same-dtype input is
one `add_`. bench/kernels.py measures both paths side by side on the machine at hand.
"""

from __future__ import annotations

import torch

# elements converted per chunk: 1 MiB of fp32, within a core's L2 on current x86 and
# Arm server cores (judgment; bench/kernels.py times it beside the mixed-dtype add_)
CHUNK_ELEMS = 1 << 18


def accumulate_(window: torch.Tensor, grads: torch.Tensor, alpha: float = 1.0,
                chunk_elems: int = CHUNK_ELEMS) -> torch.Tensor:
    """`window += alpha * grads` in place (1-D, same length); returns `window`."""
    if window.shape != grads.shape:
        raise ValueError(f"window {tuple(window.shape)} and gradients "
                         f"{tuple(grads.shape)} differ in shape")
    if grads.dtype == window.dtype:
        return window.add_(grads, alpha=alpha)
    n = window.numel()
    scratch = torch.empty(min(n, chunk_elems), dtype=window.dtype, device=window.device)
    for lo in range(0, n, chunk_elems):
        hi = min(n, lo + chunk_elems)
        part = scratch[:hi - lo]
        part.copy_(grads[lo:hi])
        window[lo:hi].add_(part, alpha=alpha)
    return window
