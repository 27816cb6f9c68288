"""Figure 17 (analysis/plot_convergence.py, issue 47): panel (b) draws the LM task's
three-seed run from pretrained weights (bench/results/convergence_lm/), not the one-seed
LM runs of bench/results/convergence/, and (a) and (b) draw each strategy's mean with its
min-max interval over seeds. Read from the committed results; no model, no simulation."""

import csv
from pathlib import Path
from statistics import mean

import pandas as pd
import pytest

from zfbench.analysis import plot_convergence as pc
from zfbench.analysis.plot_index import FigureData, fig_convergence
from zfbench.analysis.plot_measured import MissingData
from zfbench.figures.command import CONVERGENCE_LM_RESULTS, CONVERGENCE_RESULTS, FULL, meta


def _lm_seeds() -> dict[str, list[float]]:
    """final_val_loss (nats/token) per variant, read straight from convergence_lm/runs.csv."""
    seeds: dict[str, list[float]] = {}
    with open(CONVERGENCE_LM_RESULTS / "runs.csv") as fh:
        for row in csv.DictReader(fh):
            seeds.setdefault(row["variant"], []).append(float(row["final_val_loss"]))
    return seeds


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Figure 17 drawn the way `python -m zfbench.figures --only 17` draws it, with made-up
    simulated step times (they only move panel (c))."""
    data_dir = tmp_path_factory.mktemp("data")
    pd.DataFrame({"strategy": ["device", "zero-offload", "zero-offload-dpu", "zenflow"],
                  "step_time_s": [0.4, 2.0, 1.8, 0.6]}).to_csv(
        data_dir / "convergence_steps.csv", index=False)
    info = {**meta(FULL), "where": "test node"}
    return fig_convergence(FigureData(data_dir, data_dir, info))


def test_meta_points_figure_17_at_both_committed_runs():
    info = meta(FULL)
    assert Path(info["convergence_dir"]) == CONVERGENCE_RESULTS
    assert Path(info["convergence_lm_dir"]).name == "convergence_lm"
    assert (Path(info["convergence_lm_dir"]) / "runs.csv").exists()


def test_lm_rows_are_convergence_lm_three_seeds_per_strategy():
    runs, curves = pc.load_study(CONVERGENCE_RESULTS, CONVERGENCE_LM_RESULTS)
    table = pc.per_strategy(runs, "lm", "final_val_loss")
    seeds = _lm_seeds()
    assert list(table.index) == ["device", "zenflow"]
    assert table["n"].tolist() == [3, 3]
    for v, values in seeds.items():
        assert table.loc[v, "mean"] == pytest.approx(mean(values), abs=1e-12)
        assert (table.loc[v, "min"], table.loc[v, "max"]) == (min(values), max(values))
    # convergence/'s one-seed LM runs (device 3.4715 from the wrong weights) are gone
    assert sorted(runs[runs.task == "lm"]["final_val_loss"]) == sorted(
        x for values in seeds.values() for x in values)
    assert set(curves[curves.task == "lm"]["seed"]) == {0, 1, 2}
    # the topic task still comes from convergence/, 3 seeds per strategy
    assert set(pc.per_strategy(runs, "topics", "final_test_acc")["n"]) == {3}


def _dots(ax) -> dict[float, tuple[float, float, float]]:
    """x -> (mean, low, high) of each dot and interval drawn on `ax`."""
    out = {}
    for container in ax.containers:
        line, _, (bars, *_) = container.lines
        (x, y), = line.get_xydata()
        (_, lo), (_, hi) = bars.get_segments()[0]
        out[float(x)] = (float(y), float(lo), float(hi))
    return out


def test_panel_b_plots_the_mean_and_min_max_of_the_three_seeds(drawn):
    fig, sentence = drawn
    ax = fig.axes[1]
    assert ax.get_title().startswith("(b)") and "3 seeds" in ax.get_title()
    assert "nats/token" in ax.get_ylabel() and "min-max" in ax.get_ylabel()
    seeds = _lm_seeds()
    dots = _dots(ax)
    for x, v in enumerate(("device", "zenflow")):
        m, lo, hi = dots[float(x)]
        assert m == pytest.approx(mean(seeds[v]), abs=1e-9)
        assert (lo, hi) == pytest.approx((min(seeds[v]), max(seeds[v])), abs=1e-9)
    assert len(dots) == 2
    # the dotted line at the pretrained model's loss, from convergence_lm/summary.json
    start = pc.start_scores(CONVERGENCE_RESULTS, CONVERGENCE_LM_RESULTS)["loss"]
    assert start == pytest.approx(3.7935, abs=1e-4)
    assert any(line.get_ydata()[0] == pytest.approx(start) for line in ax.get_lines())
    assert f"device (no offload) {mean(seeds['device']):.3f}" in sentence
    assert f"ZenFlow {mean(seeds['zenflow']):.3f}" in sentence


def test_panel_a_plots_the_topic_accuracy_of_convergence_in_percent(drawn):
    fig, _ = drawn
    runs, _ = pc.load(CONVERGENCE_RESULTS)
    acc = runs[runs.task == "topics"].groupby("variant")["final_test_acc"]
    dots = _dots(fig.axes[0])
    assert len(dots) == len(acc)
    m, lo, hi = dots[0.0]  # device, first in ORDER
    assert (m, lo, hi) == pytest.approx((100 * acc.mean()["device"], 100 * acc.min()["device"],
                                         100 * acc.max()["device"]))


def test_a_missing_lm_run_names_its_command(tmp_path):
    with pytest.raises(MissingData) as err:
        pc.load_study(CONVERGENCE_RESULTS, tmp_path)
    assert err.value.path == tmp_path / "runs.csv"
    assert "--out bench/results/convergence_lm" in err.value.command
