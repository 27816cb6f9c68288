"""Device-side AdamW on lists of tensors with explicit per-tensor step numbers.

The device optimizer of every strategy (the whole model for `device`, the selected
columns and 1-D parameters for `zenflow`) is torch.optim.AdamW's math with decoupled
weight decay, written on torch's foreach ops so one call updates many tensors; the step
number is passed in, since ZenFlow counts steps its own way (zenflow.md).
"""

from __future__ import annotations

import math

import torch


def adamw_foreach_(params: list[torch.Tensor], grads: list[torch.Tensor],
                   exp_avgs: list[torch.Tensor], exp_avg_sqs: list[torch.Tensor],
                   steps: list[int], *, lr: float, beta1: float, beta2: float, eps: float,
                   weight_decay: float, scratch: list[torch.Tensor] | None = None) -> None:
    """In place: p *= 1 - lr*wd; m, v updated; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).

    `scratch` (tensors shaped like `exp_avg_sqs`) is reused for the denominators, so a hot
    loop allocates nothing (fresh large CPU tensors page-fault on every step)."""
    if not params:
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
