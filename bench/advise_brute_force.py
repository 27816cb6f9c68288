"""`zfbench.advise`'s search against a brute force over its whole default space (issue 49).

    python bench/advise_brute_force.py [--model llama2-13b] [--node h100-8x-gen5]
                                       [--global-batch N] [--jobs auto] [--out DIR]

Every setup of `zfbench.advise.space.Space()` (all strategies, every knob value) is
checked against the memory model and simulated where it fits; then the command's search
(coarse grid and refinement) is run on the same numbers (no second simulation) for each
objective, over every strategy and over the offloading ones only (what advise --strategies
gives without device), and its pick set beside the brute force's: the same setup, or within the
error bar the table states (the pick's interval meets the best's). tests/test_advise.py
checks the same on a reduced space; this is the whole one, minutes on 2 cores.

Writes DIR/advise_brute_force.json (default bench/results/): the setups in the space, how
many fit, how many the search looked at, both picks per objective with their objective
and error interval, the wall time, the machine's load before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.advise.error_bars import regime_errors  # noqa: E402
from zfbench.advise.quality import QualityModel  # noqa: E402
from zfbench.advise.ranking import (OBJECTIVE_COLUMN, OBJECTIVES, overlaps,  # noqa: E402
                                    rank, scorer)
from zfbench.advise.search import Evaluator, brute_force, search  # noqa: E402
from zfbench.advise.space import Space, default_zenflow  # noqa: E402
from zfbench.advise.command import PER_GPU_DEFAULT, per_gpu_batch  # noqa: E402
from zfbench.core.strategies import device_adamw  # noqa: E402
from zfbench.sims.costs import SimSettings  # noqa: E402
from zfbench.sims.settings import on_node  # noqa: E402
from zfbench.simulation import usable_cpus  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama2-13b")
    p.add_argument("--node", default="h100-8x-gen5")
    p.add_argument("--global-batch", type=int)
    p.add_argument("--jobs", type=int, default=usable_cpus())
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    started = time.perf_counter()
    base = SimSettings.from_knobs(**on_node(args.node, {"model": args.model}))
    per_gpu = per_gpu_batch(args.global_batch, base.machine.ranks)
    space, quality, errors = Space(), QualityModel.load(), regime_errors()
    default = default_zenflow(space.strategies, per_gpu)
    evaluator = Evaluator(base, args.jobs)
    try:
        every = brute_force(space, per_gpu, evaluator)
    finally:
        evaluator.close()
    brute_s = time.perf_counter() - started
    out = {"model": args.model, "node": args.node, "per_gpu_batch": per_gpu,
           "global_batch": per_gpu * base.machine.ranks, "per_gpu_default": PER_GPU_DEFAULT,
           "setups": len(every), "fit": sum(r["simulated"] for r in every.values()),
           "brute_force_wall_s": brute_s, "jobs": args.jobs, "objectives": {}}
    offloading = tuple(s for s in space.strategies if not device_adamw(s))
    for objective, names in [(o, n) for n in (space.strategies, offloading)
                             for o in OBJECTIVES]:
        sub = replace(space, strategies=names)
        seen = Evaluator(base, quiet=True)
        seen.done = dict(evaluator.done)
        found = search(sub, per_gpu, seen, scorer(objective, quality))
        mine = {s: r for s, r in every.items() if s.strategy in names}
        best = rank(mine, objective, quality, errors, default)[0]
        pick = rank(found, objective, quality, errors, default)[0]
        within = overlaps(best, pick, objective)
        column = OBJECTIVE_COLUMN[objective]
        key = objective if names == space.strategies else f"{objective}, offloading only"
        out["objectives"][key] = {
            "searched_setups": len(found),
            "searched_simulated": sum(r["simulated"] for r in found.values()),
            "same_pick": pick["setup"] == best["setup"], "within_error_bar": within,
            **{f"{who}_{k}": row[k] for who, row in (("brute_force", best), ("search", pick))
               for k in ("setup", column, f"{column}_lo", f"{column}_hi", "step_s",
                         "error_pct")}}
        print(f"{key}: brute force {best['setup']} ({best[column]:.4g}); search "
              f"{pick['setup']} ({pick[column]:.4g}) after {len(found)} of "
              f"{len(mine)} setups")
    out.update(wall_s=time.perf_counter() - started, load_average_before=load_before,
               load_average_after=os.getloadavg(),
               date_utc=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "advise_brute_force.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out / 'advise_brute_force.json'} ({out['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
