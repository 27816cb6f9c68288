"""`python -m zfbench.validate`: does the simulator predict what the engine measures here?

Scenario: three shapes of one model slice (bf16 on the device lane by default, as
`zfbench.run`), sized from two calibrations (4 and 64 tokens) so that the host Adam is
shorter than, about equal to, and longer than forward+backward on this machine (the
ratio each shape's own profile measured is printed as `host_adam_over_compute`);
for each shape a profile is measured (`real.profile`) and every strategy runs on the
engine, zenflow at two (topk_ratio, update_interval) pairs; the simulator then runs the
same cells with that shape's profile. Printed and written (`--out`, default
runs/validate): `validate.csv` (measured vs simulated step time, stall fraction and bytes
per step with signed deltas), `validate_summary.json` (MAPE and max error of step time,
worst stall miss in points, rank correlation of the strategies' order per shape and
pair), `profiles/*.json`, and `traces/<cell>.json` (measured and simulated timelines of a
cell side by side, for Perfetto). Any cell whose schedule signature differs (the compute
lane's op order or the ops on another lane, per steady-state step) is reported and makes
the command exit non-zero.

    python -m zfbench.validate                 # full matrix, about 5-10 minutes here
    python -m zfbench.validate --quick         # tiny shapes, seconds (what CI runs)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd

from analysis.breakdown import summarize
from analysis.validation import (compare_rows, error_summary, schedule_signature,
                                 signature_diff)
from real.profile import mean_profile, measure_profile
from real.runner import RunSpec, train
from sims.costs import SimSettings
from sims.simulator import simulate
from zfbench.config import STRATEGIES
from zfbench.run import DEFAULT_PRECISION
from zfbench.trace import merge_chrome_traces, write_json_atomic

PAIRS = ((0.1, 4), (0.25, 2))
SIZING_SEQ = (4, 64)  # token counts of the two sizing profiles
RATIOS = (2.0, 1.0, 0.5)  # host Adam / (forward + backward), host longer to shorter


def compute_s(profile: dict, shape) -> float:
    """Forward + backward seconds per step at the profile's token count."""
    blocks = profile["calibration"]["blocks"]
    return sum((b["forward_s"] + b["backward_s"]) * (shape.layers if k == "decoder" else 1)
               for k, b in blocks.items())


def host_adam_s(profile: dict, shape) -> float:
    return shape.total_params / profile["calibration"]["host_adam_params_per_s"]


def sized_shapes(base: RunSpec, low: dict, high: dict, max_seq: int) -> dict[str, RunSpec]:
    """Token counts at which host Adam / (forward + backward) is about 2, 1 and 0.5, from
    two profiles (at few and at many tokens): forward + backward is fitted as a + b *
    tokens. On a CPU lane a (the weight traffic) dominates at small token counts, so the
    ratio cannot exceed r_max = host / (a + 4 b); then the three targets are scaled to
    r_max, r_max / 2 and r_max / 4 so the shapes stay distinct. Each shape is named by
    its target ratio (`ratio2`, `ratio0.45` ...); validate prints the ratio its own
    profile measured."""
    shape = base.shape()
    t_lo = low["calibration"]["batch"] * low["calibration"]["seq"]
    t_hi = high["calibration"]["batch"] * high["calibration"]["seq"]
    c_lo, c_hi = compute_s(low, shape), compute_s(high, shape)
    slope = max((c_hi - c_lo) / max(t_hi - t_lo, 1), 1e-9)
    intercept = c_lo - slope * t_lo
    host_s = host_adam_s(low, shape)
    r_max = host_s / (intercept + slope * 4)
    scale = min(1.0, r_max / max(RATIOS))
    if scale < 1.0:
        print(f"host Adam / (forward + backward) reaches at most {r_max:.2f} here (at 4 "
              f"tokens); shapes spread over {r_max / 4:.2f}-{r_max:.2f}", file=sys.stderr)
    out = {}
    for ratio in RATIOS:
        target = ratio * scale
        tokens = int(min(max(4, round((host_s / target - intercept) / slope)), max_seq))
        out[f"ratio{target:.3g}"] = replace(base, batch=1, seq=tokens)
    return out


def zenflow_overrides(topk: float, interval: int) -> dict:
    return {"topk_ratio": topk, "update_interval": interval, "overlap_step": True,
            "select_strategy": "step", "select_interval": 0}


def measure_cell(spec: RunSpec, strategy: str, pair, progress: bool):
    """Run one cell on the engine; its timeline (the engine itself is let go)."""
    spec = replace(spec, overrides=zenflow_overrides(*pair) if strategy == "zenflow" else {})
    return train(spec, strategy, progress=progress).timeline


def simulate_cell(spec: RunSpec, strategy: str, pair, profile_path: Path, skip: int, tl):
    """Simulate one cell with the shape's profile; compare it with the measured timeline."""
    measured = summarize(tl.spans_frame(), tl.steps_frame(), skip)
    settings = SimSettings(model=spec.model, layers=spec.layers, gpus=1,
                           micro_batch=spec.batch, seq=spec.seq,
                           precision=spec.engine_config(strategy).precision,
                           transfers="full", profile=str(profile_path), steps=spec.steps,
                           topk_ratio=pair[0], update_interval=pair[1], overlap_step=True,
                           select_interval=0)
    sim = simulate(settings, strategy).timeline
    simulated = summarize(sim.spans_frame(), sim.steps_frame(), skip)
    diffs = signature_diff(schedule_signature(tl.spans_frame(), skip, spec.steps - 1),
                           schedule_signature(sim.spans_frame(), skip, spec.steps - 1))
    return compare_rows(measured, simulated), diffs, sim


def validate(base: RunSpec, out: Path, skip: int, quick: bool, progress: bool) -> int:
    shape = base.shape()
    max_seq = (shape.max_positions - 2) if shape.max_positions else 4096
    print(f"calibrating {shape.name} at {SIZING_SEQ} tokens ...", file=sys.stderr)
    low, high = (measure_profile(replace(base, batch=1, seq=n)) for n in SIZING_SEQ)
    shapes = sized_shapes(base, low, high, max_seq)
    pairs = PAIRS[:1] if quick else PAIRS
    rows, failures = [], []
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    for shape_name, spec in shapes.items():
        # the machine drifts: the shape is profiled before and after its cells run, and
        # the simulator gets the mean of the two
        before = measure_profile(spec)
        cells = [(strategy, pair, measure_cell(spec, strategy, pair, progress))
                 for strategy in STRATEGIES
                 for pair in (pairs if strategy == "zenflow" else pairs[:1])]
        profile = mean_profile([before, measure_profile(spec)])
        profile_path = out / "profiles" / f"{shape_name}.json"
        write_json_atomic(profile_path, profile)
        ratio = host_adam_s(profile, shape) / compute_s(profile, shape)
        for strategy, pair, measured_tl in cells:
            row, diffs, sim_tl = simulate_cell(spec, strategy, pair, profile_path, skip,
                                               measured_tl)
            cell = f"{shape_name}.{strategy}" + (
                f".topk{pair[0]}-U{pair[1]}" if strategy == "zenflow" else "")
            write_json_atomic(out / "traces" / f"{cell}.json", merge_chrome_traces(
                {f"{cell} measured": measured_tl, f"{cell} simulated": sim_tl}))
            for p in ([pair] if strategy == "zenflow" else pairs):
                rows.append({"shape": shape_name, "batch": spec.batch, "seq": spec.seq,
                             "host_adam_over_compute": ratio,
                             "topk_ratio": p[0], "update_interval": p[1],
                             "strategy": strategy, "schedule_diffs": len(diffs), **row})
            failures.extend(f"{cell}: {d}" for d in diffs[:3])
    table = pd.DataFrame(rows)
    # each (shape, pair) group ranks all four strategies; the shared baselines appear in
    # every pair's group, so the error statistics count each real cell once
    summary = error_summary(table, ["shape", "topk_ratio", "update_interval"])
    unique = table.drop_duplicates(["shape", "strategy", "measured_step_time_s"])
    summary.update({k: v for k, v in error_summary(unique, ["shape"]).items()
                    if k.startswith(("step_time", "stall", "cells"))})
    summary["schedule_mismatches"] = len(failures)
    table.to_csv(out / "validate.csv", index=False)
    write_json_atomic(out / "validate_summary.json", summary)
    show = unique[["shape", "seq", "host_adam_over_compute", "strategy", "topk_ratio", "update_interval",
                   "measured_step_time_s", "simulated_step_time_s",
                   "rel_error_step_time_s", "measured_stall_fraction",
                   "simulated_stall_fraction", "schedule_diffs"]]
    print(show.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}/validate.csv, validate_summary.json, profiles/, traces/")
    for line in failures:
        print(f"schedule mismatch: {line}", file=sys.stderr)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m zfbench.validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="opt-350m")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--skip", type=int, default=8, help="steps left out of the averages")
    p.add_argument("--quick", action="store_true", help="tiny shapes, one pair (CI)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=DEFAULT_PRECISION,
                   help=f"device weights and gradients (default {DEFAULT_PRECISION}, as "
                        "python -m zfbench.run)")
    p.add_argument("--device-threads", type=int)
    p.add_argument("--host-threads", type=int)
    p.add_argument("--out", type=Path, default=Path("runs/validate"))
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.layers, args.steps, args.skip = "tiny", 2, 14, 6
    if args.skip >= args.steps - 1:
        print(f"error: --skip {args.skip} leaves no steps of {args.steps}", file=sys.stderr)
        return 2
    base = RunSpec(model=args.model, layers=args.layers, batch=1, seq=32, steps=args.steps,
                   device="cpu", device_threads=args.device_threads,
                   host_threads=args.host_threads, precision=args.precision)
    return validate(base, args.out, args.skip, args.quick, not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
