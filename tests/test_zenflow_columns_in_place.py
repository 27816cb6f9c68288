"""ZenFlow's device AdamW on the weights' own columns (real/zenflow_device.py `_in_place`) and the
division by U inside the AdamW pass (real/adamw.py `grad_divisor`): the same bits as the
gathered path with its own division pass, and the write-back gone."""

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps
from zfbench.real import adamw, kernels, zenflow_device
from zfbench.real.adamw import adamw_foreach_, columns_in_place_ok

HYPER = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


@pytest.mark.parametrize("divisor", [4.0, 3.0, 7.0])
@pytest.mark.parametrize("fused", [True, False])
def test_grad_divisor_is_the_division_pass(divisor, fused, monkeypatch):
    if not fused:  # the foreach path (CUDA's): divided first, in one call
        monkeypatch.setattr(adamw, "_fused_ok", lambda *lists: False)
    gen = torch.Generator().manual_seed(3)
    shapes = [(5, 33), (48,), (7,)]
    start = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(4)]
    for v in start[3]:
        v.abs_()
    want = [[t.clone() for t in ts] for ts in start]
    got = [[t.clone() for t in ts] for ts in start]
    for g in want[1]:
        g.div_(divisor)
    adamw_foreach_(*want, [3, 3, 5], **HYPER)
    adamw_foreach_(*got, [3, 3, 5], grad_divisor=divisor, **HYPER)
    for a_list, b_list in zip(want, got):
        for a, b in zip(a_list, b_list):
            assert torch.equal(a, b)


def test_in_place_needs_whole_vector_rows():
    """Only weights stored column by column with rows a multiple of the vector width."""
    def column_major(rows, cols):
        return torch.zeros(cols, rows).t()
    assert columns_in_place_ok(column_major(32, 12))
    assert not columns_in_place_ok(column_major(12, 32))  # the remainder loop's rounding
    assert not columns_in_place_ok(torch.zeros(32, 12))  # row-major: columns strided
    assert not columns_in_place_ok(column_major(32, 12).to(torch.bfloat16))


def _run(monkeypatch, in_place: bool, overlap: bool, steps: int = 14):
    """A model whose every 2-D weight qualifies (rows 32, 48, 16, 32), U = 3 (a divisor
    that rounds), reselection every 5 steps; the parameters, moments and scatter count."""
    if not in_place:
        monkeypatch.setattr(zenflow_device, "columns_in_place_ok", lambda p: False)
    scatters = []
    real_scatter = kernels.scatter_
    monkeypatch.setattr(kernels, "scatter_",
                        lambda *a, **k: (scatters.append(1), real_scatter(*a, **k))[1])
    model = BiasMLP(vocab=32, hidden=16, inner=48)
    engine = make_engine(model, config("zenflow", topk_ratio=0.25, update_interval=3,
                                       select_strategy="step", select_interval=5,
                                       overlap_step=overlap))
    data = batches()
    train_steps(engine, data, steps)
    engine.finish()
    s = engine.strategy
    moments = {n: (s.dm[n].clone(), s.dv[n].clone()) for n in s.entry_names}
    engine.close()
    monkeypatch.undo()
    return params_of(model), moments, len(scatters)


@pytest.mark.parametrize("overlap", [False, True])
def test_in_place_columns_are_bit_identical(monkeypatch, overlap):
    got, got_m, got_scatters = _run(monkeypatch, True, overlap)
    want, want_m, want_scatters = _run(monkeypatch, False, overlap)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    for name in want_m:
        assert torch.equal(got_m[name][0], want_m[name][0]), name
        assert torch.equal(got_m[name][1], want_m[name][1]), name
    assert want_scatters == 14 * 4  # four matrices written back each step
    assert got_scatters == 0  # none with the AdamW on their own columns
