"""Tests for zfbench.core.schedule: hand-checked tables, invariants, the adaptive tracker."""
import pytest
from hypothesis import given, strategies as st

from zfbench.core.schedule import (
    AutoIntervalTracker,
    StepPlan,
    is_selection_step,
    is_update_boundary,
    is_warmup,
    plan_steps,
    topk_count,
    windows,
)


def table(n, W, U, S):
    """(selection steps, boundary steps) over iterations 0 .. n-1."""
    plan = plan_steps(n, W, U, S)
    return [p.t for p in plan if p.select], [p.t for p in plan if p.boundary]


# ---------------------------------------------------------------- hand-checked tables
def test_w0_u4_s0_select_once():
    sel, bnd = table(10, W=0, U=4, S=0)
    assert sel == [0]
    assert bnd == [3, 7]
    assert windows(10, 0, 4, 0) == [(0, 3), (4, 7), (8, 9)]  # last one cut by the run end
    assert not any(is_warmup(t, 0) for t in range(10))


def test_w2_u3_s6():
    # warm-up t=0,1 (each a boundary); selections at t=W=2, then t % 6 == 0: 6, 12.
    # fixed-U boundaries (t+1-2) % 3 == 0: t=4,7,10,13; before reselection: t=5,11.
    sel, bnd = table(14, W=2, U=3, S=6)
    assert sel == [2, 6, 12]
    assert bnd == [0, 1, 4, 5, 7, 10, 11, 13]
    assert windows(14, 2, 3, 6) == [(2, 4), (5, 5), (6, 7), (8, 10), (11, 11), (12, 13)]
    assert [is_warmup(t, 2) for t in range(4)] == [True, True, False, False]


def test_w0_u4_s6_window_cut_before_reselection():
    # U boundaries t=3,7,11; reselection at 6 and 12 forces boundaries at 5 and 11,
    # so the window 4..5 is cut to 2 steps.
    sel, bnd = table(14, W=0, U=4, S=6)
    assert sel == [0, 6, 12]
    assert bnd == [3, 5, 7, 11]
    assert windows(14, 0, 4, 6) == [(0, 3), (4, 5), (6, 7), (8, 11), (12, 13)]


def test_w3_u2_s4_warmup_longer_than_first_select_multiple():
    # t=0 % 4 == 0 is inside warm-up: no selection there; first selection at t=W=3.
    sel, bnd = table(10, W=3, U=2, S=4)
    assert sel == [3, 4, 8]
    # warm-up 0,1,2; before reselection at 4 and 8: t=3, 7; U: (t-2) % 2 == 0 -> 4, 6, 8
    assert bnd == [0, 1, 2, 3, 4, 6, 7, 8]
    assert windows(10, 3, 2, 4) == [(3, 3), (4, 4), (5, 6), (7, 7), (8, 8), (9, 9)]


def test_auto_mode_forced_boundaries_only():
    sel, bnd = table(9, W=1, U=None, S=4)
    assert sel == [1, 4, 8]
    assert bnd == [0, 3, 7]
    assert windows(9, 1, None, 4) == [(1, 3), (4, 7), (8, 8)]
    assert windows(9, 0, None, 0) == [(0, 8)]


def test_plan_steps_records():
    assert plan_steps(3, 1, 2, 0) == [StepPlan(0, True, False, True),
                                      StepPlan(1, False, True, False),
                                      StepPlan(2, False, False, True)]
    assert plan_steps(0, 1, 2, 0) == [] and windows(0, 1, 2, 0) == []
    assert windows(2, 3, 2, 0) == []  # the run ends inside warm-up


@pytest.mark.parametrize("args", [(-1, 0, 1, 0), (0, -1, 1, 0), (0, 0, 0, 0), (0, 0, 1, -2)])
def test_bad_arguments(args):
    with pytest.raises(ValueError):
        is_update_boundary(*args)


@pytest.mark.parametrize("cols,ratio,k", [
    (4096, 0.1, 409), (4096, 0.05, 204), (10, 0.1, 1), (10, 0.05, 1), (9, 0.1, 1),
    (1, 0.5, 1), (100, 1.0, 100), (7, 0.5, 3), (3, 1e-9, 1), (1000, 0.29, 290),
])
def test_topk_count_table(cols, ratio, k):
    assert topk_count(cols, ratio) == k


@pytest.mark.parametrize("cols,ratio", [(0, 0.1), (10, 0.0), (10, 1.5), (10, -0.1),
                                        (True, 0.5), (2.0, 0.5)])
def test_topk_count_rejects(cols, ratio):
    with pytest.raises(ValueError):
        topk_count(cols, ratio)


# ---------------------------------------------------------------- invariants
schedules = st.tuples(st.integers(0, 80), st.integers(0, 8),
                      st.one_of(st.none(), st.integers(1, 9)), st.integers(0, 20))


@given(schedules)
def test_windows_partition_post_warmup_steps(args):
    n, W, U, S = args
    ws = windows(n, W, U, S)
    covered = [t for a, b in ws for t in range(a, b + 1)]
    assert covered == list(range(W, n))
    assert all(a <= b for a, b in ws)


@given(schedules)
def test_window_ends_are_exactly_the_boundaries(args):
    n, W, U, S = args
    ends = {b for _, b in windows(n, W, U, S)}
    post = {t for t in range(W, n) if is_update_boundary(t, W, U, S)}
    assert post <= ends and ends - post <= {n - 1}


@given(schedules)
def test_no_window_longer_than_u(args):
    n, W, U, S = args
    if U is not None:
        assert all(b - a + 1 <= U for a, b in windows(n, W, U, S))


@given(schedules)
def test_every_reselection_starts_a_new_window(args):
    n, W, U, S = args
    starts = {a for a, _ in windows(n, W, U, S)}
    for t in range(n):
        if is_selection_step(t, W, S):
            assert t in starts
            assert t == 0 or is_update_boundary(t - 1, W, U, S)  # flushed before


@given(schedules)
def test_warmup_steps_are_boundaries_without_selection(args):
    n, W, U, S = args
    for p in plan_steps(n, W, U, S):
        assert p.warmup == (p.t < W)
        if p.warmup:
            assert p.boundary and not p.select


@given(schedules, st.integers(1, 9))
def test_auto_forced_boundaries_are_boundaries_for_any_fixed_u(args, U_fixed):
    n, W, _, S = args
    for t in range(n):
        if is_update_boundary(t, W, None, S):
            assert is_update_boundary(t, W, U_fixed, S)


@given(st.integers(1, 100_000), st.floats(min_value=1e-12, max_value=1.0))
def test_topk_count_in_range(cols, ratio):
    k = topk_count(cols, ratio)
    assert 1 <= k <= cols
    assert k == max(1, int(ratio * cols))
    assert topk_count(cols, 1.0) == cols


# ---------------------------------------------------------------- adaptive interval
def stats(C, R, r=0.25):
    """(total, critic) whose normalised terms are C = critic/(10r), R = rest/(10(1-r))."""
    critic = C * 10 * r
    return (critic + R * 10 * (1 - r), critic)


def run_auto(per_step, W, S, topk_ratio=0.25, auto_ratio=1.0):
    """Drive the tracker the way the engine does; returns (boundaries after W, tracker)."""
    tr = AutoIntervalTracker(topk_ratio, auto_ratio)
    bounds = []
    for t, weights in enumerate(per_step):
        boundary = is_update_boundary(t, W, None, S) or tr.boundary_next
        if t >= W:
            tr.observe(weights)
            if boundary:
                bounds.append(t)
                tr.flush()
    return bounds, tr


def test_auto_tracker_hand_sequence():
    # r = 0.25, one 2-D weight, W = 1, S = 6.  Per window: sum of R vs mean of C.
    seq = [
        None,             # t=0  warm-up, not observed
        [stats(4, 1)],    # t=1  window opens: sum 1, mean 4       -> no
        [stats(2, 0)],    # t=2  sum 1, mean (4+2)/2 = 3           -> no
        [stats(0, 2)],    # t=3  sum 3, mean 6/3 = 2: 3 >= 2       -> t=4 is a boundary
        [stats(4, 0)],    # t=4  boundary; window 1..4 (4 steps)
        [stats(4, 1)],    # t=5  sum 1 < 4, but (5+1) % 6 == 0: forced; window 5..5
        [stats(4, 4)],    # t=6  reselection, window opens: sum 4 >= mean 4 -> t=7
        [stats(1, 0)],    # t=7  boundary; window 6..7
        [stats(8, 1)],    # t=8  sum 1, mean 8
        [stats(0, 1)],    # t=9  sum 2, mean 4
        [stats(0, 1)],    # t=10 sum 3, mean 8/3: fires -> t=11 (also forced)
        [stats(9, 0)],    # t=11 boundary; window 8..11
    ]
    bounds, tr = run_auto(seq, W=1, S=6)
    assert bounds == [4, 5, 7, 11]
    assert tr.chosen_windows == [4, 1, 2, 4]
    assert tr.steps_in_window == 0 and not tr.boundary_next


def test_auto_tracker_return_values_and_reset():
    tr = AutoIntervalTracker(0.25, 1.0)
    assert [tr.observe([stats(4, 1)]), tr.observe([stats(2, 0)]),
            tr.observe([stats(0, 2)])] == [False, False, True]
    tr.flush()
    # without the reset the sum (3 + 1) would reach the mean (2) at once
    assert tr.observe([stats(4, 1)]) is False
    assert tr.chosen_windows == [3]


def test_auto_tracker_uses_topk_ratio_normalisation():
    # r = 0.1: critic 10 -> mean term 10/(10*0.1) = 10; rest 9 -> 9/(10*0.9) = 1 per step
    tr = AutoIntervalTracker(0.1, 1.0)
    fired = [tr.observe([(19.0, 10.0)]) for _ in range(10)]
    assert fired == [False] * 9 + [True]


@pytest.mark.parametrize("auto_ratio,fires", [(0.5, True), (0.99, False), (1.0, False)])
def test_auto_ratio_share_of_weights(auto_ratio, fires):
    tr = AutoIntervalTracker(0.25, auto_ratio)
    # weight 0: sum 5 >= mean 4 (fires); weight 1: sum 1 < mean 4
    assert tr.observe([stats(4, 5), stats(4, 1)]) is fires


def test_auto_ratio_boundary_is_inclusive():
    tr = AutoIntervalTracker(0.25, 0.7)  # 7 of 10 weights exactly reach 0.7
    per = [stats(1, 1)] * 7 + [stats(4, 1)] * 3
    assert tr.observe(per) is True
    tr2 = AutoIntervalTracker(0.25, 0.7)
    assert tr2.observe([stats(1, 1)] * 6 + [stats(4, 1)] * 4) is False


def test_auto_tracker_edge_cases():
    full = AutoIntervalTracker(1.0, 1.0)  # every column selected: no unselected mass
    assert not any(full.observe([(5.0, 5.0)]) for _ in range(50))
    assert AutoIntervalTracker(0.5, 1.0).observe([]) is False
    tr = AutoIntervalTracker(0.5, 1.0)
    tr.observe([(1.0, 0.5)])
    with pytest.raises(ValueError):
        tr.observe([(1.0, 0.5), (1.0, 0.5)])
    with pytest.raises(ValueError):
        AutoIntervalTracker(0.5, 1.0).observe([(float("nan"), 0.5)])
    with pytest.raises(ValueError):
        AutoIntervalTracker(0.5, 1.0).observe([(1.0, -0.5)])
    with pytest.raises(ValueError):
        AutoIntervalTracker(0.0, 1.0)
    with pytest.raises(ValueError):
        AutoIntervalTracker(0.5, 1.5)
    empty = AutoIntervalTracker(0.5, 1.0)
    empty.flush()
    assert empty.chosen_windows == []


@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 6)), min_size=1, max_size=60),
       st.integers(0, 4), st.sampled_from([0, 5, 8]))
def test_auto_windows_partition_and_respect_reselection(cr, W, S):
    per_step = [[stats(c, r)] for c, r in cr]
    n = len(per_step)
    bounds, tr = run_auto(per_step, W=W, S=S)
    # the recorded windows are the gaps between boundaries and cover every flushed step
    ends = [W - 1] + bounds
    assert tr.chosen_windows == [b - a for a, b in zip(ends, ends[1:])]
    assert sum(tr.chosen_windows) + tr.steps_in_window == max(0, n - W)
    for t in range(W, n):
        if is_selection_step(t, W, S) and t > W:
            assert t - 1 in bounds


def test_selected_elements_has_one_home_for_the_engine_and_the_simulator():
    """ZenFlow's device-updated elements, the top-k columns of every matrix and every 1-D
    parameter: zfbench.core.schedule.selected_elements, as the simulator's buckets and the
    engine's memory estimate count them."""
    from zfbench.core.models import get_model
    from zfbench.core.schedule import selected_elements, topk_count
    from zfbench.sims.costs import CostModel, SimSettings

    shape = get_model("qwen2.5-0.5b")
    vectors = sum(v.numel for v in shape.vectors())
    want = sum(m.rows * max(1, int(0.1 * m.cols)) for m in shape.matrices()) + vectors
    assert selected_elements(shape.matrices(), vectors, 0.1) == want
    assert all(topk_count(m.cols, 0.1) == max(1, int(0.1 * m.cols)) for m in shape.matrices())
    costs = CostModel(SimSettings.from_knobs(model="qwen2.5-0.5b", gpus=1, steps=2, topk_ratio=0.1))
    assert costs.selected_params == want
