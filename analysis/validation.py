"""Measured vs simulated: error tables and schedule comparison (pure pandas, no torch).

- `compare_rows` pairs a measured summary row with a simulated one: step time, stall
  fraction and bytes per step, with signed deltas (simulated minus measured).
- `error_summary` gives the mean absolute percentage error and the maximum of step time,
  the worst stall-fraction miss in points, and per group of strategies run on the same
  shape the Spearman rank correlation of their order (measured vs simulated).
- `schedule_signature` reduces a timeline to what must agree whatever the speeds: per step,
  the compute lane's op sequence (consecutive repeats collapsed) and the set of ops on each
  other lane. `signature_diff` lists where two signatures differ.
- `op_seconds` / `compare_ops`: the busy seconds per step of every (lane, op) over the
  steady steps, measured beside simulated: where a step-time error comes from.
"""

from __future__ import annotations

import pandas as pd

COMPARED = ("step_time_s", "stall_fraction", "d2h_bytes_per_step", "h2d_bytes_per_step")


def compare_rows(measured: dict, simulated: dict) -> dict:
    out = {}
    for key in COMPARED:
        m, s = float(measured[key]), float(simulated[key])
        out[f"measured_{key}"] = m
        out[f"simulated_{key}"] = s
        out[f"delta_{key}"] = s - m
        if key != "stall_fraction":
            out[f"rel_error_{key}"] = (s - m) / m if m else (0.0 if s == 0 else float("inf"))
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); 1.0 for fewer than 2 items."""
    if len(a) < 2:
        return 1.0
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return 1.0 if (ra == rb).all() else 0.0
    return float(pd.Series(ra).corr(pd.Series(rb)))


def error_summary(table: pd.DataFrame, group_cols: list[str]) -> dict:
    rel = table["rel_error_step_time_s"].abs()
    stall_points = 100 * table["delta_stall_fraction"].abs()
    corr = []
    same_order = 0
    distinct = agree = 0
    for _, group in table.groupby(group_cols):
        rho = spearman(group["measured_step_time_s"].tolist(),
                       group["simulated_step_time_s"].tolist())
        corr.append(rho)
        same_order += int(list(group.sort_values("measured_step_time_s")["strategy"]) ==
                          list(group.sort_values("simulated_step_time_s")["strategy"]))
        d, a = _pairs_beyond_noise(group)
        distinct, agree = distinct + d, agree + a
    return {"cells": len(table), "step_time_mape": float(rel.mean()),
            "step_time_max_abs_rel_error": float(rel.max()),
            "stall_max_abs_error_points": float(stall_points.max()),
            "stall_mean_abs_error_points": float(stall_points.mean()),
            "rank_correlation_min": min(corr) if corr else 1.0,
            "rank_correlation_mean": sum(corr) / len(corr) if corr else 1.0,
            "groups_same_order": same_order, "groups": len(corr),
            "pairs_beyond_noise": distinct, "pairs_beyond_noise_same_order": agree}


ORDER_NOISE = 0.05  # measured step times closer than this are a tie for the order check


def _pairs_beyond_noise(group: pd.DataFrame) -> tuple[int, int]:
    """Pairs of strategies whose measured step times differ by more than ORDER_NOISE, and
    how many of them the simulator orders the same way (closer pairs swap with noise)."""
    rows = list(zip(group["measured_step_time_s"], group["simulated_step_time_s"]))
    distinct = agree = 0
    for i, (m1, s1) in enumerate(rows):
        for m2, s2 in rows[i + 1:]:
            if abs(m1 - m2) > ORDER_NOISE * min(m1, m2):
                distinct += 1
                agree += int((m1 < m2) == (s1 < s2))
    return distinct, agree


def schedule_signature(spans: pd.DataFrame, first_step: int, last_step: int) -> dict:
    """Per step in [first, last]: ("compute", tuple of ops in order, repeats collapsed)
    and, for every other lane, the sorted set of ops it ran."""
    sig = {}
    window = spans[(spans["step"] >= first_step) & (spans["step"] <= last_step)]
    for step, group in window.groupby("step"):
        comp = group[group["lane"] == "compute"].sort_values("t_start_s")["op"].tolist()
        collapsed = [op for i, op in enumerate(comp) if i == 0 or comp[i - 1] != op]
        entry = {"compute": tuple(collapsed)}
        for lane, ops in group[group["lane"] != "compute"].groupby("lane")["op"]:
            entry[lane] = tuple(sorted(set(ops)))
        sig[int(step)] = entry
    return sig


def signature_diff(measured: dict, simulated: dict) -> list[str]:
    diffs = []
    for step in sorted(set(measured) | set(simulated)):
        m, s = measured.get(step, {}), simulated.get(step, {})
        for lane in sorted(set(m) | set(s)):
            if m.get(lane) != s.get(lane):
                diffs.append(f"step {step} {lane}: measured {m.get(lane)} "
                             f"vs simulated {s.get(lane)}")
    return diffs


def op_seconds(spans: pd.DataFrame, first_step: int, last_step: int,
               nested: tuple[str, str] | None = None) -> pd.Series:
    """Busy seconds per step of each (lane, op) over steps [first, last]: the sum of its
    spans' durations divided by the number of steps in the window. `nested` (outer
    lane, inner lane): spans of the inner lane lying wholly inside a span of the outer
    one are taken out of the outer span's time (the CPU lanes' host worker runs each
    upload inside its AdamW chunk: ("host", "h2d"))."""
    window = spans[(spans["step"] >= first_step) & (spans["step"] <= last_step)]
    steps = last_step - first_step + 1
    busy = window["t_end_s"] - window["t_start_s"]
    if nested is not None:
        busy = busy - _inner_seconds(window, *nested)
    return busy.groupby([window["lane"], window["op"]]).sum() / steps


def _inner_seconds(window: pd.DataFrame, outer: str, inner: str) -> pd.Series:
    """Per span of `window` (same index): the seconds of `inner`-lane spans lying wholly
    inside it, for spans of the `outer` lane (0 elsewhere)."""
    out = pd.Series(0.0, index=window.index)
    hosts = window[window["lane"] == outer].sort_values("t_start_s")
    inners = window[window["lane"] == inner].sort_values("t_start_s")
    if hosts.empty or inners.empty:
        return out
    # the outer span that starts last at or before each inner span's start
    pair = pd.merge_asof(
        inners[["t_start_s", "t_end_s"]].rename(columns={"t_end_s": "inner_end"}),
        hosts[["t_start_s", "t_end_s"]].assign(outer=hosts.index).rename(
            columns={"t_end_s": "outer_end"}), on="t_start_s", direction="backward")
    inside = pair[pair["outer"].notna() & (pair["inner_end"] <= pair["outer_end"])]
    seconds = (inside["inner_end"] - inside["t_start_s"]).groupby(
        inside["outer"].astype(window.index.dtype)).sum()
    out.loc[seconds.index] = seconds
    return out


def compare_ops(measured: pd.DataFrame, simulated: pd.DataFrame, first_step: int,
                last_step: int, nested: tuple[str, str] | None = None) -> pd.DataFrame:
    """One row per (lane, op) either timeline ran in the window: `measured_s_per_step`,
    `simulated_s_per_step` (0 where one side never ran it) and `measured_over_simulated`
    (inf where only the measurement has it, NaN where neither spent time). `nested`: as
    `op_seconds`, for the measured timeline (the simulator records no nested spans)."""
    m = op_seconds(measured, first_step, last_step, nested).rename("measured_s_per_step")
    s = op_seconds(simulated, first_step, last_step).rename("simulated_s_per_step")
    table = pd.concat([m, s], axis=1).fillna(0.0)
    both = table["simulated_s_per_step"] > 0
    table["measured_over_simulated"] = (
        table["measured_s_per_step"] / table["simulated_s_per_step"].where(both)).where(
        both, float("inf")).where(both | (table["measured_s_per_step"] > 0))
    table.index.names = ["lane", "op"]
    return table.reset_index().sort_values(["lane", "op"], ignore_index=True)
