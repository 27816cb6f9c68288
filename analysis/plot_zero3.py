"""Figure 18: ZenFlow on ZeRO-2 against ZenFlow on ZeRO-3 against ZeRO-Infinity, for a
model that needs ZeRO-3 (llama2-70b on 8 x H100), each step broken down.

Covers `zero3_facts` (the numbers the figure's sentence quotes, read from the rows) and
`plot_zero3` (one stacked bar per run: compute, exposed I/O, host wait; each bar's device
memory per GPU written above it, and a run that does not fit its GPU marked so). The rows
are `zfbench.simulation.summary_row`s with a `series` label (`zfbench.figures` makes them).
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from zfbench.analysis.plots import PART_STYLE, bar_style, new_figure

GIB = 2 ** 30


def zero3_facts(df: pd.DataFrame) -> dict:
    """Per series (in the rows' order): step, stall, device GiB per GPU, capacity, fits;
    and ZenFlow on ZeRO-3's speed-up over ZeRO-Infinity (the rows whose `key` is
    `zenflow-zero3` and `infinity`)."""
    rows = df.set_index("key")
    out = {"series": list(df["key"]), "where": df["where"].iloc[0]}
    for key, r in rows.iterrows():
        out[key] = {"label": r["series"], "step_s": float(r["step_time_s"]),
                    "stall_pct": 100 * float(r["stall_s"]) / float(r["step_time_s"]),
                    "device_gib": float(r["device_bytes_per_rank"]) / GIB,
                    "capacity_gib": float(r["device_capacity_bytes"]) / GIB,
                    "fits": bool(r["fits"])}
    if {"zenflow-zero3", "infinity"} <= set(rows.index):
        out["speedup_over_infinity"] = out["infinity"]["step_s"] / \
            out["zenflow-zero3"]["step_s"]
    return out


def plot_zero3(df: pd.DataFrame, caption: str = "") -> Figure:
    """One stacked bar per row (`series` its tick label) of compute, exposed I/O and host
    wait; above it the device memory per GPU, and `does not fit` where it exceeds the
    GPU's."""
    f = zero3_facts(df)
    fig, axes = new_figure(1, 1, figsize=(5.6, 3.6))
    ax = axes[0, 0]
    top = float(df["step_time_s"].max())
    labelled = False  # the legend from the first run that fits (drawn at full colour)
    for x, (_, r) in enumerate(df.iterrows()):
        facts = f[r["key"]]
        bottom = 0.0
        for part, style in PART_STYLE.items():  # a run that does not fit: pale
            ax.bar(x, r[part], bottom=bottom, width=0.6, **bar_style(style),
                   alpha=1.0 if facts["fits"] else 0.35,
                   label=style["label"] if facts["fits"] and not labelled else None)
            bottom += r[part]
        labelled = labelled or facts["fits"]
        note = f"{facts['device_gib']:.0f} GiB/GPU" + (
            "" if facts["fits"] else f"\n> {facts['capacity_gib']:.0f} GiB:\ndoes not fit")
        ax.text(x, r["step_time_s"] + 0.02 * top, note, ha="center", va="bottom", fontsize=7,
                color="#000000" if facts["fits"] else "#BB5566")
        if not facts["fits"]:
            ax.bar(x, r["step_time_s"], width=0.6, fill=False, linestyle="--",
                   edgecolor="#BB5566", linewidth=1.0)
    ax.set_xticks(range(len(df)), list(df["series"]))
    ax.set_ylabel("step time (s)")
    ax.set_ylim(0, 1.3 * top)
    ax.legend(loc="upper left", fontsize=7, frameon=False)
    ax.set_title(caption or f"ZenFlow on ZeRO-2 and ZeRO-3 against ZeRO-Infinity\n"
                 f"{f['where']} (simulated)", fontsize=8)
    return fig


def zero3_sentence(df: pd.DataFrame) -> str:
    """The figure's sentence, every number read from the rows."""
    f = zero3_facts(df)
    parts = []
    for key in f["series"]:
        s = f[key]
        parts.append(f"{s['label'].replace(chr(10), ' ')} needs {s['device_gib']:.0f} GiB per "
                     f"GPU" + (f" (more than its {s['capacity_gib']:.0f} GiB: it does not "
                               f"fit, its bar is what it would take)" if not s["fits"] else
                               f" and steps in {s['step_s']:.2f} s ({s['stall_pct']:.0f}% "
                               f"stall)"))
    speedup = f.get("speedup_over_infinity")
    return (f"Training {f['where']}: " + "; ".join(parts)
            + (f"; ZenFlow on ZeRO-3 is {speedup:.2f}x faster than ZeRO-Infinity."
               if speedup is not None else "."))
