"""`zfbench.real.adamw.adamw_foreach_`: both its paths (torch's fused kernel, foreach ops) are AdamW."""

from __future__ import annotations

import pytest
import torch

from zfbench.real.adamw import _fused_ok, adamw_foreach_


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_matches_torch_adamw_over_steps(layout):
    """Contiguous fp32 tensors take the fused kernel, transposed views the foreach ops;
    each matches torch.optim.AdamW for 6 steps with its own step numbers."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(7, 5), (3, 11), (13,)]
    ref = [torch.randn(s, generator=gen) for s in shapes]
    ours = [r.clone() if layout == "contiguous" or r.dim() == 1
            else torch.empty(r.shape[::-1]).t().copy_(r) for r in ref]
    assert _fused_ok(ours) == (layout == "contiguous")
    params = [torch.nn.Parameter(r.clone()) for r in ref]
    opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    m = [torch.zeros_like(p) for p in ours]
    v = [torch.zeros_like(p) for p in ours]
    for step in range(1, 7):
        grads = [torch.randn(s, generator=gen) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        adamw_foreach_(ours, grads, m, v, [step] * 3, lr=1e-2, beta1=0.9, beta2=0.99,
                       eps=1e-8, weight_decay=0.1)
    for p, o in zip(params, ours):
        torch.testing.assert_close(o, p.detach(), rtol=1e-5, atol=1e-6)


def test_the_fused_kernel_takes_one_device_of_cpu_or_cuda():
    """fp32 contiguous tensors all on the CPU (or all on one CUDA device: tests/test_cuda.py)
    take the fused kernel; tensors on a device it has no kernel for, or spread over two
    devices, take the foreach ops."""
    cpu = [torch.zeros(4), torch.zeros(3)]
    meta = [torch.zeros(4, device="meta")]
    assert _fused_ok(cpu)
    assert not _fused_ok(meta)
    assert not _fused_ok(cpu, meta)
    assert not _fused_ok([torch.zeros(4, dtype=torch.bfloat16)])
