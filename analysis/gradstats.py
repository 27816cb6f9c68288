"""Gradient statistics from per-column norms: skew, temporal and spatial locality.

Pure numpy / pandas (no torch): every function takes arrays or the long column-norm
table that `zfbench.real.gradcapture` records and `zfbench.gradients` writes as
`gradients/colnorms.parquet` (step, layer, kind, col, sq_norm: sum over rows of g^2,
l1_norm: sum over rows of |g|).

Covers:
- `top_share(values, fraction)`: the share of the total held by the top
  k = max(1, floor(fraction * n)) entries (ZenFlow's k, `zfbench.core.schedule.topk_count`,
  used here for every k); `cumulative_curve`: that share on a grid of x.
- `skew_table`: top-1/5/10 % shares of the squared norm per matrix, per kind and for the
  whole model (pooled, and the mean over matrices), averaged over steps.
- `topk_membership`, `overlap_pairs`: the top-k column sets of each matrix per step, and
  for every pair of steps their overlap |A_a & A_b| / k and Jaccard |A & B| / |A | B|
  (the one top-k locality computation: `locality_table`, d = 1..max_d per kind, and
  `zfbench.analysis.plot_measured`'s figure aggregate it).
- `reselection_table`: for select_interval S, how much of the selected set a
  reselection every S steps changes.
- `spatial_share(sq_grad, fraction)`: of the energy in the top-k elements of a matrix,
  the part lying in its top-k columns.
- `pooled_heatmap`: block-mean |gradient| of a matrix, as a long (row, col, abs_grad) frame.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from zfbench.core.config_zenflow import DEFAULT_TOPK_RATIO
from zfbench.core.schedule import topk_count

FRACTIONS = (0.01, 0.05, 0.10)
KINDS = ("q", "k", "v", "o", "gate", "up", "down", "embedding", "lm_head", "other")


def top_share(values, fraction: float) -> float:
    """Share of sum(values) held by the top `topk_count(len, fraction)` values (>= 0)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    k = topk_count(v.size, fraction)
    total = v.sum()
    if total <= 0:
        return 0.0
    top = np.partition(v, v.size - k)[v.size - k:] if k < v.size else v
    return float(top.sum() / total)


def top_shares(values, fractions=FRACTIONS) -> dict[str, float]:
    """`{"top_1pct": ..., "top_5pct": ..., "top_10pct": ...}` for `fractions`."""
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())[::-1]
    total = v.sum()
    csum = np.cumsum(v)
    out = {}
    for f in fractions:
        k = topk_count(v.size, f)
        out[_label(f)] = float(csum[k - 1] / total) if total > 0 else 0.0
    return out


def _label(fraction: float) -> str:
    return f"top_{100 * fraction:g}pct"


def cumulative_curve(values, points: int = 101) -> pd.DataFrame:
    """top_fraction (0..1 on `points` points) -> share of the total held by that top part
    (linear between whole entries; 0 at 0, 1 at 1)."""
    v = np.sort(np.asarray(values, dtype=np.float64).ravel())[::-1]
    total = v.sum()
    xs = np.arange(v.size + 1) / v.size
    ys = np.append(0.0, np.cumsum(v) / total) if total > 0 else np.zeros(v.size + 1)
    grid = np.linspace(0.0, 1.0, points)
    return pd.DataFrame({"top_fraction": grid, "share": np.interp(grid, xs, ys)})


# -- skew ----------------------------------------------------------------------------
def skew_table(colnorms: pd.DataFrame, fractions=FRACTIONS, source: str = "") -> pd.DataFrame:
    """Top-x shares of the column squared norms: one row per matrix (`level` "matrix",
    `name` = layer), per kind ("kind", mean over that kind's matrices) and the whole model
    ("model": all columns of all matrices pooled per step), each a mean over steps
    (with `steps`), and the plain mean over matrices (level "model", name "mean over
    matrices"). Columns: source, unit ("column"), level, name, kind, steps, top_*."""
    labels = [_label(f) for f in fractions]
    rows = []
    for (layer, kind), g in colnorms.groupby(["layer", "kind"], sort=False):
        per_step = [top_shares(h["sq_norm"].to_numpy(), fractions)
                    for _, h in g.groupby("step", sort=True)]
        rows.append({"level": "matrix", "name": layer, "kind": kind, "steps": len(per_step),
                     **{lab: float(np.mean([p[lab] for p in per_step])) for lab in labels}})
    matrices = pd.DataFrame(rows)
    kinds = matrices.groupby("kind", sort=False).agg(
        steps=("steps", "max"), **{lab: (lab, "mean") for lab in labels}).reset_index()
    kinds["level"], kinds["name"] = "kind", kinds["kind"]
    per_step = [top_shares(h["sq_norm"].to_numpy(), fractions)
                for _, h in colnorms.groupby("step", sort=True)]
    model = pd.DataFrame([{"level": "model", "name": "all", "kind": "all",
                           "steps": len(per_step),
                           **{lab: float(np.mean([p[lab] for p in per_step]))
                              for lab in labels}}])
    mean = pd.DataFrame([{"level": "model", "name": "mean over matrices", "kind": "all",
                          "steps": len(per_step),
                          **{lab: float(matrices[lab].mean()) for lab in labels}}])
    out = pd.concat([model, mean, kinds, matrices], ignore_index=True)
    out.insert(0, "unit", "column")
    out.insert(0, "source", source)
    return out[["source", "unit", "level", "name", "kind", "steps", *labels]]


def model_curve(colnorms: pd.DataFrame, points: int = 101) -> pd.DataFrame:
    """Cumulative curve of the whole model's column squared norms, mean over steps."""
    curves = [cumulative_curve(h["sq_norm"].to_numpy(), points)["share"].to_numpy()
              for _, h in colnorms.groupby("step", sort=True)]
    return pd.DataFrame({"top_fraction": np.linspace(0, 1, points),
                         "share": np.mean(curves, axis=0)})


# -- temporal locality ---------------------------------------------------------------
def topk_membership(colnorms: pd.DataFrame, fraction: float, score: str = "sq_norm"):
    """Per layer: (kind, steps [S], member [S, cols] bool, k): the top-k columns by
    `score` at each recorded step."""
    out = {}
    for (layer, kind), g in colnorms.groupby(["layer", "kind"], sort=False):
        wide = g.pivot_table(index="step", columns="col", values=score, aggfunc="sum")
        vals = wide.to_numpy(np.float64)
        cols = vals.shape[1]
        k = topk_count(cols, fraction)
        idx = np.argpartition(-vals, k - 1, axis=1)[:, :k]
        member = np.zeros_like(vals, dtype=bool)
        np.put_along_axis(member, idx, True, axis=1)
        out[layer] = (kind, wide.index.to_numpy(), member, k)
    return out


PAIR_COLUMNS = ["layer", "kind", "start", "gap", "overlap", "jaccard", "random"]


def overlap_pairs(colnorms: pd.DataFrame, fraction: float, score: str = "sq_norm",
                  max_gap: int | None = None) -> pd.DataFrame:
    """One row per matrix and pair of its recorded steps a < b (b - a <= `max_gap` when
    given): layer, kind, start (a), gap (b - a, in steps), overlap |A_a & A_b| / k, jaccard
    |A_a & A_b| / |A_a | A_b| of the top-k column sets by `score`, and random (k / cols:
    what two independent random k-sets share on average). Empty with fewer than two steps."""
    parts: list[tuple] = []
    for layer, (kind, steps, member, k) in topk_membership(colnorms, fraction, score).items():
        steps = np.asarray(steps)
        for d in range(1, len(steps)):  # pairs (i, i + d); steps ascend, so gaps grow with d
            gap = steps[d:] - steps[:-d]
            keep = np.ones(len(gap), dtype=bool) if max_gap is None else gap <= max_gap
            if not keep.any():
                break
            inter = (member[:-d] & member[d:]).sum(axis=1)[keep]
            union = (member[:-d] | member[d:]).sum(axis=1)[keep]
            parts.append((layer, kind, steps[:-d][keep], gap[keep], inter / k, inter / union,
                          k / member.shape[1]))
    if not parts:
        return pd.DataFrame({c: [] for c in PAIR_COLUMNS})
    n = [len(p[2]) for p in parts]
    return pd.DataFrame({
        "layer": np.repeat([p[0] for p in parts], n), "kind": np.repeat([p[1] for p in parts], n),
        "start": np.concatenate([p[2] for p in parts]),
        "gap": np.concatenate([p[3] for p in parts]),
        "overlap": np.concatenate([p[4] for p in parts]),
        "jaccard": np.concatenate([p[5] for p in parts]),
        "random": np.repeat([p[6] for p in parts], n)})


def locality_table(colnorms: pd.DataFrame, fraction: float = DEFAULT_TOPK_RATIO,
                   max_d: int = 64, score: str = "sq_norm") -> pd.DataFrame:
    """kind, d, overlap, jaccard, pairs, random_overlap: mean over matrices of that kind
    and start steps t of |A_t & A_t+d| / k and |A & B| / |A | B|, for d = 1..max_d
    (recorded steps must be consecutive for d to be in steps). Also kind "all"."""
    for layer, g in colnorms.groupby("layer", sort=False):
        steps = np.sort(g["step"].unique())
        if len(steps) > 1 and not np.all(np.diff(steps) == 1):
            raise ValueError(f"{layer}: recorded steps are not consecutive")
    per_pair = overlap_pairs(colnorms, fraction, score, max_gap=max_d)
    if per_pair.empty:
        raise ValueError("locality needs at least two recorded steps")
    pairs = per_pair.groupby(["layer", "kind", "gap"], sort=False).agg(
        overlap_sum=("overlap", "sum"), jaccard_sum=("jaccard", "sum"),
        pairs=("overlap", "size"), random=("random", "first")).reset_index()
    pairs = pairs.rename(columns={"gap": "d"}).drop(columns="layer")
    both = pd.concat([pairs, pairs.assign(kind="all")], ignore_index=True)
    agg = both.groupby(["kind", "d"], sort=False).agg(
        overlap_sum=("overlap_sum", "sum"), jaccard_sum=("jaccard_sum", "sum"),
        pairs=("pairs", "sum"), random_overlap=("random", "mean")).reset_index()
    agg["overlap"] = agg["overlap_sum"] / agg["pairs"]
    agg["jaccard"] = agg["jaccard_sum"] / agg["pairs"]
    return agg[["kind", "d", "overlap", "jaccard", "pairs", "random_overlap"]]


def reselection_table(colnorms: pd.DataFrame, fraction: float = DEFAULT_TOPK_RATIO,
                      intervals=(1, 2, 4, 8, 16, 32, 64), score: str = "l1_norm") -> pd.DataFrame:
    """kind, select_interval, reselections, changed_fraction, changed_columns: selecting
    at steps 0, S, 2S, ... (by `score`, L1 as ZenFlow does), the mean share of the k
    selected columns a reselection swaps out, and the mean count per matrix."""
    rows = []
    for layer, (kind, steps, member, k) in topk_membership(colnorms, fraction, score).items():
        for s in intervals:
            picks = member[::s]
            if len(picks) < 2:
                continue
            changed = k - (picks[:-1] & picks[1:]).sum(axis=1)
            rows.append({"kind": kind, "select_interval": s, "reselections": len(changed),
                         "changed_fraction": float(np.mean(changed / k)),
                         "changed_columns": float(np.mean(changed))})
    if not rows:
        raise ValueError("reselection needs at least two recorded steps")
    table = pd.DataFrame(rows)
    both = pd.concat([table, table.assign(kind="all")], ignore_index=True)
    return both.groupby(["kind", "select_interval"], sort=False).agg(
        reselections=("reselections", "max"), changed_fraction=("changed_fraction", "mean"),
        changed_columns=("changed_columns", "mean")).reset_index()


# -- spatial locality and heatmaps ---------------------------------------------------
def spatial_share(sq_grad, fraction: float = DEFAULT_TOPK_RATIO) -> float:
    """Of the energy (g^2) held by the top `fraction` of a matrix's elements, the share
    that lies in its top `fraction` of columns (by column squared norm)."""
    g = np.asarray(sq_grad, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"need a 2-D array, got shape {g.shape}")
    flat = g.ravel()
    ke = topk_count(flat.size, fraction)
    thresh_idx = np.argpartition(-flat, ke - 1)[:ke]
    top_mask = np.zeros(flat.size, dtype=bool)
    top_mask[thresh_idx] = True
    top_mask = top_mask.reshape(g.shape)
    kc = topk_count(g.shape[1], fraction)
    cols = np.argpartition(-g.sum(axis=0), kc - 1)[:kc]
    energy = (g * top_mask).sum()
    if energy <= 0:
        return 0.0
    return float((g[:, cols] * top_mask[:, cols]).sum() / energy)


def pooled_heatmap(abs_grad, max_rows: int = 64, max_cols: int = 128) -> pd.DataFrame:
    """Block-mean of |g| down to at most max_rows x max_cols blocks: row, col, abs_grad
    (row and col are block indices when pooled)."""
    g = np.abs(np.asarray(abs_grad, dtype=np.float64))
    r = max(1, math.ceil(g.shape[0] / max_rows))
    c = max(1, math.ceil(g.shape[1] / max_cols))
    pr, pc = math.ceil(g.shape[0] / r) * r, math.ceil(g.shape[1] / c) * c
    padded = np.full((pr, pc), np.nan)
    padded[:g.shape[0], :g.shape[1]] = g
    pooled = np.nanmean(padded.reshape(pr // r, r, pc // c, c), axis=(1, 3))
    rows, cols = np.indices(pooled.shape)
    return pd.DataFrame({"row": rows.ravel(), "col": cols.ravel(),
                         "abs_grad": pooled.ravel()})
