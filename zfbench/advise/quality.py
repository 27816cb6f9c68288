"""Steps to quality and the quality penalty of a setup, from zfbench's own convergence runs.

This module owns reading `bench/convergence.py`'s committed results (the topic task of
SmolLM2-135M, docs/convergence.md: bench/results/convergence/, convergence_ablation/ and
its seeds12/, convergence_ds_seeds34/; zfbench's engine only, not the `deepspeed-*`
variants) into two numbers per setup:

- `steps_factor`: the steps a run needs to reach its validation-loss plateau, over the
  steps device AdamW needs (paired by seed: each variant against its reference on the seeds
  both ran); time to quality = simulated step time x this x device's steps;
- `quality_penalty_nats`: its final validation loss minus device AdamW's (nats, paired
  the same way; positive: worse).

Device AdamW is 1 and 0 by definition; ZeRO-Offload and its DPU variant are measured;
zero-infinity (never run here) takes device's: the same synchronous AdamW (labelled so).
ZenFlow's default (top-k 0.1, U 4, select every 16 steps, overlap on) is measured against
device; each knob was varied one at a time against that default (the ablation), so a
setup's factor is the default's times one ratio per knob, each interpolated linearly in
log2 of the knob between the measured values and extrapolated along the last measured
segment beyond them -- a separable model, stated in each row's `quality_basis`. Runs stop
at 200 steps whether or not they plateaued (`plateaued` false): those steps are a floor.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from zfbench.core.strategies import STRATEGY_LIST, device_adamw, has_windows, \
    offloads_params

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
RUN_FILES = ("convergence/runs.csv", "convergence_ablation/runs.csv",
             "convergence_ablation/seeds12/runs.csv", "convergence_ds_seeds34/runs.csv")
TASK = "topics"
TASK_LABEL = ("topic task of SmolLM2-135M (last 2 blocks trained, CPU lanes; "
              "bench/results/convergence*, docs/convergence.md)")
# ZenFlow's measured default in the study (docs/convergence.md, "The strategies").
MEASURED_DEFAULT = {"topk_ratio": 0.1, "update_interval": 4, "select_interval": 16}
# The ablation's variants: knob -> {value: variant name}; select_interval 0 is "select once".
ABLATION = {"topk_ratio": {0.05: "zenflow-k0.05", 0.2: "zenflow-k0.2"},
            "update_interval": {1: "zenflow-u1", "auto": "zenflow-uauto"},
            "select_interval": {0: "zenflow-s0", 4: "zenflow-s4", 64: "zenflow-s64"}}


class NoConvergenceData(RuntimeError):
    """The committed convergence results are not where this checkout keeps them."""


@dataclass(frozen=True)
class Measured:
    """One variant against its reference on the seeds both ran."""
    steps_ratio: float
    loss_delta_nats: float
    seeds: int
    censored: bool  # some run hit the step cap without a plateau


def read_runs(root: Path = RESULTS) -> dict[tuple[str, int], dict]:
    """{(variant, seed): the run's row} of the topic task over every file (a run found in
    two files is the same run: the first is kept)."""
    runs: dict[tuple[str, int], dict] = {}
    found = False
    for name in RUN_FILES:
        path = root / name
        if not path.is_file():
            continue
        found = True
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row["task"] == TASK:
                    runs.setdefault((row["variant"], int(row["seed"])), row)
    if not found:
        raise NoConvergenceData(f"no convergence results under {root} (bench/results/"
                                f"convergence*: a source checkout has them); use "
                                f"--objective throughput")
    return runs


def paired(runs: dict, variant: str, reference: str) -> Measured | None:
    """`variant` against `reference` over the seeds both ran (None: no shared seed)."""
    seeds = sorted(s for v, s in runs if v == variant and (reference, s) in runs)
    if not seeds:
        return None
    mine = [runs[(variant, s)] for s in seeds]
    ref = [runs[(reference, s)] for s in seeds]
    steps = sum(float(r["steps"]) for r in mine) / sum(float(r["steps"]) for r in ref)
    loss = sum(float(a["final_val_loss"]) - float(b["final_val_loss"])
               for a, b in zip(mine, ref)) / len(seeds)
    censored = any(r["plateaued"] != "True" for r in mine + ref)
    return Measured(steps, loss, len(seeds), censored)


def _axis(value) -> float:
    """Where a knob's value sits on its interpolation axis: log2 of it; select interval 0
    (select once) and update interval "auto" are their own points, never interpolated."""
    return math.log2(value)


def interpolate(points: dict, value) -> tuple[float, float, str]:
    """(steps ratio, loss delta, how) at `value` from {knob value: (ratio, delta, capped)}: an
    exact point, linear in log2 between the two around it, or along the nearest measured
    segment beyond them ("extrapolated")."""
    if value in points:
        ratio, delta, capped = points[value]
        return ratio, delta, "measured" + (" (capped at 200 steps)" if capped else "")
    numeric = sorted(k for k in points if isinstance(k, (int, float)) and k > 0)
    if not isinstance(value, (int, float)) or value <= 0 or len(numeric) < 2:
        raise ValueError(f"no convergence data to interpolate {value!r} from")
    x = _axis(value)
    lo = max([k for k in numeric if k < value], default=None)
    hi = min([k for k in numeric if k > value], default=None)
    how = "interpolated"
    if lo is None:
        lo, hi, how = numeric[0], numeric[1], "extrapolated"
    elif hi is None:
        lo, hi, how = numeric[-2], numeric[-1], "extrapolated"
    t = (x - _axis(lo)) / (_axis(hi) - _axis(lo))
    ratio = points[lo][0] + t * (points[hi][0] - points[lo][0])
    delta = points[lo][1] + t * (points[hi][1] - points[lo][1])
    if points[lo][2] or points[hi][2]:
        how += " (capped at 200 steps)"
    return max(ratio, 0.0), delta, f"{how} between {lo} and {hi}"


@dataclass(frozen=True)
class QualityModel:
    """The measured numbers a setup's steps factor and penalty are built from."""
    by_strategy: dict  # strategy -> Measured against device
    # knob -> {value: (steps ratio, loss delta, capped) against ZenFlow's measured default}
    zenflow_axes: dict
    seeds: dict  # variant -> seeds

    @classmethod
    def load(cls, root: Path = RESULTS) -> "QualityModel":
        runs = read_runs(root)
        reference = next(s.name for s in STRATEGY_LIST if device_adamw(s.name))
        by_strategy = {}
        for s in STRATEGY_LIST:
            found = paired(runs, s.name, reference)
            if found is not None:
                by_strategy[s.name] = found
        default = next(s.name for s in STRATEGY_LIST if has_windows(s.name))
        axes = {}
        for knob, variants in ABLATION.items():
            points = {MEASURED_DEFAULT[knob]: (1.0, 0.0, False)}
            for value, variant in variants.items():
                found = paired(runs, variant, default)
                if found is not None:
                    points[value] = (found.steps_ratio, found.loss_delta_nats,
                                     found.censored)
            axes[knob] = points
        seeds: dict[str, int] = {}
        for variant, _ in runs:
            seeds[variant] = seeds.get(variant, 0) + 1
        return cls(by_strategy, axes, seeds)

    def of(self, strategy: str, knobs: dict) -> tuple[float, float, str]:
        """(steps_factor, quality_penalty_nats, quality_basis) of a setup."""
        if device_adamw(strategy):
            return 1.0, 0.0, "device AdamW: the reference"
        if strategy not in self.by_strategy:
            if offloads_params(strategy) or not has_windows(strategy):
                return 1.0, 0.0, ("not measured; the same synchronous AdamW as device, so "
                                  "device's")
            raise ValueError(f"no convergence data for {strategy}")
        base = self.by_strategy[strategy]
        ratio, delta = base.steps_ratio, base.loss_delta_nats
        parts = [f"{strategy} measured ({base.seeds} seeds"
                 + (", some capped at 200 steps" if base.censored else "") + ")"]
        if has_windows(strategy):
            for knob, points in self.zenflow_axes.items():
                value = knobs[knob]
                r, d, how = interpolate(points, value)
                ratio *= r
                delta += d
                if value != MEASURED_DEFAULT[knob]:
                    parts.append(f"{knob} {value} {how}")
        return ratio, delta, "; ".join(parts)
