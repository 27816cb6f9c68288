"""`python -m zfbench.validate`: does the simulator predict what the engine measures here?

Scenario: three shapes of one model slice, sized from a first calibration so that the host
Adam is shorter than, about equal to, and longer than forward+backward on this machine;
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
from pathlib import Path

import pandas as pd

from analysis.breakdown import summarize
from analysis.validation import (compare_rows, error_summary, schedule_signature,
                                 signature_diff)
from real.profile import measure_profile
from real.runner import RunSpec, train
from sims.costs import SimSettings
from sims.simulator import simulate
from zfbench.config import STRATEGIES
from zfbench.trace import merge_chrome_traces, write_json_atomic

PAIRS = ((0.1, 4), (0.25, 2))
RATIOS = {"host-shorter": 0.5, "host-equal": 1.0, "host-longer": 2.0}


def sized_shapes(base: RunSpec, profile: dict, max_seq: int) -> dict[str, RunSpec]:
    """Token counts at which host Adam / (forward + backward) is about each ratio."""
    cal = profile["calibration"]
    shape = base.shape()
    blocks = cal["blocks"]
    per_token = sum((b["forward_s"] + b["backward_s"]) * (shape.layers if k == "decoder" else 1)
                    / b["tokens"] for k, b in blocks.items())
    host_s = shape.total_params / cal["host_adam_params_per_s"]
    out = {}
    for name, ratio in RATIOS.items():
        tokens = max(4, round(host_s / (per_token * ratio)))
        batch = max(1, -(-tokens // max_seq))
        out[name] = RunSpec(model=base.model, layers=base.layers, batch=batch,
                            seq=max(4, min(max_seq, tokens // batch)), steps=base.steps,
                            seed=base.seed, device="cpu", device_threads=base.device_threads,
                            host_threads=base.host_threads)
    return out


def zenflow_overrides(topk: float, interval: int) -> dict:
    return {"topk_ratio": topk, "update_interval": interval, "overlap_step": True,
            "select_strategy": "step", "select_interval": 0}


def run_cell(spec: RunSpec, strategy: str, pair, profile_path: Path, skip: int,
             progress: bool):
    spec = RunSpec(**{**spec.__dict__, "overrides": zenflow_overrides(*pair)
                      if strategy == "zenflow" else {}})
    result = train(spec, strategy, progress=progress)
    tl = result.timeline
    measured = summarize(tl.spans_frame(), tl.steps_frame(), skip)
    settings = SimSettings(model=spec.model, layers=spec.layers, gpus=1,
                           micro_batch=spec.batch, seq=spec.seq, precision="fp32",
                           transfers="full", profile=str(profile_path), steps=spec.steps,
                           topk_ratio=pair[0], update_interval=pair[1], overlap_step=True,
                           select_interval=0)
    sim = simulate(settings, strategy).timeline
    simulated = summarize(sim.spans_frame(), sim.steps_frame(), skip)
    diffs = signature_diff(schedule_signature(tl.spans_frame(), skip, spec.steps - 1),
                           schedule_signature(sim.spans_frame(), skip, spec.steps - 1))
    return compare_rows(measured, simulated), diffs, tl, sim


def validate(base: RunSpec, out: Path, skip: int, quick: bool, progress: bool) -> int:
    shape = base.shape()
    max_seq = (shape.max_positions - 2) if shape.max_positions else 4096
    print(f"calibrating {shape.name} ...", file=sys.stderr)
    first = measure_profile(base)
    shapes = sized_shapes(base, first, max_seq)
    pairs = PAIRS[:1] if quick else PAIRS
    rows, failures = [], []
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    for shape_name, spec in shapes.items():
        profile_path = out / "profiles" / f"{shape_name}.json"
        write_json_atomic(profile_path, measure_profile(spec))
        for strategy in STRATEGIES:
            for pair in (pairs if strategy == "zenflow" else pairs[:1]):
                row, diffs, measured_tl, sim_tl = run_cell(spec, strategy, pair,
                                                           profile_path, skip, progress)
                cell = f"{shape_name}.{strategy}" + (
                    f".topk{pair[0]}-U{pair[1]}" if strategy == "zenflow" else "")
                write_json_atomic(out / "traces" / f"{cell}.json", merge_chrome_traces(
                    {f"{cell} measured": measured_tl, f"{cell} simulated": sim_tl}))
                for p in ([pair] if strategy == "zenflow" else pairs):
                    rows.append({"shape": shape_name, "batch": spec.batch, "seq": spec.seq,
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
    show = unique[["shape", "seq", "strategy", "topk_ratio", "update_interval",
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
                   host_threads=args.host_threads)
    return validate(base, args.out, args.skip, args.quick, not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
