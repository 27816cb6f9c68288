"""The host accumulation kernel (real/host_accum.py) and that the engine and the rate
probe run the same call on the same dtypes (issue 25: the probe timed a same-dtype add
while the engine ran a mixed-dtype one, 8x slower on a Zen 4 EPYC)."""

import pytest
import torch
from hypothesis import given, strategies as st

from zfbench.real import host_accum
from engine_helpers import BiasMLP, batches, config, make_engine, train_steps


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


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_rate_probe_times_the_engines_own_accumulation(monkeypatch, precision):
    """Both go through host_accum.accumulate_, with the same (window, gradients) dtypes."""
    from zfbench.real.rate_probe import RateProbe

    calls = {"engine": set(), "probe": set()}
    who = ["engine"]
    real_fn = host_accum.accumulate_

    def recording(window, grads, alpha=1.0, **kw):
        calls[who[0]].add((window.dtype, grads.dtype))
        return real_fn(window, grads, alpha, **kw)
    monkeypatch.setattr(host_accum, "accumulate_", recording)
    cfg = config("zenflow", topk_ratio=0.25, update_interval=2)
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine = make_engine(BiasMLP(), cfg)
    train_steps(engine, batches(), 3)
    engine.finish()
    dtype = engine.flat_params.dtype
    engine.close()
    who[0] = "probe"
    RateProbe(4096, dtype, host_threads=1).measure(repeats=1)
    assert calls["engine"] == calls["probe"] == {(torch.float32, dtype)}
