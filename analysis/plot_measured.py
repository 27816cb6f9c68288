"""Figures from measured files (paper figures 10-14): the file layouts, loaders, plots.

Covers: the file layout of every measured input, its loaders, and the figures for
measured vs simulated step time and stall (10), a gradient heatmap and the share of
squared norm held by the top columns (11), and temporal locality of the top-k column sets
(12). Loss curves (13) and the adaptive update interval (14) are in
`zfbench.analysis.plot_training`.

Every input lives under one directory (`zfbench.figures --measured DIR`, by default
`paper_figures/data/measured/`); a `.csv` may be replaced by a `.parquet` of the same
stem (read when pandas has a Parquet engine). The layouts (`validate.csv`,
`grad_stats/heatmap.csv`, `grad_stats/column_norms.csv`, `accuracy/<strategy>.steps.jsonl`,
`accuracy/quality.csv`, `auto_interval/windows.csv`), each with its columns, the command
that writes it and the forms accepted, are described beside `LAYOUT`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from zfbench.analysis.gradstats import overlap_pairs
from zfbench.analysis.plots import STRATEGY_STYLE, log_log_axes, new_figure, with_style

# The layout of each measured input, in detail (the figures command and its README point
# here; LAYOUT and LAYOUT_COLUMNS below are what the loaders check):
#
#     validate.csv                    fig 10, written by `python -m zfbench.validate --out DIR`
#         one row per case and strategy: strategy, measured_step_time_s,
#         simulated_step_time_s, measured_stall_fraction, simulated_stall_fraction,
#         optional case (a label of the configuration; default: the `shape` column
#         validate writes) and topk_ratio, update_interval (tell zenflow rows apart).
#         Also accepted in long form: strategy, source ("measured" | "simulated"),
#         step_time_s, stall_fraction, case.
#     grad_stats/heatmap.csv          fig 11: weight, row, col, abs_grad
#         |gradient| of one or more 2-D weights at one step (row, col may be block indices
#         of a pooled matrix); the figure shows the first weight in the file.
#     grad_stats/column_norms.csv     figs 11, 12: weight, step, col, sq_norm
#         squared L2 norm of each column's gradient (sum over rows of g^2), for every column
#         of each weight at each recorded step.
#     accuracy/<strategy>.steps.jsonl fig 13: one JSON object per line with `loss` (the
#         per-step JSONL `python -m zfbench.run --out DIR` writes), for any of device,
#         zero-offload, zero-offload-dpu, zenflow.
#     accuracy/quality.csv            fig 13, optional: strategy, metric, value (e.g.
#         heldout_perplexity, as `python -m zfbench.accuracy` writes it; a `pretrained`
#         row is drawn as the before-fine-tuning line); without it the final quality is
#         the mean training loss of the last 10 % of steps.
#     auto_interval/windows.csv       fig 14: window, length_steps, optional end_step
#         (the iteration whose end closed the window; default: running sum of lengths - 1).
LAYOUT = {
    "validate": "validate.csv",
    "heatmap": "grad_stats/heatmap.csv",
    "column_norms": "grad_stats/column_norms.csv",
    "accuracy": "accuracy/",
    "quality": "accuracy/quality.csv",
    "windows": "auto_interval/windows.csv",
    "run": "run/summary.csv",
}

LAYOUT_COLUMNS = {
    "validate": "strategy, measured_step_time_s, simulated_step_time_s, "
                "measured_stall_fraction, simulated_stall_fraction[, case or shape, "
                "topk_ratio, update_interval] (as `zfbench.validate` writes; or long form: "
                "strategy, source, step_time_s, stall_fraction[, case])",
    "heatmap": "weight, row, col, abs_grad (one step; first weight shown)",
    "column_norms": "weight, step, col, sq_norm (every column of each weight, each step)",
    "accuracy": "<strategy>.steps.jsonl: one JSON object per step with `loss`",
    "quality": "optional: strategy, metric, value",
    "windows": "window, length_steps[, end_step]",
    "run": "strategy, step_time_s, compute_s, exposed_io_s, host_wait_s[, ranks, model, "
           "projected] (as `zfbench.run --out DIR/run` writes; summary.json beside it "
           "names the proxy)",
}


class MissingData(FileNotFoundError):
    """A measured input is absent; says which file and which command makes it."""

    def __init__(self, path: Path, command: str) -> None:
        super().__init__(f"{path} is missing; make it with: {command}")
        self.path, self.command = path, command


class BadData(ValueError):
    """A measured input is present but does not follow the documented layout."""


def _find(path: Path) -> Path | None:
    for candidate in (path, path.with_suffix(".parquet")):
        if candidate.exists():
            return candidate
    return None


def read_table(path: Path, columns: list[str], command: str) -> pd.DataFrame:
    """Read `path` (or its .parquet twin), checking the required columns are present."""
    found = _find(Path(path))
    if found is None:
        raise MissingData(Path(path), command)
    frame = pd.read_parquet(found) if found.suffix == ".parquet" else pd.read_csv(found)
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BadData(f"{found}: missing column(s) {missing}; expected {columns}")
    if frame.empty:
        raise BadData(f"{found}: no rows")
    return frame


def ordered_strategies(frame: pd.DataFrame) -> list[str]:
    present = list(dict.fromkeys(frame["strategy"]))
    return [s for s in STRATEGY_STYLE if s in present] + \
        [s for s in present if s not in STRATEGY_STYLE]


def strategy_style(strategy: str) -> dict:
    return STRATEGY_STYLE.get(strategy, dict(color="#777777", marker="x", linestyle="-",
                                             hatch="", label=strategy))


# -- figure 10: measured vs simulated -------------------------------------------------
def load_validate(path: Path, command: str) -> pd.DataFrame:
    """Wide rows (one per case and strategy); `case` defaults to `shape` (what
    `zfbench.validate` writes) or "this machine"; rows repeated for several (topk_ratio,
    update_interval) pairs with the same measurement are kept once, and zenflow rows of
    different pairs are told apart in `label`."""
    found = _find(Path(path))
    if found is not None:
        head = pd.read_parquet(found) if found.suffix == ".parquet" else pd.read_csv(found)
        if "source" in head.columns:  # long form
            long = read_table(path, ["strategy", "source", "step_time_s", "stall_fraction"],
                              command)
            if "case" not in long.columns:
                long["case"] = "this machine"
            wide = long.pivot_table(index=["case", "strategy"], columns="source",
                                    values=["step_time_s", "stall_fraction"], sort=False)
            wide.columns = [f"{src}_{val}" for val, src in wide.columns]
            return _labelled(wide.reset_index())
    df = read_table(path, ["strategy", "measured_step_time_s", "simulated_step_time_s",
                           "measured_stall_fraction", "simulated_stall_fraction"], command)
    if "case" not in df.columns:
        df["case"] = df["shape"] if "shape" in df.columns else "this machine"
    df = df.drop_duplicates(["case", "strategy", "measured_step_time_s"])
    return _labelled(df.reset_index(drop=True))


def _labelled(df: pd.DataFrame) -> pd.DataFrame:
    label = df["strategy"].map(lambda s: strategy_style(s)["label"])
    repeated = df.duplicated(["case", "strategy"], keep=False)
    if repeated.any() and {"topk_ratio", "update_interval"} <= set(df.columns):
        label = label.where(~repeated, label + df["topk_ratio"].map(lambda k: f" (top-k {k:g}")
                            + df["update_interval"].map(lambda u: f", U={u:g})"))
    return df.assign(label=label)


def validate_facts(df: pd.DataFrame) -> dict:
    delta = 100 * (df["simulated_step_time_s"] / df["measured_step_time_s"] - 1)
    stall_pp = 100 * (df["simulated_stall_fraction"] - df["measured_stall_fraction"])
    worst = int(np.argmax(np.abs(delta.to_numpy())))
    return {"rows": len(df), "cases": int(df["case"].nunique()),
            "step_mape_pct": float(np.abs(delta).mean()),
            "step_delta_abs_max_pct": float(np.abs(delta).max()),
            "step_delta_worst": f"{df['label'].iloc[worst]}, {df['case'].iloc[worst]}",
            "stall_mae_pp": float(np.abs(stall_pp).mean()),
            "stall_delta_abs_max_pp": float(np.abs(stall_pp).max())}


@with_style
def plot_validation(df: pd.DataFrame, caption: str = "") -> Figure:
    """Simulated against measured, one point per case and strategy, on the y = x line."""
    fig, axes = new_figure(1, 2, figsize=(7.2, 4.2))
    specs = ((axes[0, 0], "step_time_s", 1e3, "step time (ms)", True),
             (axes[0, 1], "stall_fraction", 100.0, "GPU stall (% of step)", False))
    for ax, col, scale, what, log in specs:
        m, sim = scale * df[f"measured_{col}"], scale * df[f"simulated_{col}"]
        for label in dict.fromkeys(df["label"]):
            rows = df["label"] == label
            st = strategy_style(df.loc[rows, "strategy"].iloc[0])
            variant = label != st["label"]
            ax.plot(m[rows], sim[rows], linestyle="none", marker=st["marker"], color=st["color"],
                    markerfacecolor="white" if variant else st["color"], markersize=6,
                    label=label)
        lo = float(min(m.min(), sim.min()))
        hi = float(max(m.max(), sim.max()))
        if log:
            lo, hi = max(lo, 1e-6) / 1.5, hi * 1.5
            log_log_axes(ax)
            grid = np.geomspace(lo, hi, 50)
            ax.fill_between(grid, grid / 1.25, grid * 1.25, color="#DDDDDD", linewidth=0,
                            label="within 25%")
        else:
            lo, hi = 0.0, max(hi * 1.1, 1.0)
            grid = np.linspace(lo, hi, 50)
            ax.fill_between(grid, grid - 10, grid + 10, color="#DDDDDD", linewidth=0,
                            label="within 10 points")
        ax.plot(grid, grid, color="#222222", linestyle="--", linewidth=0.9,
                label="simulated = measured")
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(f"measured {what}")
        ax.set_ylabel(f"simulated {what}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    extra = axes[0, 1].get_legend_handles_labels()
    for h, lab in zip(*extra):
        if lab not in labels:
            handles.append(h)
            labels.append(lab)
    fig.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=7)
    fig.suptitle(caption or f"Measured vs simulated on this machine ({df['case'].nunique()} "
                 f"case(s))", fontsize=9.5, fontweight="bold")
    return fig


# -- figure 11: gradient concentration ------------------------------------------------
def cumulative_share(norms: pd.DataFrame) -> pd.DataFrame:
    """Per (weight, step): the share of the squared norm held by the top-x columns
    (from x = 0, share 0, to x = 1, share 1)."""
    parts = []
    for (weight, step), g in norms.groupby(["weight", "step"], sort=False):
        v = np.sort(g["sq_norm"].to_numpy(float))[::-1]
        total = v.sum()
        share = np.cumsum(v) / total if total > 0 else np.zeros(len(v))
        parts.append(pd.DataFrame({"weight": weight, "step": step,
                                   "top_fraction": np.arange(0, len(v) + 1) / len(v),
                                   "share": np.append(0.0, share)}))
    return pd.concat(parts, ignore_index=True)


def share_at(curves: pd.DataFrame, fraction: float) -> pd.Series:
    """Share held by the top `fraction` of columns, per (weight, step)."""
    return curves.groupby(["weight", "step"], sort=False).apply(
        lambda g: float(np.interp(fraction, g["top_fraction"], g["share"])),
        include_groups=False)


def concentration_facts(norms: pd.DataFrame, topk_ratio: float) -> dict:
    at = share_at(cumulative_share(norms), topk_ratio)
    return {"topk_pct": 100 * topk_ratio, "share_mean_pct": 100 * float(at.mean()),
            "share_min_pct": 100 * float(at.min()), "share_max_pct": 100 * float(at.max()),
            "weights": int(norms["weight"].nunique()), "steps": int(norms["step"].nunique())}


@with_style
def plot_gradient_concentration(heat: pd.DataFrame, norms: pd.DataFrame, topk_ratio: float,
                                caption: str = "") -> Figure:
    fig, axes = new_figure(1, 2, figsize=(7.4, 3.4), width_ratios=[1.1, 1.0])
    ax, cum = axes[0, 0], axes[0, 1]
    weight = heat["weight"].iloc[0]
    one = heat[heat["weight"] == weight]
    grid = one.pivot_table(index="row", columns="col", values="abs_grad", aggfunc="mean")
    image = ax.imshow(grid.to_numpy(float), aspect="auto", interpolation="nearest",
                      cmap="viridis", origin="upper")
    bar = fig.colorbar(image, ax=ax, shrink=0.9)
    bar.set_label("|gradient| (loss per unit of weight)")
    ax.set_xlabel("input column (index)")
    ax.set_ylabel("output row (index)")
    short = weight if len(weight) <= 34 else "..." + weight[-31:]
    ax.set_title(f"|gradient| of {short}", fontsize=8.5)
    ax.grid(False)
    curves = cumulative_share(norms)
    for _, g in curves.groupby(["weight", "step"], sort=False):
        cum.plot(100 * g["top_fraction"], 100 * g["share"], color="#BBBBBB", linewidth=0.6)
    grid_x = np.linspace(0, 1, 201)
    mean = np.mean([np.interp(grid_x, g["top_fraction"], g["share"])
                    for _, g in curves.groupby(["weight", "step"], sort=False)], axis=0)
    cum.plot(100 * grid_x, 100 * mean, color="#004488", linewidth=2.0,
             label="mean over weights and steps")
    cum.plot([0, 100], [0, 100], color="#222222", linestyle=":", linewidth=1.0,
             label="uniform columns")
    f = concentration_facts(norms, topk_ratio)
    cum.axvline(100 * topk_ratio, color="#BB5566", linestyle="--", linewidth=1.0)
    cum.text(100 * topk_ratio + 2, 45, f"top {f['topk_pct']:g}% of columns:\n"
             f"{f['share_mean_pct']:.0f}% of the squared norm", fontsize=7.5)
    cum.set_xlim(0, 100)
    cum.set_ylim(0, 101)
    cum.set_xlabel("top columns by gradient norm (% of columns)")
    cum.set_ylabel("cumulative share of squared norm (%)")
    cum.legend(loc="lower right")
    fig.suptitle(caption or "Gradient concentration in a few columns (measured)",
                 fontsize=9.5, fontweight="bold")
    return fig


# -- figure 12: temporal locality ------------------------------------------------------
def topk_overlap(norms: pd.DataFrame, topk_ratio: float) -> pd.DataFrame:
    """Overlap |A_s & A_{s+gap}| / k of top-k column sets, per gap in steps (over the
    recorded steps), aggregated over weights and start steps; `random_overlap` is what
    two independent random k-sets of the same weights would share on average (k / cols).
    The pairs are `zfbench.analysis.gradstats.overlap_pairs` (every pair of steps)."""
    pairs = overlap_pairs(norms.rename(columns={"weight": "layer"}).assign(kind=""),
                          topk_ratio, "sq_norm")
    if pairs.empty:
        raise BadData("column_norms: need at least two recorded steps per weight")
    return pairs.groupby("gap").agg(overlap_mean=("overlap", "mean"),
                                    overlap_min=("overlap", "min"),
                                    overlap_max=("overlap", "max"),
                                    random_overlap=("random", "mean"),
                                    pairs=("overlap", "size")).reset_index()


def locality_facts(ov: pd.DataFrame) -> dict:
    first, last = ov.iloc[0], ov.iloc[-1]
    return {"gap_first": int(first["gap"]), "overlap_first_pct": 100 * first["overlap_mean"],
            "gap_last": int(last["gap"]), "overlap_last_pct": 100 * last["overlap_mean"],
            "random_pct": 100 * float(ov["random_overlap"].mean())}


@with_style
def plot_temporal_locality(ov: pd.DataFrame, topk_ratio: float, caption: str = "") -> Figure:
    fig, axes = new_figure(figsize=(6.0, 3.2))
    ax = axes[0, 0]
    ax.fill_between(ov["gap"], 100 * ov["overlap_min"], 100 * ov["overlap_max"],
                    color="#6699CC", alpha=0.35, linewidth=0, label="min-max over weights")
    ax.plot(ov["gap"], 100 * ov["overlap_mean"], color="#004488", marker="D",
            label="mean over weights and start steps")
    ax.plot(ov["gap"], 100 * ov["random_overlap"], color="#BB5566", linestyle="--",
            label="two random column sets")
    ax.set_ylim(0, 102)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("gap between the two steps (steps)")
    ax.set_ylabel(f"top-{100 * topk_ratio:g}% set overlap (%)")
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=3,
               fontsize=7)
    ax.set_title(caption or "Temporal locality of the important columns (measured)")
    return fig
