"""`zfbench.real.inplace_grads`: gradients accumulated into preset `.grad` buffers equal autograd's."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from zfbench.real.inplace_grads import InplaceGrads
from zfbench.real.model import build_model
from tests.engine_helpers import BiasMLP, batches, config, make_engine
from zfbench.core.models import get_model


def _autograd_grads(model, loss_fn):
    model.zero_grad(set_to_none=True)
    loss_fn(model).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _inplace_grads(model, loss_fn):
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    mode = InplaceGrads(params)
    with mode:
        loss = loss_fn(model)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, mode.routed


def _assert_same(a: dict, b: dict, rtol=1e-5, atol=1e-7):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


@pytest.mark.parametrize("name", ["tiny", "opt-tiny"])
def test_our_models_match_autograd(name):
    """Llama style (untied lm_head) and OPT style (biases, tied embedding used twice)."""
    shape = get_model("tiny")
    if name == "opt-tiny":
        from dataclasses import replace
        shape = replace(shape, name="opt-tiny", style="opt", kv_heads=4, max_positions=66,
                        linear_bias=True, tied_embeddings=True, final_norm=True)
    model = build_model(shape, seed=3)
    ids = torch.randint(0, shape.vocab, (2, 9), generator=torch.Generator().manual_seed(0))

    def loss_fn(m):
        return m(ids, ids)
    ref = _autograd_grads(model, loss_fn)
    got, routed = _inplace_grads(model, loss_fn)
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert routed >= n_linear + 1  # every linear and the embedding went the in-place way
    _assert_same(ref, got)


def test_padding_idx_frozen_bias_and_grad_none_fall_back_correctly():
    """padding rows get no gradient; a frozen bias or a weight whose .grad is None
    goes through plain autograd; gradients accumulate across two backwards."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 6, padding_idx=0)
    lin = nn.Linear(6, 5)
    lin.bias.requires_grad_(False)
    other = nn.Linear(5, 3)
    model = nn.Sequential(emb, lin, nn.Tanh(), other)
    ids = torch.tensor([[0, 3, 3, 7], [0, 0, 9, 1]])

    def loss_fn(m):
        return m(ids).square().mean()
    ref = {n: 2 * g for n, g in _autograd_grads(model, loss_fn).items()
           }
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    other.weight.grad = None  # routed calls must fall back to autograd for this one
    mode = InplaceGrads(params)
    routed = []
    for _ in range(2):
        mode.routed = 0
        with mode:
            loss = loss_fn(model)
        loss.backward()
        routed.append(mode.routed)
    # first pass only the embedding (lin has a frozen bias, other no .grad); autograd then
    # set other.weight.grad, so the second pass routes it too
    assert routed == [1, 2]
    got = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    _assert_same(ref, got)
    assert torch.count_nonzero(emb.weight.grad[0]) == 0


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 4), min_size=1, max_size=3), fin=st.integers(1, 7),
       fout=st.integers(1, 7), bias=st.booleans(), seed=st.integers(0, 10_000))
def test_linear_any_shape_matches_autograd(lead, fin, fout, bias, seed):
    gen = torch.Generator().manual_seed(seed)
    lin = nn.Linear(fin, fout, bias=bias)
    x = torch.randn(*lead, fin, generator=gen, requires_grad=True)
    w_out = torch.randn(*lead, fout, generator=gen)

    def loss_fn(m):
        return (m(x) * w_out).sum()
    ref = _autograd_grads(lin, loss_fn)
    x_ref = torch.autograd.grad(loss_fn(lin), x)[0]
    got, routed = _inplace_grads(lin, loss_fn)
    assert routed == 1
    _assert_same(ref, got)
    x.grad = None
    with InplaceGrads(list(lin.parameters())):
        out = loss_fn(lin)
    torch.testing.assert_close(torch.autograd.grad(out, x)[0], x_ref)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zenflow"])
def test_engine_parameters_equal_with_and_without(strategy):
    """The engine with `zfbench.inplace_grads` on (default) and off trains the same."""
    finals = []
    for on in (True, False):
        cfg = config(strategy)
        cfg.setdefault("zfbench", {})["inplace_grads"] = on
        engine = make_engine(BiasMLP(seed=2), cfg)
        for ids, labels in itertools.islice(batches(), 6):
            loss = engine(ids, labels)
            engine.backward(loss)
            engine.step()
        engine.finish()
        assert (engine.inplace_grads is not None) == on
        if on:
            assert engine.inplace_grads.routed == 4  # emb, up, down, out
        finals.append(engine.flat_params.clone())
        engine.close()
    torch.testing.assert_close(finals[0], finals[1], rtol=1e-5, atol=1e-6)


def _column_major_grads(params) -> None:
    """Each 2-D parameter and its `.grad` (zeroed) column-major, as the engine's layout."""
    for p in params:
        if p.dim() == 2:
            p.data = p.detach().t().contiguous().t()
            p.grad = torch.zeros(p.shape[1], p.shape[0]).t()
        else:
            p.grad = torch.zeros_like(p)


@pytest.mark.parametrize("column_major", [True, False])
def test_a_first_write_after_zeroed_has_the_bits_of_adding_into_zeros(column_major):
    """After `zeroed()` the weight gradients are written by `mm` (the slot not read);
    without it they are added into the zeros by `addmm_`: the same bits, and a second
    backward (gradient accumulation) adds to the first in both."""
    model = build_model(get_model("tiny"), seed=4)
    params = list(model.parameters())
    ids = torch.randint(0, get_model("tiny").vocab, (2, 9),
                        generator=torch.Generator().manual_seed(1))
    results = []
    for zeroed in (False, True):
        if column_major:
            _column_major_grads(params)
        else:
            for p in params:
                p.grad = torch.zeros_like(p)
        mode = InplaceGrads(params)
        if zeroed:
            mode.zeroed()
        runs = []
        for _ in range(2):  # two micro-batches into the same gradients
            with mode:
                loss = model(ids, ids)
            loss.backward()
            runs.append({n: p.grad.clone() for n, p in model.named_parameters()})
        linears = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
        # the first backward took every routed weight off the clean set; none was plain
        assert not (mode.clean & {id(w) for w in linears})
        results.append(runs)
    for plain_run, written_run in zip(*results):
        for name in plain_run:
            assert torch.equal(plain_run[name], written_run[name]), name
    ref = _autograd_grads(model, lambda m: m(ids, ids))
    _assert_same({n: 2 * g for n, g in ref.items()}, results[1][1])


@pytest.mark.parametrize("separate", [True, False])
def test_a_gradient_another_op_wrote_is_added_to_not_overwritten(separate):
    """A routed weight that another op also uses, after `zeroed()`: the gradient is the
    sum, as autograd's. In one backward autograd accumulates the other op's part after
    the routed one (its AccumulateGrad node waits for the routed function too); from an
    earlier backward of its own (`separate`) the part is already there, and the
    post-accumulate hook has marked the slot written, so the routed part adds to it."""
    gen = torch.Generator().manual_seed(7)
    lin = nn.Linear(5, 3, bias=False)
    x = torch.randn(4, 5, generator=gen)
    c = torch.randn(3, 5, generator=gen)

    def plain(m):
        return (m.weight * c).sum()

    def routed(m):
        return m(x).sum()
    ref = _autograd_grads(lin, lambda m: plain(m) + routed(m))
    _column_major_grads(list(lin.parameters()))
    mode = InplaceGrads(list(lin.parameters()))
    mode.zeroed()
    with mode:
        if separate:
            plain(lin).backward()
            loss = routed(lin)
        else:
            loss = plain(lin) + routed(lin)
    loss.backward()
    assert mode.routed == 1
    _assert_same(ref, {"weight": lin.weight.grad})
