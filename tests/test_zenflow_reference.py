"""Checks of tests/zenflow_reference.py against independent facts (torch's own optimizers,
hand computations), so it can in turn check the real engine."""
import math

import pytest
import torch

from zenflow_reference import ReferenceZenFlow, adamw_update
from zfbench.core.config import OptimizerConfig, ZenFlowConfig
from zfbench.core.schedule import AutoIntervalTracker, is_update_boundary

D = torch.float64
LR, WD, BETAS, EPS = 1e-2, 0.1, (0.9, 0.999), 1e-8
OPT = OptimizerConfig(lr=LR, weight_decay=WD, betas=BETAS, eps=EPS)
SHAPES = {"w1": (6, 8), "b1": (8,), "w2": (4, 5)}
TOL = dict(rtol=0, atol=1e-12)


def init_params(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.randn(s, generator=g, dtype=D)) for n, s in SHAPES.items()]


def grad_seq(n_steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{n: torch.randn(s, generator=g, dtype=D) for n, s in SHAPES.items()}
            for _ in range(n_steps)]


def zf(topk=0.25, U=1, S=0, W=0, overlap=False):
    return ZenFlowConfig(topk_ratio=topk, select_strategy="step", select_interval=S,
                         update_interval=U, full_warm_up_rounds=W, overlap_step=overlap)


def run(cfg, grads, **kw):
    ref = ReferenceZenFlow(init_params(), cfg, OPT, **kw)
    snaps = [ref.params()]
    for g in grads:
        ref.step(g)
        snaps.append(ref.params())
    return ref, snaps


def unselected(ref, name):
    return [j for j in range(SHAPES[name][1]) if j not in ref.selected[name].tolist()]


def l1_topk(grad, ratio):
    k = max(1, math.floor(ratio * grad.shape[1]))
    return sorted(torch.topk(grad.abs().sum(0), k).indices.tolist())


def hand_adamw(p, m, v, g, step, lr=LR):
    """Closed-form AdamW step on copies; returns (p, m, v)."""
    m = BETAS[0] * m + (1 - BETAS[0]) * g
    v = BETAS[1] * v + (1 - BETAS[1]) * g * g
    mhat = m / (1 - BETAS[0] ** step)
    vhat = v / (1 - BETAS[1] ** step)
    return p * (1 - lr * WD) - lr * mhat / (vhat.sqrt() + EPS), m, v


# ---------------------------------------------------------------- device path == torch
def test_all_columns_selected_equals_torch_adamw():
    grads = grad_seq(20)
    ref = ReferenceZenFlow(init_params(), zf(topk=1.0, U=1, S=0, W=0), OPT)
    tp = [torch.nn.Parameter(p.clone()) for _, p in init_params()]
    opt = torch.optim.AdamW(tp, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for g in grads:
        ref.step(g)
        for p, n in zip(tp, SHAPES):
            p.grad = g[n].clone()
        opt.step()
        out = ref.params()
        for p, n in zip(tp, SHAPES):
            torch.testing.assert_close(out[n], p.detach(), **TOL)
    assert all(h["boundary"] for h in ref.history)  # U=1: the host ran every step too


def test_adam_l2_mode_equals_torch_adam():
    grads = grad_seq(10)
    opt_cfg = OptimizerConfig(type="Adam", lr=LR, weight_decay=WD, adam_w_mode=False)
    ref = ReferenceZenFlow(init_params(), zf(topk=1.0), opt_cfg)
    tp = [torch.nn.Parameter(p.clone()) for _, p in init_params()]
    opt = torch.optim.Adam(tp, lr=LR, weight_decay=WD)
    for g in grads:
        ref.step(g)
        for p, n in zip(tp, SHAPES):
            p.grad = g[n].clone()
        opt.step()
    for p, n in zip(tp, SHAPES):
        torch.testing.assert_close(ref.params()[n], p.detach(), **TOL)


def test_adamw_update_matches_torch_at_explicit_step():
    g = torch.Generator().manual_seed(5)
    p0, m0, v0, gr = (torch.randn(7, generator=g, dtype=D) for _ in range(4))
    v0 = v0.abs()
    p, m, v = p0.clone(), m0.clone(), v0.clone()
    adamw_update(p, gr, m, v, 9, LR, BETAS, EPS, WD)
    tp = torch.nn.Parameter(p0.clone())
    opt = torch.optim.AdamW([tp], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    opt.state[tp] = {"step": torch.tensor(8.0, dtype=D), "exp_avg": m0.clone(),
                     "exp_avg_sq": v0.clone()}
    tp.grad = gr.clone()
    opt.step()
    torch.testing.assert_close(p, tp.detach(), **TOL)


# ---------------------------------------------------------------- who changes when
def test_between_boundaries_only_selected_change_and_boundary_rules():
    U, n_steps = 3, 9
    grads = grad_seq(n_steps)
    ref, snaps = run(zf(topk=0.25, U=U, S=0), grads)
    sel = {n: ref.selected[n] for n in ("w1", "w2")}
    assert {n: s.tolist() for n, s in sel.items()} == {
        n: l1_topk(grads[0][n], 0.25) for n in ("w1", "w2")}
    # the selected slices and 1-D params follow torch AdamW on grad/U, every step,
    # untouched by the host updates
    dev = {n: torch.nn.Parameter(p[:, sel[n]].clone() if n in sel else p.clone())
           for n, p in init_params()}
    opt = torch.optim.AdamW(dev.values(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for t in range(n_steps):
        before, after = snaps[t], snaps[t + 1]
        boundary = ref.history[t]["boundary"]
        assert boundary == ((t + 1) % U == 0)
        for n, p in dev.items():
            p.grad = (grads[t][n][:, sel[n]] if n in sel else grads[t][n]) / U
        opt.step()
        for n in SHAPES:
            if n in sel:
                got = after[n][:, sel[n]]
                assert (got != before[n][:, sel[n]]).all()
                rest = unselected(ref, n)
                if boundary:  # every unselected column (every entry) moved
                    assert (after[n][:, rest] != before[n][:, rest]).all()
                else:
                    assert torch.equal(after[n][:, rest], before[n][:, rest])
            else:
                got = after[n]
                assert (got != before[n]).all()
            torch.testing.assert_close(got, dev[n].detach(), **TOL)


def test_boundary_gives_selected_exactly_one_device_step_from_pre_boundary_value():
    U = 3
    grads = grad_seq(3)
    ref = ReferenceZenFlow(init_params(), zf(topk=0.25, U=U), OPT)
    for g in grads[:2]:
        ref.step(g)
    before = ref.params()
    st = {n: {k: (v.clone() if torch.is_tensor(v) else v)
              for k, v in ref.device_state[n].items()} for n in SHAPES}
    ref.step(grads[2])  # t = 2: boundary
    assert ref.history[-1]["boundary"] and st["w1"]["step"] == 2
    for n in SHAPES:
        cols = ref.selected[n] if n != "b1" else slice(None)
        p0 = before[n][:, cols] if n != "b1" else before[n]
        g = (grads[2][n][:, cols] if n != "b1" else grads[2][n]) / U
        want, _, _ = hand_adamw(p0, st[n]["exp_avg"], st[n]["exp_avg_sq"], g, 3)
        got = ref.params()[n][:, cols] if n != "b1" else ref.params()[n]
        torch.testing.assert_close(got, want, **TOL)


def test_window_gradient_is_mean_over_U():
    U = 3
    grads = grad_seq(3)
    ref, snaps = run(zf(topk=0.25, U=U), grads)
    for n in SHAPES:
        mean = sum(g[n] for g in grads) / U
        torch.testing.assert_close(ref.host_exp_avg[n], (1 - BETAS[0]) * mean, **TOL)
        torch.testing.assert_close(ref.host_exp_avg_sq[n], (1 - BETAS[1]) * mean ** 2,
                                   **TOL)
        # one host step at step number t + 1 = 3 on the whole master
        want, _, _ = hand_adamw(snaps[0][n], 0 * mean, 0 * mean, mean, 3)
        torch.testing.assert_close(ref.master[n], want, **TOL)
        if n != "b1":
            rest = unselected(ref, n)
            torch.testing.assert_close(snaps[3][n][:, rest], want[:, rest], **TOL)


def test_host_bias_correction_uses_global_step():
    # W=2, U=3: host updates at t=0, 1 (warm-up) and t=4, so the third host update has
    # bias correction step t + 1 = 5, not 3.
    W, U = 2, 3
    grads = grad_seq(5)
    ref, snaps = run(zf(topk=0.25, U=U, W=W), grads)
    assert [h["host_step"] for h in ref.history] == [1, 2, None, None, 5]
    for n in SHAPES:
        zero = torch.zeros(SHAPES[n], dtype=D)
        p, m, v = snaps[0][n], zero, zero
        for t in range(W):
            p, m, v = hand_adamw(p, m, v, grads[t][n] / U, t + 1)
        mean = (grads[2][n] + grads[3][n] + grads[4][n]) / U
        want, _, _ = hand_adamw(p, m, v, mean, 5)
        wrong, _, _ = hand_adamw(p, m, v, mean, 3)
        torch.testing.assert_close(ref.master[n], want, **TOL)
        assert (ref.master[n] - wrong).abs().max() > 1e-6
        if n != "b1":
            rest = unselected(ref, n)
            torch.testing.assert_close(snaps[5][n][:, rest], want[:, rest], **TOL)


def test_gradient_clipping_scales_window_by_global_norm():
    U, clip = 2, 0.5
    grads = grad_seq(2)
    ref, _ = run(zf(topk=0.25, U=U), grads, gradient_clipping=clip)
    window = [torch.nn.Parameter(torch.zeros(s, dtype=D)) for s in SHAPES.values()]
    for p, n in zip(window, SHAPES):
        p.grad = (grads[0][n] + grads[1][n]) / U
    norm = torch.nn.utils.clip_grad_norm_(window, clip)
    assert norm > clip  # the clip is active
    for p, n in zip(window, SHAPES):
        torch.testing.assert_close(ref.host_exp_avg[n], (1 - BETAS[0]) * p.grad, **TOL)


# ---------------------------------------------------------------- selection
@pytest.mark.parametrize("importance", ["l1", "l2sq"])
def test_reselection_zeroes_device_moments_and_syncs_master(importance):
    U = S = 3
    grads = grad_seq(9)
    ref = ReferenceZenFlow(init_params(), zf(topk=0.25, U=U, S=S), OPT,
                           importance=importance)
    for t, g in enumerate(grads):
        before = ref.params()
        ref.step(g)
        h = ref.history[-1]
        assert h["select"] == (t % S == 0)
        assert h["boundary"] == (t % S == S - 1)
        if not h["select"]:
            continue
        for n in ("w1", "w2"):
            score = g[n].abs().sum(0) if importance == "l1" else (g[n] ** 2).sum(0)
            k = max(1, math.floor(0.25 * SHAPES[n][1]))
            top = sorted(torch.topk(score, k).indices.tolist())
            assert ref.selected[n].tolist() == top
        for n in SHAPES:
            st = ref.device_state[n]
            assert st["step"] == t + 1  # counted every step, not reset
            cols = ref.selected[n] if n != "b1" else slice(None)
            gs = (g[n][:, cols] if n != "b1" else g[n]) / U
            # zeroed moments, then one update with this step's gradient
            torch.testing.assert_close(st["exp_avg"], (1 - BETAS[0]) * gs, **TOL)
            torch.testing.assert_close(st["exp_avg_sq"], (1 - BETAS[1]) * gs ** 2, **TOL)
            p0 = before[n][:, cols] if n != "b1" else before[n]
            want, _, _ = hand_adamw(p0, 0 * gs, 0 * gs, gs, t + 1)
            got = ref.params()[n][:, cols] if n != "b1" else ref.params()[n]
            torch.testing.assert_close(got, want, **TOL)
            if t > 0:  # not a boundary: the master still holds the synced device values
                torch.testing.assert_close(ref.master[n], before[n], **TOL)


def test_reselection_keep_1d_moments_option():
    grads = grad_seq(4)
    ref = ReferenceZenFlow(init_params(), zf(topk=0.25, U=2, S=2), OPT,
                           reset_1d_moments_on_reselect=False)
    m_before = None
    for t, g in enumerate(grads):
        if t == 2:
            m_before = ref.device_state["b1"]["exp_avg"].clone()
        ref.step(g)
    want = BETAS[0] * m_before + (1 - BETAS[0]) * grads[2]["b1"] / 2
    want = BETAS[0] * want + (1 - BETAS[0]) * grads[3]["b1"] / 2
    torch.testing.assert_close(ref.device_state["b1"]["exp_avg"], want, **TOL)


# ---------------------------------------------------------------- warm-up
def test_warmup_steps_equal_plain_adamw_on_grad_over_U():
    W, U = 4, 2
    grads = grad_seq(W)
    ref = ReferenceZenFlow(init_params(), zf(topk=0.25, U=U, W=W), OPT)
    tp = [torch.nn.Parameter(p.clone()) for _, p in init_params()]
    opt = torch.optim.AdamW(tp, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    for g in grads:
        ref.step(g)
        assert ref.history[-1]["warmup"] and ref.selected == {} and not ref.device_state
        for p, n in zip(tp, SHAPES):
            p.grad = g[n] / U
        opt.step()
        for p, n in zip(tp, SHAPES):
            torch.testing.assert_close(ref.params()[n], p.detach(), **TOL)
            torch.testing.assert_close(ref.master[n], p.detach(), **TOL)


# ---------------------------------------------------------------- overlap
def test_overlap_two_windows_hand_traced():
    # W=0, U=2, S=0, 4 steps: boundaries t=1 and t=3.
    # sequential: window 1 (mean g0,g1, host step 2) lands at t=1, window 2 at t=3.
    # overlap: at t=1 nothing lands (submit only); at t=3 window 1 lands; finish() lands
    # window 2. Selected columns and the bias are identical in both modes at every step.
    U = 2
    grads = grad_seq(4)
    seq, s_snaps = run(zf(topk=0.25, U=U), grads)
    ovl, o_snaps = run(zf(topk=0.25, U=U, overlap=True), grads)
    init = dict(init_params())
    w1 = {}
    for n in SHAPES:
        mean = (grads[0][n] + grads[1][n]) / U
        w1[n], _, _ = hand_adamw(init[n], 0 * mean, 0 * mean, mean, 2)
    for t in range(5):
        for n in SHAPES:
            if n == "b1":
                torch.testing.assert_close(o_snaps[t][n], s_snaps[t][n], **TOL)
                continue
            cols, rest = seq.selected[n], unselected(seq, n)
            torch.testing.assert_close(o_snaps[t][n][:, cols], s_snaps[t][n][:, cols],
                                       **TOL)
            want_rest = {0: init[n], 1: init[n], 2: init[n], 3: init[n],
                         4: w1[n]}[t][:, rest]
            torch.testing.assert_close(o_snaps[t][n][:, rest], want_rest, **TOL)
    for n in ("w1", "w2"):  # sequential lands window 1 at t=1: the same values
        rest = unselected(seq, n)
        torch.testing.assert_close(s_snaps[2][n][:, rest], w1[n][:, rest], **TOL)
    assert ovl.pending is not None
    assert ovl.finish() is True and ovl.pending is None
    assert ovl.finish() is False
    for n in SHAPES:
        torch.testing.assert_close(ovl.params()[n], seq.params()[n], **TOL)
        torch.testing.assert_close(ovl.master[n], seq.master[n], **TOL)


def test_overlap_is_sequential_shifted_by_one_window_with_reselection():
    W, U, S, n_steps = 2, 2, 6, 14
    grads = grad_seq(n_steps, seed=7)
    seq = ReferenceZenFlow(init_params(), zf(topk=0.25, U=U, S=S, W=W), OPT)
    ovl = ReferenceZenFlow(init_params(), zf(topk=0.25, U=U, S=S, W=W, overlap=True), OPT)
    s_snaps, o_snaps = [seq.params()], [ovl.params()]
    for t, g in enumerate(grads):
        seq.step(g)
        ovl.step(g)
        s_snaps.append(seq.params())
        o_snaps.append(ovl.params())
        assert seq.history[t]["selected"] == ovl.history[t]["selected"]
        for n in SHAPES:  # the master sequence is the same in both modes
            torch.testing.assert_close(ovl.master[n], seq.master[n], **TOL)
            if n == "b1" or t < W:  # 1-D params (and warm-up): identical
                torch.testing.assert_close(o_snaps[-1][n], s_snaps[-1][n], **TOL)
            else:  # selected columns: identical
                cols = seq.selected[n]
                torch.testing.assert_close(o_snaps[-1][n][:, cols],
                                           s_snaps[-1][n][:, cols], **TOL)
    bounds = [h["t"] for h in seq.history if h["boundary"] and not h["warmup"]]
    assert bounds == [3, 5, 7, 9, 11, 13]
    # t=3 submits; 5 applies w(3); 6 (reselection) applies w(5) early; 7 submits only;
    # 9 and 11 apply; 12 (reselection) applies w(11); 13 submits, finish() applies it.
    assert [h["t"] for h in ovl.history if h["applied_pending"]] == [5, 6, 9, 11, 12]
    # unselected columns: overlap after boundary k == sequential after boundary k-1
    # within one selection period; at a reselection step both agree fully
    prev = None
    for t in range(W, n_steps):
        h = seq.history[t]
        if h["select"]:
            prev = None
            if t != W:
                for n in SHAPES:
                    torch.testing.assert_close(o_snaps[t + 1][n], s_snaps[t + 1][n],
                                               **TOL)
        if h["boundary"]:
            if prev is not None:
                for n in ("w1", "w2"):
                    rest = [j for j in range(SHAPES[n][1]) if j not in h["selected"][n]]
                    torch.testing.assert_close(o_snaps[t + 1][n][:, rest],
                                               s_snaps[prev + 1][n][:, rest], **TOL)
            prev = t
    ovl.finish()
    for n in SHAPES:
        torch.testing.assert_close(ovl.params()[n], seq.params()[n], **TOL)
        torch.testing.assert_close(ovl.master[n], seq.master[n], **TOL)


def test_sequential_finish_is_noop():
    seq, _ = run(zf(topk=0.25, U=2), grad_seq(3))
    before = seq.params()
    assert seq.finish() is False
    for n in SHAPES:
        assert torch.equal(seq.params()[n], before[n])


# ---------------------------------------------------------------- adaptive interval
def test_auto_update_interval_follows_tracker_and_averages_window():
    cfg = ZenFlowConfig(topk_ratio=0.25, select_strategy="step", select_interval=0,
                        update_interval="auto", auto_ratio=0.5)
    grads = grad_seq(30, seed=3)
    # make the unselected mass small at first so windows last more than one step
    for g in grads[:6]:
        for n in ("w1", "w2"):
            g[n][:, 2:] *= 0.05
    ref, snaps = run(cfg, grads)
    sel = {n: ref.selected[n] for n in ("w1", "w2")}
    tracker = AutoIntervalTracker(0.25, 0.5)
    expect = []
    for t, g in enumerate(grads):
        boundary = is_update_boundary(t, 0, None, 0) or tracker.boundary_next
        tracker.observe([(float(g[n].abs().sum()), float(g[n][:, sel[n]].abs().sum()))
                         for n in ("w1", "w2")])
        if boundary:
            tracker.flush()
        expect.append(boundary)
    assert [h["boundary"] for h in ref.history] == expect
    assert ref.chosen_windows == tracker.chosen_windows
    assert ref.chosen_windows[0] > 1 and len(set(ref.chosen_windows)) > 1
    # first window: host moments hold (1 - beta) * (sum over window / its length)
    ref2 = ReferenceZenFlow(init_params(), cfg, OPT)
    s, e = ref.windows[0]
    for g in grads[:e + 1]:
        ref2.step(g)
    for n in SHAPES:
        mean = sum(grads[t][n] for t in range(s, e + 1)) / (e - s + 1)
        torch.testing.assert_close(ref2.host_exp_avg[n], (1 - BETAS[0]) * mean, **TOL)
    assert ref2.device_state["b1"]["step"] == e + 1
    # the device path uses the undivided gradient in auto mode (step 0 is no boundary)
    assert not ref.history[0]["boundary"]
    b0 = dict(init_params())["b1"]
    want, _, _ = hand_adamw(b0, 0 * b0, 0 * b0, grads[0]["b1"], 1)
    torch.testing.assert_close(snaps[1]["b1"], want, **TOL)


def test_history_and_input_checks():
    ref, _ = run(zf(topk=0.25, U=2, W=1), grad_seq(3))
    assert [(h["t"], h["warmup"], h["select"], h["boundary"]) for h in ref.history] == [
        (0, True, False, True), (1, False, True, False), (2, False, False, True)]
    assert ref.history[2]["selected"]["w1"] == ref.selected["w1"].tolist()
    assert "b1" not in ref.selected and len(ref.selected["w2"]) == 1
    with pytest.raises(ValueError):
        ref.step({"w1": torch.zeros(6, 8)})
    with pytest.raises(ValueError):
        ref.step({"w1": torch.zeros(6, 7), "b1": torch.zeros(8), "w2": torch.zeros(4, 5)})
