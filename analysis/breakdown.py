"""Step breakdowns from a timeline: compute, exposed I/O, host wait and stall, per step.

This is the one function both sources go through (docs/design.md): a measured timeline from
the engine and a simulated one from sims/ are broken down by the same code.

Definitions, per rank and step (a step's wall interval comes from the timeline):
- `compute_s`: time the compute lane was busy inside the step.
- `stall_s` = wall - compute_s: the GPU stall of docs/design.md.
- `exposed_io_s`: the part of the stall during which a transfer (d2h, h2d or net) was in
  flight: time the GPU waited on a link.
- `host_wait_s` = stall_s - exposed_io_s: the GPU idle with no transfer in flight, i.e.
  waiting for the host optimizer.
So `compute_s + exposed_io_s + host_wait_s == wall_s` exactly, which is what a stacked bar
of the step needs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from zfbench.core.trace import TRANSFER_LANES

BREAKDOWN_COLUMNS = ["rank", "step", "wall_s", "compute_s", "exposed_io_s", "host_wait_s",
                     "stall_s", "d2h_bytes", "h2d_bytes", "net_bytes", "host_busy_s"]


def _covered(mid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For each point, whether any [start, end) interval contains it."""
    if len(starts) == 0:
        return np.zeros(len(mid), dtype=bool)
    inside = np.searchsorted(np.sort(starts), mid, "right") - \
        np.searchsorted(np.sort(ends), mid, "right")
    return inside > 0


def step_breakdown(spans: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, step) with the columns of `BREAKDOWN_COLUMNS`."""
    rows = []
    # The spans' columns as arrays and each lane's rows found once (not per rank): the
    # same elements, in the same order, as filtering the frame rank by rank.
    span_rank = spans["rank"].to_numpy()
    lanes = spans["lane"].to_numpy(object)
    starts, ends = spans["t_start_s"].to_numpy(float), spans["t_end_s"].to_numpy(float)
    span_step, span_bytes = spans["step"].to_numpy(), spans["bytes"].to_numpy()
    codes, names = pd.factorize(lanes)  # each row's lane as a number: masks from ints
    number = {name: k for k, name in enumerate(names)}

    def is_lane(lane: str) -> np.ndarray:
        return codes == number[lane] if lane in number else np.zeros(len(codes), dtype=bool)
    on_lane = {lane: is_lane(lane) for lane in ("compute", "host", "d2h", "h2d", "net")}
    on_transfer = np.zeros(len(lanes), dtype=bool)
    for lane in TRANSFER_LANES:
        on_transfer |= on_lane[lane] if lane in on_lane else is_lane(lane)
    for rank, rank_steps in steps.groupby("rank", sort=True):
        rank_steps = rank_steps.sort_values("t_start_s")
        a = rank_steps["t_start_s"].to_numpy(float)
        b = rank_steps["t_end_s"].to_numpy(float)
        mine = span_rank == rank
        comp, xfer, host = mine & on_lane["compute"], mine & on_transfer, mine & on_lane["host"]
        cs, ce = starts[comp], ends[comp]
        xs, xe = starts[xfer], ends[xfer]
        hs, he = starts[host], ends[host]
        bounds = np.unique(np.concatenate([a, b, cs, ce, xs, xe, hs, he]))
        lengths = np.diff(bounds)
        mid = (bounds[:-1] + bounds[1:]) / 2
        which = np.searchsorted(a, mid, "right") - 1
        valid = (which >= 0) & (mid < b[np.clip(which, 0, None)])
        which, lengths, mid = which[valid], lengths[valid], mid[valid]
        in_comp = _covered(mid, cs, ce)
        in_xfer = _covered(mid, xs, xe) & ~in_comp
        in_host = _covered(mid, hs, he)
        n = len(a)
        compute_s = np.bincount(which, lengths * in_comp, minlength=n)
        exposed_s = np.bincount(which, lengths * in_xfer, minlength=n)
        host_busy_s = np.bincount(which, lengths * in_host, minlength=n)
        wall = b - a
        stall = np.maximum(wall - compute_s, 0.0)
        frame = pd.DataFrame({
            "rank": rank, "step": rank_steps["step"].to_numpy(int), "wall_s": wall,
            "compute_s": compute_s, "exposed_io_s": exposed_s,
            "host_wait_s": np.maximum(stall - exposed_s, 0.0), "stall_s": stall,
            "host_busy_s": host_busy_s})
        for lane in ("d2h", "h2d", "net"):
            sel = mine & on_lane[lane]
            per_step = pd.Series(span_bytes[sel]).groupby(span_step[sel]).sum()
            frame[f"{lane}_bytes"] = frame["step"].map(per_step).fillna(0).astype("int64")
        rows.append(frame)
    if not rows:
        return pd.DataFrame(columns=BREAKDOWN_COLUMNS)
    return pd.concat(rows, ignore_index=True)[BREAKDOWN_COLUMNS]


def summarize(spans: pd.DataFrame, steps: pd.DataFrame, skip_steps: int = 0,
              model_bytes: float | None = None,
              host_optim_params_per_step: float | None = None,
              flops_per_step: float | None = None,
              peak_flops_per_s: float | None = None,
              table: pd.DataFrame | None = None, ranks: int | None = None) -> dict:
    """Mean per-step figures over steps >= `skip_steps`, averaged over ranks, plus the
    achieved rates (link GB/s per direction, host Adam parameters/s, compute utilization).
    `table`: `step_breakdown(spans, steps)` when the caller already has it. `ranks`: the
    run's rank count where the timeline holds only some of its ranks, the others alike
    (a simulation's repeating nodes: zfbench.sims.simulator); the whole run's figures
    (`ranks`, PCIe bytes of all ranks over the model's) count them all."""
    if table is None:
        table = step_breakdown(spans, steps)
    kept = table[table["step"] >= skip_steps]
    if kept.empty:
        raise ValueError(f"no steps left after skipping {skip_steps}; run more steps")
    first, last = int(kept["step"].min()), int(kept["step"].max())
    n_steps = last - first + 1
    in_timeline = kept["rank"].nunique()
    n_ranks = in_timeline if ranks is None else ranks
    mean = kept[["wall_s", "compute_s", "exposed_io_s", "host_wait_s", "stall_s",
                 "d2h_bytes", "h2d_bytes", "net_bytes", "host_busy_s"]].mean()
    step_time = float(mean["wall_s"])
    window = spans[(spans["step"] >= first) & (spans["step"] <= last)]
    busy = window.assign(d=window["t_end_s"] - window["t_start_s"]).groupby(
        ["lane", "op"])["d"].sum() / in_timeline / n_steps
    out = {
        "steps_measured": n_steps, "ranks": n_ranks,
        "step_time_s": step_time,
        "compute_s": float(mean["compute_s"]),
        "exposed_io_s": float(mean["exposed_io_s"]),
        "host_wait_s": float(mean["host_wait_s"]),
        "stall_s": float(mean["stall_s"]),
        "stall_fraction": float(mean["stall_s"]) / step_time if step_time > 0 else 0.0,
        "d2h_bytes_per_step": float(mean["d2h_bytes"]),
        "h2d_bytes_per_step": float(mean["h2d_bytes"]),
        "net_bytes_per_step": float(mean["net_bytes"]),
        "host_busy_fraction": float(mean["host_busy_s"]) / step_time if step_time else 0.0,
        "compute_utilization": float(mean["compute_s"]) / step_time if step_time else 0.0,
    }
    lane_busy = busy.groupby(level="lane").sum()
    for lane in ("d2h", "h2d"):
        t = float(lane_busy.get(lane, 0.0))
        out[f"{lane}_gb_per_s"] = out[f"{lane}_bytes_per_step"] / t / 1e9 if t > 0 else 0.0
    if model_bytes:
        out["pcie_bytes_per_step_over_model_bytes"] = \
            (out["d2h_bytes_per_step"] + out["h2d_bytes_per_step"]) * n_ranks / model_bytes
    host_optim_s = float(busy.get(("host", "host_optim"), 0.0))
    if host_optim_params_per_step is not None:
        out["host_adam_params_per_s"] = (host_optim_params_per_step / host_optim_s
                                         if host_optim_s > 0 else 0.0)
    if flops_per_step and peak_flops_per_s:
        out["mfu"] = flops_per_step / (peak_flops_per_s * step_time)
    return out
