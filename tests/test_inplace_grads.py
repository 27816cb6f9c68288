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
