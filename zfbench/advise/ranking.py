"""The ranked table: each simulated setup that fits, scored by the objective, with its
error bar, its steps to quality and its quality penalty.

This module owns the objectives and the table's columns (units in their names):
- `throughput`: simulated tokens per second (the step time ranks the same: every setup
  trains the same global batch);
- `time-to-quality`: `time_to_quality_s_per_device_step` = the simulated step time x
  `steps_factor` (zfbench.advise.quality): the wall time per step device AdamW would need,
  so time to quality = this x device's steps. Interpolated as `quality_basis` says.

Every row carries `error_pct`, the mean absolute error of the simulator in its regime
(zfbench.advise.error_bars), as a bar on the simulated step, `step_s_lo` / `step_s_hi` =
step x (1 -/+ error), and the bar it puts on each objective (`tokens_per_s_lo` / `_hi`,
`time_to_quality_s_per_device_step_lo` / `_hi`). A row whose bar on the objective meets
the next row's is marked `within_error_of_next`: the simulator's measured error cannot
tell the two apart.
"""

from __future__ import annotations

import math

from zfbench.advise.error_bars import ErrorBar, unknown
from zfbench.advise.space import KNOB_ORDER, Setup

OBJECTIVES = ("throughput", "time-to-quality")
GIB = 2 ** 30
OBJECTIVE_COLUMN = {"throughput": "tokens_per_s",
                    "time-to-quality": "time_to_quality_s_per_device_step"}
TQ = "time_to_quality_s_per_device_step"
COLUMNS = ("rank", "strategy", "setup", "micro_batch", "grad_accum", *KNOB_ORDER,
           "step_s", "step_s_lo", "step_s_hi", "tokens_per_s", "tokens_per_s_lo",
           "tokens_per_s_hi", "error_pct", "within_error_of_next", "steps_factor",
           "quality_penalty_nats", TQ, f"{TQ}_lo", f"{TQ}_hi", "stall_fraction", "device_GiB",
           "device_capacity_GiB", "host_GiB", "host_capacity_GiB", "steps_simulated",
           "default_zenflow", "quality_basis", "error_source")


def scorer(objective: str, quality):
    """score(setup, result), lower is better; `quality` a QualityModel (or None for
    throughput)."""
    if objective == "throughput":
        return lambda setup, result: result["step_time_s"]
    if quality is None:
        raise ValueError("--objective time-to-quality needs the convergence results")

    def score(setup: Setup, result: dict) -> float:
        return result["step_time_s"] * quality.of(setup.strategy, setup.knobs())[0]
    return score


def row_of(setup: Setup, result: dict, objective: str, quality, error: ErrorBar,
           default: Setup | None) -> dict:
    """One table row (`COLUMNS`, less rank and within_error_of_next)."""
    factor, penalty, basis = (quality.of(setup.strategy, setup.knobs()) if quality
                              else (math.nan, math.nan, "no convergence data"))
    step, tokens, err = result["step_time_s"], result["tokens_per_s"], error.fraction
    lo, hi = step * max(1 - err, 0.0), step * (1 + err)
    row = {"strategy": setup.strategy, "setup": setup.label(),
           "micro_batch": setup.micro_batch, "grad_accum": setup.grad_accum,
           **{k: getattr(setup, k) for k in KNOB_ORDER},
           "step_s": step, "step_s_lo": lo, "step_s_hi": hi, "tokens_per_s": tokens,
           "tokens_per_s_lo": tokens * step / hi,
           "tokens_per_s_hi": tokens * step / lo if lo > 0 else math.inf,
           "error_pct": 100 * err, "steps_factor": factor,
           "quality_penalty_nats": penalty, TQ: step * factor, f"{TQ}_lo": lo * factor,
           f"{TQ}_hi": hi * factor,
           "stall_fraction": result["stall_fraction"],
           "device_GiB": result["device_bytes_per_rank"] / GIB,
           "device_capacity_GiB": result["device_capacity_bytes"] / GIB,
           "host_GiB": result["host_bytes"] / GIB,
           "host_capacity_GiB": result["host_capacity_bytes"] / GIB,
           "steps_simulated": result["steps_simulated"],
           "default_zenflow": setup == default, "quality_basis": basis,
           "error_source": error.source}
    return row


def rank(results: dict, objective: str, quality, errors: dict[str, ErrorBar],
         default: Setup | None) -> list[dict]:
    """Every simulated setup, best first, numbered from 1 (ties: `_second`, then fewer
    knobs changed from the default ZenFlow setup, then the label)."""
    rows = [row_of(s, r, objective, quality, errors.get(s.strategy) or unknown(s.strategy),
                   default)
            for s, r in results.items() if r["simulated"]]
    better_high = objective == "throughput"
    column = OBJECTIVE_COLUMN[objective]
    rows.sort(key=lambda r: (-r[column] if better_high else r[column],
                             _second(r, better_high), changed(r, default), r["setup"]))
    for i, row in enumerate(rows):
        row["rank"] = i + 1
        row["within_error_of_next"] = i + 1 < len(rows) and overlaps(row, rows[i + 1],
                                                                    objective)
    return [{c: row[c] for c in COLUMNS} for row in rows]


def _second(row: dict, throughput: bool) -> float:
    """The tie-break after the objective: the time to quality (a setup the simulation
    cannot tell from another in speed, but which needs fewer steps), else the step."""
    value = row[TQ] if throughput else row["step_s"]
    return math.inf if math.isnan(value) else value


def changed(row: dict, default: Setup | None) -> int:
    """How many knobs of a row differ from the default ZenFlow setup's (ties go to the
    setup with fewer changes)."""
    if default is None:
        return 0
    return sum(row[k] is not None and row[k] != getattr(default, k) for k in KNOB_ORDER)


def overlaps(row: dict, following: dict, objective: str) -> bool:
    """Whether `row`'s bar on the objective meets `following`'s, `row` ranked above it (an
    unknown error: it does)."""
    if math.isnan(row["error_pct"]) or math.isnan(following["error_pct"]):
        return True
    column = OBJECTIVE_COLUMN[objective]
    if objective == "throughput":
        return row[f"{column}_lo"] <= following[f"{column}_hi"]
    return row[f"{column}_hi"] >= following[f"{column}_lo"]
