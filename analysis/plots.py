"""Shared plotting vocabulary and the timeline figures (paper figures 1-4).

Covers: the one style file (`style.mplstyle`) every figure is drawn with, the palettes
(strategy, op, breakdown part: each colour paired with a hatch, marker and line style so
the figures read in greyscale), saving a figure as PNG and PDF, and the figures drawn
from a timeline's spans: GPU utilization over time (1), one ZeRO-Offload step (2), why
layer-wise overlap cannot hide a host update longer than forward+backward (3), and
ZenFlow's pipeline over several update windows (4).

Every function takes DataFrames (the `zfbench.core.trace` span and step frames) and returns a
`matplotlib.figure.Figure` drawn on an Agg canvas (no pyplot, no global backend), or a
dict of the key numbers the figure shows (`*_facts`), so the index that describes a
figure reads its numbers from the same data the figure was drawn from.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from pathlib import Path

import matplotlib.style
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from zfbench.analysis.breakdown import step_breakdown
from zfbench.core.strategies import STRATEGY

STYLE_FILE = Path(__file__).with_name("style.mplstyle")

# Paul Tol's high-contrast and medium-contrast colours (https://personal.sron.nl/~pault/):
# their greyscale luminances differ, and each entry adds a hatch / marker / line style.
STRATEGY_STYLE = {
    "device": dict(color="#222222", marker="s", linestyle=":", hatch="xx",
                   label=STRATEGY["device"].label),
    "zero-offload": dict(color="#BB5566", marker="o", linestyle="--", hatch="//",
                         label=STRATEGY["zero-offload"].label),
    "zero-offload-dpu": dict(color="#DDAA33", marker="^", linestyle="-.", hatch="..",
                             label=STRATEGY["zero-offload-dpu"].label),
    "zero-infinity": dict(color="#44AA99", marker="X", linestyle=(0, (3, 1, 1, 1, 1, 1)),
                          hatch="||", label=STRATEGY["zero-infinity"].label),  # Tol's muted teal
    "zenflow": dict(color="#004488", marker="D", linestyle="-", hatch="",
                    label=STRATEGY["zenflow"].label),
}
# ZenFlow with DeepSpeed's shipped data path (`transfers=shipped`).
SHIPPED_STYLE = dict(color="#6699CC", marker="v", linestyle=(0, (5, 1.5, 1, 1.5)),
                     hatch="\\\\", label="ZenFlow, shipped transfers")
OP_STYLE = {
    "forward": dict(color="#004488", hatch="", label="forward"),
    "backward": dict(color="#6699CC", hatch="", label="backward"),
    "select": dict(color="#997700", hatch="++", label="column selection"),
    "device_optim": dict(color="#000000", hatch="", label="device Adam"),
    "d2h_grad": dict(color="#EECC66", hatch="////", label="gradients down (d2h)"),
    "h2d_param": dict(color="#994455", hatch="", label="parameters up (h2d)"),
    "d2h_act": dict(color="#EECC66", hatch="..", label="activation checkpoints down (d2h)"),
    "h2d_act": dict(color="#994455", hatch="..", label="activation checkpoints up (h2d)"),
    "h2d_moments": dict(color="#994455", hatch="oo", label="offloaded moments up (h2d)"),
    "d2h_moments": dict(color="#EECC66", hatch="oo", label="offloaded moments down (d2h)"),
    "host_optim": dict(color="#BB5566", hatch="", label="host Adam"),
    "host_accum": dict(color="#EE99AA", hatch="....", label="host accumulate"),
    "host_clip": dict(color="#882255", hatch="\\\\", label="host unscale/clip"),
    "host_convert": dict(color="#CC6677", hatch="xx", label="host fp32 -> 16-bit"),
    "allreduce": dict(color="#BBBBBB", hatch="", label="all-reduce"),
    "allgather": dict(color="#888888", hatch="", label="all-gather"),
}
PART_STYLE = {
    "compute_s": dict(color="#004488", hatch="", label="compute"),
    "exposed_io_s": dict(color="#DDAA33", hatch="////", label="exposed I/O"),
    "host_wait_s": dict(color="#BB5566", hatch="xxx", label="host wait (stall)"),
}
SHORT_LABEL = {"device": "device\n(no offload)", "zero-offload": "ZeRO-\nOffload",
               "zero-offload-dpu": "ZeRO-Offload\n+ DPU", "zero-infinity": "ZeRO-\nInfinity",
               "zenflow": "ZenFlow"}
LANE_LABEL = {"compute": "GPU compute", "d2h": "PCIe d2h", "h2d": "PCIe h2d",
              "host": "CPU (host)", "net": "GPU-GPU net"}
GANTT_LANES = ("compute", "d2h", "host", "h2d")


@contextmanager
def styled():
    """Apply `style.mplstyle` (figures are created and saved inside it)."""
    with matplotlib.style.context(str(STYLE_FILE)):
        yield


def with_style(fn):
    """Decorator: draw the figure inside the shared style."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with styled():
            return fn(*args, **kwargs)
    return wrapper


def new_figure(nrows: int = 1, ncols: int = 1, figsize=None, **subplot_kw):
    """A Figure on an Agg canvas and its axes grid (always 2-D), pyplot untouched."""
    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig, fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)


def log_log_axes(ax) -> None:
    """Both axes logarithmic, major ticks at 1, 2 and 5 of each decade written plainly
    (`0.2`, `50`), no minor tick labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())


def save_figure(fig: Figure, out_dir: str | Path, stem: str,
                png_dpi: float | None = None) -> list[Path]:
    """Write `<stem>.png` (at the style's dpi unless `png_dpi`) and `<stem>.pdf` (no
    timestamps in the PDF: same input, same file)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.pdf"]
    with styled():
        fig.savefig(paths[0], metadata={"Software": None},
                    **({"dpi": png_dpi} if png_dpi else {}))
        fig.savefig(paths[1], metadata={"CreationDate": None, "Producer": None})
    return paths


def bar_style(style: dict) -> dict:
    """Keyword arguments for `ax.bar` from a palette entry: face colour, hatch, edge."""
    return dict(facecolor=style["color"], hatch=style.get("hatch", ""),
                edgecolor=_hatch_colour(style["color"]), linewidth=0.5)


def _hatch_colour(face: str) -> str:
    r, g, b = (int(face[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return "#ffffff" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.45 else "#222222"


def luminance(colour: str) -> float:
    """Greyscale luminance (Rec. 709 weights on sRGB) of a '#rrggbb' colour, 0..1."""
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# -- data reductions ------------------------------------------------------------------
def merged_intervals(starts: np.ndarray, ends: np.ndarray, gap_s: float = 1e-9):
    """Union of [start, end) intervals, as sorted disjoint (starts, ends)."""
    if len(starts) == 0:
        return np.array([]), np.array([])
    order = np.argsort(starts, kind="stable")
    s, e = np.asarray(starts, float)[order], np.asarray(ends, float)[order]
    running = np.maximum.accumulate(e)
    new = np.ones(len(s), bool)
    new[1:] = s[1:] > running[:-1] + gap_s
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx) if len(idx) else e


def busy_fraction_bins(spans: pd.DataFrame, lane: str = "compute", rank: int = 0,
                       bin_s: float = 0.25, t_end_s: float | None = None) -> pd.DataFrame:
    """Busy fraction of one lane of one rank in consecutive time bins from t = 0."""
    mine = spans[(spans["rank"] == rank) & (spans["lane"] == lane)]
    s, e = merged_intervals(mine["t_start_s"].to_numpy(), mine["t_end_s"].to_numpy())
    end = float(t_end_s if t_end_s is not None else (e.max() if len(e) else bin_s))
    edges = np.arange(0.0, end + 1e-12, bin_s)
    if edges[-1] < end - 1e-12:
        edges = np.append(edges, end)
    busy_to = np.clip(edges[:, None] - s[None, :], 0.0, (e - s)[None, :]).sum(axis=1)
    return pd.DataFrame({"t_start_s": edges[:-1], "t_end_s": edges[1:],
                         "busy_fraction": np.diff(busy_to) / np.diff(edges)})


def _step_row(steps: pd.DataFrame, step: int, rank: int = 0) -> pd.Series:
    row = steps[(steps["rank"] == rank) & (steps["step"] == step)]
    if row.empty:
        raise ValueError(f"step {step} of rank {rank} is not in the timeline")
    return row.iloc[0]


def _op_seconds(spans: pd.DataFrame, step: int, op: str, rank: int = 0) -> float:
    mine = spans[(spans["rank"] == rank) & (spans["step"] == step) & (spans["op"] == op)]
    return float((mine["t_end_s"] - mine["t_start_s"]).sum())


# -- Gantt ----------------------------------------------------------------------------
def draw_gantt(ax, spans: pd.DataFrame, t0: float, t1: float, lanes=GANTT_LANES,
               rank: int = 0) -> list[str]:
    """Lanes as rows (first on top), each op's spans merged where contiguous and clipped
    to [t0, t1]; x is seconds since t0. Returns the ops drawn, for the legend."""
    mine = spans[(spans["rank"] == rank) & (spans["t_end_s"] > t0) &
                 (spans["t_start_s"] < t1) & spans["lane"].isin(lanes)]
    drawn = []
    for y, lane in enumerate(reversed(lanes)):
        for op, group in mine[mine["lane"] == lane].groupby("op", sort=False):
            s, e = merged_intervals(group["t_start_s"].to_numpy(), group["t_end_s"].to_numpy(),
                                    gap_s=1e-6)
            s, e = np.clip(s, t0, t1) - t0, np.clip(e, t0, t1) - t0
            st = OP_STYLE[op]
            ax.broken_barh(list(zip(s, e - s)), (y - 0.36, 0.72), facecolors=st["color"],
                           hatch=st["hatch"], edgecolor=_hatch_colour(st["color"]),
                           linewidth=0)
            if op not in drawn:
                drawn.append(op)
    ax.set_yticks(range(len(lanes)), [LANE_LABEL[ln] for ln in reversed(lanes)])
    ax.set_ylim(-0.6, len(lanes) - 0.4)
    ax.set_xlim(0, t1 - t0)
    ax.grid(axis="y", visible=False)
    return [op for op in OP_STYLE if op in drawn]


def op_legend(ax, ops, **kw) -> None:
    handles = [Patch(facecolor=OP_STYLE[o]["color"], hatch=OP_STYLE[o]["hatch"],
                     edgecolor=_hatch_colour(OP_STYLE[o]["color"]), linewidth=0,
                     label=OP_STYLE[o]["label"]) for o in ops]
    ax.legend(handles=handles, **{"loc": "upper center", "ncols": min(len(ops), 5),
                                  "bbox_to_anchor": (0.5, -0.22), **kw})


# -- figure 1: GPU utilization over time ----------------------------------------------
def utilization_facts(util: pd.DataFrame) -> dict:
    """Mean compute-lane busy fraction per strategy over the plotted window."""
    out = {}
    for strategy, g in util.groupby("strategy"):
        w = g["t_end_s"] - g["t_start_s"]
        out[f"{strategy}_util_pct"] = 100 * float((g["busy_fraction"] * w).sum() / w.sum())
    out["window_s"] = float(util["t_end_s"].max())
    return out


@with_style
def plot_gpu_utilization(util: pd.DataFrame, caption: str = "") -> Figure:
    """`util`: strategy, t_start_s, t_end_s, busy_fraction (from `busy_fraction_bins`);
    one panel per strategy, stacked, sharing the time axis."""
    facts = utilization_facts(util)
    order = [s for s in STRATEGY_STYLE if s in set(util["strategy"])]
    fig, axes = new_figure(len(order), 1, figsize=(7.2, 1.3 + 1.25 * len(order)),
                           sharex=True)
    for ax, strategy in zip(axes[:, 0], order):
        g = util[util["strategy"] == strategy]
        st = STRATEGY_STYLE[strategy]
        mean = facts[f"{strategy}_util_pct"]
        edges = np.append(g["t_start_s"].to_numpy(), g["t_end_s"].iloc[-1])
        ax.stairs(100 * g["busy_fraction"].to_numpy(), edges, fill=True, color=st["color"],
                  hatch=st["hatch"], edgecolor=_hatch_colour(st["color"]), linewidth=0)
        ax.stairs(100 * g["busy_fraction"].to_numpy(), edges, color=st["color"],
                  linewidth=0.8)
        ax.axhline(mean, color="#000000", linestyle="--", linewidth=1.0)
        ax.text(facts["window_s"], mean, f" mean {mean:.0f}%", va="center", fontsize=8,
                ha="left", clip_on=False)
        ax.set_xlim(0, facts["window_s"])
        ax.set_ylim(0, 105)
        ax.set_yticks([0, 50, 100])
        ax.set_ylabel("GPU busy (%)")
        ax.set_title(st["label"], loc="left", fontsize=8.5)
        ax.set_xlabel("training time (s)")
        ax.label_outer()
    fig.suptitle(caption or "GPU utilization during training (simulated)",
                 fontsize=9.5, fontweight="bold")
    return fig


# -- figure 2: one ZeRO-Offload step --------------------------------------------------
def step_facts(spans: pd.DataFrame, steps: pd.DataFrame, step: int, rank: int = 0) -> dict:
    """Wall time, compute time, stall and host Adam time of one step of one rank."""
    table = step_breakdown(spans[spans["rank"] == rank], steps[steps["rank"] == rank])
    row = table[table["step"] == step].iloc[0]
    fwd_bwd = _op_seconds(spans, step, "forward", rank) + _op_seconds(spans, step, "backward", rank)
    return {"step": step, "wall_s": float(row["wall_s"]), "compute_s": float(row["compute_s"]),
            "fwd_bwd_s": fwd_bwd, "stall_s": float(row["stall_s"]),
            "stall_pct": 100 * float(row["stall_s"] / row["wall_s"]),
            "exposed_io_s": float(row["exposed_io_s"]), "host_wait_s": float(row["host_wait_s"]),
            "host_optim_s": _op_seconds(spans, step, "host_optim", rank)}


@with_style
def plot_offload_step(spans: pd.DataFrame, steps: pd.DataFrame, step: int,
                      caption: str = "") -> Figure:
    fig, axes = new_figure(figsize=(7.2, 2.9))
    ax = axes[0, 0]
    row = _step_row(steps, step)
    t0, t1 = float(row["t_start_s"]), float(row["t_end_s"])
    ops = draw_gantt(ax, spans, t0, t1)
    f = step_facts(spans, steps, step)
    top = len(GANTT_LANES) - 1
    ax.annotate("", xy=(t1 - t0, top + 0.5), xytext=(f["fwd_bwd_s"], top + 0.5),
                arrowprops=dict(arrowstyle="<->", color="#222222", linewidth=0.8),
                annotation_clip=False)
    ax.text((f["fwd_bwd_s"] + t1 - t0) / 2, top + 0.58,
            f"GPU idle: {f['stall_s']:.2f} s of {f['wall_s']:.2f} s ({f['stall_pct']:.0f}%)",
            ha="center", va="bottom", fontsize=8)
    host_y = len(GANTT_LANES) - 1 - GANTT_LANES.index("host")
    host = spans[(spans["rank"] == 0) & (spans["step"] == step) & (spans["op"] == "host_optim")]
    if not host.empty:
        mid = (host["t_start_s"].min() + host["t_end_s"].max()) / 2 - t0
        ax.text(mid, host_y, f"host Adam over the rank's partition: {f['host_optim_s']:.2f} s",
                ha="center", va="center", color="white", fontsize=8)
    ax.text(f["fwd_bwd_s"] / 2, top + 0.5, f"fwd+bwd {f['fwd_bwd_s']:.2f} s", ha="center",
            va="center", fontsize=7.5)
    ax.set_ylim(-0.6, top + 1.1)
    ax.set_xlabel("time since the step began (s)")
    ax.set_ylabel("lane (rank 0)")
    ax.set_title(caption or f"One ZeRO-Offload step (step {step}, simulated)")
    op_legend(ax, ops, bbox_to_anchor=(0.5, -0.24))
    return fig


# -- figure 3: the limit of layer-wise overlap ----------------------------------------
def overlap_limit_facts(spans: pd.DataFrame, steps: pd.DataFrame, first: int,
                        count: int, rank: int = 0) -> dict:
    """Per-step means over steps first .. first+count-1 of a zero-offload-dpu timeline."""
    rows = [step_facts(spans, steps, s, rank) for s in range(first, first + count)]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0] if k != "step"}
    mean["stall_pct"] = 100 * mean["stall_s"] / mean["wall_s"]  # ratio of means
    mean["exposed_host_s"] = max(mean["host_optim_s"] - mean["fwd_bwd_s"], 0.0)
    mean["host_over_fwd_bwd"] = mean["host_optim_s"] / mean["fwd_bwd_s"]
    return mean


@with_style
def plot_overlap_limit(spans: pd.DataFrame, steps: pd.DataFrame, first: int, count: int = 3,
                       caption: str = "") -> Figure:
    fig, axes = new_figure(2, 1, figsize=(7.2, 4.6), height_ratios=[2.2, 1.0])
    ax, bars = axes[0, 0], axes[1, 0]
    t0 = float(_step_row(steps, first)["t_start_s"])
    t1 = float(_step_row(steps, first + count - 1)["t_end_s"])
    ops = draw_gantt(ax, spans, t0, t1)
    for s in range(first, first + count):
        x = float(_step_row(steps, s)["t_start_s"]) - t0
        ax.axvline(x, color="#444444", linewidth=0.7, linestyle="--")
        ax.text(x + 0.01 * (t1 - t0), len(GANTT_LANES) - 0.45, f"step {s}", fontsize=7.5,
                va="bottom")
    ax.set_ylim(-0.6, len(GANTT_LANES) + 0.05)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("lane (rank 0)")
    ax.set_title(caption or "ZeRO-Offload + DPU: the host update of step t runs behind "
                 "step t+1 (simulated)")
    op_legend(ax, ops, bbox_to_anchor=(0.5, -0.26))
    f = overlap_limit_facts(spans, steps, first, count)
    y = [1, 0]
    bars.barh(y[0], f["host_optim_s"], height=0.55, **bar_style(OP_STYLE["host_optim"]))
    left = 0.0
    for part in ("compute_s", "exposed_io_s", "host_wait_s"):
        bars.barh(y[1], f[part], left=left, height=0.55, **bar_style(PART_STYLE[part]),
                  label=PART_STYLE[part]["label"])
        left += f[part]
    bars.axvline(f["fwd_bwd_s"], color="#000000", linestyle="--", linewidth=0.9)
    bars.text(f["fwd_bwd_s"], 1.45, f" forward+backward {f['fwd_bwd_s']:.2f} s: the most "
              f"overlap can hide", fontsize=7.5, va="center")
    bars.text(f["host_optim_s"], y[0], f"  host Adam {f['host_optim_s']:.2f} s "
              f"({f['host_over_fwd_bwd']:.1f}x fwd+bwd)", va="center", fontsize=7.5)
    bars.text(left, y[1], f"  step {f['wall_s']:.2f} s, stall {f['stall_s']:.2f} s",
              va="center", fontsize=7.5)
    bars.set_yticks(y, ["host update\nof one step", "one DPU step\n(GPU view)"])
    bars.set_ylim(-0.5, 1.75)
    bars.set_xlim(0, max(f["host_optim_s"], left) * 1.45)
    bars.set_xlabel(f"seconds per step (mean of steps {first}-{first + count - 1})")
    bars.set_ylabel("rank 0, per step")
    bars.grid(axis="y", visible=False)
    bars.legend(loc="upper center", bbox_to_anchor=(0.5, -0.42), ncols=3)
    return fig


# -- figure 4: ZenFlow's pipeline over update windows --------------------------------
def window_bounds(spans: pd.DataFrame, rank: int = 0) -> list[int]:
    """Steps at whose end a host update window closed (the steps holding host_optim)."""
    mine = spans[(spans["rank"] == rank) & (spans["op"] == "host_optim")]
    return sorted(int(s) for s in mine["step"].unique())


def pipeline_facts(spans: pd.DataFrame, steps: pd.DataFrame, first: int, count: int,
                   rank: int = 0) -> dict:
    last = first + count - 1
    bounds = [b for b in window_bounds(spans, rank) if first - 1 <= b <= last]
    facts = overlap_limit_facts(spans, steps, first, count, rank)
    host_optim = [_op_seconds(spans, b, "host_optim", rank) for b in bounds]
    accum = np.mean([_op_seconds(spans, s, "host_accum", rank) for s in range(first, last + 1)])
    interval = int(np.median(np.diff(bounds))) if len(bounds) > 1 else count
    t0 = float(_step_row(steps, first, rank)["t_start_s"])
    t1 = float(_step_row(steps, last, rank)["t_end_s"])
    host = spans[(spans["rank"] == rank) & (spans["lane"] == "host")]
    s, e = merged_intervals(host["t_start_s"].to_numpy(), host["t_end_s"].to_numpy())
    busy = float(np.clip(np.minimum(e, t1) - np.maximum(s, t0), 0, None).sum())
    return {**facts, "host_busy_pct": 100 * busy / (t1 - t0), "update_interval": interval,
            "windows": max(len(bounds) - 1, 1),
            "host_optim_per_window_s": float(np.mean(host_optim)) if host_optim else 0.0,
            "host_accum_per_step_s": float(accum),
            "window_compute_s": facts["compute_s"] * interval}


@with_style
def plot_zenflow_pipeline(spans: pd.DataFrame, steps: pd.DataFrame, first: int, count: int,
                          caption: str = "") -> Figure:
    fig, axes = new_figure(figsize=(7.2, 3.3))
    ax = axes[0, 0]
    last = first + count - 1
    t0 = float(_step_row(steps, first)["t_start_s"])
    t1 = float(_step_row(steps, last)["t_end_s"])
    ops = draw_gantt(ax, spans, t0, t1)
    bounds = [b for b in window_bounds(spans) if first - 1 <= b <= last]
    for k, b in enumerate(bounds):
        x = (float(_step_row(steps, b)["t_end_s"]) if b >= first else t0) - t0
        ax.axvline(x, color="#000000", linewidth=0.9, linestyle="--")
        if k + 1 < len(bounds):
            nxt = float(_step_row(steps, bounds[k + 1])["t_end_s"]) - t0
            ax.text((x + nxt) / 2, len(GANTT_LANES) - 0.45, f"update window {k + 1}",
                    ha="center", va="bottom", fontsize=7.5)
    ax.set_ylim(-0.6, len(GANTT_LANES) + 0.05)
    ax.set_xlabel(f"time since step {first} began (s)")
    ax.set_ylabel("lane (rank 0)")
    ax.set_title(caption or "ZenFlow: host Adam of each window runs behind the next "
                 "(simulated)")
    op_legend(ax, ops, bbox_to_anchor=(0.5, -0.24), ncols=4)
    return fig
