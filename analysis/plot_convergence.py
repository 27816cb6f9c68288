"""Figure 17: accuracy at convergence and time-to-quality (issue 28).

Covers: loading the committed results of `bench/convergence.py` (runs.csv, curves.csv
under bench/results/convergence/), the facts the figure's sentence quotes, and the
figure: (a) the topic task's test accuracy per strategy, mean and std over seeds with
each seed as a dot (the form of the ZenFlow paper's accuracy bars), (b) the LM task's
held-out loss at the plateau, the same way, (c) time-to-quality: the held-out loss
(mean over seeds) against the wall-clock its steps would take on the GPU node, each
step costing the simulated step time of llama2-7b-class training under that strategy
(`zfbench/figures/command.py`'s `convergence_steps` dataset): the step times are
simulated, the losses measured on SmolLM2-135M. Where the results hold runs through
DeepSpeed's own engine (`deepspeed-zero-offload`, `deepspeed-zenflow`: the same task,
data, seeds and settings), (a) and (b) draw them beside zfbench's, hatched; (c) leaves
them out (no simulated step time of their own).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from zfbench.analysis.plot_measured import BadData, MissingData, strategy_style
from zfbench.analysis.plots import SHORT_LABEL, bar_style, new_figure, with_style

COMMAND = "`python bench/convergence.py` (committed under bench/results/convergence/)"
ORDER = ("device", "zero-offload", "zero-offload-dpu", "zenflow", "deepspeed-zero-offload",
         "deepspeed-zenflow")
DS_PREFIX = "deepspeed-"


def style(variant: str) -> dict:
    """The strategy's palette entry; a DeepSpeed run of it hatched, labelled DeepSpeed."""
    if not variant.startswith(DS_PREFIX):
        return strategy_style(variant)
    base = strategy_style(variant[len(DS_PREFIX):])
    return {**base, "hatch": "////", "label": f"DeepSpeed {base['label']}"}


def short_label(variant: str) -> str:
    if variant.startswith(DS_PREFIX):
        base = SHORT_LABEL.get(variant[len(DS_PREFIX):], variant[len(DS_PREFIX):])
        return "DeepSpeed\n" + base.replace("\n", "")
    return SHORT_LABEL.get(variant, variant)


def load(directory: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of the study's main variants; MissingData when absent."""
    runs_path, curves_path = directory / "runs.csv", directory / "curves.csv"
    for path in (runs_path, curves_path):
        if not path.exists():
            raise MissingData(path, COMMAND)
    runs, curves = pd.read_csv(runs_path), pd.read_csv(curves_path)
    for frame, need, path in ((runs, {"task", "variant", "seed", "final_val_loss"}, runs_path),
                              (curves, {"task", "variant", "seed", "step", "val_loss"},
                               curves_path)):
        if not need <= set(frame.columns):
            raise BadData(f"{path}: needs columns {sorted(need)}")
    keep = lambda f: f[f["variant"].isin(ORDER)]  # noqa: E731
    return keep(runs), keep(curves)


def per_strategy(runs: pd.DataFrame, task: str, metric: str) -> pd.DataFrame:
    g = runs[runs["task"] == task].groupby("variant")[metric]
    table = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "n": g.size()})
    return table.loc[[v for v in ORDER if v in table.index]]


def time_to_quality(curves: pd.DataFrame, step_s: dict[str, float], task: str) -> pd.DataFrame:
    """Mean held-out loss over the seeds that reached each step, against hours of the
    simulated step time: variant, step, val_loss, hours."""
    c = curves[(curves["task"] == task) & curves["variant"].isin(step_s)]
    mean = c.groupby(["variant", "step"], as_index=False)["val_loss"].mean()
    mean["hours"] = mean["step"] * mean["variant"].map(step_s) / 3600.0
    return mean


def hours_to_reach(ttq: pd.DataFrame, level: float) -> dict[str, float]:
    """Per variant, the first simulated hour at which its mean loss is <= level (NaN:
    never)."""
    out = {}
    for v, g in ttq.groupby("variant"):
        hit = g[g["val_loss"] <= level]
        out[v] = float(hit["hours"].min()) if len(hit) else float("nan")
    return out


def facts(runs: pd.DataFrame, curves: pd.DataFrame, step_s: dict[str, float]) -> dict:
    f = {"tasks": sorted(set(runs["task"]))}
    if "topics" in f["tasks"]:
        f["acc"] = per_strategy(runs, "topics", "final_test_acc")
    if "lm" in f["tasks"]:
        f["loss"] = per_strategy(runs, "lm", "final_val_loss")
    # the task with the most runs (the complete one when the other was cut short)
    task = max(f["tasks"], key=lambda t: (int((runs["task"] == t).sum()), t))
    ttq = time_to_quality(curves, step_s, task)
    f["ttq_task"] = task
    f["ttq"] = ttq
    if len(ttq):
        # the level every strategy reaches: the worst of the strategies' best mean losses
        f["level"] = float(ttq.groupby("variant")["val_loss"].min().max())
        f["hours"] = hours_to_reach(ttq, f["level"])
    f["step_s"] = step_s
    return f


def sentence(f: dict) -> str:
    label = lambda v: style(v)["label"]  # noqa: E731
    parts = []
    if "acc" in f:
        a = f["acc"]
        parts.append("Topic-classification test accuracy at the plateau: " + ", ".join(
            f"{label(v)} {100 * r['mean']:.1f} ± {100 * (r['std'] if r['std'] == r['std'] else 0):.1f}%"
            f" (n={int(r['n'])})" for v, r in a.iterrows()))
    if "loss" in f:
        a = f["loss"]
        parts.append("LM held-out loss: " + ", ".join(
            f"{label(v)} {r['mean']:.3f} ± {(r['std'] if r['std'] == r['std'] else 0):.3f}"
            f" (n={int(r['n'])})" for v, r in a.iterrows()))
    if "hours" in f:
        parts.append(f"to reach {f['ttq_task']} held-out loss {f['level']:.3f} with "
                     f"llama2-7b-class simulated step times: " + ", ".join(
                         f"{label(v)} {h:.2f} h" for v, h in f["hours"].items()))
    return "; ".join(parts) + " (± = std over seeds)."


def _bars(ax, table: pd.DataFrame, runs: pd.DataFrame, task: str, metric: str,
          scale: float, ylabel: str) -> None:
    for i, (v, r) in enumerate(table.iterrows()):
        st = style(v)
        err = 0.0 if r["std"] != r["std"] else scale * r["std"]
        ax.bar(i, scale * r["mean"], 0.6, yerr=err, capsize=3, **bar_style(st))
        seeds = runs[(runs["task"] == task) & (runs["variant"] == v)][metric] * scale
        ax.plot(np.full(len(seeds), i) + np.linspace(-0.12, 0.12, len(seeds)), seeds, "o",
                color="#000000", markersize=2.5, zorder=3)
        ax.text(i, scale * (r["mean"] + (0 if err == 0 else r["std"])), f"{scale * r['mean']:.3g}",
                ha="center", va="bottom", fontsize=7)
    lo = scale * (runs[runs["task"] == task][metric].min())
    hi = scale * (runs[runs["task"] == task][metric].max())
    span = max(hi - lo, 0.02 * abs(hi), 1e-6)  # one seed: a small window round its value
    ax.set_ylim(lo - 0.6 * span, hi + 0.4 * span)
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_xticks(range(len(table)), [short_label(v) for v in table.index],
                  fontsize=7 if len(table) <= 4 else 6)
    ax.set_ylabel(ylabel)
    ax.grid(axis="x", visible=False)


@with_style
def plot(runs: pd.DataFrame, curves: pd.DataFrame, f: dict, where: str) -> Figure:
    panels = [k for k in ("acc", "loss") if k in f] + ["ttq"]
    widths = [3.0 + (0.5 * (len(f[k]) - 4) if k in ("acc", "loss") else 0.0)
              for k in panels]
    widths = [max(w, 3.0) for w in widths]
    fig, axes = new_figure(1, len(panels), figsize=(sum(widths) + 0.6, 3.3),
                           gridspec_kw={"width_ratios": widths})
    for ax, key in zip(axes[0], panels):
        if key == "acc":
            _bars(ax, f["acc"], runs, "topics", "final_test_acc", 100.0,
                  "topic test accuracy (%)")
            ax.set_title("(a) accuracy at the plateau", fontsize=8.5)
        elif key == "loss":
            _bars(ax, f["loss"], runs, "lm", "final_val_loss", 1.0,
                  "held-out loss (nats per token)")
            ax.set_title("(b) LM held-out loss at the plateau", fontsize=8.5)
        else:
            for v, g in f["ttq"].groupby("variant"):
                st = strategy_style(v)
                g = g[g["hours"] > 0]
                ax.plot(g["hours"], g["val_loss"], color=st["color"],
                        linestyle=st["linestyle"], marker=st["marker"], markersize=2.5,
                        label=st["label"])
            if "level" in f:
                ax.axhline(f["level"], color="#777777", linewidth=0.7, linestyle=":")
            ax.set_xscale("log")
            ax.set_xlabel(f"hours (simulated step times x measured steps)\n{where}",
                          fontsize=7)
            ax.set_ylabel(f"{f['ttq_task']} held-out loss (nats)")
            ax.set_title("(c) time-to-quality", fontsize=8.5)
            ax.legend(fontsize=6.5, loc="upper right")
    fig.suptitle("Accuracy at convergence, SmolLM2-135M (measured; step times simulated)",
                 fontsize=9.5, fontweight="bold")
    return fig
