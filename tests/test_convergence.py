"""bench/convergence.py and bench/convergence_ablation.py (issue 28): the plateau rule, the
variant names, the topic-classification task's construction and its classifier head, and
the ablation's paired differences. No pretrained model: the head is checked on a tiny
randomly initialized Llama (needs `transformers`, the real-model extra)."""

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import convergence as cv  # noqa: E402
import convergence_ablation as ab  # noqa: E402
from zfbench.real import topic_task as tt  # noqa: E402


def test_plateau_stops_after_patience_evals_without_enough_improvement():
    stop = cv.Plateau(patience=2, min_delta=0.1, min_steps=0)
    # 3.0 -> 2.5 improves; 2.45 is better but by less than min_delta: counts as no gain
    assert [stop.update(s, v) for s, v in ((10, 3.0), (20, 2.5), (30, 2.45), (40, 2.6))] \
        == [False, False, False, True]
    assert stop.best == pytest.approx(2.45) and stop.best_step == 30


def test_plateau_waits_for_min_steps_and_resets_on_real_gain():
    stop = cv.Plateau(patience=1, min_delta=0.0, min_steps=30)
    assert not stop.update(10, 1.0)
    assert not stop.update(20, 1.0)      # no gain, but before min_steps
    assert not stop.update(30, 0.5)      # a gain resets the count
    assert stop.update(40, 0.7)


def test_variants_parse_to_the_paper_settings_and_knobs():
    assert cv.parse_variant("zero-offload-dpu", 16) == ("zero-offload-dpu", None)
    _, zf = cv.parse_variant("zenflow", 16)
    assert (zf["topk_ratio"], zf["update_interval"], zf["overlap_step"],
            zf["select_interval"]) == (0.1, 4, True, 16)
    _, zf = cv.parse_variant("zenflow-k0.05-u8-s32-ov0", 16)
    assert (zf["topk_ratio"], zf["update_interval"], zf["overlap_step"],
            zf["select_interval"]) == (0.05, 8, False, 32)
    assert cv.parse_variant("zenflow-uauto", 16)[1]["update_interval"] == "auto"
    # a reselection interval below U is raised to U (the config refuses 0 < S < U)
    assert cv.parse_variant("zenflow-u8-s4", 16)[1]["select_interval"] == 8
    assert cv.parse_variant("zenflow-s0", 16)[1]["select_interval"] == 0
    for bad in ("zenflow-x3", "adam", "zenflow-ov2"):
        with pytest.raises(ValueError):
            cv.parse_variant(bad, 16)


def _topics():
    long = lambda tag, i: f"{tag} paragraph number {i} " + "word " * 30  # noqa: E731
    shared = long("shared", 0)
    return {
        "alpha": "\n\n".join([long("alpha", i) for i in range(10)] + [shared, "short"]),
        "beta": "\n\n".join([long("beta", i) for i in range(6)] + [shared]),
        "gamma": "\n\n".join(long("gamma", i) for i in range(4)),
        "delta": "\n\n".join(long("delta", i) for i in range(2)),
    }


def test_topic_task_drops_shared_and_short_paragraphs_and_ranks_classes():
    task = tt.build_task(_topics(), classes=3, min_chars=100, fractions=(0.5, 0.25))
    assert task.classes == ("alpha", "beta", "gamma")      # delta (2 paragraphs) left out
    everything = [t for ex in task.splits.values() for t, _ in ex]
    assert len(everything) == len(set(everything)) == 10 + 6 + 4
    assert not any(t.startswith("shared") for t in everything)
    counts = task.counts()
    # round-half-even: 0.25 * 10 -> 2, 0.25 * 6 -> 2; the rest is test
    assert counts["train"] == [5, 3, 2] and counts["val"] == [2, 2, 1]
    assert counts["test"] == [3, 1, 1]
    for examples in task.splits.values():
        for text, label in examples:
            assert text.startswith(task.classes[label])


def test_topic_split_depends_on_split_seed_only():
    a = tt.build_task(_topics(), classes=3, min_chars=100)
    b = tt.build_task(_topics(), classes=3, min_chars=100)
    c = tt.build_task(_topics(), classes=3, min_chars=100, split_seed=1)
    assert a.splits == b.splits
    assert a.splits["test"] != c.splits["test"]


def test_pydoc_task_has_eight_disjoint_classes():
    task = tt.build_task()
    assert len(task.classes) == 8
    texts = [t for ex in task.splits.values() for t, _ in ex]
    assert len(texts) == len(set(texts)) > 400
    assert min(task.counts()["test"]) >= 3


def test_topic_head_scores_are_the_lm_logits_of_the_label_tokens():
    transformers = pytest.importorskip("transformers")
    from zfbench.real import hf_model as hm
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, tie_word_embeddings=True)
    lm = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (5, 9))
    labels = [3, 17, 40]
    full = lm(input_ids=ids).logits[:, -1, labels]
    for first in (0, 1, 3):
        head = tt.TopicHead(lm, first, labels)
        x = ids if first == 0 else hm.prefix_hidden(lm, ids, first)
        torch.testing.assert_close(head.logits(x), full, rtol=1e-4, atol=1e-5)
    y = torch.tensor([0, 1, 2, 0, 1])
    loss, acc = tt.evaluate(head, [(x[:3], y[:3]), (x[3:], y[3:])])
    assert loss == pytest.approx(float(torch.nn.functional.cross_entropy(full, y)), rel=1e-4)
    assert acc == pytest.approx(float((full.argmax(1) == y).float().mean()))


def test_ablation_differences_are_paired_by_seed():
    rows = []
    for seed, base in enumerate((1.0, 2.0, 3.0)):
        rows += [{"task": "topics", "variant": "zenflow", "seed": seed,
                  "final_val_loss": base, "final_test_acc": 0.5},
                 {"task": "topics", "variant": "zenflow-u1", "seed": seed,
                  "final_val_loss": base - 0.1 * (seed + 1), "final_test_acc": 0.6}]
    table = ab.paired(pd.DataFrame(rows), ["update_interval"])
    u1 = table[table.variant == "zenflow-u1"].iloc[0]
    assert u1["final_val_loss_minus_ref_mean"] == pytest.approx(-0.2)
    assert u1["final_val_loss_minus_ref_std"] == pytest.approx(0.1)
    assert u1["final_test_acc_minus_ref_mean"] == pytest.approx(0.1)
    assert u1["final_val_loss_mean"] == pytest.approx(np.mean([0.9, 1.8, 2.7]))
    assert set(table.variant) == {"zenflow-u1", "zenflow"}  # no device runs: no row


def test_time_to_quality_scales_steps_by_the_simulated_step_time():
    from zfbench.analysis import plot_convergence as pc
    curves = pd.DataFrame([
        {"task": "lm", "variant": v, "seed": seed, "step": step, "val_loss": loss + seed * 0.1}
        for v, losses in (("zero-offload", (3.0, 2.5, 2.0)), ("zenflow", (3.0, 2.6, 2.1)))
        for seed in (0, 1) for step, loss in zip((0, 10, 20), losses)])
    ttq = pc.time_to_quality(curves, {"zero-offload": 36.0, "zenflow": 9.0}, "lm")
    zo = ttq[ttq.variant == "zero-offload"].set_index("step")
    assert zo.loc[20, "hours"] == pytest.approx(20 * 36 / 3600)
    assert zo.loc[10, "val_loss"] == pytest.approx(2.55)          # mean over the seeds
    # both first reach 2.16 at step 20: zenflow after 0.05 h, ZeRO-Offload after 0.2 h
    reach = pc.hours_to_reach(ttq, 2.16)
    assert reach == pytest.approx({"zenflow": 0.05, "zero-offload": 0.2})
    assert np.isnan(pc.hours_to_reach(ttq, 1.0)["zenflow"])


def test_ablation_pool_pairs_runs_from_several_directories(tmp_path):
    row = lambda v, seed, loss: {"task": "topics", "variant": v, "seed": seed,  # noqa: E731
                                 "final_val_loss": loss, "final_test_acc": 0.5}
    first, more, study = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d, rows in ((first, [row("zenflow", 0, 1.0), row("zenflow-ov0", 0, 0.8)]),
                    (more, [row("zenflow-ov0", 1, 0.5)]),
                    (study, [row("zenflow", 0, 9.0), row("zenflow", 1, 0.7),
                             row("zero-offload", 1, 0.1)])):
        d.mkdir()
        pd.DataFrame(rows).to_csv(d / "runs.csv", index=False)
    assert ab.main(["--pool", str(first), str(more), str(study), "--set", "overlap",
                    "--out", str(first)]) == 0
    table = pd.read_csv(first / "ablation.csv")
    ov0 = table[table.variant == "zenflow-ov0"].iloc[0]
    # seed 0 pairs with the first directory's zenflow (1.0, not 9.0), seed 1 with 0.7
    assert ov0["n"] == 2
    assert ov0["final_val_loss_minus_ref_mean"] == pytest.approx(((0.8 - 1.0) + (0.5 - 0.7)) / 2)
    assert "zero-offload" not in set(table.variant)


# ------------------------------------------------------- DeepSpeed's own ZenFlow (issue 28)
import ds_engines as dse  # noqa: E402  (imports torch only; deepspeed lazily)


def test_deepspeed_variants_parse_to_the_same_settings_as_zfbench_ones():
    assert cv.is_deepspeed("deepspeed-zenflow") and not cv.is_deepspeed("zenflow")
    assert cv.parse_variant("deepspeed-zenflow", 16) == cv.parse_variant("zenflow", 16)
    assert cv.parse_variant("deepspeed-zenflow-ov0", 16)[1]["overlap_step"] is False
    assert cv.parse_variant("deepspeed-zero-offload", 16) == ("zero-offload", None)
    for bad in ("deepspeed-device", "deepspeed-zero-offload-dpu", "deepspeed-adam"):
        with pytest.raises(ValueError):
            cv.parse_variant(bad, 16)


def test_paper_zenflow_maps_key_for_key_to_deepspeed_and_notes_the_overlap_lag():
    _, zf = cv.parse_variant("zenflow", 16)
    section, notes = dse.deepspeed_zenflow_section(zf)
    assert section == {"topk_ratio": 0.1, "update_interval": 4, "overlap_step": True,
                       "select_strategy": "step", "select_interval": 16,
                       "full_warm_up_rounds": 0}
    assert len(notes) == 1 and "two sets" in notes[0] and "first window" in notes[0]
    # overlap off: nothing DeepSpeed reads differently
    assert dse.deepspeed_zenflow_section(cv.parse_variant("zenflow-ov0", 16)[1])[1] == []
    with pytest.raises(ValueError, match="auto"):   # DeepSpeed refuses; zfbench reads steps
        dse.deepspeed_zenflow_section({"select_strategy": "auto", "select_interval": 16})
    with pytest.raises(ValueError, match="importance"):
        dse.deepspeed_zenflow_section({"topk_ratio": 0.1, "importance": "l2sq"})


def test_deepspeed_config_drops_zfbench_section_and_zenflow_for_zero_offload():
    _, zf = cv.parse_variant("zenflow", 16)
    cfg = dse.ds_config(8, zf, 3e-4, 0.01, 1.0)
    assert "zfbench" not in cfg and cfg["gradient_clipping"] == 1.0
    assert cfg["zero_optimization"]["zenflow"]["select_interval"] == 16
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert cfg["optimizer"]["params"] == {"lr": 3e-4, "weight_decay": 0.01}
    zo = dse.ds_config(8, None, 3e-4, 0.01, 1.0, strategy="zero-offload")
    assert "zenflow" not in zo["zero_optimization"]
    assert zo["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    with pytest.raises(ValueError):
        dse.ds_config(8, None, 3e-4, 0.01, 1.0, strategy="device")


def test_missing_deepspeed_names_the_extra(monkeypatch, capsys):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")             # restored afterwards
    monkeypatch.setitem(sys.modules, "deepspeed", None)   # import deepspeed -> ImportError
    with pytest.raises(SystemExit) as exit_:
        dse.import_deepspeed(any_version=False)
    assert exit_.value.code == 2
    assert ".[deepspeed]" in capsys.readouterr().err


def test_append_replaces_same_runs_keeps_others_and_backfills_the_stop_eval():
    run = lambda v, seed, loss: {"task": "topics", "variant": v, "seed": seed,  # noqa: E731
                                 "final_val_loss": loss}
    old = pd.DataFrame([run("device", 0, 0.6), run("zenflow", 0, 0.7),
                        run("deepspeed-zenflow", 0, 9.9)])
    new = pd.DataFrame([{**run("deepspeed-zenflow", 0, 0.8), "stop_val_loss": 0.85,
                         "stop_test_acc": 0.5}])
    merged = cv.merge(old, new)
    assert list(merged.variant) == ["device", "zenflow", "deepspeed-zenflow"]
    assert merged.final_val_loss.tolist() == [0.6, 0.7, 0.8]
    curves = pd.DataFrame([
        {"task": "topics", "variant": v, "seed": 0, "step": s, "val_loss": l, "test_acc": a}
        for v, pts in (("device", ((10, 0.9, 0.4), (20, 0.65, 0.6))),
                       ("zenflow", ((20, 0.72, 0.7), (10, 1.0, 0.3))))
        for s, l, a in pts])
    filled = cv.backfill_stop(merged, curves).set_index("variant")
    assert filled.loc["device", "stop_val_loss"] == 0.65        # the last step's, not 0.9
    assert filled.loc["zenflow", "stop_test_acc"] == 0.7
    assert filled.loc["deepspeed-zenflow", "stop_val_loss"] == 0.85   # kept as written
    assert cv.stop_metrics({"val_loss": 1.5, "step": 3}) == {"stop_val_loss": 1.5}


def test_figure_draws_deepspeed_runs_beside_zfbench_ones_in_the_base_colour(tmp_path):
    from zfbench.analysis import plot_convergence as pc
    zf, ds = pc.style("zenflow"), pc.style("deepspeed-zenflow")
    assert ds["color"] == zf["color"] and ds["hatch"] and ds["hatch"] != zf.get("hatch")
    assert ds["label"] == f"DeepSpeed {zf['label']}"
    assert pc.short_label("deepspeed-zero-offload") == "DeepSpeed\nZeRO-Offload"
    rows = [{"task": "topics", "variant": v, "seed": s, "final_val_loss": 0.5 + s,
             "final_test_acc": 0.7, "step": 10, "val_loss": 0.5}
            for v in ("device", "deepspeed-zenflow", "deepspeed-zenflow-ov0", "zenflow")
            for s in (0, 1)]
    pd.DataFrame(rows).to_csv(tmp_path / "runs.csv", index=False)
    pd.DataFrame(rows).to_csv(tmp_path / "curves.csv", index=False)
    runs, _ = pc.load(tmp_path)
    table = pc.per_strategy(runs, "topics", "final_val_loss")
    # the ablation variant stays out; DeepSpeed's ZenFlow comes after zfbench's
    assert list(table.index) == ["device", "zenflow", "deepspeed-zenflow"]
    assert table.loc["deepspeed-zenflow", "mean"] == pytest.approx(1.0)


def test_lag1_is_a_deepspeed_zenflow_only_knob_with_the_same_settings():
    assert cv.parse_variant("deepspeed-zenflow-lag1", 16) == cv.parse_variant("zenflow", 16)
    assert cv.parse_variant("deepspeed-zenflow-u8-lag1", 16)[1]["update_interval"] == 8
    for bad in ("deepspeed-zero-offload-lag1", "zenflow-lag1"):
        with pytest.raises(ValueError):
            cv.parse_variant(bad, 16)
