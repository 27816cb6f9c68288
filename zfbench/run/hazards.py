"""`python -m zfbench.run --device cpu --hazard-check`: the engine's real schedule of each
strategy, run on the CPU lanes under the hazard checker (zfbench/real/hazards.py).

Every buffer access of every op is checked against the waits the schedule declares, as a
GPU's streams would need them (real/backend.py). Prints, per strategy, its gradient buckets, the accesses seen,
the cross-lane accesses checked and the hazards found (each named: which lane touched
which buffer without waiting for which other lane), and writes them to OUT/hazards.json
when --out is given. Exit status 1 when any hazard is found.

Without a --config each offloading strategy runs twice: as on the CPU lanes (gradients
down after backward) and as zfbench.run schedules it on a GPU (overlap_comm: gradient
buckets sent during backward, real/grad_buckets.py); with one, as the config says.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from zfbench.core.provenance import provenance
from zfbench.core.strategies import OFFLOAD_STRATEGIES
from zfbench.core.trace import write_json_atomic
from zfbench.real.runner import RunSpec, train


BUCKETS = 8


def check_schedules(spec: RunSpec, strategies: list[str], quiet: bool = False,
                    out: Path | None = None, argv: list[str] | None = None) -> int:
    """Run each strategy's schedules under the checker, print and (with `out`) write
    hazards.json, whose provenance records `argv`; 1 on any hazard."""
    if spec.device == "cuda":
        print("error: --hazard-check runs the CPU lanes (the checker proves the schedule "
              "itself); use --device cpu", file=sys.stderr)
        return 2
    spec = replace(spec, device="cpu")
    rows = []
    for strategy in strategies:
        variants = [{}]
        if spec.config is None and strategy in OFFLOAD_STRATEGIES:
            # the GPU's default schedule, in about BUCKETS buckets (whatever the model's
            # size: DeepSpeed's 5e8-element default would be one bucket for a slice)
            size = max(1, spec.shape().total_params // BUCKETS)
            variants.append({"overlap_comm": True, "reduce_bucket_size": size})
        for extra in variants:
            run = replace(spec, overrides={**spec.overrides, **extra})
            result = train(run, strategy, progress=not quiet, hazard_check=True)
            engine = result.engine
            report = engine.backend.hazards.report()
            buckets = 0 if engine.buckets is None else len(engine.buckets.buckets)
            rows.append({"strategy": strategy, "buckets": buckets,
                         "steps": spec.steps, **report,
                         "waits": sorted(engine.backend.waits_used)})
    print(f"{'strategy':>16} {'buckets':>8} {'accesses':>10} {'cross-lane checked':>19} "
          f"{'hazards':>8}")
    for row in rows:
        print(f"{row['strategy']:>16} {row['buckets'] or '-':>8} "
              f"{row['accesses']:>10} {row['cross_lane_checked']:>19} {row['hazards']:>8}")
        for line in row["distinct"]:
            print(f"  {line}")
    found = sum(row["hazards"] for row in rows)
    print(f"{found} hazard(s) in {len(rows)} schedule(s)")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "hazards.json",
                          {"rows": rows, "provenance": provenance(argv, "zfbench.run")})
    return 1 if found else 0
