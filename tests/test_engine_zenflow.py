"""The engine's ZenFlow against the plain reference of zenflow.md, step for step.

The engine's gradients (computed at the engine's own parameters) are fed to the
reference each step, so a wrong update shows at the first step it happens."""

import pytest
from hypothesis import given, settings, strategies as st
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps
from zenflow_reference import ReferenceZenFlow
from zfbench.core.config import load_config

CASES = {
    "U4": dict(topk_ratio=0.25, update_interval=4, select_strategy="step",
               select_interval=0),
    "warmup_reselect": dict(topk_ratio=0.2, update_interval=3, select_strategy="step",
                            select_interval=9, full_warm_up_rounds=2),
    "clip_l2sq": dict(topk_ratio=0.3, update_interval=2, select_strategy="step",
                      select_interval=8),
    "auto": dict(topk_ratio=0.25, update_interval="auto", select_strategy="step",
                 select_interval=0, auto_ratio=0.5),
}


def run_against_reference(zf: dict, overlap: bool, steps: int = 42, clip: float = 0.0,
                          importance: str = "l1", host_delay_s: float = 0.0):
    zf = dict(zf, overlap_step=overlap)
    cfg = config("zenflow", clip=clip, **zf)
    cfg["zfbench"]["importance"] = importance
    model = BiasMLP()
    parsed = load_config(cfg)
    ref = ReferenceZenFlow(list(params_of(model).items()), parsed.zenflow, parsed.optimizer,
                           gradient_clipping=clip, importance=importance)
    engine = make_engine(model, cfg)
    if host_delay_s:
        original = engine.strategy.host.adam_chunk

        def slow_chunk(*args, **kwargs):
            import time
            time.sleep(host_delay_s)
            return original(*args, **kwargs)
        engine.strategy.host.adam_chunk = slow_chunk
    worst = 0.0
    data = batches()
    for _ in range(steps):
        train_steps(engine, data, 1, on_grads=ref.step)
        got = params_of(model)
        for name, want in ref.params().items():
            worst = max(worst, float((got[name].double() - want).abs().max()))
    engine.finish()
    ref.finish()
    final = {n: (params_of(model)[n].double() - w).abs().max().item()
             for n, w in ref.params().items()}
    engine.close()
    return worst, max(final.values()), engine, ref, params_of(model)


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("overlap", [False, True])
def test_engine_matches_reference(case, overlap):
    clip = 0.5 if case == "clip_l2sq" else 0.0
    importance = "l2sq" if case == "clip_l2sq" else "l1"
    worst, final, engine, ref, _ = run_against_reference(CASES[case], overlap, clip=clip,
                                                         importance=importance)
    assert worst < 2e-5, f"largest parameter difference over the run: {worst}"
    assert final < 2e-5
    for name, idx in ref.selected.items():
        assert torch.equal(engine.strategy.selected[name], idx), name
    if case == "auto":
        assert engine.strategy.chosen_windows == ref.chosen_windows
        assert len(set(ref.chosen_windows)) > 1  # the tracker really chose


@pytest.mark.slow
def test_overlap_is_deterministic_whatever_the_host_speed():
    """A slowed host worker changes timing, never parameters (one-window-late schedule)."""
    zf = CASES["warmup_reselect"]
    _, _, _, _, fast = run_against_reference(zf, overlap=True, steps=20)
    _, _, engine, _, slow = run_against_reference(zf, overlap=True, steps=20,
                                                  host_delay_s=0.02)
    for name in fast:
        assert torch.equal(fast[name], slow[name]), name
    waits = [s for s in engine.timeline.spans if s.lane == "host"]
    assert waits, "the slowed run recorded its host spans"


@pytest.mark.slow
def test_topk_one_u_one_is_torch_adamw():
    model = BiasMLP()
    twin = BiasMLP()
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.01)
    engine = make_engine(model, config("zenflow", topk_ratio=1.0, update_interval=1,
                                       select_strategy="step", select_interval=0))
    data, twin_data = batches(), batches()
    for _ in range(15):
        train_steps(engine, data, 1)
        ids, labels = next(twin_data)
        twin(ids, labels).backward()
        opt.step()
        opt.zero_grad()
        for (name, a), b in zip(model.named_parameters(), twin.parameters()):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), name
    engine.close()


@pytest.mark.slow
def test_selected_column_gets_exactly_its_own_adamw_step():
    """Between boundaries a selected column moves by AdamW on grad / U with its own state;
    unselected columns do not move."""
    zf = dict(topk_ratio=0.25, update_interval=4, select_strategy="step", select_interval=0)
    model = BiasMLP()
    engine = make_engine(model, config("zenflow", **zf))
    data = batches()
    grads = {}
    train_steps(engine, data, 1, on_grads=grads.update)  # t=0: selection, not a boundary
    before = params_of(model)
    train_steps(engine, data, 1, on_grads=grads.update)  # t=1
    after = params_of(model)
    strategy = engine.strategy
    w = "up.weight"
    idx = strategy.selected[w]
    unselected = [j for j in range(before[w].shape[1]) if j not in set(idx.tolist())]
    assert torch.equal(after[w][:, unselected], before[w][:, unselected])
    assert not torch.equal(after[w][:, idx], before[w][:, idx])
    assert strategy.device_count == 2
    engine.close()
    # replay both steps from the initial values with a plain AdamW
    model2 = BiasMLP()
    engine2 = make_engine(model2, config("zenflow", **zf))
    data2 = batches()
    g_seq = []
    train_steps(engine2, data2, 2, on_grads=lambda gr: g_seq.append(gr[w][:, idx] / 4))
    p = BiasMLP().up.weight.detach()[:, idx].clone()
    m = torch.zeros_like(p)
    v = torch.zeros_like(p)
    for step, g in enumerate(g_seq, start=1):
        p.mul_(1 - 1e-2 * 0.01)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p -= 1e-2 / (1 - 0.9 ** step) * m / ((v / (1 - 0.999 ** step)).sqrt() + 1e-8)
    assert torch.allclose(model2.up.weight.detach()[:, idx], p, rtol=1e-5, atol=1e-7)
    engine2.close()


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_finish_can_flush_the_open_window(overlap):
    """The reference discards a window still open at the end; flush_partial runs its host
    update so the last gradients reach the unselected columns."""
    zf = dict(topk_ratio=0.25, update_interval=4, select_strategy="step", select_interval=0,
              overlap_step=overlap)
    runs = {}
    for flush in (False, True):
        model = BiasMLP()
        engine = make_engine(model, config("zenflow", **zf))
        train_steps(engine, batches(), 10)  # boundaries at t=3, 7; steps 8-9 still open
        assert engine.strategy.window_len == 2
        engine.finish(flush_partial=flush)
        runs[flush] = (params_of(model), engine.strategy.selected["up.weight"])
        engine.close()
    (kept, idx), (flushed, _) = runs[False], runs[True]
    cols = [j for j in range(kept["up.weight"].shape[1]) if j not in set(idx.tolist())]
    assert not torch.equal(kept["up.weight"][:, cols], flushed["up.weight"][:, cols])
    assert torch.equal(kept["up.weight"][:, idx], flushed["up.weight"][:, idx])


@pytest.mark.slow
def test_bf16_selected_columns_keep_fp32_values_and_round_only_the_weights():
    """With bf16 weights the device AdamW runs on fp32 values of the selected columns,
    which it keeps from step to step, and writes them rounded into the bf16 weights; three
    steps replayed by hand in fp32 (no rounding between them) give those values."""
    zf = dict(topk_ratio=0.25, update_interval=4, select_strategy="step", select_interval=0)
    cfg = config("zenflow", **zf)
    cfg["bf16"] = {"enabled": True}
    w = "up.weight"
    model = BiasMLP()
    start = model.up.weight.detach().to(torch.bfloat16).float()
    engine = make_engine(model, cfg)
    assert engine.flat_params.dtype == torch.bfloat16
    g_seq = []
    train_steps(engine, batches(), 3, on_grads=lambda gr: g_seq.append(gr[w].float() / 4))
    strategy = engine.strategy
    idx = strategy.selected[w]
    for name, p in strategy.matrices:
        work = strategy.selected_values[name]
        cols = strategy.selected[name]
        # one row per selected column ([k, rows]: columns are contiguous in the engine)
        assert torch.equal(work.values.t().to(torch.bfloat16), p.detach()[:, cols]), name
    p = start[:, idx].clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for step, g in enumerate(g_seq, start=1):  # t = 0, 1, 2: no boundary before t = 3
        g = g[:, idx]
        p.mul_(1 - 1e-2 * 0.01)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * g * g
        p -= 1e-2 / (1 - 0.9 ** step) * m / ((v / (1 - 0.999 ** step)).sqrt() + 1e-8)
    values = strategy.selected_values[w].values.t()
    torch.testing.assert_close(values, p, rtol=1e-6, atol=1e-7)
    assert not torch.equal(values, values.to(torch.bfloat16).float())  # not rounded
    assert not torch.equal(model.up.weight.detach()[:, idx].float(), start[:, idx])
    engine.close()


def test_engine_stores_each_weight_column_by_column():
    """2-D weights and their gradients are column-major in the flat buffers, so one
    column (what ZenFlow selects) is contiguous; the module still sees [rows, cols]."""
    model = BiasMLP()
    want = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine = make_engine(model, config("zenflow", topk_ratio=0.25, update_interval=2))
    for name, p in engine.named_params:
        assert torch.equal(p.detach(), want[name])
        if p.dim() == 2:
            assert p.stride() == (1, p.shape[0]) and p.t().is_contiguous()
            assert p.grad.stride() == p.stride()
            slot = engine.layout.by_name[name]
            stored = engine.flat_params[slot.offset:slot.offset + slot.numel]
            assert torch.equal(stored[:p.shape[0]], p.detach()[:, 0])  # column 0 first
    engine.close()


@pytest.mark.slow
def test_both_weight_layouts_train_to_the_same_parameters():
    """zfbench.column_major changes where each element lives, not the arithmetic: ZenFlow
    (and the device strategy) end at the same parameters either way."""
    for strategy, zf in (("zenflow", dict(topk_ratio=0.25, update_interval=2,
                                          select_strategy="step", select_interval=4,
                                          overlap_step=True)), ("device", {})):
        ends = []
        for column_major in (True, False):
            model = BiasMLP()
            cfg = config(strategy, clip=0.5, **zf)
            cfg["zfbench"]["column_major"] = column_major
            engine = make_engine(model, cfg)
            train_steps(engine, batches(), 9)
            engine.finish()
            engine.close()
            ends.append(params_of(model))
        for name in ends[0]:
            torch.testing.assert_close(ends[0][name], ends[1][name], rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.data())
def test_column_take_and_put_agree_across_layouts(rows, cols, data):
    from zfbench.real.flat import is_column_major, put_columns, selected_shape, take_columns
    k = data.draw(st.integers(1, cols))
    idx = torch.tensor(sorted(data.draw(st.lists(st.integers(0, cols - 1), min_size=k,
                                                 max_size=k, unique=True))))
    row_major = torch.randn(rows, cols)
    col_major = row_major.t().contiguous().t()
    a, b = take_columns(row_major, idx), take_columns(col_major, idx)
    assert a.shape == selected_shape(row_major, k) and b.shape == selected_shape(col_major, k)
    # (a 1-row or 1-column matrix is both: then the row-major shape is used)
    flip = is_column_major(col_major)
    assert torch.equal(a, row_major[:, idx])
    assert torch.equal(b.t() if flip else b, row_major[:, idx])
    new = torch.randn(rows, k)
    put_columns(row_major, idx, new)
    put_columns(col_major, idx, new.t().contiguous() if flip else new)
    assert torch.equal(row_major, col_major)
