"""Simulate a finished validate run's cells again, with this checkout's simulator.

`python -m zfbench.validate --out DIR` keeps, per cell, the profile the simulator used
(`DIR/profiles/<cell>.json`) and the measured step time (`DIR/validate.csv`). This runs the
simulator again on those profiles, so that a change to the simulator can be checked
against measurements taken before it, on a machine (a lent GPU) no longer at hand:

    python bench/validate_replay.py DIR --out FILE.csv [--calibration RATES.json]

`--calibration`: a JSON object of calibration keys added to every cell's profile (rates a
newer probe measures that the run's profiles lack, e.g. `host_zero_elems_per_s`), each
quoted with where it was measured in the output. Prints and writes, per cell, the
measured step time, the simulated one of the run and the one simulated now, and their
errors; then the mean absolute percentage error of both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.analysis.breakdown import summarize  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real.profile_record import with_rates  # noqa: E402
from zfbench.real.runner import RunSpec  # noqa: E402
from zfbench.sims.settings import for_engine_run  # noqa: E402
from zfbench.sims.simulator import simulate  # noqa: E402
from zfbench.validate.command import cell_name, zenflow_overrides  # noqa: E402


def zero_stage(row) -> int:
    """The row's ZeRO stage (2 in runs from before validate's ZeRO-3 cells)."""
    stage = row.get("zero_stage", 2)
    return 2 if pd.isna(stage) else int(stage)


def replay(run_dir: Path, extra: dict) -> pd.DataFrame:
    summary = json.loads((run_dir / "validate_summary.json").read_text())
    settings = summary["settings"]
    base_run = dict(settings["base_run"])
    if "batch" in base_run:  # summaries before RunSpec's `micro_batch` (the GPU sessions')
        base_run["micro_batch"] = base_run.pop("batch")
    base = RunSpec(**{**base_run, "overrides": {}})
    skip = settings["skip"]
    table = pd.read_csv(run_dir / "validate.csv")
    if "zero_stage" not in table:
        table["zero_stage"] = 2
    table = table.drop_duplicates(["shape", "strategy", "zero_stage", "measured_step_time_s"])
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _, row in table.iterrows():
            pair = (float(row["topk_ratio"]), int(row["update_interval"]))
            cell = cell_name(row["shape"], row["strategy"], pair, zero_stage(row))
            profile = json.loads((run_dir / "profiles" / f"{cell}.json").read_text())
            if extra:
                profile = with_rates(profile, extra)
            path = Path(tmp) / f"{cell}.json"
            write_json_atomic(path, profile)
            spec = replace(base, micro_batch=int(row["batch"]), seq=int(row["seq"]))
            config = replace(spec, overrides=zenflow_overrides(
                *pair, zero_stage(row))).engine_config("zenflow")
            sim_settings = for_engine_run(
                config, model=spec.model, layers=spec.layers, gpus=1,
                micro_batch=spec.micro_batch, seq=spec.seq, profile=str(path), steps=spec.steps,
                precision=spec.engine_config(row["strategy"]).precision)
            tl = simulate(sim_settings, row["strategy"]).timeline
            now = summarize(tl.spans_frame(), tl.steps_frame(), skip)["step_time_s"]
            measured = row["measured_step_time_s"]
            rows.append({"cell": cell, "measured_step_time_s": measured,
                         "simulated_then_step_time_s": row["simulated_step_time_s"],
                         "simulated_now_step_time_s": now,
                         "error_then_pct": 100 * (row["simulated_step_time_s"] - measured)
                         / measured,
                         "error_now_pct": 100 * (now - measured) / measured})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/validate_replay.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", type=Path, help="a validate --out folder")
    p.add_argument("--calibration", type=Path, help="JSON of calibration keys to add")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    extra = json.loads(args.calibration.read_text()) if args.calibration else {}
    extra = {k: float(v) for k, v in extra.items() if not k.startswith("_")}
    table = replay(args.run, extra)
    write_csv_atomic(table, args.out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"step-time MAPE: then {table['error_then_pct'].abs().mean():.1f}%, now "
          f"{table['error_now_pct'].abs().mean():.1f}%"
          + (f" (added: {', '.join(sorted(extra))})" if extra else ""))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
