"""The engine's step leaves the gradient slots that backward writes over unzeroed
(real/engine.py `_zero_grads(defer=True)`, real/inplace_grads.py `deferrable`): training
gives the bits of zeroing everything, with a weight unused in some micro-steps or steps,
one later used by a plain op, and gradient accumulation over two micro-batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine_helpers import batches, config, make_engine


class Switchy(nn.Module):
    """BiasMLP's shape plus a linear used only in some micro-steps (`side`) and one used
    as a linear at first and by a plain matmul later (`late`); `tied`: the head is the
    embedding's weight (a routed linear use, whose backward comes before the
    embedding's)."""

    def __init__(self, vocab: int = 32, hidden: int = 12, seed: int = 0, tied: bool = False):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, 20)
        self.down = nn.Linear(20, hidden, bias=False)
        self.side = nn.Linear(hidden, hidden, bias=False)
        self.late = nn.Linear(hidden, hidden, bias=False)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        self.use_side, self.plain_late, self.tied = True, False, tied
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        if self.use_side:
            h = h + self.side(h)
        h = h + (h @ self.late.weight.t() if self.plain_late else self.late(h))
        h = self.norm(h)
        logits = nn.functional.linear(h, self.emb.weight) if self.tied else self.out(h)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


# per step, per micro-step: (side used, late used by a plain op)
PLAN = [[(True, False), (True, False)], [(True, False), (False, False)],
        [(False, False), (False, False)], [(False, True), (True, False)],
        [(True, True), (False, False)], [(False, False), (True, False)]]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32).clone()


def _train(strategy: str, defer: bool, tmp_path, zeroes_grads: bool = True,
           tied: bool = False):
    cfg = config(strategy)
    cfg["gradient_accumulation_steps"] = 2
    cfg.pop("train_batch_size", None)
    model = Switchy(seed=4, tied=tied)
    engine = make_engine(model, cfg)
    assert engine.inplace_grads is not None and engine.defer_zero  # the CPU lanes
    engine.defer_zero = defer
    if not zeroes_grads:
        engine.strategy.zeroes_grads = False
    data, grads, deferred, held = batches(), [], set(), False
    for step in PLAN:
        for side, plain in step:
            model.use_side, model.plain_late = side, plain
            ids, labels = next(data)
            engine.backward(engine(ids, labels))
            grads.append(_bits(engine.flat_grads))  # what the step reads
            engine.step()
            stale = engine.inplace_grads.stale
            deferred |= set(stale)
            # the slots left stale still hold last step's gradient, but no p.grad shows
            # them: every one is None until the next backward (as after DeepSpeed's step)
            held |= any(bool(engine.layout.view(engine.flat_grads, n).any())
                        for n, p in model.named_parameters() if id(p) in stale)
            assert all(p.grad is None for p in model.parameters()) == bool(stale)
    engine.save_checkpoint(tmp_path / f"{strategy}-{defer}", tag="end")
    engine.finish()
    params = _bits(engine.flat_params)
    engine.close()
    state = torch.load(tmp_path / f"{strategy}-{defer}" / "end" / _rank_file(
        tmp_path / f"{strategy}-{defer}" / "end"), weights_only=False)
    names = {id(p): n for n, p in model.named_parameters()}
    return params, grads, state, {names[i] for i in deferred}, held


def _rank_file(folder):
    (only,) = [p.name for p in folder.iterdir()]
    return only


def _same(a, b, where="state"):
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.is_floating_point() else a,
                           b.view(torch.uint8) if b.is_floating_point() else b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif not isinstance(a, float):  # wall times differ run to run
        assert a == b, where


@pytest.mark.parametrize("strategy,zeroes,own_pass", [
    ("zenflow", True, False), ("zero-offload", True, False),
    ("zero-offload-dpu", True, False), ("device", True, True), ("device", False, False)])
def test_deferred_zeroing_keeps_every_bit(strategy, zeroes, own_pass, tmp_path):
    on = _train(strategy, True, tmp_path / "on", zeroes)
    off = _train(strategy, False, tmp_path / "off", zeroes)
    assert torch.equal(on[0], off[0])  # parameters
    assert len(on[1]) == len(off[1]) == 12
    for i, (a, b) in enumerate(zip(on[1], off[1])):
        assert torch.equal(a, b), f"gradients of micro-step {i}"
    _same(on[2], off[2])  # moments, master weights, what the checkpoint holds
    # the routed weights were deferred (the device strategy's own pass zeroes all)
    assert off[3] == set()
    assert on[3] == (set() if own_pass
                     else {"up.weight", "down.weight", "side.weight", "out.weight",
                           "late.weight"})  # late: until its plain use
    assert on[4] == (on[3] != set())  # a deferred slot held last step's gradient


def test_deferrable_holds_the_routed_linear_weights_only():
    """The routed linear weights no plain op used: not `late` (a plain matmul used it),
    nor a bias or an untied embedding (add-only: deferring would only move the zeroing),
    nor the norm's (plain autograd)."""
    model = Switchy(seed=1)
    engine = make_engine(model, config("zero-offload"))
    model.plain_late = True
    ids, labels = next(batches())
    engine.backward(engine(ids, labels))
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in engine.inplace_grads.deferrable()} == {
        "up.weight", "down.weight", "side.weight", "out.weight"}
    engine.step()
    engine.close()


def _reference_grads(model, twin, ids, labels) -> dict:
    """Plain torch's gradients of `twin` at `model`'s current weights (None: unused)."""
    with torch.no_grad():
        for p, q in zip(model.parameters(), twin.parameters()):
            q.copy_(p)
    twin.use_side, twin.plain_late = model.use_side, model.plain_late
    twin.zero_grad(set_to_none=True)
    twin(ids, labels).backward()
    return {n: q.grad for n, q in twin.named_parameters()}


def _reads_as(model, want: dict | None) -> None:
    """Every p.grad reads as `want` (plain torch's gradients, None read as zeros) or, with
    `want` None, as zeros or None: never as last step's gradient."""
    for n, p in model.named_parameters():
        ref = None if want is None else want[n]
        if ref is None:
            assert p.grad is None or not p.grad.any(), n
        else:
            assert torch.allclose(p.grad, ref, rtol=1e-5, atol=1e-7), n


@pytest.mark.parametrize("strategy", ["zero-offload", "zenflow"])
def test_a_deepspeed_script_never_reads_a_stale_gradient(strategy):
    """Through DeepSpeed's front door (`import zfbench.real as deepspeed`): after
    backward each p.grad is plain torch's gradient; after step() every p.grad is None, as
    DeepSpeed's step leaves them (its ZeRO optimizer's zero_grad(set_to_none=True)), while
    the slots behind them still hold last step's values; engine.zero_grad() and
    optimizer.zero_grad() read as zeros or None, and the next backward after either gives
    that batch's gradient alone."""
    import zfbench.real as deepspeed

    model, twin = Switchy(seed=2), Switchy(seed=2)
    engine, optimizer, _, _ = deepspeed.initialize(
        model=model, config=config(strategy), device="cpu", device_threads=1, host_threads=1)
    assert engine.defer_zero
    data, left_stale = batches(), False
    for step, (side, plain) in enumerate([(True, False), (False, False), (True, True),
                                          (True, False), (False, False)]):
        model.use_side, model.plain_late = side, plain
        ids, labels = next(data)
        engine.backward(engine(ids, labels))
        _reads_as(model, _reference_grads(model, twin, ids, labels))
        if step == 3:  # dropped mid-step: the next backward's gradient is its own
            (engine.zero_grad if strategy == "zenflow" else optimizer.zero_grad)()
            _reads_as(model, None)
            ids, labels = next(data)
            engine.backward(engine(ids, labels))
            _reads_as(model, _reference_grads(model, twin, ids, labels))
        engine.step()
        assert all(p.grad is None for p in model.parameters())
        left_stale |= any(bool(engine.layout.view(engine.flat_grads, n).any())
                          for n, p in model.named_parameters()
                          if id(p) in engine.inplace_grads.stale)
        if step == 1:  # after step, as scripts written for torch do
            engine.zero_grad()
            _reads_as(model, None)
        if step == 2:
            optimizer.zero_grad()
            _reads_as(model, None)
    assert left_stale  # the buffer held last step's values where p.grad read None
    # forwards while every p.grad was None still took the in-place path (only `late`'s
    # plain use took it off)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in engine.inplace_grads.deferrable()} == {
        "up.weight", "down.weight", "side.weight", "out.weight"}
    engine.close()


def _embedding_zeroings(strategy: str, tied: bool, monkeypatch) -> list:
    """Who zeroed the embedding's gradient slot ("step" or "backward") in steps 2-3."""
    from zfbench.real import inplace_grads, kernels
    zeroed, names = [], {}
    real_settle, real_zero = inplace_grads._settle_one, kernels.zero_

    def settle(ref, stale, grad=None):
        p = ref()
        if p is not None and id(p) in stale:
            zeroed.append(("backward", names.get(id(p))))
        return real_settle(ref, stale, grad)

    def zero_(t, *a, **k):
        if t.untyped_storage().data_ptr() == engine.flat_grads.untyped_storage().data_ptr():
            lo, n = t.storage_offset(), t.numel()
            if lo < emb_hi and emb_lo < lo + n:
                zeroed.append(("step", "emb.weight"))
        return real_zero(t, *a, **k)
    monkeypatch.setattr(inplace_grads, "_settle_one", settle)  # before the hooks bind it
    model = Switchy(seed=4, tied=tied)
    names.update({id(p): n for n, p in model.named_parameters()})
    engine = make_engine(model, config(strategy))
    slot = engine.layout.view(engine.flat_grads, "emb.weight")
    emb_lo, emb_hi = slot.storage_offset(), slot.storage_offset() + slot.numel()
    data = batches()
    for step in range(4):
        if step == 2:  # the first steps learn which parameters are routed only
            zeroed.clear()
            monkeypatch.setattr(kernels, "zero_", zero_)
        ids, labels = next(data)
        engine.backward(engine(ids, labels))
        engine.step()
    monkeypatch.undo()
    engine.finish()
    engine.close()
    return [z for z in zeroed if z[1] == "emb.weight"]


@pytest.mark.parametrize("strategy", ["zenflow", "zero-offload"])
def test_a_tied_embedding_is_never_zeroed(strategy, tmp_path, monkeypatch):
    """The head's linear writes over the tied embedding's slot (its backward comes first),
    so neither the step nor backward zeroes it; the bits of zeroing everything. Untied,
    the step zeroes it (the negative control)."""
    on = _train(strategy, True, tmp_path / "on", tied=True)
    off = _train(strategy, False, tmp_path / "off", tied=True)
    assert torch.equal(on[0], off[0])
    for i, (a, b) in enumerate(zip(on[1], off[1])):
        assert torch.equal(a, b), f"gradients of micro-step {i}"
    _same(on[2], off[2])
    assert "emb.weight" in on[3]
    assert _embedding_zeroings(strategy, True, monkeypatch) == []
    assert ("step", "emb.weight") in _embedding_zeroings(strategy, False, monkeypatch)
