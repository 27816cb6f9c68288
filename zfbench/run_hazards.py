"""`python -m zfbench.run --device cpu --hazard-check`: the engine's real schedule of each
strategy, run on the CPU lanes under the hazard checker (zfbench/real/hazards.py).

Every buffer access of every op is checked against the waits the schedule declares, as a
GPU's streams would need them (real/backend.py). Prints, per strategy, the accesses seen,
the cross-lane accesses checked and the hazards found (each named: which lane touched
which buffer without waiting for which other lane), and writes them to OUT/hazards.json
when --out is given. Exit status 1 when any hazard is found.
"""

from __future__ import annotations

import sys

from zfbench.core.provenance import provenance
from zfbench.core.trace import write_json_atomic
from zfbench.real.runner import RunSpec, train


def check_schedules(args, spec: RunSpec, strategies: list[str]) -> int:
    if spec.device == "cuda":
        print("error: --hazard-check runs the CPU lanes (the checker proves the schedule "
              "itself); use --device cpu", file=sys.stderr)
        return 2
    spec.device = "cpu"
    rows = []
    for strategy in strategies:
        result = train(spec, strategy, progress=not args.quiet, hazard_check=True)
        report = result.engine.backend.hazards.report()
        waits = sorted(result.engine.backend.waits_used)
        rows.append({"strategy": strategy, "steps": spec.steps, **report, "waits": waits})
    print(f"{'strategy':>16} {'accesses':>10} {'cross-lane checked':>19} {'hazards':>8}")
    for row in rows:
        print(f"{row['strategy']:>16} {row['accesses']:>10} "
              f"{row['cross_lane_checked']:>19} {row['hazards']:>8}")
        for line in row["distinct"]:
            print(f"  {line}")
    found = sum(row["hazards"] for row in rows)
    print(f"{found} hazard(s) in {len(rows)} schedule(s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.out / "hazards.json",
                          {"rows": rows, "provenance": provenance(args.argv, "zfbench.run")})
    return 1 if found else 0
