"""Figure 15: the first command, measured here and projected onto the GPU node.

Reads the `summary.csv` that `python -m zfbench.run --model llama2-7b --gpus 4 --out DIR`
writes (layout key `run`: `run/summary.csv` under the measured directory) and, when it
is there, the `summary.json` beside it (its `proxy` names what was measured). Rows with
`projected` true are the simulator's projection of the named model whole on the GPU
node; the others were measured on this machine (the proxy, when the model did not fit).
Each panel stacks a strategy's step into compute, exposed I/O and host wait (seconds),
so the two regimes can be read side by side; the sentence gives ZenFlow's step over
ZeRO-Offload's on each.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from zfbench.analysis.plot_measured import BadData, ordered_strategies, read_table, strategy_style
from zfbench.analysis.plots import new_figure, with_style
from zfbench.core.strategies import BASELINE, windowed_of

COLUMNS = ["strategy", "step_time_s", "compute_s", "exposed_io_s", "host_wait_s"]
PARTS = (("compute_s", "compute", 1.0), ("exposed_io_s", "exposed I/O", 0.6),
         ("host_wait_s", "host wait", 0.3))


def load_run(path: Path, command: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(measured rows, projected rows, the proxy record or {}) of one run's summary."""
    frame = read_table(path, COLUMNS, command)
    projected = frame["projected"].fillna(False).astype(bool) if "projected" in frame \
        else pd.Series(False, index=frame.index)
    measured, there = frame[~projected], frame[projected]
    if measured.empty:
        raise BadData(f"{path}: no measured rows (every row has projected true)")
    meta = Path(path).with_suffix(".json")
    proxy = {}
    if meta.exists():
        proxy = json.loads(meta.read_text()).get("proxy") or {}
    return measured, there, proxy


def ratio(rows: pd.DataFrame) -> float | None:
    """ZenFlow's step over ZeRO-Offload's, None without both."""
    by = rows.set_index("strategy")["step_time_s"]
    zenflow = windowed_of(by)
    if zenflow is None or BASELINE not in by:
        return None
    return float(zenflow / by[BASELINE])


def run_facts(measured: pd.DataFrame, there: pd.DataFrame, proxy: dict) -> dict:
    ranks = int(measured["ranks"].iloc[0]) if "ranks" in measured else None
    return {"here": ratio(measured), "there": ratio(there) if not there.empty else None,
            "measured": proxy.get("measured", "the named model"),
            "model": proxy.get("model"), "ranks": ranks}


@with_style
def plot_run(measured: pd.DataFrame, there: pd.DataFrame, proxy: dict) -> Figure:
    panels = [("measured here: " + proxy.get("measured", "the run"), measured)]
    if not there.empty:
        panels.append(("projected: " + str(there["model"].iloc[0]) + " on the GPU node"
                       if "model" in there else "projected", there))
    fig, axes = new_figure(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (title, rows) in zip(axes[0], panels):
        order = ordered_strategies(rows)
        rows = rows.set_index("strategy").loc[order]
        bottom = [0.0] * len(order)
        for column, label, alpha in PARTS:
            values = rows[column].fillna(0.0).clip(lower=0.0).tolist()
            for i, strategy in enumerate(order):
                st = strategy_style(strategy)
                ax.bar(i, values[i], bottom=bottom[i], color=st["color"], alpha=alpha,
                       hatch=st["hatch"] if column != "compute_s" else "",
                       edgecolor="white", linewidth=0.5,
                       label=label if i == 0 else None)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels([strategy_style(s)["label"] for s in order], rotation=20,
                           ha="right", fontsize=7)
        ax.set_ylabel("step time (s)")
        ax.set_title(title, fontsize=8)
    axes[0][0].legend(fontsize=7, loc="upper right")
    return fig
