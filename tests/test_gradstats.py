"""zfbench.analysis.gradstats on small hand-made gradients whose answers are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from zfbench.analysis import gradstats as gs


def norms_from_sets(sets: list[set[int]], cols: int = 10, layer: str = "layers.0.q_proj.weight",
                    kind: str = "q") -> pd.DataFrame:
    """A column-norm table whose top columns at step s are exactly `sets[s]`."""
    rows = []
    for step, top in enumerate(sets):
        for c in range(cols):
            v = 10.0 + c if c in top else 1.0 / (1 + c)
            rows.append({"step": step, "layer": layer, "kind": kind, "col": c,
                         "sq_norm": v, "l1_norm": v})
    return pd.DataFrame(rows)


def test_topk_count_is_the_schedules():
    """One definition of ZenFlow's k (tests/test_schedule.py checks its values)."""
    from zfbench.core.schedule import topk_count
    assert gs.topk_count is topk_count
    assert gs.topk_count(100, 0.29) == 28  # 0.29 * 100 = 28.999... in floating point


def test_top_share_known_values():
    v = [4.0, 3.0, 2.0, 1.0]
    assert gs.top_share(v, 0.25) == pytest.approx(0.4)
    assert gs.top_share(v, 0.5) == pytest.approx(0.7)
    assert gs.top_share(v, 1.0) == pytest.approx(1.0)
    assert gs.top_share(np.zeros(5), 0.2) == 0.0
    # one column holding everything: the top 1% holds all of it
    one_hot = np.zeros(200)
    one_hot[17] = 5.0
    assert gs.top_shares(one_hot) == {"top_1pct": 1.0, "top_5pct": 1.0, "top_10pct": 1.0}
    # uniform: the top x holds x
    shares = gs.top_shares(np.ones(1000))
    assert shares == pytest.approx({"top_1pct": 0.01, "top_5pct": 0.05, "top_10pct": 0.10})


def test_cumulative_curve_endpoints_and_uniform_diagonal():
    c = gs.cumulative_curve(np.ones(50), points=11)
    assert c["share"].to_numpy() == pytest.approx(np.linspace(0, 1, 11))
    c = gs.cumulative_curve([9.0, 1.0], points=3)
    assert c["share"].tolist() == pytest.approx([0.0, 0.9, 1.0])


def test_skew_table_levels():
    a = pd.DataFrame({"step": 0, "layer": "a", "kind": "q", "col": range(100),
                      "sq_norm": [100.0] + [0.0] * 99, "l1_norm": 1.0})
    b = pd.DataFrame({"step": 0, "layer": "b", "kind": "up", "col": range(100),
                      "sq_norm": 1.0, "l1_norm": 1.0})
    t = gs.skew_table(pd.concat([a, b]), source="hand").set_index(["level", "name"])
    assert t.loc[("matrix", "a"), "top_1pct"] == pytest.approx(1.0)
    assert t.loc[("matrix", "b"), "top_1pct"] == pytest.approx(0.01)
    assert t.loc[("kind", "up"), "top_10pct"] == pytest.approx(0.10)
    # whole model: 200 columns pooled, top 1% = 2 columns = 100 + 1 of 200
    assert t.loc[("model", "all"), "top_1pct"] == pytest.approx(101 / 200)
    assert t.loc[("model", "mean over matrices"), "top_1pct"] == pytest.approx((1 + 0.01) / 2)
    assert set(t["source"]) == {"hand"}


def test_locality_overlap_and_jaccard_known_sets():
    norms = norms_from_sets([{0, 1}, {0, 1}, {1, 2}, {3, 4}])
    loc = gs.locality_table(norms, fraction=0.2, max_d=3)
    q = loc[loc.kind == "q"].set_index("d")
    # d=1 pairs: {0,1}/{0,1} -> 1, {0,1}/{1,2} -> 1/2, {1,2}/{3,4} -> 0
    assert q.loc[1, "overlap"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert q.loc[1, "jaccard"] == pytest.approx((1 + 1 / 3 + 0) / 3)
    # d=2: {0,1}/{1,2} -> 1/2, {0,1}/{3,4} -> 0
    assert q.loc[2, "overlap"] == pytest.approx(0.25)
    assert q.loc[3, "overlap"] == 0.0 and q.loc[3, "pairs"] == 1
    assert q.loc[1, "random_overlap"] == pytest.approx(0.2)
    assert set(loc.kind) == {"q", "all"}


def test_overlap_pairs_every_pair_of_steps_and_the_figure_aggregates_them():
    from zfbench.analysis import plot_measured as pm
    norms = norms_from_sets([{0, 1}, {0, 1}, {1, 2}, {3, 4}])
    norms.loc[norms.step == 3, "step"] = 5  # gaps need not be consecutive here
    pairs = gs.overlap_pairs(norms, 0.2)
    assert len(pairs) == 6 and set(pairs["gap"]) == {1, 2, 3, 4, 5}
    assert list(gs.overlap_pairs(norms, 0.2, max_gap=1)["overlap"]) == [1.0, 0.5]
    fig = pm.topk_overlap(norms.drop(columns="kind").rename(columns={"layer": "weight"}), 0.2)
    one = fig.set_index("gap")
    assert one.loc[1, "overlap_mean"] == pytest.approx(0.75)  # (0,1) -> 1, (1,2) -> 1/2
    assert one.loc[1, "pairs"] == 2 and one.loc[5, "overlap_max"] == 0.0
    assert one.loc[1, "random_overlap"] == pytest.approx(0.2)
    assert gs.overlap_pairs(norms[norms.step == 0], 0.2).empty


def test_locality_refuses_gaps_in_steps():
    norms = norms_from_sets([{0, 1}, {0, 1}, {0, 1}])
    norms.loc[norms.step == 2, "step"] = 5
    with pytest.raises(ValueError, match="consecutive"):
        gs.locality_table(norms, 0.2)


def test_reselection_counts_swapped_columns():
    norms = norms_from_sets([{0, 1}, {0, 1}, {1, 2}, {3, 4}])
    t = gs.reselection_table(norms, 0.2, intervals=(1, 2)).set_index(["kind", "select_interval"])
    assert t.loc[("q", 1), "changed_fraction"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert t.loc[("q", 1), "reselections"] == 3
    assert t.loc[("q", 2), "changed_columns"] == pytest.approx(1.0)  # {0,1} -> {1,2}


def test_spatial_share_known_matrices():
    g = np.zeros((10, 10))
    g[:, 3] = np.arange(1, 11)          # all energy in one column
    assert gs.spatial_share(g, 0.1) == pytest.approx(1.0)
    d = np.diag(np.arange(1.0, 11.0))   # top 10 elements = the diagonal; top column = col 9
    assert gs.spatial_share(d, 0.1) == pytest.approx(10.0 / 55.0)
    with pytest.raises(ValueError):
        gs.spatial_share(np.ones(4), 0.1)


def test_pooled_heatmap_block_means():
    g = np.arange(16, dtype=float).reshape(4, 4)
    h = gs.pooled_heatmap(-g, max_rows=2, max_cols=2)
    assert len(h) == 4
    top_left = h[(h.row == 0) & (h.col == 0)]["abs_grad"].item()
    assert top_left == pytest.approx((0 + 1 + 4 + 5) / 4)
    full = gs.pooled_heatmap(g)  # small enough: not pooled
    assert len(full) == 16 and full["abs_grad"].max() == 15


@pytest.mark.slow
def test_gradstats_does_not_import_torch():
    import subprocess
    import sys
    code = ("import sys, zfbench.analysis.gradstats; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
