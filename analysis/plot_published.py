"""The published-measurements figure: simulated against published, one marker per row.

Covers: `plot_published(df)` (one panel per kind of quantity, each on the simulated =
published line with a +-15 % band, markers coloured by source and shaped by strategy; a
row whose source calibrates a constant also drawn hollow where its leave-one-source-out
simulation lands, joined to its filled marker; both mean errors in the title)
`published_facts(df)` (the numbers its sentence quotes) and `published_sentence(facts)`. `df` is `python -m zfbench.validate --published`'s published.csv (columns in
docs/published.md); rows whose status is not `ok` are left out. No simulation here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from zfbench.analysis.plot_measured import strategy_style
from zfbench.analysis.plots import log_log_axes, new_figure, with_style

BAND = 0.15  # the band drawn around simulated = published
# Colour-blind-safe qualitative colours (Paul Tol's "bright"), one per source in order.
SOURCE_COLOURS = ("#4477AA", "#EE6677", "#228833", "#CCBB44", "#66CCEE", "#AA3377",
                  "#BBBBBB", "#000000")
# One log-log panel per kind of quantity (a panel without rows is left out).
PANELS = (("throughput", ("tflops_per_gpu",), "throughput per GPU (TFLOP/s)"),
          ("whole run", ("pflops_total", "samples_per_s", "tokens_per_s"),
           "throughput of all GPUs (PFLOP/s, samples/s or tokens/s)"),
          ("time", ("step_time_s", "backward_time_s", "host_adam_time_s",
                    "host_step_time_s"), "time (s)"))


def ok_rows(df: pd.DataFrame) -> pd.DataFrame:
    ok = df[df["status"] == "ok"].copy()
    ok["value"] = ok["value"].astype(float)
    ok["simulated"] = ok["simulated"].astype(float)
    ok["error_pct"] = ok["error_pct"].astype(float)
    for column in ("simulated_loso", "error_pct_loso"):  # tables from before LOSO: none
        ok[column] = ok[column].astype(float) if column in ok else np.nan
    return ok


def loso_judged(ok: pd.DataFrame) -> pd.Series:
    """Whether each row was simulated again with its source's calibrations judged."""
    if "loso_judged" not in ok:
        return pd.Series(False, index=ok.index)
    return ok["loso_judged"].astype(object).fillna("").astype(str).str.strip() != ""


def short_source(source: str) -> str:
    """`ZeRO-Offload, arXiv 2101.06840, Figure 8 (bars ...)` -> `ZeRO-Offload Figure 8`."""
    parts = [p.strip() for p in str(source).split(",")]
    where = parts[-1].split("(")[0].strip() if len(parts) > 2 else ""
    name = parts[0].split("(")[0].strip()
    return f"{name} {where}".strip()


def counted_rows(ok: pd.DataFrame) -> pd.DataFrame:
    """The rows the error counts: calibration rows (a non-empty `calibration`, which
    reproduce themselves by construction) left out, as `validate --published` does."""
    if "calibration" not in ok:
        return ok
    # read back from CSV, an all-empty column is float NaN: no text to fill it with
    return ok[ok["calibration"].astype(object).fillna("").astype(str).str.strip() == ""]


def published_facts(df: pd.DataFrame) -> dict:
    all_ok = ok_rows(df).reset_index(drop=True)  # one label per row (a concat repeats)
    ok = counted_rows(all_ok)
    worst = ok.loc[ok["error_pct"].abs().idxmax()]
    per = ok.groupby("source", sort=False)["error_pct"].apply(lambda e: e.abs().mean())
    loso = all_ok["error_pct_loso"].abs()
    return {"rows": len(ok), "calibration": len(all_ok) - len(ok),
            "rows_loso": int(loso.notna().sum()),
            "mae_loso_pct": float(loso.mean()) if loso.notna().any() else float("nan"),
            "unsupported": int((df["status"] != "ok").sum()),
            "mae_pct": float(ok["error_pct"].abs().mean()),
            "within_15_pct": float(100 * (ok["error_pct"].abs() <= 100 * BAND).mean()),
            "within_25_pct": float(100 * (ok["error_pct"].abs() <= 25).mean()),
            "worst_id": worst["id"], "worst_pct": float(worst["error_pct"]),
            "best_source": short_source(per.idxmin()), "best_source_pct": float(per.min()),
            "worst_source": short_source(per.idxmax()), "worst_source_pct": float(per.max())}


def published_sentence(f: dict) -> str:
    """What figure 16 shows, in numbers from `published_facts`."""
    calib = f.get("calibration", 0)
    left_out = f" ({calib} calibration rows left out)" if calib else ""
    return (f"Over {f['rows']} published GPU measurements{left_out} the simulation misses by "
            f"{f['mae_pct']:.1f}% on average ({f['within_15_pct']:.0f}% of rows within 15%, "
            f"{f['within_25_pct']:.0f}% within 25%, {f['unsupported']} unsupported); the "
            f"closest source is {f['best_source']} ({f['best_source_pct']:.1f}%), the "
            f"farthest {f['worst_source']} ({f['worst_source_pct']:.1f}%), and the worst row "
            f"{f['worst_id']} ({f['worst_pct']:+.0f}%)."
            + (f" Leave-one-source-out (each source simulated with the constants its own "
               f"rows calibrate at their sourced judgments, every row counted) it misses by "
               f"{f['mae_loso_pct']:.1f}% over {f['rows_loso']} rows."
               if f.get("rows_loso") else ""))


@with_style
def plot_published(df: pd.DataFrame) -> Figure:
    ok = ok_rows(df)
    sources = list(dict.fromkeys(ok["source"]))
    colour = {s: SOURCE_COLOURS[i % len(SOURCE_COLOURS)] for i, s in enumerate(sources)}
    panels = [(metrics, what) for _, metrics, what in PANELS
              if ok["metric"].isin(metrics).any()] or [PANELS[0][1:]]
    fig, axes = new_figure(1, len(panels), figsize=(4.2 * len(panels), 5.6))
    for ax, (metrics, what) in zip(axes[0], panels):
        rows = ok[ok["metric"].isin(metrics)]
        if rows.empty:
            ax.set_visible(False)
            continue
        loso = rows["simulated_loso"].where(loso_judged(rows)).dropna()
        lo = float(min(rows["value"].min(), rows["simulated"].min(),
                       loso.min() if len(loso) else np.inf)) / 1.4
        hi = float(max(rows["value"].max(), rows["simulated"].max(),
                       loso.max() if len(loso) else 0)) * 1.4
        grid = np.geomspace(lo, hi, 60)
        ax.fill_between(grid, grid * (1 - BAND), grid * (1 + BAND), color="#E4E4E4",
                        linewidth=0, label=f"within {100 * BAND:.0f}%")
        ax.plot(grid, grid, color="#222222", linestyle="--", linewidth=0.9,
                label="simulated = published")
        judged = loso_judged(rows)
        for i, r in rows.iterrows():
            marker = strategy_style(r["strategy"])["marker"]
            ax.plot(r["value"], r["simulated"], linestyle="none", marker=marker,
                    markersize=6, color=colour[r["source"]], markeredgecolor="#222222",
                    markeredgewidth=0.4)
            if judged[i] and r["simulated_loso"] > 0:  # out of sample: hollow, joined
                ax.plot([r["value"]] * 2, [r["simulated"], r["simulated_loso"]],
                        color=colour[r["source"]], linewidth=0.7)
                ax.plot(r["value"], r["simulated_loso"], linestyle="none", marker=marker,
                        markersize=6, markerfacecolor="none",
                        markeredgecolor=colour[r["source"]], markeredgewidth=1.0)
        log_log_axes(ax)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_aspect("equal", adjustable="box")
        ax.set_xlabel(f"published {what}")
        ax.set_ylabel(f"simulated {what}")
    handles = [axes[0, 0].plot([], [], linestyle="none", marker="s", color=colour[s],
                               label=short_source(s))[0] for s in sources]
    for strategy in dict.fromkeys(ok["strategy"]):
        st = strategy_style(strategy)
        handles.append(axes[0, 0].plot([], [], linestyle="none", marker=st["marker"],
                                       color="#888888", label=st["label"])[0])
    if loso_judged(ok).any():
        handles.append(axes[0, 0].plot([], [], linestyle="none", marker="o",
                                       markerfacecolor="none", color="#444444",
                                       label="leave-one-source-out (its source's "
                                             "calibrations at their judgments)")[0])
    band = [h for h in axes[0, 0].get_legend_handles_labels()[0][:2]]
    fig.legend(handles=band + handles, loc="outside lower center", ncols=3, fontsize=7)
    f = published_facts(df)
    errors = f"mean |error| {f['mae_pct']:.1f}% over {f['rows']} rows (calibration rows " \
             f"left out)" + (f", leave-one-source-out {f['mae_loso_pct']:.1f}% over " \
                             f"{f['rows_loso']} rows" if f["rows_loso"] else "")
    fig.suptitle("Simulated against published GPU measurements (one marker per row)\n"
                 + errors, fontsize=10)
    return fig
