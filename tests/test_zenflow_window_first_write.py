"""ZenFlow's window is no longer zeroed (issue 45): a window's first accumulation writes
its buffer (`accumulate_(..., fresh=True)`) and the host AdamW pass leaves the window it
read as it is. Against the computation before (the AdamW pass zeroing the window chunk
it read, every accumulation adding into the buffer), bit for bit:

- the kernels: the C++ loop and the torch fallback against zeroing then `add_`, over
  sizes, dtypes, alphas and values with -0.0, NaN, inf and subnormals, whatever the
  window held before (NaN included);
- the engine: parameters, host master, moments and the saved checkpoint after runs with
  update_interval 1, 4 and auto, warm-up and reselections, overlap on and off, bf16
  weights, gradient accumulation, ZeRO-3, and a checkpoint saved mid-window and resumed.
Every host window holds the whole shard's gradient (real/zenflow.py), so no column of a
window goes unaccumulated; the selection decides only what the device keeps.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine_helpers import BiasMLP, batches, config, make_engine, train_steps
from zfbench.real import host_fused, kernels
from zfbench.real.host_accum import accumulate_ as torch_accumulate_
from zfbench.real.strategies import HostState

SERIAL = host_fused.SERIAL_BELOW
SPECIAL = [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 1e-40,
           -3e38, 65504.0]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t` (any dtype, any shape): equal bytes are equal bits."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def same(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Equal bits where `want` is a number, NaN where it is NaN (host_fused._same_bits)."""
    return host_fused._same_bits(want, got)


def values(n: int, seed: int, special: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    out = torch.randn(n, generator=gen) * 3
    if special and n:
        picks = torch.randint(0, len(SPECIAL), (n,), generator=gen)
        mask = torch.rand(n, generator=gen) < 0.4
        out = torch.where(mask, torch.tensor(SPECIAL)[picks], out)
    return out


def before(window: torch.Tensor, grads: torch.Tensor, alpha: float) -> torch.Tensor:
    """The computation before issue 45: the window zeroed, then `add_` (torch's bits)."""
    window.zero_()
    return torch_accumulate_(window, grads, alpha)


@settings(max_examples=80, deadline=None)
@given(n=st.one_of(st.integers(0, 100), st.integers(SERIAL - 20, SERIAL + 70)),
       offset=st.integers(0, 9), dtype=st.sampled_from([torch.float32, torch.bfloat16,
                                                        torch.float16]),
       alpha=st.sampled_from([1.0, 0.25, 1 / 3, -1.0, -2.5, 1e-30, 1e30]),
       seed=st.integers(0, 1000), special=st.booleans(), stale=st.sampled_from(
           ["nan", "values", "minus_zero"]))
def test_first_accumulation_equals_zeroing_then_adding(n, offset, dtype, alpha, seed,
                                                       special, stale):
    grads = values(n + offset, seed, special).to(dtype)[offset:]
    old = {"nan": torch.full((n + offset,), float("nan")),
           "values": values(n + offset, seed + 1, True),
           "minus_zero": torch.full((n + offset,), -0.0)}[stale][offset:]
    want = before(old.clone(), grads, alpha)
    got = host_fused.accumulate_(old.clone(), grads, alpha, fresh=True)
    assert same(want, got), (n, dtype, alpha)
    # the torch fallback, converted chunk by chunk for mixed dtypes
    for chunk in (None, 7):
        fallback = torch_accumulate_(old.clone(), grads, alpha, chunk, fresh=True)
        assert same(want, fallback), (n, dtype, alpha, chunk)
    lib = host_fused._library()
    if lib is not None:
        threads_before = torch.get_num_threads()
        try:
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for stream_above in (0, 1 << 62):  # non-temporal stores and plain ones
                    direct = host_fused._cpp_accumulate(lib, old.clone(), grads, alpha,
                                                        True, stream_above)
                    assert same(want, direct), (n, dtype, alpha, threads, stream_above)
        finally:
            torch.set_num_threads(threads_before)


def test_a_minus_zero_product_comes_out_plus_zero():
    """-0.0 x alpha added to a zeroed window is +0.0 (IEEE: -0 + +0 = +0), which a plain
    write of the product would have kept as -0.0; a product that underflows keeps its
    sign (the fma's exact sum is not zero), as before."""
    grads = torch.tensor([-0.0, 0.0, -1e-45, 1.0] * 11)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for alpha in (1.0, -1.0, 0.5):
            g = grads.to(dtype)
            got = host_fused.accumulate_(torch.full((44,), -7.0), g, alpha, fresh=True)
            want = before(torch.empty(44), g, alpha)
            assert torch.equal(bits(got), bits(want))
            assert not bool(torch.signbit(got[g.float() == 0]).any())


def test_a_first_accumulation_past_the_cache_streams(monkeypatch):
    """Streamed stores from the first element where the window written and the gradients
    read pass the last-level cache; never below it or where no cache size is known."""
    window = torch.zeros(1000)
    monkeypatch.setattr(host_fused, "_llc", [1000 * 6 - 1])
    assert host_fused.fresh_stream_above(window, torch.zeros(1000).bfloat16()) == 0
    assert host_fused.fresh_stream_above(window, torch.zeros(1000)) == 0
    monkeypatch.setattr(host_fused, "_llc", [1000 * 6])
    assert host_fused.fresh_stream_above(window, torch.zeros(1000).bfloat16()) \
        == host_fused.WORDS_STREAM_ABOVE
    monkeypatch.setattr(host_fused, "_llc", [None])
    assert host_fused.fresh_stream_above(window, torch.zeros(1000)) \
        == host_fused.WORDS_STREAM_ABOVE


# -- the engine, against its computation before ------------------------------------------
def _old_engine(monkeypatch) -> None:
    """The engine as before issue 45: every accumulation adds, and the host AdamW pass
    zeroes the window chunk it read (the two window buffers; not the warm-up's staging)."""
    accumulate = kernels.accumulate_
    monkeypatch.setattr(kernels, "accumulate_",
                        lambda window, grads, alpha=1.0, chunk_elems=None, fresh=False:
                        accumulate(window, grads, alpha, chunk_elems))
    adam_chunk = HostState.adam_chunk

    def zeroing_chunk(self, a, b, grad, step, opt, wire=None):
        adam_chunk(self, a, b, grad, step, opt, wire)
        if len(self.grads) == 3 and any(grad is g for g in self.grads[:2]):
            grad[a:b].zero_()
    monkeypatch.setattr(HostState, "adam_chunk", zeroing_chunk)


CASES = {
    "U1": dict(topk_ratio=0.25, update_interval=1, select_strategy="step",
               select_interval=5),
    "U4_reselect": dict(topk_ratio=0.2, update_interval=4, select_strategy="step",
                        select_interval=6, full_warm_up_rounds=2),
    "auto": dict(topk_ratio=0.25, update_interval="auto", select_strategy="step",
                 select_interval=0, auto_ratio=0.5),
}


def _state(engine) -> dict:
    """What the host holds once its jobs are done (the last accumulation runs on the
    host lane after `step()` returns)."""
    s = engine.strategy
    engine.host_lane.wait(s.accum_job, engine.host_timeout_s)
    host = s.host
    return {"params": [p.detach().clone() for _, p in engine.named_params],
            "master": host.master.clone(), "m": host.m.clone(), "v": host.v.clone(),
            "window": host.grads[s.parity].clone() if s.window_len else None}


def _flat(tree, prefix=""):
    """(path, tensor or value) leaves of a nested checkpoint dict, in a stable order."""
    if isinstance(tree, dict):
        for k in sorted(tree, key=str):
            yield from _flat(tree[k], f"{prefix}/{k}")
    elif isinstance(tree, (list, tuple)):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}/{i}")
    else:
        yield prefix, tree


def _run(case: str, overlap: bool, bf16: bool, accum: int, steps: int, tmp=None,
         resume_at: int | None = None, stage: int = 2):
    cfg = config("zenflow", lr=1e-2, clip=0.5, **dict(CASES[case], overlap_step=overlap))
    cfg["zero_optimization"]["stage"] = stage
    if bf16:
        cfg["bf16"] = {"enabled": True}
    if accum > 1:
        cfg["gradient_accumulation_steps"] = accum
    data = batches()
    engine = make_engine(BiasMLP(), cfg)
    saved = None
    if resume_at is not None:
        train_steps(engine, data, resume_at * accum)
        engine.save_checkpoint(tmp, tag="mid")
        saved = torch.load(tmp / "mid" / engine.checkpoint_name, weights_only=False)
        engine.close()
        engine = make_engine(BiasMLP(seed=3), cfg)
        engine.load_checkpoint(tmp, tag="mid")
        train_steps(engine, data, (steps - resume_at) * accum)
    else:
        train_steps(engine, data, steps * accum)
    engine.finish()
    out = _state(engine)
    engine.close()
    return out, saved


@pytest.mark.parametrize("case,overlap,bf16,accum,stage", [
    ("U1", False, False, 1, 2), ("U1", True, True, 1, 2), ("U4_reselect", True, False, 1, 2),
    ("U4_reselect", False, True, 2, 2), ("auto", True, False, 1, 2),
    ("auto", False, True, 1, 2), ("U4_reselect", True, True, 1, 3)])
def test_engine_equals_its_computation_before(monkeypatch, case, overlap, bf16, accum,
                                              stage):
    new, _ = _run(case, overlap, bf16, accum, 15, stage=stage)
    with monkeypatch.context() as m:
        _old_engine(m)
        old, _ = _run(case, overlap, bf16, accum, 15, stage=stage)
    for key in new:
        for a, b in zip(_flat(old[key]), _flat(new[key])):
            assert a[0] == b[0]
            if isinstance(a[1], torch.Tensor):
                assert torch.equal(bits(a[1]), bits(b[1])), (case, key, a[0])


@pytest.mark.parametrize("case,resume_at", [("U4_reselect", 9), ("U4_reselect", 7),
                                            ("auto", 8)])
def test_a_checkpoint_mid_window_saves_and_resumes_as_before(monkeypatch, tmp_path, case,
                                                              resume_at):
    """Saved mid-window (U 4, warm-up 2: windows end at t = 5, 9, 13; t = 9 is also
    after a reselection) and right after a window's end: the checkpoint's tensors, and
    the run resumed from it, equal the computation before in every bit."""
    new, new_saved = _run(case, True, False, 1, 16, tmp_path / "new", resume_at)
    with monkeypatch.context() as m:
        _old_engine(m)
        old, old_saved = _run(case, True, False, 1, 16, tmp_path / "old", resume_at)
    leaves_old, leaves_new = list(_flat(old_saved)), list(_flat(new_saved))
    assert [k for k, _ in leaves_old] == [k for k, _ in leaves_new]
    for (k, a), (_, b) in zip(leaves_old, leaves_new):
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(bits(a.contiguous().view(-1)),
                                                      bits(b.contiguous().view(-1))), k
    for key in new:
        for a, b in zip(_flat(old[key]), _flat(new[key])):
            if isinstance(a[1], torch.Tensor):
                assert torch.equal(bits(a[1]), bits(b[1])), (case, key, a[0])
