"""AdamW over a list of fp32 tensors in one parallel region (issue 45), and its check.

ZenFlow's device update on the CPU lanes hands torch._fused_adamw_ about 2000 small
tensors a step (per-column views of the weights, 1-D parameters, a few [k, rows] copies),
and torch's CPU kernel opens a parallel region per tensor: 24-26 ms a call for 5.4 M
elements where one tensor of that size takes about 12 ms (2-core Xeon, issue 45). The C++
loop (real/host_fused.cpp `zf_adamw_segments`) splits the list's total element count over
the threads once, each thread walking the segments its range covers, with the arithmetic
of `zf_adamw` (`adamw_span`): torch's bits. Each segment's last n % TAIL elements go to
torch in one batched call, as `host_fused._cpp_adamw` hands them to it.

This module owns torch's fused call as every fused path makes it (`torch_fused_adamw_`,
any device, per-tensor step numbers), the reference (`torch_adamw_segments_`), the C++ call
(`cpp_adamw_segments_`, given the loaded library) and the self-check that rejects a library
whose segments path differs in any bit (`check_segments`); real/host_fused.py's
`adamw_segments_` chooses between them.
"""

from __future__ import annotations

from array import array

import torch
from torch import Tensor

__all__ = ["check_segments", "cpp_adamw_segments_", "step_tensor", "torch_adamw_segments_",
           "torch_fused_adamw_"]


def step_tensor(step: int, device: torch.device) -> Tensor:
    """The fused kernel's step count: on the CPU a plain tensor, on CUDA filled there (a
    fill kernel: a copy from pageable host memory would wait for the stream)."""
    if device.type == "cpu":
        return torch.tensor(float(step))
    return torch.full((), float(step), dtype=torch.float32, device=device)


def torch_fused_adamw_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                       exp_avg_sqs: list[Tensor], steps: list[int], lr: float, beta1: float,
                       beta2: float, eps: float, wd: float, grad_divisor: float = 1.0) -> None:
    """torch._fused_adamw_ with each tensor's own step number (one step tensor per distinct
    number, on the tensors' device: the kernel only reads them, and ZenFlow's lists hold
    thousands of tensors of one step), the gradients divided by `grad_divisor` (its
    `grad_scale`, which on the CPU stores the quotient into them)."""
    if not params:
        return
    counts = {s: step_tensor(s, params[0].device) for s in set(steps)}
    torch._fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [], [counts[s] for s in steps],
                        lr=lr, beta1=beta1, beta2=beta2, weight_decay=wd, eps=eps,
                        amsgrad=False, maximize=False,
                        grad_scale=(None if grad_divisor == 1.0
                                    else torch.tensor(float(grad_divisor))))


def torch_adamw_segments_(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                          exp_avg_sqs: list[Tensor], step: int, lr: float, beta1: float,
                          beta2: float, eps: float, wd: float,
                          grad_divisor: float = 1.0) -> None:
    """The reference: `torch_fused_adamw_` with one step number for every tensor."""
    torch_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, [step] * len(params), lr,
                       beta1, beta2, eps, wd, grad_divisor)


def cpp_adamw_segments_(lib, params: list[Tensor], grads: list[Tensor],
                        exp_avgs: list[Tensor], exp_avg_sqs: list[Tensor], step: int,
                        lr: float, beta1: float, beta2: float, eps: float, wd: float,
                        grad_divisor: float, threads: int, serial_below: int,
                        tail: int) -> None:
    """`torch_adamw_segments_`'s bits: each tensor's first n - n % `tail` elements in the
    C++ loop (one parallel region of `threads` over them all, serial under `serial_below`
    elements in all), the rest in one torch call. Every tensor contiguous fp32 on the CPU,
    each quadruple of one element count (ValueError otherwise: the loop would write past
    a tensor)."""
    # the pointer table is this call's cost in Python: 2.6 ms for 2063 tensors (data_ptr
    # 1.4 of them), beside 4.4 ms of C++ on two threads (bench/adamw_segments.py's list)
    numel, data_ptr = Tensor.numel, Tensor.data_ptr  # map(): faster than a comprehension
    lens = list(map(numel, params))
    for group in (grads, exp_avgs, exp_avg_sqs):
        if len(group) != len(params) or list(map(numel, group)) != lens:
            raise ValueError("adamw segments: grads, exp_avgs and exp_avg_sqs must match "
                             "params one for one, in element count")
    bodies = [n - n % tail for n in lens]
    ptrs = array("q")
    for group in (params, grads, exp_avgs, exp_avg_sqs):
        ptrs.extend(map(data_ptr, group))
    sizes = array("q", bodies)
    if sum(bodies):
        lib.zf_adamw_segments(ptrs.buffer_info()[0], sizes.buffer_info()[0], len(params),
                              float(step), float(lr), float(beta1), float(beta2),
                              float(eps), float(wd), float(grad_divisor), int(threads),
                              int(serial_below))
    rest = [k for k, (n, b) in enumerate(zip(lens, bodies)) if n > b]
    if rest:
        views = [[group[k].reshape(-1)[bodies[k]:] for k in rest]
                 for group in (params, grads, exp_avgs, exp_avg_sqs)]
        torch_adamw_segments_(*views, step, lr, beta1, beta2, eps, wd, grad_divisor)


def _same_bits(a: Tensor, b: Tensor) -> bool:
    """Every bit equal (no NaN in these inputs)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def check_segments(lib, threads: int, serial_below: int, tail: int) -> str | None:
    """None when the segments path gives `torch_adamw_segments_`'s bits on a list past the
    threading threshold (segment lengths multiples of `tail` and not, 1 to several
    thousand elements, views into one buffer with gaps, as the weights' columns are), for
    weight decay on and off, both lerp branches and divisors 1, 4 and 3 (the quotient
    checked in the gradients too); else what differed."""
    lens = [serial_below // 2 + 37, 16, 5, 1024, 31, 4096 + 3, 1, 160, serial_below // 4,
            17, 2 * tail, 640]
    gap = 48
    total = sum(lens) + gap * len(lens)
    gen = torch.Generator().manual_seed(4545)
    base = [torch.randn(total, generator=gen), torch.randn(total, generator=gen) * 1e-2,
            torch.randn(total, generator=gen) * 1e-3, torch.rand(total, generator=gen) * 1e-5]
    base[1][::97] = 0.0
    base[0][::89] *= 1e4
    want, got = [b.clone() for b in base], [b.clone() for b in base]
    starts = [sum(lens[:k]) + gap * k for k in range(len(lens))]

    def views(bufs):
        return [[b[s:s + n] for s, n in zip(starts, lens)] for b in bufs]

    cases = [(3, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0), (3, 1e-3, 0.9, 0.999, 1e-8, 0.0, 4.0),
             (1, 1e-2, 0.3, 0.95, 1e-6, 0.0, 1.0), (1, 1e-2, 0.3, 0.95, 1e-6, 0.01, 3.0)]
    for hyper in cases:
        for bufs in (want, got):
            for dst, src in zip(bufs, base):
                dst.copy_(src)
        torch_adamw_segments_(*views(want), *hyper)
        cpp_adamw_segments_(lib, *views(got), *hyper, threads, serial_below, tail)
        if not all(_same_bits(a, b) for a, b in zip(want, got)):
            return f"AdamW segments bits differ from torch's ({hyper})"
    return None
