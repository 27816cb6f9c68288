"""Figure 17: accuracy at convergence and time-to-quality (issue 28).

Covers: loading the committed results of `bench/convergence.py` (the topic task from
bench/results/convergence/, the LM task from bench/results/convergence_lm/: three seeds
from pretrained SmolLM2, which replace the one-seed LM runs of convergence/ that started
from the wrong weights), the facts the figure's sentence quotes, and the figure:
(a) the topic task's test accuracy per strategy, (b) the LM task's held-out loss at the
plateau, both as dot and interval (the mean over seeds, the min-max over seeds, each seed
a small dot, and a dotted line at the pretrained model's value, so that the distance
between strategies reads against what training gained), (c) time-to-quality: the topic
task's held-out loss (mean over seeds) against the wall-clock its steps would take on
the GPU node, each step costing the simulated step time of llama2-7b-class training
under that strategy (`zfbench/figures/command.py`'s `convergence_steps` dataset): the
step times are simulated, the losses measured on SmolLM2-135M. Where the results hold
runs through DeepSpeed's own engine (`deepspeed-zero-offload`, `deepspeed-zenflow`: the
same task, data, seeds and settings), (a) and (b) draw them beside zfbench's with hollow
markers; (c) leaves them out (no simulated step time of their own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from zfbench.analysis.plot_measured import BadData, MissingData, strategy_style
from zfbench.analysis.plots import SHORT_LABEL, new_figure, with_style

COMMAND = "`python bench/convergence.py` (committed under bench/results/convergence/)"
LM_COMMAND = ("`python bench/convergence.py --tasks lm --variants device zenflow --seeds 0 1 2 "
              "--out bench/results/convergence_lm`")
ORDER = ("device", "zero-offload", "zero-offload-dpu", "zenflow", "deepspeed-zero-offload",
         "deepspeed-zenflow")
DS_PREFIX = "deepspeed-"


@dataclass(frozen=True)
class Panel:
    """One dot-and-interval panel: which task and runs.csv column, how it is shown."""
    task: str
    metric: str
    scale: float  # shown value = scale x the column's value
    unit: str  # of the shown value
    digits: int
    axis: str  # the quantity, on the y-axis
    label: str  # the quantity, in the sentence
    title: str


PANELS = {
    "acc": Panel("topics", "final_test_acc", 100.0, "%", 1, "topic test accuracy",
                 "Topic test accuracy at the plateau", "(a) topic accuracy at the plateau"),
    "loss": Panel("lm", "final_val_loss", 1.0, "nats/token", 3, "LM held-out loss",
                  "LM held-out loss at the plateau, trained from pretrained SmolLM2",
                  "(b) LM held-out loss, from pretrained"),
}
INTERVAL = "min-max over seeds"


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


def load(directory: Path, command: str = COMMAND) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of the study's main variants; MissingData (naming `command`) when
    absent."""
    runs_path, curves_path = directory / "runs.csv", directory / "curves.csv"
    for path in (runs_path, curves_path):
        if not path.exists():
            raise MissingData(path, command)
    runs, curves = pd.read_csv(runs_path), pd.read_csv(curves_path)
    for frame, need, path in ((runs, {"task", "variant", "seed", "final_val_loss"}, runs_path),
                              (curves, {"task", "variant", "seed", "step", "val_loss"},
                               curves_path)):
        if not need <= set(frame.columns):
            raise BadData(f"{path}: needs columns {sorted(need)}")
    keep = lambda f: f[f["variant"].isin(ORDER)]  # noqa: E731
    return keep(runs), keep(curves)


def load_study(topics_dir: Path, lm_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of the figure: the topic task of `topics_dir`, the LM task of
    `lm_dir` (the three-seed run from pretrained weights); `topics_dir`'s own LM rows (one
    seed, started from the wrong weights) are left out."""
    topic_runs, topic_curves = load(topics_dir)
    lm_runs, lm_curves = load(lm_dir, LM_COMMAND)
    pick = lambda f, task: f[f["task"] == task]  # noqa: E731
    return (pd.concat([pick(topic_runs, "topics"), pick(lm_runs, "lm")], ignore_index=True),
            pd.concat([pick(topic_curves, "topics"), pick(lm_curves, "lm")],
                      ignore_index=True))


def start_scores(topics_dir: Path, lm_dir: Path) -> dict:
    """The pretrained model's score before training, per panel key: "acc" (topic test
    accuracy, a fraction) and "loss" (LM held-out loss, nats per token), from each run's
    summary.json; a key is absent when its file or value is."""
    found = {}
    for key, directory, task, field in (("acc", topics_dir, "topics", "test_acc"),
                                        ("loss", lm_dir, "lm", "val_loss")):
        path = directory / "summary.json"
        value = (json.loads(path.read_text()).get("pretrained", {}).get(task, {}).get(field)
                 if path.exists() else None)
        if value is not None:
            found[key] = float(value)
    return found


def per_strategy(runs: pd.DataFrame, task: str, metric: str) -> pd.DataFrame:
    """Per variant, in ORDER: mean, std (ddof 1), min, max and count over seeds."""
    g = runs[runs["task"] == task].groupby("variant")[metric]
    table = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1), "min": g.min(),
                          "max": g.max(), "n": g.size()})
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


def facts(runs: pd.DataFrame, curves: pd.DataFrame, step_s: dict[str, float],
          start: dict | None = None) -> dict:
    """What the figure and its sentence show: per PANELS key its per_strategy table,
    `start` (the pretrained scores of start_scores), and time-to-quality on the task
    with the most runs (the complete one when the other was cut short)."""
    f = {"tasks": sorted(set(runs["task"])), "start": start or {}}
    for key, panel in PANELS.items():
        if panel.task in f["tasks"]:
            f[key] = per_strategy(runs, panel.task, panel.metric)
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


def _panel_sentence(key: str, f: dict) -> str:
    p = PANELS[key]
    shown = lambda x: f"{p.scale * x:.{p.digits}f}"  # noqa: E731
    start = f" (before training {shown(f['start'][key])} {p.unit})" if key in f["start"] else ""
    return f"{p.label}{start}: " + ", ".join(
        f"{style(v)['label']} {shown(r['mean'])} ± {shown(np.nan_to_num(r['std']))}"
        f" [{shown(r['min'])}-{shown(r['max'])}] {p.unit} (n={int(r['n'])})"
        for v, r in f[key].iterrows())


def sentence(f: dict) -> str:
    parts = [_panel_sentence(k, f) for k in PANELS if k in f]
    if "hours" in f:
        parts.append(f"to reach {f['ttq_task']} held-out loss {f['level']:.3f} nats "
                     f"with llama2-7b-class simulated step times: " + ", ".join(
                         f"{style(v)['label']} {h:.2f} h" for v, h in f["hours"].items()))
    return "; ".join(parts) + (f" (mean ± std [{INTERVAL}]; (a) and (b) draw the mean and "
                               f"the {INTERVAL}).")


def _dots(ax, key: str, f: dict, runs: pd.DataFrame) -> None:
    """Panel `key`: per strategy its mean (marker, hollow for DeepSpeed's engine) and
    min-max over seeds (interval), each seed a grey dot beside it, the pretrained value
    a dotted line."""
    p, table = PANELS[key], f[key]
    for i, (v, r) in enumerate(table.iterrows()):
        st, mean = style(v), p.scale * r["mean"]
        ax.errorbar(i, mean, yerr=[[mean - p.scale * r["min"]], [p.scale * r["max"] - mean]],
                    fmt=st["marker"], color=st["color"], markersize=6, capsize=4,
                    elinewidth=1.2, zorder=3,
                    markerfacecolor="white" if v.startswith(DS_PREFIX) else st["color"])
        seeds = p.scale * runs[(runs["task"] == p.task) & (runs["variant"] == v)][p.metric]
        ax.plot(np.full(len(seeds), i + 0.22), seeds, "o", color="#777777", markersize=2.5)
        ax.annotate(f"{mean:.{p.digits}f}", (i, p.scale * r["max"]), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=7)
    if key in f["start"]:
        _before_training(ax, p, p.scale * f["start"][key])
    ax.margins(y=0.12)
    ax.set_xlim(-0.6, len(table) - 0.4)
    ax.ticklabel_format(axis="y", useOffset=False)
    ax.set_xticks(range(len(table)), [short_label(v) for v in table.index],
                  fontsize=7 if len(table) <= 4 else 6)
    ax.set_ylabel(f"{p.axis} ({p.unit})\ndot: mean; bar: {INTERVAL}", fontsize=7.5)
    ax.grid(axis="x", visible=False)
    counts = sorted(set(table["n"].astype(int)))
    ax.set_title(f"{p.title}, {'/'.join(map(str, counts))} seeds", fontsize=8.5)


def _before_training(ax, p: Panel, y: float) -> None:
    """The pretrained model's value (shown units) as a labelled dotted line."""
    ax.axhline(y, color="#777777", linewidth=0.8, linestyle=":")
    ax.text(0.99, y, f"before training {y:.{p.digits}f}", transform=ax.get_yaxis_transform(),
            ha="right", va="bottom", fontsize=6, color="#555555")


def _key(ax) -> None:
    """What the marks of (a) and (b) mean."""
    ax.legend(handles=[
        Line2D([], [], marker="o", color="#444444", linestyle="none", label="mean over seeds"),
        Line2D([], [], marker="|", markersize=10, color="#444444", linestyle="none",
               label=INTERVAL),
        Line2D([], [], marker="o", markersize=2.5, color="#777777", linestyle="none",
               label="one seed"),
        Line2D([], [], color="#777777", linewidth=0.8, linestyle=":",
               label="pretrained, before training")], fontsize=6, loc="center")


def _ttq(ax, f: dict, where: str) -> None:
    for v, g in f["ttq"].groupby("variant"):
        st = strategy_style(v)
        g = g[g["hours"] > 0]
        ax.plot(g["hours"], g["val_loss"], color=st["color"], linestyle=st["linestyle"],
                marker=st["marker"], markersize=2.5, label=st["label"])
    if "level" in f:
        ax.axhline(f["level"], color="#777777", linewidth=0.7, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel(f"hours (simulated step times x measured steps)\n{where}", fontsize=7)
    ax.set_ylabel(f"{f['ttq_task']} held-out loss (nats)")
    ax.set_title("(c) time-to-quality", fontsize=8.5)
    ax.legend(fontsize=6.5, loc="upper right")


@with_style
def plot(runs: pd.DataFrame, curves: pd.DataFrame, f: dict, where: str) -> Figure:
    panels = [k for k in PANELS if k in f] + ["ttq"]
    widths = [max(3.0, 3.0 + 0.5 * (len(f[k]) - 4)) if k in PANELS else 3.0 for k in panels]
    fig, axes = new_figure(1, len(panels), figsize=(sum(widths) + 0.6, 3.3),
                           gridspec_kw={"width_ratios": widths})
    for ax, key in zip(axes[0], panels):
        if key in PANELS:
            _dots(ax, key, f, runs)
        else:
            _ttq(ax, f, where)
    if panels[0] in PANELS:
        _key(axes[0][0])
    fig.suptitle("Accuracy at convergence, SmolLM2-135M (measured; step times simulated)",
                 fontsize=9.5, fontweight="bold")
    return fig
