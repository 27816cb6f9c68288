"""Device-side AdamW on lists of tensors with explicit per-tensor step numbers.

The device optimizer of every strategy (the whole model for `device`, the selected
columns and 1-D parameters for `zenflow`) is torch.optim.AdamW's math with decoupled
weight decay, on torch's fused AdamW kernel when every tensor is fp32 and contiguous on
the CPU (the emulated device lane) or on one CUDA device, and on torch's foreach ops
otherwise, so one call updates many tensors (on the CPU, many tensors of one step number
in one parallel region with the fused kernel's bits: real/host_segments.py); the step
number is passed in, since ZenFlow counts steps its own way (zenflow.md).
"""

from __future__ import annotations

import math

import torch

from zfbench.real.flat import is_column_major
from zfbench.real.host_fused import TAIL, adamw_segments_, host_adamw_
from zfbench.real.host_segments import torch_fused_adamw_

#: from this many tensors (of one step number) on, and on more than one thread, the fused
#: CPU path is one parallel region over them all (real/host_segments.py), not
#: torch._fused_adamw_'s region per tensor. Its fixed cost (one ctypes call) is a few
#: microseconds, so two tensors already gain or tie (2-core Xeon-AMX, load 4.2, medians of
#: 15: 2 x 1024 elements 0.015 ms against torch's 0.021, 2 x 65536 0.070 against 0.065,
#: 2 x 1M 8.4 against 12.5); one tensor keeps torch's call. On one thread torch opens no
#: region and the segments loop only adds its pointer table (1.3 us a tensor in Python,
#: data_ptr and numel of four tensors): bench/adamw_segments.py's 2063 tensors, 5.4 M
#: elements, 12.4 ms against torch's 12.1 on one thread, 9.1 against 15.2 on two (one
#: tensor of that size: 4.5-4.7 ms; load 0.6, bench/results/adamw_segments/)
SEGMENTS_FROM = 2


def adamw_foreach_(params: list[torch.Tensor], grads: list[torch.Tensor],
                   exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                   steps: list[int], *, lr: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, scratch: list[torch.Tensor] | None = None,
                   zero_grads: bool = False, grad_divisor: float = 1.0,
                   fused: bool | None = None) -> None:
    """In place: p *= 1 - lr*wd; m, v updated; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).

    `scratch` (tensors shaped like `exp_avg_sqs`) is reused for the denominators, so a hot
    loop allocates nothing (fresh large CPU tensors page-fault on every step).
    `zero_grads`: the gradients are zeroed afterwards; on the fused CPU path with 1-D
    tensors in the same pass (real/host_fused.py `host_adamw_` with `zero_grad`: torch's
    fused AdamW's bits, then the zeros: 0.139 s against 0.137 + 0.045 s in two passes over
    110M elements on one thread, bench/results/reference_step_cpu/device_step_ops.csv).
    `grad_divisor`: the gradients are divided by it first, in place (ZenFlow's grad / U);
    on the fused CPU path inside the kernel's own pass (its `grad_scale`, which divides and
    stores the quotient: the same IEEE division, the same bits,
    tests/test_zenflow_columns_in_place.py), not in a pass of its own over the gradients.
    `fused`: whether torch's fused CPU kernel applies (`_fused_ok`), where the caller
    knows; None: every tensor is looked at (for ZenFlow's thousands of per-column views
    that look took 14 ms a step, more than the write-back the views save)."""
    if not params:
        return
    if fused is None:
        fused = _fused_ok(params, grads, exp_avgs, exp_avg_sqs)
    on_cpu = params[0].device.type == "cpu"
    if grad_divisor != 1.0 and (zero_grads or not fused or not on_cpu):
        # on CUDA too: the fused CPU kernel stores the quotient in the gradients, which
        # the callers rely on; the CUDA kernel is not relied on to do the same
        torch._foreach_div_(grads, grad_divisor)
        grad_divisor = 1.0
    if zero_grads and fused and on_cpu and all(
            t.dim() == 1 for t in params + grads + exp_avgs + exp_avg_sqs):
        for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, steps):
            host_adamw_(p, g, m, v, step=s, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                        weight_decay=weight_decay, zero_grad=True)
        return
    _adamw_foreach_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps,
                    weight_decay, scratch, grad_divisor, fused)
    if zero_grads:
        torch._foreach_zero_(grads)


def _adamw_foreach_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps,
                    weight_decay, scratch, grad_divisor=1.0, fused=True) -> None:
    if fused and len(params) >= SEGMENTS_FROM and params[0].device.type == "cpu" and (
            torch.get_num_threads() > 1 and len(set(steps)) == 1):
        # one parallel region over all the tensors, torch's bits (torch's own call where
        # the library is missing or rejected)
        adamw_segments_(params, grads, exp_avgs, exp_avg_sqs, step=steps[0], lr=lr,
                        beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                        grad_divisor=grad_divisor)
        return
    if fused:
        # torch's fused kernel: one pass per tensor, 3.6x the foreach ops on a CPU lane
        # (10.8M selected elements, one thread: 11.5 vs 41.9 ms); same math, rounding aside.
        # On one H200 the foreach ops' kernels took 29 ms a step for qwen2.5-1.5b's device
        # update where plain PyTorch's fused AdamW took 12.4 (bench/results/gpu/
        # NVIDIA-H200/2026-11-28, reference_step)
        torch_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2,
                           eps, weight_decay, grad_divisor)
        return
    if weight_decay:
        torch._foreach_mul_(params, 1 - lr * weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    if scratch is None:
        denoms = torch._foreach_sqrt(exp_avg_sqs)
    else:
        denoms = scratch
        torch._foreach_copy_(denoms, exp_avg_sqs)
        torch._foreach_sqrt_(denoms)
    torch._foreach_div_(denoms, [math.sqrt(1 - beta2 ** s) for s in steps])
    torch._foreach_add_(denoms, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denoms,
                            [-lr / (1 - beta1 ** s) for s in steps])


def columns_in_place_ok(weight: torch.Tensor) -> bool:
    """Whether AdamW on some columns of the 2-D `weight` may run on the weight's own
    columns, one tensor each, with the bits it has on a [k, rows] copy of them: torch's
    fused CPU kernel applies, the weight is stored column by column (each column is `rows`
    contiguous elements), and `rows` is a multiple of the kernel's vector width
    (real/host_fused.py `TAIL`): its remainder loop rounds `v` otherwise (seen at rows 7,
    12 and 33; tests/test_zenflow_columns_in_place.py)."""
    return (weight.dim() == 2 and weight.device.type == "cpu" and is_column_major(weight)
            and weight.shape[0] % TAIL == 0 and _fused_ok([weight.t()]))


def _fused_ok(*lists) -> bool:
    """torch's fused AdamW applies: present, and every tensor fp32 and contiguous, all on
    the CPU or all on one CUDA device."""
    devices = {t.device for tensors in lists for t in tensors}
    if not hasattr(torch, "_fused_adamw_") or len(devices) > 1:
        return False
    return all(d.type in ("cpu", "cuda") for d in devices) and all(
        t.dtype == torch.float32 and t.is_contiguous() for tensors in lists for t in tensors)


def fused_ok(tensors: list[torch.Tensor]) -> bool:
    """`_fused_ok` over one list: whether torch's fused kernel takes these tensors."""
    return _fused_ok(tensors)
