"""AdamW over a list of tensors in one parallel region (real/host_segments.py, the C++
`zf_adamw_segments`) gives torch._fused_adamw_'s bits on the same list: segment lengths
multiples of 16 and not (their tails go to torch), zero-length ones, views into one
buffer with gaps (as the weights' columns), weight decay on and off, both lerp branches,
gradient divisors 1, 4 and 3 (the quotient stored into the gradients, as torch's
grad_scale does), one and two threads. The torch path runs without the library, and
real/adamw.py's fused CPU path, and the engine's ZenFlow step over it, take the segments
loop with the old path's bits. The C++ tests skip where the library did not build."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps
from test_host_fused import lib  # noqa: F401  (the fixture: the checked library, or skip)
from zfbench.real import adamw, host_fused, host_native, host_segments

SERIAL = host_fused.SERIAL_BELOW
lengths = st.lists(st.one_of(st.integers(0, 70), st.sampled_from([16, 160, 1024, 1040]),
                             st.integers(SERIAL // 2, SERIAL + 40)), min_size=1, max_size=24)
hypers = st.fixed_dictionaries({
    "step": st.integers(1, 3000), "lr": st.sampled_from([1e-4, 1e-3, 3e-2]),
    "beta1": st.sampled_from([0.9, 0.3]), "beta2": st.sampled_from([0.95, 0.999]),
    "eps": st.sampled_from([1e-8, 1e-6]), "wd": st.sampled_from([0.0, 0.01]),
    "grad_divisor": st.sampled_from([1.0, 4.0, 3.0])})


def buffers(lens: list[int], seed: int, gap: int = 5):
    """p, g, m, v as whole buffers, and the segments: views of `lens` elements into them,
    `gap` elements apart (the gaps must stay untouched)."""
    total = sum(lens) + gap * (len(lens) + 1)
    gen = torch.Generator().manual_seed(seed)
    bufs = [torch.randn(total, generator=gen), torch.randn(total, generator=gen) * 1e-2,
            torch.randn(total, generator=gen) * 1e-3, torch.rand(total, generator=gen) * 1e-4]
    bufs[1][::13] = 0.0
    starts = [gap * (k + 1) + sum(lens[:k]) for k in range(len(lens))]
    segs = [[b[s:s + n] for s, n in zip(starts, lens)] for b in bufs]
    return bufs, segs


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


def hyper_args(h: dict) -> tuple:
    return (h["step"], h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"], h["grad_divisor"])


def run_both(lib, lens, seed, hyper, threads):
    want, want_segs = buffers(lens, seed)
    got, got_segs = buffers(lens, seed)
    grads_before = want[1].clone()
    host_segments.torch_adamw_segments_(*want_segs, *hyper_args(hyper))
    host_segments.cpp_adamw_segments_(lib, *got_segs, *hyper_args(hyper), threads, SERIAL,
                                      host_fused.TAIL)
    for name, a, b in zip("pgmv", want, got):
        assert torch.equal(bits(a), bits(b)), f"{name} lens={lens} {hyper} threads={threads}"
    # the quotient stored into the gradients (fp32 division); the gaps untouched
    quotient = grads_before / torch.tensor(hyper["grad_divisor"])
    inside = torch.zeros_like(grads_before, dtype=torch.bool)
    for seg in got_segs[1]:
        if seg.numel():
            lo = seg.storage_offset()
            inside[lo:lo + seg.numel()] = True
    assert torch.equal(bits(got[1])[inside], bits(quotient)[inside])
    assert torch.equal(bits(got[1])[~inside], bits(grads_before)[~inside])


@settings(max_examples=60, deadline=None)
@given(lens=lengths, seed=st.integers(0, 1000), hyper=hypers, threads=st.sampled_from([1, 2]))
def test_segments_equal_torchs_fused_adamw_bit_for_bit(lib, lens, seed, hyper, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # torch's own threads too (its bits do not depend on them)
    try:
        run_both(lib, lens, seed, hyper, threads)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_many_steps_over_columns_and_vectors(lib, threads):
    """The engine's shape: per-column views of a column-major weight (rows a multiple of
    16), 1-D vectors with and without a tail, a contiguous [k, rows] copy; 10 steps at
    divisor 4, threaded across segment boundaries."""
    rows, cols = 64, 300
    gen = torch.Generator().manual_seed(7)

    def model():
        g = torch.Generator().manual_seed(11)
        weight = [torch.randn(cols, rows, generator=g).t() * s for s in (1, 1e-2, 1e-3)]
        weight.append(torch.rand(cols, rows, generator=g).t() * 1e-4)
        vec = [torch.randn(1000 + 5, generator=g) for _ in range(4)]
        block = [torch.randn(3, rows, generator=g) for _ in range(4)]
        for t in (vec[3], block[3]):
            t.abs_()
        segs = [[w[:, j] for j in range(0, cols, 2)] + [v, b]
                for w, v, b in zip(weight, vec, block)]
        return weight + vec + block, segs

    want, want_segs = model()
    got, got_segs = model()
    for step in range(1, 11):
        noise = torch.randn(cols, rows, generator=gen).t() * 1e-2
        for tensors in (want, got):
            tensors[1].copy_(noise)
        host_segments.torch_adamw_segments_(*want_segs, step, 1e-3, 0.9, 0.999, 1e-8, 0.01,
                                            4.0)
        host_segments.cpp_adamw_segments_(lib, *got_segs, step, 1e-3, 0.9, 0.999, 1e-8,
                                          0.01, 4.0, threads, 1024, host_fused.TAIL)
    for a, b in zip(want, got):
        assert torch.equal(bits(a.contiguous()), bits(b.contiguous()))


def test_without_the_library_the_torch_call_runs(lib, monkeypatch):
    """The public call's fallback (library missing or rejected) is torch's own call; both
    paths give the same bits."""
    lens = [SERIAL + 7, 33, 0, 1024]
    h = {"step": 4, "lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "wd": 0.01,
         "grad_divisor": 4.0}
    results = []
    for library in (lambda: None, lambda: lib):
        monkeypatch.setattr(host_fused, "_library", library)
        bufs, segs = buffers(lens, 3)
        host_fused.adamw_segments_(*segs, step=h["step"], lr=h["lr"], beta1=h["beta1"],
                                   beta2=h["beta2"], eps=h["eps"], weight_decay=h["wd"],
                                   grad_divisor=h["grad_divisor"])
        results.append(bufs)
    want, want_segs = buffers(lens, 3)
    host_segments.torch_adamw_segments_(*want_segs, *hyper_args(h))
    for bufs in results:
        for a, b in zip(want, bufs):
            assert torch.equal(bits(a), bits(b))


@pytest.mark.parametrize("divisor", [1.0, 4.0])
def test_adamw_foreach_takes_the_segments_loop_with_the_old_bits(monkeypatch, divisor):
    """real/adamw.py's fused CPU path over many tensors (one step number) against the same
    call with the segments loop turned off (torch._fused_adamw_ as before)."""
    lens = [1024] * 40 + [5000, 1040, 77]
    calls = []

    def counted(*args, **kwargs):
        calls.append(len(args[0]))
        host_fused.adamw_segments_(*args, **kwargs)
    monkeypatch.setattr(adamw, "adamw_segments_", counted)
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # on one thread torch's call runs (no region to save)
    out = []
    try:
        for seg_from in (adamw.SEGMENTS_FROM, 10 ** 9):
            monkeypatch.setattr(adamw, "SEGMENTS_FROM", seg_from)
            bufs, segs = buffers(lens, 9)
            for fused in (True, None):
                adamw.adamw_foreach_(*segs, [3] * len(lens), lr=1e-3, beta1=0.9,
                                     beta2=0.999, eps=1e-8, weight_decay=0.01,
                                     grad_divisor=divisor, fused=fused)
            out.append(bufs)
    finally:
        torch.set_num_threads(before)
    assert calls == [len(lens)] * 2  # the segments loop ran, twice, only where allowed
    for a, b in zip(*out):
        assert torch.equal(bits(a), bits(b))


def test_mismatched_lists_are_refused(lib):
    _, segs = buffers([32, 48], 1)
    segs[2][1] = segs[2][1][:16]
    with pytest.raises(ValueError, match="element count"):
        host_segments.cpp_adamw_segments_(lib, *segs, 1, 1e-3, 0.9, 0.999, 1e-8, 0.0, 1.0,
                                          1, SERIAL, host_fused.TAIL)


def test_a_library_whose_segments_differ_is_rejected(lib, monkeypatch, capsys):
    """Negative control of the self-check: the real library but for a segments loop that
    ignores the divisor is rejected with one warning line, and torch's ops run."""
    class NoDivisor:
        def __getattr__(self, name):
            return getattr(lib, name)

        def zf_adamw_segments(self, *args):
            args = list(args)
            args[9] = 1.0  # the divisor
            lib.zf_adamw_segments(*args)
    monkeypatch.setattr(host_native, "_state", {})
    monkeypatch.setattr(host_fused, "_checked", {})
    monkeypatch.setattr(host_native, "_build_and_load",
                        lambda: (NoDivisor(), {"path": "cpp"}))
    assert host_fused.backend() == "torch"
    assert "segments" in host_fused.status()["reason"]
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def _zenflow_run(monkeypatch, segments: bool) -> tuple[dict, dict, int]:
    """ZenFlow on the CPU lanes with two device threads (the weights' columns in place,
    U = 3: a divisor that rounds), the segments loop on or off; the parameters, the
    moments and how many device updates the segments loop ran."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        host_fused.adamw_segments_(*args, **kwargs)
    monkeypatch.setattr(adamw, "adamw_segments_", counted)
    if not segments:
        monkeypatch.setattr(adamw, "SEGMENTS_FROM", 10 ** 9)
    before = torch.get_num_threads()
    try:
        model = BiasMLP(vocab=32, hidden=16, inner=48)
        engine = make_engine(model, config("zenflow", topk_ratio=0.25, update_interval=3,
                                           select_strategy="step", select_interval=5),
                             device_threads=2)
        train_steps(engine, batches(), 10)
        engine.finish()
        s = engine.strategy
        moments = {n: (s.dm[n].clone(), s.dv[n].clone()) for n in s.entry_names}
        engine.close()
    finally:
        torch.set_num_threads(before)
        monkeypatch.undo()
    return params_of(model), moments, len(calls)


def test_the_engines_zenflow_step_has_the_same_bits_with_the_segments_loop(lib,
                                                                          monkeypatch):
    got, got_m, got_calls = _zenflow_run(monkeypatch, True)
    want, want_m, want_calls = _zenflow_run(monkeypatch, False)
    assert got_calls == 10 and want_calls == 0  # one device update a step
    for name in want:
        assert torch.equal(bits(got[name]), bits(want[name])), name
    for name in want_m:
        for a, b in zip(got_m[name], want_m[name]):
            assert torch.equal(bits(a), bits(b)), name
