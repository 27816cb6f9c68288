"""The offloading step's own device work, read off the committed GPU runs (issue 44 item 1).

Does an offloading step (ZeRO-Offload and its kin) keep the device's compute lane busy
longer than the `device` strategy's forward+backward, with its gradient hooks, bucket
copies and the copy engine's HBM traffic during backward? Two readings of files already
under bench/results/gpu/, nothing simulated:

1. Every `run_*/steps.csv` with a `device` row (same GPU, model, shape, one run): the
   compute lane's busy seconds per step (`compute_s`, step 0 left out as warm-up). The
   `device` lane also holds its GPU AdamW, which an offloading lane lacks; its seconds come
   from the same session's profile (`<run>/../profile/profile.json`), as the simulator
   reads a profile (`CostModel.device_step_s`: elements / `device_optim_elems_per_s` +
   elements x `master_copy_s_per_elem`, or the engine's update timed by newer profiles,
   `device_step_s_per_elem`). Per offloading step i:
   `excess_i = compute_i - (median device compute - device update)`.
2. validate's per-op busy seconds (`validate/ops.csv`, measured columns): each offloading
   cell's forward and backward over the `device` cell's, same shape and run.

Beside them a what-if, simulated (not a fit): for each ZeRO-Offload bar of the ZenFlow
paper (zfbench/data/paper_zero_offload_bars.json, settings unstated), the tokens per GPU
(micro-batch 1, sequence in steps of 256) at which the simulated ZeRO-Offload compute
reaches the bar's GPU time, with and without activation checkpointing.

    python bench/offload_device_work.py [--results bench/results/gpu] [--out DIR]

Writes offload_device_work.csv (a row per run and offloading strategy), ops_vs_device.csv
and paper_bar_tokens.csv.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.strategies import offloads  # noqa: E402
from zfbench.core.trace import write_csv_atomic  # noqa: E402

WARMUP_STEPS = 1  # step 0 holds the allocations and the first kernels' setup
WHAT_IF_SEQS = tuple(range(512, 8192 + 1, 256))  # micro-batch 1: tokens per GPU


def device_update_s(params: float, calibration: dict) -> float:
    """The `device` strategy's optimizer step on its compute lane, from a profile's rates
    (as `CostModel.device_step_s` with a calibration: the engine's update where the
    profile timed it, else the selected columns' AdamW rate and the master copies)."""
    if "device_step_s_per_elem" in calibration:
        return params * calibration["device_step_s_per_elem"]
    return (params / calibration["device_optim_elems_per_s"]
            + params * calibration.get("master_copy_s_per_elem", 0.0))


def _spread(values: np.ndarray, prefix: str) -> dict:
    return {f"{prefix}_median_s": float(np.median(values)),
            f"{prefix}_min_s": float(values.min()), f"{prefix}_max_s": float(values.max())}


def run_rows(run_dir: Path, gpu: str, root: Path) -> list[dict]:
    """A row per offloading strategy of one run (see the module docstring)."""
    steps = pd.read_csv(run_dir / "steps.csv")
    steps = steps[steps["step"] >= WARMUP_STEPS]
    settings = json.loads((run_dir / "summary.json").read_text())["settings"]
    profile_path = run_dir.parent / "profile" / "profile.json"
    calibration = json.loads(profile_path.read_text())["calibration"]
    names = list(dict.fromkeys(steps["strategy"]))
    plain = [n for n in names if not offloads(n)]
    if len(plain) != 1:
        return []
    device = steps.loc[steps["strategy"] == plain[0], "compute_s"].to_numpy(float)
    update_s = device_update_s(float(settings["params"]), calibration)
    fwd_bwd_s = float(np.median(device)) - update_s
    rows = []
    for name in names:
        if not offloads(name):
            continue
        lane = steps.loc[steps["strategy"] == name, "compute_s"].to_numpy(float)
        excess = lane - fwd_bwd_s
        rows.append({
            "gpu": gpu, "run": str(run_dir.relative_to(root)), "model": settings["model"],
            "micro_batch": int(settings["micro_batch"]), "seq": int(settings["seq"]),
            "strategy": name, "steps": len(lane),
            **_spread(lane, "compute"), **_spread(device, "device_compute"),
            "device_update_s": update_s, "device_fwd_bwd_s": fwd_bwd_s,
            "lane_minus_device_median_s": float(np.median(lane) - np.median(device)),
            **_spread(excess, "excess"),
            "excess_over_fwd_bwd": float(np.median(excess)) / fwd_bwd_s,
            "profile": str(profile_path.relative_to(root))})
    return rows


def runs(results: Path, root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(results.glob("*/**/run_*/steps.csv")):
        run_dir = path.parent
        if not ((run_dir / "summary.json").is_file()
                and (run_dir.parent / "profile" / "profile.json").is_file()):
            continue
        rows += run_rows(run_dir, path.relative_to(results).parts[0], root)
    return pd.DataFrame(rows)


def ops_vs_device(results: Path, root: Path) -> pd.DataFrame:
    """Each offloading cell's measured forward and backward seconds over the device cell's
    of the same shape (validate/ops.csv)."""
    rows = []
    for path in sorted(results.glob("*/**/validate/ops.csv")):
        ops = pd.read_csv(path)
        ops = ops[ops["lane"] == "compute"]
        ops = ops.assign(shape=ops["cell"].str.split(".").str[0],
                         strategy=ops["cell"].str.split(".").str[1])
        for (shape, op), group in ops.groupby(["shape", "op"]):
            if op not in ("forward", "backward"):
                continue
            ref = group[~group["strategy"].map(offloads)]["measured_s_per_step"]
            if len(ref) != 1:
                continue
            for cell in group[group["strategy"].map(offloads)].itertuples():
                rows.append({"gpu": path.relative_to(results).parts[0],
                             "file": str(path.relative_to(root)), "cell": cell.cell,
                             "op": op, "measured_s_per_step": cell.measured_s_per_step,
                             "device_s_per_step": float(ref.iloc[0]),
                             "over_device": cell.measured_s_per_step / float(ref.iloc[0])})
    return pd.DataFrame(rows)


def crossing(xs: list[float], ys: list[float], target: float) -> float | None:
    """The x at which the non-decreasing curve (xs, ys) reaches `target`, linear between
    points; None when outside the curve."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if y0 <= target <= y1:
            return x0 if y1 == y0 else x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def paper_bar_tokens(path: Path) -> pd.DataFrame:
    """For each bar, the tokens per GPU whose simulated ZeRO-Offload compute is the bar's
    GPU time (module docstring); a what-if, no constant is changed by it."""
    from zfbench.core.strategies import BASELINE
    from zfbench.sims.costs import SimSettings
    from zfbench.sims.settings import node_knobs
    from zfbench.sims.simulator import simulate
    from zfbench.simulation import summary_row
    data = json.loads(path.read_text())
    rows = []
    for bar in data["bars"]:
        node = data["nodes"][bar["gpu"]]["node"]
        for checkpointing in (True, False):
            base = SimSettings.from_knobs(**node_knobs(node, data["gpus"]), model=bar["model"],
                                          micro_batch=1, seq=WHAT_IF_SEQS[0], precision="bf16",
                                          activation_checkpointing=checkpointing, steps=6)
            compute = [summary_row(simulate(base.with_(seq=seq), BASELINE))["compute_s"]
                       for seq in WHAT_IF_SEQS]
            at_1024 = compute[WHAT_IF_SEQS.index(1024)]
            rows.append({"gpu": bar["gpu"], "node": node, "model": bar["model"],
                         "activation_checkpointing": checkpointing,
                         "published_compute_s": bar["compute_s"],
                         "simulated_compute_1x1024_s": at_1024,
                         "tokens_per_gpu_to_match": crossing(
                             list(WHAT_IF_SEQS), list(np.maximum.accumulate(compute)),
                             bar["compute_s"])})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "gpu")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "offload_device_work")
    ap.add_argument("--bars", type=Path,
                    default=ROOT / "zfbench" / "data" / "paper_zero_offload_bars.json")
    args = ap.parse_args(argv)
    frame = runs(args.results, ROOT)
    if frame.empty:
        print(f"offload_device_work: no run with a device row and a profile under "
              f"{args.results}; pass --results with bench/results/gpu's layout",
              file=sys.stderr)
        return 1
    ops = ops_vs_device(args.results, ROOT)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "offload_device_work.csv")
    write_csv_atomic(ops, args.out / "ops_vs_device.csv")
    cols = ["gpu", "run", "micro_batch", "strategy", "steps", "compute_median_s",
            "device_compute_median_s", "device_update_s", "excess_median_s", "excess_min_s",
            "excess_max_s", "excess_over_fwd_bwd"]
    with pd.option_context("display.width", 200, "display.max_colwidth", 50):
        print(frame[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        if not ops.empty:
            print(ops[["gpu", "cell", "op", "over_device"]].to_string(
                index=False, float_format=lambda v: f"{v:.3f}"))
    bars = paper_bar_tokens(args.bars)
    write_csv_atomic(bars, args.out / "paper_bar_tokens.csv")
    print(bars.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"wrote offload_device_work.csv, ops_vs_device.csv and paper_bar_tokens.csv "
          f"to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
