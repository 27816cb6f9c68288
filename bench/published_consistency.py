"""What the published ZeRO-Offload bars allow the host step to be, from the bars alone.

For each setting measured both with ZeRO-Offload and with its one-step delayed parameter
update (DPU), the two published throughputs give two step times (through the counted
FLOPs of `python -m zfbench.validate --published`, zfbench/validate/metrics.py). Without
DPU the host's optimizer step H runs between backward and the next forward; with DPU it
runs beside the next step's device work C. So, whatever the host and the link do,

    step_zo  = C + H + X        (X: the rest of ZeRO-Offload's exposed time, >= 0)
    step_dpu = max(C, H) + Y    (Y: DPU's exposed time besides, >= 0)

and where DPU exposes no more than ZeRO-Offload does (Y <= X: it moves the same bytes and
hides the host step), min(C, H) <= step_zo - step_dpu. The device's work C is at least the
counted FLOPs at the GPU's peak (`compute_floor_s`, no efficiency assumed); where that
floor is above the difference, the difference bounds the host step H from above, no
simulator constant involved. The bars were read off the figures' images to about +-0.5
TFLOPS (the dataset's documentation): `host_step_bound_max_s` takes each bar at the end
of that band that widens the bound. Beside it: the host step the same paper's Table 4 gives for the
row's parameters (CPU-Adam alone, 10B parameters in 2.57 s on the DGX-2's two Xeon 8168,
scaled by parameter count; Adam is the floor of the host step, not all of it).

Second, across figures: two throughput rows of one strategy, node, GPU count, hidden
size, heads, micro-batch, sequence and accumulation that differ only in depth (Figure
14's 1B at batch 8 and Figure 9's 2B at batch 8, 20 and 40 layers of hidden 2048) run the
same layers on the same device: per counted FLOP, only the embedding and head's share and
the parameters per FLOP (the host step and the copies) differ, so their throughputs can
differ only by that. `depth_pairs` sets the published ratio (each bar's read-off band
taken to the end that brings it nearest the simulated one) beside the simulator's ratio by
shape without anchors, which carries exactly those shares and nothing fitted.

Third, one GPU without offload across code bases: every `device` row on one GPU, of the
dataset and of the held-out file `zfbench/data/published/held_out_no_offload_v100.csv`
(Megatron-LM's own single-V100 baseline, 2019 and 1.0; rows of no figure the error
averages), with the step its number stands for, its counted FLOPs over that step as a
fraction of the GPU's peak, and the simulator's step of the same row without anchors.
`measured_speed_over_simulated` (simulated step over published step) is how much faster
the measured code ran than the shape-based compute model; its spread over rows of like
shapes on one GPU kind is what no per-shape model, whatever its constants, can cover.

    python bench/published_consistency.py [--out bench/results/published_consistency]

Writes `pairs.csv` (one row per ZeRO-Offload/DPU pair), `depth_pairs.csv`,
`no_offload.csv` and `summary.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.sims.costs import CostModel  # noqa: E402
from zfbench.validate.metrics import counted_flops, implied_step_s  # noqa: E402
from zfbench.validate.published import (bundled_path, published_value,  # noqa: E402
                                        read_rows, row_settings, simulate_row)

TABLE4_ID = "zo-table4-cpuadam-10b"
HELD_OUT = ROOT / "zfbench" / "data" / "published" / "held_out_no_offload_v100.csv"
SETTING = ("source", "model", "micro_batch", "seq", "grad_accum", "gpus", "hardware")
# What two rows must share to differ only in depth (besides hidden size and heads).
SAME_BUT_DEPTH = ("strategy", "hardware", "gpu", "gpus", "micro_batch", "seq", "grad_accum",
                  "precision", "activation_checkpointing")


READ_OFF_TFLOPS = 0.5  # the bars' reading accuracy (docs/published.md)


def step_and_params(row: dict, shift: float = 0.0) -> tuple[float, float, float]:
    """The published step time of a throughput row (its value moved by `shift`), the
    parameters of its rank's partition (the host step's work) and the step's counted
    FLOPs at the GPU's peak."""
    settings = row_settings(row)
    costs = CostModel(settings)
    value = published_value(row) + shift
    step = implied_step_s(settings, costs, row["metric"], value)
    floor = counted_flops(settings, costs) / costs.flops_per_s * costs.mfu
    return step, costs.params / settings.machine.ranks, floor


def pairs(rows: list[dict]) -> pd.DataFrame:
    by_id = {r["id"]: r for r in rows}
    table4 = by_id[TABLE4_ID]
    _, table4_params, _ = step_and_params({**table4, "metric": "step_time_s"})
    adam_s_per_param = published_value(table4) / table4_params
    groups: dict[tuple, dict[str, dict]] = {}
    for r in rows:
        if r["metric"] == "tflops_per_gpu":
            groups.setdefault(tuple(r[k] for k in SETTING), {})[r["strategy"]] = r
    out = []
    for members in groups.values():
        if "zero-offload" not in members or "zero-offload-dpu" not in members:
            continue
        zo, dpu = members["zero-offload"], members["zero-offload-dpu"]
        step_zo, params, floor = step_and_params(zo)
        step_dpu = step_and_params(dpu)[0]
        widest = (step_and_params(zo, -READ_OFF_TFLOPS)[0]
                  - step_and_params(dpu, READ_OFF_TFLOPS)[0])
        device = members.get("device")
        step_pt = step_and_params(device)[0] if device else float("nan")
        table4_adam = adam_s_per_param * params
        bound = step_zo - step_dpu
        out.append({
            "zo_id": zo["id"], "dpu_id": dpu["id"], "source": zo["source"],
            "model": zo["model"], "micro_batch": int(zo["micro_batch"]),
            "partition_params": params,
            "published_zo_step_s": step_zo, "published_dpu_step_s": step_dpu,
            "published_device_step_s": step_pt,
            "dpu_gain_pct": 100 * (step_zo / step_dpu - 1),
            "compute_floor_s": floor,
            "host_step_bound_s": bound,
            "host_step_bound_max_s": widest,
            "bound_holds": bool(floor > widest),
            "table4_adam_s": table4_adam,
            "table4_over_bound_max": table4_adam / widest if widest > 0 else float("inf"),
        })
    return pd.DataFrame(out)


def depth_pairs(rows: list[dict]) -> pd.DataFrame:
    """Throughput rows that differ only in depth (module docstring): the published ratio
    of the shallower to the deeper, its read-off band, and the simulator's ratio."""
    by_id = {r["id"]: r for r in rows}
    groups: dict[tuple, list[tuple[int, dict]]] = {}
    for r in rows:
        if r["metric"] != "tflops_per_gpu":
            continue
        shape = get_model(r["model"])
        key = (*(r.get(k, "") for k in SAME_BUT_DEPTH), shape.hidden, shape.heads)
        groups.setdefault(key, []).append((shape.layers, r))
    out, anchors, simulated = [], {}, {}

    def sim(row: dict) -> float:  # a row in two pairs is simulated once
        if row["id"] not in simulated:
            simulated[row["id"]] = simulate_row(row, by_id, anchors)["simulated_no_anchor"]
        return simulated[row["id"]]
    for members in groups.values():
        members.sort(key=lambda m: m[0])
        for (l_a, a), (l_b, b) in zip(members, members[1:]):
            if l_a == l_b:
                continue
            pa, pb = published_value(a), published_value(b)
            ratio = sim(a) / sim(b)
            low = (pa - READ_OFF_TFLOPS) / (pb + READ_OFF_TFLOPS)
            high = (pa + READ_OFF_TFLOPS) / (pb - READ_OFF_TFLOPS)
            nearest = min(max(ratio, low), high)
            out.append({"shallow_id": a["id"], "deep_id": b["id"],
                        "strategy": a["strategy"], "micro_batch": int(a["micro_batch"]),
                        "layers_shallow": l_a, "layers_deep": l_b,
                        "published_ratio": pa / pb, "published_ratio_low": low,
                        "published_ratio_high": high, "simulated_ratio": ratio,
                        "gap_at_nearest_pct": 100 * (nearest / ratio - 1)})
    return pd.DataFrame(out)


def no_offload_rates(rows: list[dict]) -> pd.DataFrame:
    """One-GPU rows without offload (module docstring): published and simulated step, each
    as counted FLOPs over the GPU's peak, and the measured code's speed over the model's."""
    out = []
    for r in rows:
        if r["strategy"] != "device" or int(r["gpus"]) != 1 \
                or r["metric"] not in ("tflops_per_gpu", "step_time_s"):
            continue
        step, _, floor = step_and_params(r)
        simulated = float(simulate_row(r, {}, {})["sim_step_time_s"])
        shape = get_model(r["model"])
        out.append({"id": r["id"], "source": r["source"], "hidden": shape.hidden,
                    "layers": shape.layers, "micro_batch": int(r["micro_batch"]),
                    "published_step_s": step, "simulated_step_s": simulated,
                    "published_fraction_of_peak": floor / step,
                    "simulated_fraction_of_peak": floor / simulated,
                    "measured_speed_over_simulated": simulated / step})
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=str(bundled_path()),
                        help="published rows (default: the bundled dataset)")
    parser.add_argument("--held-out", default=str(HELD_OUT),
                        help="rows outside the error, used only by the no-offload table "
                             "(default: the bundled held-out file)")
    parser.add_argument("--out", default="bench/results/published_consistency")
    args = parser.parse_args(argv)
    _, rows = read_rows(args.csv)
    table = pairs(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(table, out / "pairs.csv")
    depth = depth_pairs(rows)
    write_csv_atomic(depth, out / "depth_pairs.csv")
    no_offload = no_offload_rates(rows + read_rows(args.held_out)[1])
    write_csv_atomic(no_offload, out / "no_offload.csv")
    speeds = no_offload.measured_speed_over_simulated
    held = table[table.bound_holds]
    ratios = dict(zip(held.zo_id, held.table4_over_bound_max.round(2)))
    summary = {
        "rows_file": ("bundled" if Path(args.csv) == bundled_path() else str(args.csv)),
        "pairs": len(table),
        "table4_adam_over_widest_bound": ratios,
        "depth_gap_at_nearest_pct": dict(zip(depth.shallow_id + " / " + depth.deep_id,
                                             depth.gap_at_nearest_pct.round(1))),
        "no_offload_measured_speed_over_simulated": dict(zip(no_offload.id,
                                                             speeds.round(3))),
        "no_offload_speed_spread": round(float(speeds.max() / speeds.min()), 2),
        "read_off_tflops": READ_OFF_TFLOPS,
        "rule": "host step <= step_zo - step_dpu where DPU exposes no more than "
                "ZeRO-Offload besides the host step and the counted FLOPs at peak take "
                "longer than that difference; bars moved by the read-off to widen it",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    cols = ["zo_id", "micro_batch", "published_zo_step_s", "published_dpu_step_s",
            "dpu_gain_pct", "compute_floor_s", "host_step_bound_s", "host_step_bound_max_s",
            "table4_adam_s", "table4_over_bound_max"]
    print(table[cols].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("Table 4's Adam over the widest bound (above 1: the pair allows less host time "
          "than Table 4's Adam alone): " + ", ".join(f"{k} {v}x" for k, v in ratios.items()))
    print(depth.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print("Depth pairs (same device work per layer): the published ratio's band against the "
          "simulator's, gap at the band's nearest end: " + ", ".join(
              f"{k} {v:+.1f}%" for k, v in summary["depth_gap_at_nearest_pct"].items()))
    print(no_offload.drop(columns="source").to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"One GPU without offload: the measured code ran {speeds.min():.2f}x to "
          f"{speeds.max():.2f}x the simulated speed ({summary['no_offload_speed_spread']}x "
          "apart)")
    print(f"wrote {out / 'pairs.csv'}, {out / 'depth_pairs.csv'}, {out / 'no_offload.csv'} "
          f"and {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
