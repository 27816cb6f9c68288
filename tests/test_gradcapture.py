"""zfbench.real.gradcapture and `python -m zfbench.gradients` on the tiny model (no extra needed)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from zfbench.analysis import gradstats as gs
from zfbench.analysis import plot_measured as pm
from zfbench.real.gradcapture import GradCapture, kind_of
from zfbench.real.model import build_model
from tests.engine_helpers import BiasMLP, batches, config, make_engine
from zfbench.gradients import command as gradients
from zfbench.core.models import get_model


@pytest.mark.parametrize("name, kind", [
    ("model.layers.3.self_attn.q_proj.weight", "q"),
    ("model.layers.3.self_attn.k_proj.weight", "k"),
    ("layers.0.v_proj.weight", "v"),
    ("model.layers.0.self_attn.o_proj.weight", "o"),
    ("layers.1.out_proj.weight", "o"),
    ("model.layers.2.mlp.gate_proj.weight", "gate"),
    ("layers.1.fc1.weight", "up"),
    ("model.layers.2.mlp.down_proj.weight", "down"),
    ("model.embed_tokens.weight", "embedding"),
    ("embed.embed_tokens.weight", "embedding"),
    ("head.lm_head.weight", "lm_head"),
    ("norm.weight", "other"),
])
def test_kind_of(name, kind):
    assert kind_of(name) == kind


def test_capture_matches_hand_computed_norms():
    lin = torch.nn.Linear(3, 2, bias=True)
    g = torch.tensor([[1.0, -2.0, 0.0], [3.0, 0.5, -1.0]])
    lin.weight.grad = g.clone()
    lin.bias.grad = torch.ones(2)
    seen = []
    cap = GradCapture([("up_proj.weight", lin.weight), ("up_proj.bias", lin.bias)],
                      detail_every=1, detail_fn=lambda *a: seen.append(a) or [{"x": 1}])
    cap.capture(0)
    lin.weight.grad = 2 * g
    cap.capture(1)
    f = cap.frame()
    assert list(f.columns) == ["step", "layer", "kind", "col", "sq_norm", "l1_norm"]
    assert len(f) == 6 and set(f["kind"]) == {"up"}  # the bias is not a matrix
    s0 = f[f.step == 0].sort_values("col")
    assert s0["sq_norm"].tolist() == pytest.approx([10.0, 4.25, 1.0])
    assert s0["l1_norm"].tolist() == pytest.approx([4.0, 2.5, 1.0])
    assert f[f.step == 1]["sq_norm"].sum() == pytest.approx(4 * 15.25)
    assert len(seen) == 2 and seen[0][2] == "up"
    np.testing.assert_allclose(seen[0][3], g.square().numpy())
    assert cap.heatmap_grad is not None and cap.heatmap_grad.shape == (2, 3)


@pytest.mark.slow
def test_capture_through_the_engine_agrees_with_selection_scores():
    """The L1 column norms recorded are ZenFlow's selection scores for that step."""
    model = BiasMLP()
    engine = make_engine(model, config("zenflow", topk_ratio=0.25, update_interval=2,
                                       select_strategy="step", select_interval=2))
    cap = GradCapture(engine.named_params, detail_every=0)
    data = batches()
    picked = {}
    try:
        for step in range(4):
            ids, labels = next(data)
            engine.backward(engine(ids, labels))
            cap.capture(step)
            engine.step()
            if step % 2 == 0:
                picked[step] = {n: idx.tolist() for n, idx in engine.strategy.selected.items()}
    finally:
        engine.close()
    f = cap.frame()
    assert sorted(f["step"].unique()) == [0, 1, 2, 3]
    for step, sel in picked.items():
        for name, idx in sel.items():
            g = f[(f.step == step) & (f.layer == name)].sort_values("col")
            k = len(idx)
            top = sorted(np.argsort(-g["l1_norm"].to_numpy(), kind="stable")[:k].tolist())
            assert top == idx, (step, name)


@pytest.mark.slow
def test_tiny_model_capture_feeds_the_statistics():
    model = build_model(get_model("tiny"), seed=0)
    engine = make_engine(model, config("device", lr=1e-3))
    cap = GradCapture(engine.named_params, detail_every=2,
                      detail_fn=gradients.detail_rows(0.1))
    from zfbench.real.data import default_text, text_batches
    data = text_batches(default_text(), 2, 16, seed=0)
    try:
        for step in range(5):
            b = next(data)
            engine.backward(engine(b["input_ids"], b["labels"]))
            cap.capture(step)
            engine.step()
    finally:
        engine.close()
    norms = cap.frame()
    kinds = set(norms["kind"])
    assert {"q", "k", "v", "o", "gate", "up", "down", "embedding"} <= kinds
    assert (norms["sq_norm"] >= 0).all() and norms["sq_norm"].sum() > 0
    skew = gs.skew_table(norms, source="tiny")
    model_row = skew[skew.level == "model"].iloc[0]
    assert 0.01 <= model_row["top_1pct"] <= model_row["top_5pct"] <= model_row["top_10pct"] <= 1
    loc = gs.locality_table(norms, 0.1, max_d=4)
    assert set(loc["d"]) == {1, 2, 3, 4}
    assert ((loc["overlap"] >= 0) & (loc["overlap"] <= 1)).all()
    details = cap.detail_frame()
    assert set(details["step"]) == {0, 2, 4}
    assert {"column", "row", "element"} <= set(details["unit"])


@pytest.mark.slow
def test_gradients_command_on_tiny_writes_the_documented_files(tmp_path):
    out = tmp_path / "runs"
    rc = gradients.main(["--model", "tiny", "--steps", "6", "--random-steps", "2",
                         "--batch", "2", "--seq", "16", "--max-d", "4", "--detail-every",
                         "3", "--threads", "1", "--out", str(out)])
    assert rc == 0
    g = out / "gradients"
    assert (g / "colnorms.parquet").exists() or (g / "colnorms.csv").exists()
    norms = pm.read_table(g / "colnorms.csv", ["step", "layer", "kind", "col", "sq_norm",
                                               "l1_norm"], "")
    assert sorted(norms["step"].unique()) == list(range(6))
    skew = pd.read_csv(g / "skew.csv")
    assert {"pretrained", "random"} == set(skew["source"])
    assert {"column", "row", "element"} <= set(skew["unit"])
    loc = pd.read_csv(g / "locality.csv")
    assert list(loc.columns[:4]) == ["kind", "d", "overlap", "jaccard"]
    assert set(loc["d"]) == {1, 2, 3, 4}
    for name in ("reselection.csv", "spatial.csv", "cumulative.csv", "heatmap.csv"):
        assert len(pd.read_csv(g / name)) > 0
    head = json.loads((g / "summary.json").read_text())
    assert head["steps"] == 6 and "1" in {str(k) for k in head["overlap"]}
    # the figures' layout (zfbench.figures reads these for figures 11 and 12)
    heat = pm.read_table(out / "grad_stats/heatmap.csv", ["weight", "row", "col", "abs_grad"], "")
    cn = pm.read_table(out / "grad_stats/column_norms.csv", ["weight", "step", "col",
                                                             "sq_norm"], "")
    assert len(heat) > 0
    assert pm.topk_overlap(cn, 0.1)["gap"].min() == 1
    assert not (out / ".gradients.tmp").exists()
