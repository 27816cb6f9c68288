"""The engine's element-wise kernels, one named function each, shared by the engine, the
calibration probe and the kernel bench.

The strategies (real/strategies.py, real/zenflow.py) and the engine call every hot
element-wise kernel through this module's attributes (`kernels.copy_(...)`), and so do
the calibration measurements (real/rate_probe.py, real/profile.py) and bench/kernels.py,
so the probe times the very function the engine runs (tests/test_kernel_identity.py
replaces each attribute with a counting wrapper and runs both). The kernels and their lanes:

- `host_adamw_` (real/host_fused.py), every offloading strategy's host chunk: AdamW over
  fp32 master chunks and the new parameters rounded into the 16-bit h2d wire, in one
  pass; `accumulate_` (real/host_fused.py): ZenFlow's `window += alpha * grads` into
  fp32, a window's first writing it (`fresh`: nothing zeroes it); both host lane;
- `adamw_foreach_` (real/adamw.py): device AdamW, `device` and `zenflow`; compute lane;
- `copy_`: a dtype-converting copy (the d2h wire into fp32 on the host lane; the device
  strategy's fp32 gradient and master write-back and the applied upload on the compute lane;
  the CPU lanes' link copies, real/backend.py `CpuLanes`); `copy_checked_`: the CPU lanes'
  fp32 d2h of the gradients with the non-finite check in the same pass (real/engine.py);
  `zero_`: the gradients zeroed after each step (compute lane);
- `sum_of_squares` (real/host_fused.py): the host lane's clipping norm, squared, one read;
- `grad_norm` (the `device` strategy's clipping; compute lane), `all_finite`
  (the non-finite check), `column_scores`, `top_columns`, `gather_grads_`, `scatter_`
  (ZenFlow's selection and its per-step gather and write-back; compute lane).
"""

from __future__ import annotations

import torch

from zfbench.real.adamw import adamw_foreach_
from zfbench.real.flat import put_columns, take_columns
from zfbench.real.host_fused import (accumulate_, convert_, copy_checked_, host_adamw_,
                                     sum_of_squares, zero_)

__all__ = ["accumulate_", "adamw_foreach_", "all_finite", "column_scores", "copy_",
           "copy_checked_", "gather_grads_", "grad_norm", "host_adamw_", "scatter_",
           "sum_of_squares", "top_columns", "zero_"]


def copy_(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """`dst[:] = src`, converting to `dst`'s dtype; returns `dst`. Between fp32 and bf16 or
    fp16 on the CPU, contiguous and of one shape, real/host_fused.py's one-pass loop (the
    bits of torch's copy_, which it measured at 0.63-0.67 of the bandwidth on 2 cores), and
    fp32 into fp32 (plain stores, streamed into a buffer larger than the last-level
    cache: real/host_fused.py `words_stream_above`); anything else torch's `copy_`."""
    return convert_(dst, src)


def grad_norm(grad: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """The L2 norm of `grad` as a 0-d fp32 tensor, accumulated in fp32 whatever its dtype.

    For 16-bit `grad` torch's `vector_norm(dtype=float32)` converts the whole buffer into a
    fresh fp32 tensor first, which page-faults on every call: 16M bf16 elements took
    0.036 s against 0.0024 s for fp32 ones on a 2-core AMD EPYC (Zen 4, torch 2.13 CPU;
    bench/kernels.py). Given an fp32 `scratch` of `grad`'s size (one the caller keeps),
    the conversion goes there instead: the same conversion and the same norm, so the same
    bits (tests/test_kernels.py)."""
    if scratch is not None and grad.dtype != torch.float32:
        return torch.linalg.vector_norm(scratch.view(grad.shape).copy_(grad))
    return torch.linalg.vector_norm(grad, dtype=torch.float32)


def all_finite(grad: torch.Tensor) -> torch.Tensor:
    """Whether the sum of `grad` is finite, as a 0-d bool tensor on `grad`'s device (read
    it when convenient: on a GPU reading it waits for the device): one summing pass in the
    gradients' own dtype (torch accumulates bf16/fp16 sums in fp32; a NaN or inf makes
    the sum non-finite; measured 15x faster than isfinite or max-abs on CPU). A sum may
    overflow without a non-finite element: the caller checks element-wise only then."""
    return torch.isfinite(grad.sum())


def column_scores(grad: torch.Tensor, importance: str = "l1") -> torch.Tensor:
    """ZenFlow's per-column importance of a 2-D gradient, in fp32: sum over rows of |g|
    (`l1`) or of g^2 (`l2sq`)."""
    g = grad.float()
    if importance == "l2sq":
        return g.pow(2).sum(0)
    return g.abs().sum(0)


def top_columns(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k highest scores, ascending."""
    return torch.topk(scores, k, sorted=False).indices.sort().values


def gather_grads_(grad: torch.Tensor, idx: torch.Tensor, out: torch.Tensor,
                  low: torch.Tensor | None = None) -> torch.Tensor:
    """The columns `idx` of the 2-D gradient `grad` into the fp32 `out` (shaped as
    `flat.selected_shape`); `low`, in `grad`'s dtype, stages them when it is not fp32.
    Returns `out`."""
    if low is None:
        return take_columns(grad, idx, out=out)
    return out.copy_(take_columns(grad, idx, out=low))


def scatter_(weight: torch.Tensor, idx: torch.Tensor, values: torch.Tensor,
             low: torch.Tensor | None = None) -> None:
    """The fp32 `values` into the columns `idx` of the 2-D `weight`, rounded through
    `low` (in the weight's dtype) when the weight is not fp32."""
    put_columns(weight, idx, values if low is None else low.copy_(values))
