"""Figures drawn from summary tables of simulated runs (paper figures 5-9).

Covers: the step-time breakdown across models and nodes (5), PCIe bytes per step against
the update interval and the top-k ratio (6), selection traffic of per-column scores
against a full-gradient all-gather (7), multi-GPU scaling (8) and step-time sensitivity
to the top-k ratio and the update interval (9).

Inputs are DataFrames with the columns of `zfbench.simulation.summary_row` (`step_time_s`,
`compute_s`, `exposed_io_s`, `host_wait_s`, `stall_s`, `pcie_bytes_per_step_over_model_bytes`,
`fits` ...) plus the labels that say which case a row is (`node`, `model`, `series`,
`gpus`, the swept knob). Each figure has a `*_facts` function returning the numbers its
index sentence quotes, computed from the same frame.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, NullLocator

from zfbench.analysis.plots import (PART_STYLE, SHIPPED_STYLE, SHORT_LABEL, STRATEGY_STYLE,
                            bar_style, new_figure, with_style)
from zfbench.core.models import get_model
from zfbench.core.strategies import BASELINE, device_adamw, has_windows, offloads_params

# Series of the sweep tables: ZenFlow with each data path, and the references.
SERIES_STYLE = {"zenflow-design": {**STRATEGY_STYLE["zenflow"],
                                   "label": "ZenFlow, design transfers"},
                "zenflow-shipped": SHIPPED_STYLE,
                "zero-offload": STRATEGY_STYLE["zero-offload"],
                "device": STRATEGY_STYLE["device"]}
KNOB_LABEL = {"update_interval": "update interval U (steps)",
              "topk_ratio": "top-k ratio (% of columns on the device)"}


# -- figure 5: step-time breakdown ----------------------------------------------------
def breakdown_facts(df: pd.DataFrame) -> dict:
    """Speedup and stall reduction of ZenFlow over ZeRO-Offload per (node, model), and
    its speedup over ZeRO-Infinity where the table has that strategy (NaN otherwise)."""
    rows = []
    for (node, model), g in df.groupby(["node", "model"], sort=False):
        by = g.set_index("strategy")
        zo, zf = by.loc["zero-offload"], by.loc["zenflow"]
        zi = by["step_time_s"].get("zero-infinity", np.nan)
        rows.append({"node": node, "model": model,
                     "speedup": zo["step_time_s"] / zf["step_time_s"],
                     "speedup_vs_zero_infinity": zi / zf["step_time_s"],
                     "stall_reduction_pct": 100 * (1 - zf["stall_s"] / zo["stall_s"]),
                     "zo_stall_pct": 100 * zo["stall_s"] / zo["step_time_s"],
                     "zf_stall_pct": 100 * zf["stall_s"] / zf["step_time_s"]})
    t = pd.DataFrame(rows)
    best, worst = t.loc[t["speedup"].idxmax()], t.loc[t["speedup"].idxmin()]
    return {"table": t, "speedup_min": worst["speedup"], "speedup_min_case":
            f"{worst['model']} on {worst['node']}", "speedup_max": best["speedup"],
            "speedup_max_case": f"{best['model']} on {best['node']}",
            "stall_reduction_min_pct": t["stall_reduction_pct"].min(),
            "stall_reduction_max_pct": t["stall_reduction_pct"].max(),
            "zo_stall_min_pct": t["zo_stall_pct"].min(),
            "zo_stall_max_pct": t["zo_stall_pct"].max(),
            "zi_speedup_min": t["speedup_vs_zero_infinity"].min(),
            "zi_speedup_max": t["speedup_vs_zero_infinity"].max()}


PAPER_PARTS = {"compute_s": "compute_s", "exposed_io_s": "io_s", "host_wait_s": "stall_s"}


def paper_facts(paper: pd.DataFrame) -> dict:
    """ZenFlow's speedup predicted from the paper's ZeRO-Offload bars (nominal, and the
    widest range the data leaves open)."""
    return {"bars": len(paper), "speedup_min": paper["speedup"].min(),
            "speedup_max": paper["speedup"].max(),
            "range_min": paper["speedup_low"].min(), "range_max": paper["speedup_high"].max()}


@with_style
def plot_step_breakdown(df: pd.DataFrame, caption: str = "",
                        paper: pd.DataFrame | None = None) -> Figure:
    """`df`: one row per (node, model, strategy) with the breakdown columns; `paper`
    (optional): per (node, model) the paper's ZeRO-Offload bar and the ZenFlow bar
    predicted from it (`python -m zfbench.predict --paper` columns), drawn beside."""
    nodes = list(dict.fromkeys(df["node"]))
    models = list(dict.fromkeys(df["model"]))
    facts = breakdown_facts(df)["table"].set_index(["node", "model"])
    infinity = any(map(offloads_params, df["strategy"]))
    width = (7.4 if paper is None else 9.6) + (1.6 if infinity else 0.0)
    fig, axes = new_figure(len(nodes), len(models), figsize=(
        width, 1.0 + 2.2 * len(nodes) + (0.3 if infinity else 0.0)))
    paper = None if paper is None else paper.set_index(["node", "model"])
    ours = (["zero-infinity"] if infinity else []) + ["zero-offload", "zenflow"]
    x_of = {s: x for x, s in enumerate(ours)}
    for r, node in enumerate(nodes):
        for c, model in enumerate(models):
            ax = axes[r, c]
            g = df[(df["node"] == node) & (df["model"] == model)].set_index("strategy")
            bars = [(x_of[s], {p: g.loc[s, p] for p in PART_STYLE}) for s in ours]
            ticks = [SHORT_LABEL[s] for s in ours]
            top = max(g.loc[s, "step_time_s"] for s in ours)
            f = facts.loc[(node, model)]
            if paper is not None and (node, model) in paper.index:
                row = paper.loc[(node, model)]
                x0 = len(ours) + 0.4
                bars += [(x, {p: row[f"{who}_{q}"] for p, q in PAPER_PARTS.items()})
                         for x, who in ((x0, "zero_offload"), (x0 + 1, "zenflow"))]
                ticks += ["paper\nZeRO-Off.", "predicted\nZenFlow"]
                top = max(top, row["zero_offload_step_s"])
                ax.errorbar(x0 + 1, row["zenflow_step_s"], color="#000000", linewidth=0.8,
                            yerr=[[row["zenflow_step_s"] - row["zenflow_step_low_s"]],
                                  [row["zenflow_step_high_s"] - row["zenflow_step_s"]]],
                            capsize=2)
                ax.text(x0 + 1, row["zenflow_step_high_s"] + 0.03 * top,
                        f"{row['speedup']:.2f}x", ha="center", va="bottom", fontsize=7)
            for x, parts in bars:
                bottom = 0.0
                for part, st in PART_STYLE.items():
                    ax.bar(x, parts[part], bottom=bottom, width=0.62, **bar_style(st))
                    bottom += parts[part]
            zf_top = g.loc["zenflow", "step_time_s"]
            if infinity:  # three bars side by side: short labels that fit a bar's slot,
                # each bar's stall and (baselines) ZenFlow's speedup over it
                for s in ours:
                    stall = 100 * g.loc[s, "stall_s"] / g.loc[s, "step_time_s"]
                    over = g.loc[s, "step_time_s"] / zf_top
                    ax.text(x_of[s], g.loc[s, "step_time_s"] + 0.02 * top, f"{stall:.0f}%"
                            + (f"\n{over:.2f}x" if not has_windows(s) else ""), ha="center",
                            va="bottom", fontsize=7)
            else:
                ax.text(x_of["zenflow"], zf_top + 0.03 * top, f"{f['speedup']:.2f}x faster\n"
                        f"stall -{f['stall_reduction_pct']:.0f}%", ha="center",
                        va="bottom", fontsize=7)
                ax.text(0, g.loc["zero-offload", "step_time_s"] + 0.02 * top,
                        f"{f['zo_stall_pct']:.0f}% stall", ha="center", va="bottom",
                        fontsize=7)
            ax.set_ylim(0, top * (1.32 if not infinity else 1.38))
            ax.set_xticks([x for x, _ in bars], ticks, fontsize=6.5 if paper is not None else None)
            ax.set_xlim(-0.6, bars[-1][0] + 0.6)
            ax.grid(axis="x", visible=False)
            ax.set_title(model, fontsize=8.5)
            if c == 0:
                ax.set_ylabel(node, fontweight="bold")
    handles = [Patch(label=st["label"], **bar_style(st)) for st in PART_STYLE.values()]
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    fig.supylabel("average time per step (s)", fontsize=9)
    who = "ZeRO-Infinity (parameters on cpu), ZeRO-Offload" if infinity else "ZeRO-Offload"
    fig.suptitle(caption or f"Where a step's time goes: {who} vs ZenFlow, 4-GPU nodes "
                 "(simulated)" + ("\nabove each bar: its stall (% of the step) and ZenFlow's "
                                  "speedup over it" if infinity else "") + ("" if paper is None else "\nright: the paper's ZeRO-Offload "
                                  "bar, ZenFlow predicted from it (error bar: d2h/h2d split)"),
                 fontsize=9.5, fontweight="bold")
    return fig


# -- figures 6 and 9: sweeps over the update interval and the top-k ratio ------------
def _sweep_series(df: pd.DataFrame, knob: str, column: str):
    """Yield (series, x, y, is_reference) from a sweep table."""
    for series in SERIES_STYLE:
        g = df[df["series"] == series]
        if g.empty:
            continue
        if g[knob].notna().any():
            g = g.sort_values(knob)
            yield series, g[knob].to_numpy(float), g[column].to_numpy(float), False
        else:
            yield series, None, np.array([float(g[column].iloc[0])]), True


def _knob_axis(ax, knob: str, values) -> None:
    values = sorted(set(float(v) for v in values))
    ax.set_xscale("log", base=2 if knob == "update_interval" else 10)
    ax.xaxis.set_major_locator(FixedLocator(values))
    ax.xaxis.set_minor_locator(NullLocator())
    if knob == "topk_ratio":
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:g}"))
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel(KNOB_LABEL[knob])


def _sweep_panel(ax, df: pd.DataFrame, knob: str, column: str) -> None:
    knob_values = df[knob].dropna()
    for series, x, y, ref in _sweep_series(df, knob, column):
        st = SERIES_STYLE[series]
        if ref:
            ax.axhline(y[0], color=st["color"], linestyle=st["linestyle"], linewidth=1.3,
                       label=f"{st['label']} ({y[0]:.2f})")
        else:
            ax.plot(x, y, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                    label=st["label"])
    _knob_axis(ax, knob, knob_values)


def pcie_facts(u_df: pd.DataFrame, k_df: pd.DataFrame, default_u: int,
               default_k: float) -> dict:
    col = "pcie_bytes_per_step_over_model_bytes"
    pick = lambda df, s, knob, v: float(df[(df["series"] == s) & np.isclose(  # noqa: E731
        df[knob].astype(float), v)][col].iloc[0])
    zo = float(u_df[u_df["series"] == BASELINE][col].iloc[0])
    design_u = u_df[u_df["series"] == "zenflow-design"]
    design_k = k_df[k_df["series"] == "zenflow-design"]
    return {"design": pick(u_df, "zenflow-design", "update_interval", default_u),
            "shipped": pick(u_df, "zenflow-shipped", "update_interval", default_u),
            "zero_offload": zo, "default_u": default_u, "default_k_pct": 100 * default_k,
            "design_u_min": design_u[col].min(), "design_u_max": design_u[col].max(),
            "u_min": int(design_u["update_interval"].min()),
            "u_max": int(design_u["update_interval"].max()),
            "design_k_min": design_k[col].min(), "design_k_max": design_k[col].max(),
            "k_min_pct": 100 * design_k["topk_ratio"].min(),
            "k_max_pct": 100 * design_k["topk_ratio"].max()}


@with_style
def plot_pcie_traffic(u_df: pd.DataFrame, k_df: pd.DataFrame, caption: str = "") -> Figure:
    col = "pcie_bytes_per_step_over_model_bytes"
    fig, axes = new_figure(1, 2, figsize=(7.2, 3.3), sharey=True)
    for ax, df, knob in ((axes[0, 0], u_df, "update_interval"), (axes[0, 1], k_df, "topk_ratio")):
        _sweep_panel(ax, df, knob, col)
        ax.set_ylabel("PCIe bytes per step (x model bytes)")
        ax.set_ylim(bottom=0)
    axes[0, 1].tick_params(labelleft=True)
    axes[0, 0].set_title("against the update interval", fontsize=8.5)
    axes[0, 1].set_title("against the top-k ratio", fontsize=8.5)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3)
    fig.suptitle(caption or "PCIe traffic per step, both directions, all ranks (simulated)",
                 fontsize=9.5, fontweight="bold")
    return fig


def sensitivity_facts(u_df: pd.DataFrame, k_df: pd.DataFrame) -> dict:
    col = "step_time_s"
    out = {"zero_offload_s": float(u_df[u_df["series"] == BASELINE][col].iloc[0])}
    dev = u_df[u_df["series"].map(device_adamw).astype(bool)]
    out["device_s"] = float(dev[col].iloc[0]) if not dev.empty else float("nan")
    for name, df, knob in (("u", u_df, "update_interval"), ("k", k_df, "topk_ratio")):
        g = df[df["series"] == "zenflow-design"].sort_values(knob)
        best = g.loc[g[col].idxmin()]
        out.update({f"{name}_best": float(best[knob]), f"{name}_best_s": float(best[col]),
                    f"{name}_min_s": float(g[col].min()), f"{name}_max_s": float(g[col].max()),
                    f"{name}_first": float(g[knob].iloc[0]),
                    f"{name}_first_s": float(g[col].iloc[0]),
                    f"{name}_last": float(g[knob].iloc[-1]),
                    f"{name}_last_s": float(g[col].iloc[-1])})
    return out


@with_style
def plot_sensitivity(u_df: pd.DataFrame, k_df: pd.DataFrame, caption: str = "") -> Figure:
    fig, axes = new_figure(1, 2, figsize=(7.2, 3.3), sharey=True)
    for ax, df, knob in ((axes[0, 0], k_df, "topk_ratio"), (axes[0, 1], u_df, "update_interval")):
        _sweep_panel(ax, df, knob, "step_time_s")
        ax.set_ylabel("time per step (s)")
        ax.set_ylim(bottom=0)
    axes[0, 1].tick_params(labelleft=True)
    axes[0, 0].set_title("against the top-k ratio", fontsize=8.5)
    axes[0, 1].set_title("against the update interval", fontsize=8.5)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2)
    fig.suptitle(caption or "Step-time sensitivity of ZenFlow (simulated)", fontsize=9.5,
                 fontweight="bold")
    return fig


# -- figure 7: selection traffic --------------------------------------------------------
def selection_traffic(models: list[str], gpus: int) -> pd.DataFrame:
    """Bytes each rank moves per column selection, from the model shapes.

    scores: every rank all-reduces one fp32 score per column of every 2-D weight (ring
    all-reduce: 2 (N-1)/N of the vector per rank); full-gradient all-gather: every rank
    gathers the bf16 gradient of every 2-D weight (rows x cols x 2 bytes) from the others,
    receiving (N-1)/N of it."""
    n = gpus
    rows = []
    for name in models:
        mats = get_model(name).matrices()
        cols = sum(m.cols for m in mats)
        numel = sum(m.rows * m.cols for m in mats)
        scores = 2 * (n - 1) / n * 4 * cols
        gather = (n - 1) / n * 2 * numel
        rows.append({"model": name, "gpus": n, "weights_2d": len(mats), "columns": cols,
                     "scores_bytes_per_rank": scores,
                     "allgather_bytes_per_rank": gather, "ratio": gather / scores})
    return pd.DataFrame(rows)


def selection_facts(df: pd.DataFrame) -> dict:
    lo, hi = df.loc[df["ratio"].idxmin()], df.loc[df["ratio"].idxmax()]
    return {"gpus": int(df["gpus"].iloc[0]), "ratio_min": lo["ratio"],
            "ratio_min_model": lo["model"],
            "ratio_max": hi["ratio"], "ratio_max_model": hi["model"],
            "scores_max_bytes": df["scores_bytes_per_rank"].max(),
            "allgather_max_bytes": df["allgather_bytes_per_rank"].max()}


@with_style
def plot_selection_traffic(df: pd.DataFrame, caption: str = "") -> Figure:
    fig, axes = new_figure(figsize=(7.2, 3.3))
    ax = axes[0, 0]
    x = np.arange(len(df))
    w = 0.38
    s_st = {**STRATEGY_STYLE["zenflow"], "label": "per-column scores (fp32 all-reduce)"}
    g_st = {**STRATEGY_STYLE["zero-offload"], "label": "full-gradient all-gather (bf16)"}
    ax.bar(x - w / 2, df["scores_bytes_per_rank"], w, label=s_st["label"], **bar_style(s_st))
    ax.bar(x + w / 2, df["allgather_bytes_per_rank"], w, label=g_st["label"], **bar_style(g_st))
    for xi, (s, g, r) in enumerate(zip(df["scores_bytes_per_rank"],
                                       df["allgather_bytes_per_rank"], df["ratio"])):
        ax.text(xi - w / 2, s * 1.25, EngFormatter("B", places=0)(s), ha="center", fontsize=7)
        ax.text(xi + w / 2, g * 1.25, f"{EngFormatter('B', places=1)(g)}\n{r:,.0f}x",
                ha="center", fontsize=7)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(EngFormatter("B"))
    ax.set_ylim(df["scores_bytes_per_rank"].min() / 3, df["allgather_bytes_per_rank"].max() * 20)
    ax.set_xticks(x, list(df["model"]))
    ax.grid(axis="x", visible=False)
    ax.set_ylabel("traffic per rank per selection (bytes)")
    ax.legend(loc="upper left", ncols=2)
    ax.set_title(caption or f"Selection traffic per rank, {int(df['gpus'].iloc[0])} GPUs "
                 f"(from the model shapes)")
    return fig


# -- figure 8: multi-GPU scaling ------------------------------------------------------
def scaling_facts(df: pd.DataFrame) -> dict:
    out = {"nodes": []}
    for node, g in df.groupby("node", sort=False):
        top = int(g["gpus"].max())
        at = g[g["gpus"] == top].set_index("strategy")["tokens_per_s"]
        one = g[g["gpus"] == g["gpus"].min()].set_index("strategy")["tokens_per_s"]
        out["nodes"].append({"node": node, "gpus_max": top, "gpus_min": int(g["gpus"].min()),
                             "zf_tokens_per_s": at["zenflow"],
                             "zo_tokens_per_s": at["zero-offload"],
                             "zf_over_zo": at["zenflow"] / at["zero-offload"],
                             "zf_over_zi": at["zenflow"] / at.get("zero-infinity", np.nan),
                             "zf_scaling": at["zenflow"] / one["zenflow"],
                             "zo_scaling": at["zero-offload"] / one["zero-offload"]})
    return out


@with_style
def plot_scaling(df: pd.DataFrame, caption: str = "") -> Figure:
    """`df`: node, gpus, strategy, tokens_per_s, step_time_s, fits."""
    nodes = list(dict.fromkeys(df["node"]))
    fig, axes = new_figure(1, len(nodes), figsize=(7.2, 3.4), sharey=True)
    for ax, node in zip(axes[0], nodes):
        for strategy, st in STRATEGY_STYLE.items():
            g = df[(df["node"] == node) & (df["strategy"] == strategy)].sort_values("gpus")
            if g.empty:
                continue
            ax.plot(g["gpus"], g["tokens_per_s"], color=st["color"], linestyle=st["linestyle"])
            fits = g["fits"].astype(bool)
            ax.plot(g["gpus"][fits], g["tokens_per_s"][fits], linestyle="none",
                    marker=st["marker"], color=st["color"])
            ax.plot(g["gpus"][~fits], g["tokens_per_s"][~fits], linestyle="none",
                    marker=st["marker"], markerfacecolor="white", color=st["color"])
        gpus = sorted(df[df["node"] == node]["gpus"].unique())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(gpus))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(EngFormatter())
        ax.set_xlabel("GPUs (count)")
        ax.set_ylabel("training throughput (tokens/s)")
        ax.tick_params(labelleft=True)
        ax.set_title(node, fontsize=8.5)
    handles = [Line2D([], [], color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                      label=st["label"]) for s, st in STRATEGY_STYLE.items()
               if s in set(df["strategy"])]
    handles.append(Line2D([], [], color="#444444", linestyle="none", marker="o",
                          markerfacecolor="white", label="hollow: exceeds GPU or host memory"))
    fig.legend(handles=handles, loc="outside lower center", ncols=3)
    fig.suptitle(caption or "Scaling from 1 GPU to 8 nodes of 8 (simulated)", fontsize=9.5,
                 fontweight="bold")
    return fig
