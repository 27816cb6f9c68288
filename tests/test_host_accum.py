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


def test_the_default_chunk_gives_every_thread_of_the_pool_its_share():
    import threading

    seen = {}

    def worker(threads):
        torch.set_num_threads(threads)  # per thread, as the host lane's worker sets it
        seen[threads] = host_accum.chunk_elems_here()

    for threads in (1, 3):
        t = threading.Thread(target=worker, args=(threads,))
        t.start()
        t.join()
    assert seen == {1: host_accum.CHUNK_ELEMS, 3: 3 * host_accum.CHUNK_ELEMS}


def test_default_chunks_add_the_same_as_one_add(monkeypatch):
    monkeypatch.setattr(host_accum, "CHUNK_ELEMS", 5)  # many chunks over 1001 elements
    window = torch.randn(1001)
    grads = torch.randn(1001).to(torch.bfloat16)
    want = window.clone().add_(grads.float(), alpha=0.5)
    host_accum.accumulate_(window, grads, 0.5)
    assert torch.equal(window, want)
    with pytest.raises(ValueError, match="chunk_elems"):
        host_accum.accumulate_(window, grads, chunk_elems=0)
