"""Which ZenFlow knob, if any, costs quality? The convergence study (bench/convergence.py)
re-run with one knob changed at a time from the paper's settings (top-k 0.1, update
interval 4, overlap on, reselection every 16 steps), beside the device baseline.

    python bench/convergence_ablation.py                      # the topic task, seeds 0 1 2
    python bench/convergence_ablation.py --tasks topics lm --seeds 0 1 2 3 4
    python bench/convergence_ablation.py --set update_interval --seeds 0
    python bench/convergence_ablation.py --pool DIR1 DIR2 ...   # the table from runs pooled

Knob sets (`--set`, default all):
    update_interval   zenflow-u1, zenflow (U=4), zenflow-uauto
    topk_ratio        zenflow-k0.05, zenflow (0.1), zenflow-k0.2
    select_interval   zenflow-s4, zenflow (16), zenflow-s64, zenflow-s0 (select once)
    overlap           zenflow-ov0, zenflow (on)
Every other argument goes to bench/convergence.py unchanged (same plateau criterion, same
data and seeds); results under bench/results/convergence_ablation/ in its layout, plus
`ablation.csv`: per knob set and variant, the mean and std over seeds of the final
validation loss and test accuracy and their difference to zenflow at the paper's
settings, with each seed's difference paired (same batches).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import pandas as pd  # noqa: E402

import convergence  # noqa: E402

SETS = {
    "update_interval": ("zenflow-u1", "zenflow", "zenflow-uauto"),
    "topk_ratio": ("zenflow-k0.05", "zenflow", "zenflow-k0.2"),
    "select_interval": ("zenflow-s4", "zenflow", "zenflow-s64", "zenflow-s0"),
    "overlap": ("zenflow-ov0", "zenflow"),
}
REFERENCE = "zenflow"


def variants_for(sets: list[str]) -> list[str]:
    return list(dict.fromkeys(["device", REFERENCE, *(v for s in sets for v in SETS[s])]))


def paired(runs: pd.DataFrame, sets: list[str]) -> pd.DataFrame:
    """Per (task, set, variant): mean/std of the final metrics and of their per-seed
    difference to the reference variant (same task and seed)."""
    metrics = [m for m in ("final_val_loss", "final_test_acc") if m in runs]
    ref = runs[runs.variant == REFERENCE].set_index(["task", "seed"])[metrics]
    rows = []
    for knob in sets:
        for variant in ("device", *SETS[knob]):
            for task, g in runs[runs.variant == variant].groupby("task"):
                g = g.set_index(["task", "seed"])
                d = g[metrics] - ref.reindex(g.index)
                r = {"set": knob, "task": task, "variant": variant, "n": len(g)}
                for m in metrics:
                    if g[m].isna().all():
                        continue
                    r |= {f"{m}_mean": g[m].mean(), f"{m}_std": g[m].std(ddof=1),
                          f"{m}_minus_ref_mean": d[m].mean(),
                          f"{m}_minus_ref_std": d[m].std(ddof=1)}
                rows.append(r)
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/convergence_ablation.py",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="+", choices=list(SETS), default=list(SETS), dest="sets")
    p.add_argument("--tasks", nargs="+", default=["topics"], choices=["topics", "lm"])
    p.add_argument("--seeds", nargs="+", default=["0", "1", "2"])
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/convergence_ablation")
    p.add_argument("--pool", nargs="+", type=Path, metavar="DIR",
                   help="run nothing: write --out/ablation.csv from the runs.csv of these "
                        "directories pooled (a task, variant and seed found twice keeps "
                        "the first), e.g. this study's seed 0, more seeds run apart with "
                        "bench/convergence.py, and the study's device and zenflow runs")
    args, rest = p.parse_known_args(argv)
    if args.pool:
        runs = pd.concat([pd.read_csv(d / "runs.csv") for d in args.pool], ignore_index=True)
        runs = runs.drop_duplicates(["task", "variant", "seed"])
        runs = runs[runs["variant"].isin(variants_for(args.sets))]
        table = paired(runs, args.sets)
        table.to_csv(args.out / "ablation.csv", index=False)
        print(table.to_string(index=False))
        return 0
    code = convergence.main(["--tasks", *args.tasks, "--seeds", *args.seeds,
                             "--variants", *variants_for(args.sets),
                             "--out", str(args.out), *rest])
    table = paired(pd.read_csv(args.out / "runs.csv"), args.sets)
    table.to_csv(args.out / "ablation.csv", index=False)
    print(table.to_string(index=False))
    return code


if __name__ == "__main__":
    sys.exit(main())
