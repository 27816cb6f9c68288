"""`python -m zfbench.figures`: every figure from small inputs, missing measured data
reported (not crashed on, not faked), cached data re-plotted, and the style rules
(units on every numeric axis, palettes that stay apart in greyscale).

The simulated figures run in `--quick` mode (2-layer slices, short sweeps); the measured
inputs of figures 10-14 are fabricated here in the layout `analysis/plot_measured.py`
documents, so the test also pins that layout.
"""

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import zfbench.figures.command as figures
import zfbench.figures.data as figures_data
from zfbench.analysis import plot_measured as pm
from zfbench.analysis import plots as pl
from zfbench.analysis.plot_index import FIGURES, FigureData, draw_one
from zfbench.analysis.plot_sweeps import SERIES_STYLE


def write_measured(root: Path) -> dict:
    """Small measured inputs in the documented layout; returns the numbers they hold."""
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    # as `python -m zfbench.validate` writes it: baselines repeated for each zenflow
    # (topk_ratio, update_interval) pair, zenflow once per pair
    cells = []
    for shape, scale in (("host-shorter", 1.0), ("host-longer", 2.0)):
        for pair in ((0.1, 4), (0.25, 2)):
            for strategy, meas, sim, mstall, sstall in (
                    ("device", 0.50, 0.55, 0.05, 0.04), ("zero-offload", 2.00, 1.80, 0.80, 0.78),
                    ("zero-offload-dpu", 1.60, 1.60, 0.70, 0.72),
                    ("zenflow", 0.80 + pair[0], 0.84, 0.30, 0.35)):
                cells.append({"shape": shape, "topk_ratio": pair[0], "update_interval": pair[1],
                              "strategy": strategy, "measured_step_time_s": scale * meas,
                              "simulated_step_time_s": scale * sim,
                              "measured_stall_fraction": mstall,
                              "simulated_stall_fraction": sstall})
    pd.DataFrame(cells).to_csv(root / "validate.csv", index=False)
    (root / "grad_stats").mkdir()
    rows, cols = 16, 40
    hot = [3, 17, 29, 33]  # a few columns carry most of the gradient, step after step
    heat = np.abs(rng.normal(size=(rows, cols)))
    heat[:, hot] *= 20
    r, c = np.meshgrid(range(rows), range(cols), indexing="ij")
    pd.DataFrame({"weight": "layers.0.q_proj", "row": r.ravel(), "col": c.ravel(),
                  "abs_grad": heat.ravel()}).to_csv(root / "grad_stats/heatmap.csv", index=False)
    norms = []
    for weight in ("layers.0.q_proj", "layers.0.down_proj"):
        for step in range(6):
            v = rng.random(cols)
            v[hot] += 50
            norms.append(pd.DataFrame({"weight": weight, "step": step, "col": range(cols),
                                       "sq_norm": v}))
    pd.concat(norms).to_csv(root / "grad_stats/column_norms.csv", index=False)
    (root / "accuracy").mkdir()
    for i, strategy in enumerate(("device", "zero-offload-dpu", "zenflow")):
        with open(root / f"accuracy/{strategy}.steps.jsonl", "w") as handle:
            for step in range(40):
                loss = 5.0 * np.exp(-step / 15) + 1.0 + 0.01 * i + 0.02 * rng.random()
                handle.write(json.dumps({"step": step, "loss": loss, "skipped": False}) + "\n")
    # as `python -m zfbench.accuracy` writes it: a pretrained reference and a variant
    # without a curve, which the figure leaves out
    pd.DataFrame({"strategy": ["pretrained", "device", "zero-offload-dpu",
                               "zenflow-k0.05-u4", "zenflow"],
                  "metric": "heldout_perplexity", "value": [30.0, 21.0, 21.4, 22.0, 21.2]}
                 ).to_csv(root / "accuracy/quality.csv", index=False)
    (root / "auto_interval").mkdir()
    lengths = [1, 2, 2, 3, 4, 4, 5, 4]
    pd.DataFrame({"window": range(len(lengths)), "length_steps": lengths}).to_csv(
        root / "auto_interval/windows.csv", index=False)
    write_run(root / "run")
    return {"windows": len(lengths), "mean_window": float(np.mean(lengths)),
            "validate_cells": 2 * 5}  # per shape: three baselines, zenflow at two pairs


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two runs into one directory: all figures without measured data, then figure 2 and
    the measured ones with it (`--only`, the simulator disabled, so figure 2 must come
    from the cached CSVs, and the README must keep the first run's entries). Every
    figure saved is kept, to check its axes."""
    out = tmp_path_factory.mktemp("figs")
    saved = {}
    original_save, original_simulate = pl.save_figure, figures_data.simulate

    def keep(fig, out_dir, stem, png_dpi=None):
        saved[stem] = fig
        return original_save(fig, out_dir, stem, png_dpi)

    def no_simulation(*args, **kwargs):
        raise AssertionError("the second run re-simulated although the CSVs were cached")

    pl.save_figure = keep
    try:
        rc_missing = figures.main(["--quick", "--quiet", "--no-measure", "--out", str(out), "--measured",
                                   str(out / "no-measured")])
        readme_missing = (out / "README.md").read_text()
        pngs_missing = sorted(p.name for p in out.glob("*.png"))
        measured = out / "measured"
        numbers = write_measured(measured)
        figures_data.simulate = no_simulation
        rc = figures.main(["--quick", "--quiet", "--no-measure", "--out", str(out), "--measured",
                           str(measured), "--only", "2,10,11,12,13,14,15"])
    finally:
        pl.save_figure, figures_data.simulate = original_save, original_simulate
    return {"out": out, "measured": measured, "numbers": numbers, "rc": rc, "saved": saved,
            "rc_missing": rc_missing, "readme_missing": readme_missing,
            "pngs_missing": pngs_missing, "readme": (out / "README.md").read_text()}


def test_every_figure_is_produced_as_png_and_pdf(built):
    assert built["rc"] == 0
    out = built["out"]
    for spec in FIGURES:
        for ext in ("png", "pdf"):
            path = out / f"{spec.stem}.{ext}"
            assert path.exists() and path.stat().st_size > 5000, path
    readme = built["readme"]
    assert readme.count("**Shows.**") == len(FIGURES) == 18
    for line in readme.splitlines():  # each sentence quotes numbers and ends
        if line.startswith("- **Shows.**"):
            assert re.search(r"\d", line) and line.endswith("."), line
    assert "Not drawn" not in readme
    for spec in FIGURES:
        assert f"## Figure {spec.number}: {spec.title}" in readme
        assert f"![Figure {spec.number}]({spec.stem}.png)" in readme


def test_missing_measured_data_is_reported_with_its_command(built):
    assert built["rc_missing"] == 0
    readme = built["readme_missing"]
    assert readme.count("**Not drawn: data missing.**") == 6
    for command in ("python -m zfbench.validate", "python -m zfbench.gradients",
                    "python -m zfbench.accuracy", "python -m zfbench.run --model llama2-7b"):
        assert command in readme
    for spec in FIGURES:
        drawn = f"{spec.stem}.png" in built["pngs_missing"]
        assert drawn == (not spec.measured), spec.stem


def test_readme_numbers_are_read_from_the_data(built):
    out, readme = built["out"], built["readme"]
    traffic = pd.read_csv(out / "data/selection_traffic.csv")
    assert f"{traffic['ratio'].max():,.0f}x" in readme
    breakdown = pd.read_csv(out / "data/breakdown.csv").set_index(["node", "model", "strategy"])
    speedups = [breakdown.loc[(n, m, "zero-offload"), "step_time_s"] /
                breakdown.loc[(n, m, "zenflow"), "step_time_s"]
                for n, m, _ in breakdown.index if _ == "zenflow"]
    assert f"{max(speedups):.2f}x" in readme and f"{min(speedups):.2f}x" in readme
    n = built["numbers"]
    assert f"closed {n['windows']} windows" in readme
    assert f"Over {n['validate_cells']} measured cells (2 case(s))" in readme
    assert "held-out perplexity is device (no offload) 21.000, ZeRO-Offload + DPU 21.400, " \
        "ZenFlow 21.200 (before fine-tuning 30.000); ZenFlow minus device: +0.200" in readme
    assert f"mean {n['mean_window']:.1f}" in readme
    # every simulated dataset carries the settings that made it
    for name in ("timeline", "breakdown", "sweep_update_interval", "sweep_topk_ratio",
                 "scaling", "selection_traffic"):
        assert (out / f"data/{name}.spec.json").exists()


def test_changed_settings_make_the_cache_stale(built):
    data_dir = built["out"] / "data"
    quick = figures.datasets(figures.QUICK)
    assert all(figures.is_fresh(data_dir, ds) for ds in quick.values())
    full = figures.datasets(figures.FULL)
    assert not figures.is_fresh(data_dir, full["breakdown"])


def _has_unit(label: str) -> bool:
    return bool(re.search(r"\(.+\)", label))


NUMBER = re.compile(r"^\s*[-+\u2212]?\d[\d.,]*\s*[kMGTPmun]?[A-Za-z/%]*\s*$|^\$.*\$$")


def _is_numeric(axis) -> bool:
    """Tick labels that read as numbers (with an SI prefix or unit) make a numeric axis;
    names (lanes, models, strategies) make a categorical one, which needs no unit."""
    texts = [t for t in axis.get_major_formatter().format_ticks(axis.get_majorticklocs()) if t]
    return bool(texts) and all(NUMBER.match(t) for t in texts)


@pytest.mark.parametrize("spec", FIGURES, ids=lambda s: s.stem)
def test_every_numeric_axis_has_a_unit(built, spec):
    fig = built["saved"][spec.stem]
    sup = [t for t in (fig.get_supxlabel(), fig.get_supylabel()) if t]
    for ax in fig.axes:
        for axis, siblings in ((ax.xaxis, ax.get_shared_x_axes()),
                               (ax.yaxis, ax.get_shared_y_axes())):
            if not axis.get_visible() or not ax.get_visible() or not _is_numeric(axis):
                continue
            labels = [axis.get_label_text()] + [
                (s.xaxis if axis is ax.xaxis else s.yaxis).get_label_text()
                for s in siblings.get_siblings(ax)] + sup
            assert any(_has_unit(label) for label in labels), (spec.stem, axis.axis_name, labels)


def test_palettes_stay_apart_in_greyscale():
    for palette in (pl.STRATEGY_STYLE, pl.PART_STYLE, SERIES_STYLE):
        items = list(palette.values())
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                apart = abs(pl.luminance(a["color"]) - pl.luminance(b["color"])) >= 0.09
                other_cue = a.get("hatch") != b.get("hatch") or \
                    a.get("linestyle") != b.get("linestyle")
                assert apart and other_cue, (a["label"], b["label"])
    assert pl.STYLE_FILE.exists()


def test_bad_measured_input_is_reported_not_drawn(tmp_path):
    (tmp_path / "m").mkdir()
    pd.DataFrame({"strategy": ["zenflow"], "step_s": [1.0]}).to_csv(
        tmp_path / "m/validate.csv", index=False)
    data = FigureData(tmp_path / "data", tmp_path / "m", figures.meta(figures.QUICK))
    outcome = draw_one(FIGURES[9], data, tmp_path)
    assert outcome.status == "bad" and "measured_step_time_s" in outcome.text
    assert not list(tmp_path.glob("*.png"))
    with pytest.raises(pm.MissingData, match="validate"):
        pm.load_validate(tmp_path / "nowhere.csv", "python -m zfbench.validate")


def write_run(run: Path) -> None:
    """A first-command run in the documented layout: measured rows of a proxy, then the
    projected rows of the named model, and summary.json naming the proxy."""
    run.mkdir(parents=True)
    rows = []
    for projected, steps in ((False, (0.6, 1.2, 1.4, 0.9)), (True, (0.44, 2.17, 1.79, 0.65))):
        for strategy, step in zip(("device", "zero-offload", "zero-offload-dpu", "zenflow"),
                                  steps):
            rows.append({"strategy": strategy, "step_time_s": step, "compute_s": 0.3,
                         "exposed_io_s": step / 4, "host_wait_s": step / 2, "ranks": 4,
                         "model": "llama2-7b" if projected else None,
                         "projected": projected or None})
    pd.DataFrame(rows).to_csv(run / "summary.csv", index=False)
    (run / "summary.json").write_text(json.dumps({"proxy": {"measured": "llama2-7b[4L][w0.25]",
                                                            "model": "llama2-7b"}}))


def test_figure_15_reads_the_first_commands_measured_and_projected_rows(built):
    from zfbench.analysis import plot_run as pr

    measured, there, proxy = pr.load_run(built["measured"] / "run" / "summary.csv", "cmd")
    facts = pr.run_facts(measured, there, proxy)
    assert facts["here"] == pytest.approx(0.9 / 1.2)
    assert facts["there"] == pytest.approx(0.65 / 2.17)
    assert (built["out"] / "fig15_first_command.png").stat().st_size > 10_000
    readme = (built["out"] / "README.md").read_text()
    assert "ZenFlow's step is 0.75x ZeRO-Offload's (llama2-7b[4L][w0.25], 4 rank(s))" in readme
    assert "it is 0.30x (simulated)" in readme
