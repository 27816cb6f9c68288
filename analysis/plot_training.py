"""Figures from training runs (paper figures 13 and 14): loss curves and final quality
per strategy, and the update interval ZenFlow's adaptive mode chose over training.

The file layouts are documented with the others in `zfbench.analysis.plot_measured`:
`accuracy/<strategy>.steps.jsonl`, the optional `accuracy/quality.csv`, and
`auto_interval/windows.csv`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from zfbench.analysis.plot_measured import (BadData, MissingData, ordered_strategies, read_table,
                                    strategy_style)
from zfbench.analysis.plots import SHORT_LABEL, STRATEGY_STYLE, bar_style, new_figure, with_style
from zfbench.core.strategies import device_adamw, windowed_of


# -- figure 13: loss curves and final quality -----------------------------------------
def load_losses(directory: Path, command: str) -> pd.DataFrame:
    directory = Path(directory)
    frames = []
    for strategy in STRATEGY_STYLE:
        path = directory / f"{strategy}.steps.jsonl"
        if not path.exists():
            continue
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        losses = [r["loss"] for r in records if r.get("loss") is not None]
        if not losses:
            raise BadData(f"{path}: no 'loss' in any line")
        frames.append(pd.DataFrame({"strategy": strategy, "iteration": np.arange(len(losses)),
                                    "loss": np.asarray(losses, float)}))
    if not frames:
        raise MissingData(directory / "<strategy>.steps.jsonl", command)
    return pd.concat(frames, ignore_index=True)


METRIC_LABEL = {"heldout_perplexity": "held-out perplexity (dimensionless)",
                "heldout_loss": "held-out loss (nats per token)",
                "eval_loss": "eval loss (nats per token)"}
REFERENCE = "pretrained"  # a quality.csv row measured before any step: drawn as a line


def final_quality(losses: pd.DataFrame, quality: pd.DataFrame | None) -> pd.DataFrame:
    """strategy, metric, value for the strategies with a loss curve (plus a `pretrained`
    reference row if quality.csv has one): quality.csv's first metric, else the mean
    training loss of the last 10 % of steps."""
    if quality is not None:
        metric = quality["metric"].iloc[0]
        keep = set(losses["strategy"]) | {REFERENCE}
        q = quality[(quality["metric"] == metric) & quality["strategy"].isin(keep)]
        return q[["strategy", "metric", "value"]].reset_index(drop=True)
    rows = []
    for strategy, g in losses.groupby("strategy", sort=False):
        tail = g.tail(max(1, len(g) // 10))
        rows.append({"strategy": strategy, "metric": "final training loss (mean of last 10%)",
                     "value": float(tail["loss"].mean())})
    return pd.DataFrame(rows)


def metric_label(metric: str) -> str:
    if metric in METRIC_LABEL:
        return METRIC_LABEL[metric]
    return metric if "(" in metric else f"{metric.replace('_', ' ')} (as reported)"


def quality_facts(losses: pd.DataFrame, quality: pd.DataFrame | None) -> dict:
    table = final_quality(losses, quality)
    q = table.set_index("strategy")["value"]
    out = {"metric": metric_label(table["metric"].iloc[0]).split(" (")[0],
           "values": {s: float(v) for s, v in q.items() if s != REFERENCE},
           "reference": float(q[REFERENCE]) if REFERENCE in q else None,
           "steps": int(losses.groupby("strategy").size().max())}
    zenflow = windowed_of(q)
    device = next((v for s, v in q.items() if device_adamw(s)), None)
    if zenflow is not None and device is not None:
        out["zenflow_minus_device"] = float(zenflow - device)
    return out


@with_style
def plot_loss_curves(losses: pd.DataFrame, quality: pd.DataFrame | None,
                     caption: str = "") -> Figure:
    fig, axes = new_figure(1, 2, figsize=(7.2, 3.3), width_ratios=[2.0, 1.0])
    ax, bars = axes[0, 0], axes[0, 1]
    for strategy in ordered_strategies(losses):
        g = losses[losses["strategy"] == strategy]
        st = strategy_style(strategy)
        ax.plot(g["iteration"], g["loss"], color=st["color"], linewidth=0.5, alpha=0.35)
        smooth = g["loss"].rolling(max(1, len(g) // 20), min_periods=1).mean()
        ax.plot(g["iteration"], smooth, color=st["color"], linestyle=st["linestyle"],
                label=st["label"])
    ax.set_xlabel("training step (iterations)")
    ax.set_ylabel("training loss (nats per token)")
    ax.legend(loc="upper right")
    table = final_quality(losses, quality)
    ref = table[table["strategy"] == REFERENCE]
    q = table[table["strategy"] != REFERENCE]
    q = q.set_index("strategy").loc[ordered_strategies(q)].reset_index()
    for i, row in q.iterrows():
        bars.bar(i, row["value"], 0.6, **bar_style(strategy_style(row["strategy"])))
        bars.text(i, row["value"], f"{row['value']:.3f}", ha="center", va="bottom", fontsize=7)
    values = list(q["value"])
    if not ref.empty:
        level = float(ref["value"].iloc[0])
        values.append(level)
        bars.axhline(level, color="#222222", linestyle="--", linewidth=0.9)
        bars.text(len(q) - 0.5, level, f"before fine-tuning {level:.3f}", ha="right",
                  va="bottom", fontsize=7)
    bars.set_xticks(range(len(q)), [SHORT_LABEL.get(s, s) for s in q["strategy"]], fontsize=7)
    lo, hi = min(values), max(values)
    span = hi - lo + 1e-9  # zoom on the differences, which are what the panel is about
    bars.set_ylim(max(0.0, lo - 0.5 * span - 0.05 * abs(lo)), hi + 0.15 * span + 0.02 * abs(hi))
    bars.set_ylabel(metric_label(q["metric"].iloc[0]))
    bars.grid(axis="x", visible=False)
    fig.suptitle(caption or "Convergence: loss per strategy (measured)", fontsize=9.5,
                 fontweight="bold")
    return fig


# -- figure 14: the adaptive update interval ------------------------------------------
def load_windows(path: Path, command: str) -> pd.DataFrame:
    df = read_table(path, ["window", "length_steps"], command).sort_values("window")
    if "end_step" not in df.columns:
        df["end_step"] = df["length_steps"].cumsum() - 1
    return df.reset_index(drop=True)


def window_facts(df: pd.DataFrame) -> dict:
    n = df["length_steps"]
    return {"windows": len(df), "mean": float(n.mean()), "min": int(n.min()),
            "max": int(n.max()), "first": int(n.iloc[0]), "last": int(n.iloc[-1]),
            "steps": int(df["end_step"].max()) + 1}


@with_style
def plot_auto_interval(df: pd.DataFrame, caption: str = "") -> Figure:
    fig, axes = new_figure(figsize=(6.4, 3.0))
    ax = axes[0, 0]
    start = df["end_step"] - df["length_steps"] + 1
    edges = np.append(start.to_numpy(), df["end_step"].iloc[-1] + 1)
    ax.stairs(df["length_steps"], edges, baseline=None, color="#004488", linewidth=1.6,
              label="chosen update interval")
    ax.plot(df["end_step"], df["length_steps"], linestyle="none", marker="D", color="#004488",
            markersize=3.5, label="window closes (host update)")
    ax.axhline(df["length_steps"].mean(), color="#BB5566", linestyle="--", linewidth=1.0,
               label=f"mean {df['length_steps'].mean():.1f} steps")
    ax.set_ylim(0, df["length_steps"].max() * 1.2 + 0.5)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step (iterations)")
    ax.set_ylabel("update interval (steps)")
    ax.legend(loc="upper left", ncols=3)
    ax.set_title(caption or "Adaptive update interval over training (measured)")
    return fig
