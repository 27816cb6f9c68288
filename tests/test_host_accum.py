"""The host accumulation kernel (real/host_accum.py). That the engine and the rate probe
run the same call on the same dtypes (issue 25: the probe timed a same-dtype add while the
engine ran a mixed-dtype one, 8x slower on a Zen 4 EPYC) is tests/test_kernel_identity.py."""

import pytest
import torch
from hypothesis import given, strategies as st

from zfbench.real import host_accum


@given(n=st.integers(1, 3000), chunk=st.integers(1, 700),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
       alpha=st.sampled_from([1.0, 0.25, 1 / 3]))
def test_accumulate_equals_one_add_whatever_the_chunks(n, chunk, dtype, alpha):
    gen = torch.Generator().manual_seed(n)
    window = torch.randn(n, generator=gen)
    grads = torch.randn(n, generator=gen).to(dtype)
    want = window.clone().add_(grads.float(), alpha=alpha)
    got = host_accum.accumulate_(window, grads, alpha, chunk_elems=chunk)
    assert got is window and torch.equal(window, want)


def test_shapes_that_differ_are_refused():
    with pytest.raises(ValueError, match="differ in shape"):
        host_accum.accumulate_(torch.zeros(4), torch.zeros(5))
