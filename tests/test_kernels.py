"""The engine's element-wise kernels (zfbench.real.kernels) give the reference computation's
bits: a kernel made faster for a slow path on some CPU must not change a result."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from zfbench.real import kernels


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 100),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       scale=st.sampled_from([1e-6, 1e-2, 10.0]))
def test_grad_norm_through_a_scratch_is_torchs_fp32_norm(n, seed, dtype, scale):
    gen = torch.Generator().manual_seed(seed)
    grad = (torch.randn(n, generator=gen) * scale).to(dtype)
    want = torch.linalg.vector_norm(grad, dtype=torch.float32)
    scratch = torch.full((n,), float("nan"))
    assert torch.equal(kernels.grad_norm(grad, scratch), want)
    assert torch.equal(kernels.grad_norm(grad), want)
    assert kernels.grad_norm(grad).dtype == torch.float32


def test_grad_norm_on_a_large_16bit_buffer_with_two_threads():
    """Past one thread's grain: torch's reduction splits the work; the bits still agree."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        grad = (torch.randn(1 << 20, generator=torch.Generator().manual_seed(3))
                * 1e-3).to(torch.bfloat16)
        want = torch.linalg.vector_norm(grad, dtype=torch.float32)
        assert torch.equal(kernels.grad_norm(grad, torch.empty(1 << 20)), want)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("importance", ["l1", "l2sq"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_column_scores_and_the_top_columns(importance, dtype):
    grad = torch.tensor([[1.0, -3.0, 0.5], [-2.0, 1.0, 0.5]]).to(dtype)
    scores = kernels.column_scores(grad, importance)
    want = [3.0, 4.0, 1.0] if importance == "l1" else [5.0, 10.0, 0.5]
    assert scores.dtype == torch.float32 and scores.tolist() == want
    assert kernels.top_columns(scores, 2).tolist() == [0, 1]
