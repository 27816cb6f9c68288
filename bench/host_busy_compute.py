"""How much host work beside it slows a GPU step's compute lane, read off the committed runs (issue 44).

The GPU steps here are launch-bound (the host issues ~3800 kernels a step), so host
threads busy with AdamW or accumulation can slow the Python thread that issues them.
A profile measures it (`compute_factor_when_host_busy`: forward+backward alone over
beside host AdamW on the host threads, zfbench.real.rate_probe.lane_contention). This
reads every `run_*/steps.csv` under bench/results/gpu/ and simulates each of its
offloading strategies with the same session's profile (`<run>/../profile/`, the
strategy's own where present) at the run's shape, without the slowdown (factor 1):

- `excess_s`: measured compute-lane seconds a step (median, step 0 left out) over the
  simulated, less zero-offload's own (its compute never runs beside host work in the
  engine's schedule: the lanes' content the profile does not cost cancels);
- `overlap_s`: the simulated compute seconds a step that run while the rank's host lane
  is busy (median, same steps);
- `implied_factor` = overlap / (overlap + excess): the rate factor that would explain
  the excess if it all came from host work beside compute; beside `profile_factor`;
- `slowed_excess_s`: what the profile's factor adds to the simulated lane
  (zfbench.sims.host_busy: `sim_compute_slowed_s`, `sim_step_slowed_s`).

Seconds of a run at a micro-batch other than its profile's are put on the measured
zero-offload lane's scale (x measured / simulated zero-offload compute): the profile
scales its per-token times, which a launch-bound step does not.

    python bench/host_busy_compute.py [--results bench/results/gpu] [--out DIR]

Writes host_busy_compute.csv (a row per run and offloading strategy).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.config import EngineConfig, ZenFlowConfig  # noqa: E402
from zfbench.core.strategies import BASELINE, offloads  # noqa: E402
from zfbench.core.trace import write_csv_atomic  # noqa: E402
from zfbench.sims.settings import for_engine_run  # noqa: E402
from zfbench.sims.simulator import simulate, steps_needed  # noqa: E402
from zfbench.simulation import summary_row  # noqa: E402

WARMUP_STEPS = 1  # step 0 holds the allocations and the first kernels' setup


def overlap_per_step(spans: pd.DataFrame, rank: int = 0) -> pd.Series:
    """Seconds of each step's compute spans of `rank` during which its host lane is busy
    (the host spans' union), by the compute span's step."""
    mine = spans[spans["rank"] == rank]
    host = mine[mine["lane"] == "host"].sort_values("t_start_s")
    merged: list[list[float]] = []
    for a, b in zip(host["t_start_s"], host["t_end_s"]):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = np.array([m[0] for m in merged])
    ends = np.array([m[1] for m in merged])
    out: dict[int, float] = {}
    for a, b, step in mine.loc[mine["lane"] == "compute",
                               ["t_start_s", "t_end_s", "step"]].itertuples(index=False):
        both = np.clip(np.minimum(ends, b) - np.maximum(starts, a), 0.0, None).sum() \
            if len(starts) else 0.0
        out[int(step)] = out.get(int(step), 0.0) + float(both)
    return pd.Series(out, dtype=float)


def profile_for(run_dir: Path, strategy: str) -> Path:
    own = run_dir.parent / "profile" / "profiles" / f"{strategy}.json"
    return own if own.exists() else run_dir.parent / "profile" / "profile.json"


def engine_config(config: dict) -> EngineConfig:
    """The run's resolved config; a summary older than a field gets the field's default
    (the scheduler, new ZenFlow knobs: none of them changes a simulated step here)."""
    fields = {f.name: f for f in dataclasses.fields(EngineConfig)}
    d = {k: v for k, v in config.items() if k in fields or k == "train_batch_size"}
    d.setdefault("scheduler", None)
    if d.get("zenflow") is not None:
        known = {f.name for f in dataclasses.fields(ZenFlowConfig)}
        d["zenflow"] = {k: v for k, v in d["zenflow"].items() if k in known}
    return EngineConfig.from_dict(d)


def simulated(run_dir: Path, strategy: str, settings: dict, config: dict,
              workdir: Path) -> dict:
    """Simulated medians a step (steps >= WARMUP_STEPS) with the profile's compute
    factor set to 1 (`sim_compute_s`, `overlap_s`, `sim_step_s`) and as measured
    (`sim_compute_slowed_s`, `sim_step_slowed_s`: zfbench.sims.host_busy)."""
    path = profile_for(run_dir, strategy)
    profile = json.loads(path.read_text())
    factor = float(profile["calibration"].get("compute_factor_when_host_busy", 1.0))
    profile["calibration"]["compute_factor_when_host_busy"] = 1.0
    alone = workdir / f"{run_dir.parent.name}-{run_dir.name}-{strategy}.json"
    alone.write_text(json.dumps(profile))
    out = {"profile_factor": factor}
    for suffix, prof in (("", alone), ("_slowed", path)):
        sim = for_engine_run(engine_config(config), model=settings["model"],
                             layers=settings.get("layers"), gpus=1,
                             micro_batch=int(settings["micro_batch"]),
                             seq=int(settings["seq"]), profile=str(prof),
                             steps=int(settings["steps"]))
        sim = sim.with_(steps=max(sim.measurement.steps, steps_needed(sim)))
        result = simulate(sim, strategy)
        spans = result.timeline.spans_frame()
        spans = spans[spans["rank"] == 0]
        steps = sorted(s for s in spans["step"].unique() if s >= WARMUP_STEPS)
        compute = spans[spans["lane"] == "compute"].assign(d=lambda f: f.t_end_s - f.t_start_s)
        per_step = compute.groupby("step")["d"].sum().reindex(steps, fill_value=0.0)
        out[f"sim_compute{suffix}_s"] = float(per_step.median())
        out[f"sim_step{suffix}_s"] = float(summary_row(result)["step_time_s"])
        if not suffix:
            out["overlap_s"] = float(overlap_per_step(spans).reindex(
                steps, fill_value=0.0).median())
    return out


def run_rows(run_dir: Path, gpu: str, root: Path, workdir: Path) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    settings, configs = summary["settings"], summary["configs"]
    threads = {r["strategy"]: (r.get("device_threads"), r.get("host_threads"))
               for r in summary["rows"]}
    steps = pd.read_csv(run_dir / "steps.csv")
    steps = steps[steps["step"] >= WARMUP_STEPS]
    names = [n for n in dict.fromkeys(steps["strategy"]) if offloads(n)]
    measured_step = {r["strategy"]: r["step_time_s"] for r in summary["rows"]}
    if BASELINE not in names:
        return []
    rows = []
    for name in names:
        lane = steps.loc[steps["strategy"] == name, "compute_s"].to_numpy(float)
        rows.append({"gpu": gpu, "run": str(run_dir.relative_to(root)),
                     "micro_batch": int(settings["micro_batch"]), "strategy": name,
                     "device_threads": threads[name][0], "host_threads": threads[name][1],
                     "measured_compute_s": float(np.median(lane)),
                     "measured_step_s": measured_step[name],
                     **simulated(run_dir, name, settings, configs[name], workdir)})
    base = next(r for r in rows if r["strategy"] == BASELINE)
    base_gap = base["measured_compute_s"] - base["sim_compute_s"]
    for r in rows:
        r["excess_s"] = r["measured_compute_s"] - r["sim_compute_s"] - base_gap
        # on the measured zero-offload lane's scale (module docstring)
        scale = base["measured_compute_s"] / base["sim_compute_s"]
        overlap = r["overlap_s"] * scale
        # what the profile's factor adds to the lane (zfbench.sims.host_busy), same scale
        r["slowed_excess_s"] = (r["sim_compute_slowed_s"] - r["sim_compute_s"]) * scale
        r["implied_factor"] = (overlap / (overlap + r["excess_s"])
                               if overlap > 0 and overlap + r["excess_s"] > 0
                               else float("nan"))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "gpu")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_busy_compute")
    args = p.parse_args(argv)
    if not args.results.is_dir():
        p.error(f"--results {args.results}: not a folder; give bench/results/gpu")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for run_dir in sorted(args.results.glob("**/run_*")):
            if (run_dir / "steps.csv").exists() and (run_dir.parent / "profile").is_dir():
                rows += run_rows(run_dir, run_dir.relative_to(args.results).parts[0], ROOT,
                                 Path(workdir))
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(table, args.out / "host_busy_compute.csv")
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.drop(columns=["gpu"]).round(4).to_string(index=False))
    print(f"wrote {args.out}/host_busy_compute.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
