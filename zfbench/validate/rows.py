"""The published-measurements format: its columns, reading a file, and turning a row
into the simulation that stands for it.

This module owns a row of `zfbench/data/published/*.csv` (the columns of
docs/published.md): `read_rows` (the columns and rows, an unknown or missing column or a
repeated id refused), `published_value` (the row's number) and `row_settings` (the row's
`SimSettings`, compute by shape, on the presets or a hardware file's entries;
`Unsupported` with the reason where the simulator cannot stand for it). Simulating the
rows, their errors and the table are zfbench.validate.published's.
"""

from __future__ import annotations

import csv
import math
from importlib import resources
from pathlib import Path

from zfbench.cli_checks import CliError
from zfbench.sims.costs import STRATEGIES, SimSettings, SimSettingsError
from zfbench.sims.partitioning import ZERO2_STRATEGIES
from zfbench.core.schedule import FIXED_RUN_STEPS, FIXED_SKIP_STEPS
from zfbench.core.strategies import (ZERO_OFFLOAD_STRATEGIES,
                                     offloads_params, windowed_measure)
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import default_skip_steps, steps_needed
from zfbench.validate.metrics import METRICS, Unsupported

BUNDLED = "zfbench/data/published/offload_measurements.csv"
# Every column the format has, in its order; REQUIRED must be present (the rest may be
# left out of a file, or left empty in a row, for their defaults).
COLUMNS = ("id", "source", "metric", "value", "strategy", "hardware", "gpu", "gpus", "model",
           "micro_batch", "seq", "grad_accum", "precision", "activation_checkpointing",
           "offload_params", "offload_optimizer", "offload_activations", "bind_cores",
           "pin_memory", "overlap_comm", "fused_param_upload", "anchor", "note")
REQUIRED = ("id", "source", "metric", "value", "strategy", "hardware", "gpus", "model",
            "micro_batch", "seq")
FUSED_UPLOAD_STRATEGIES = ZERO_OFFLOAD_STRATEGIES
# steps simulated per row and left out of its averages where the strategy's rule is the
# fixed one (zfbench.core.schedule.measurement_window; windowed rows: `skip_of`)
STEPS, SKIP_STEPS = FIXED_RUN_STEPS, FIXED_SKIP_STEPS

# -- reading ------------------------------------------------------------------------
def bundled_path() -> Path:
    return Path(str(resources.files("zfbench").joinpath("data/published/"
                                                          "offload_measurements.csv")))


def read_rows(path: str | Path) -> tuple[list[str], list[dict]]:
    """The file's columns (in its order) and rows; an unknown or missing column, an empty
    or repeated id is a CliError naming it."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        rows = [dict(r) for r in reader]
    unknown = [c for c in columns if c not in COLUMNS]
    if unknown:
        raise CliError(f"{path}: unknown column {unknown[0]!r}; the columns are "
                       f"{', '.join(COLUMNS)} (docs/published.md)")
    missing = [c for c in REQUIRED if c not in columns]
    if missing:
        raise CliError(f"{path}: missing column {missing[0]!r}; required: "
                       f"{', '.join(REQUIRED)}")
    seen: set[str] = set()
    for n, row in enumerate(rows, 2):
        if None in row:  # more cells than columns
            raise CliError(f"{path}: line {n} has more cells than the header's columns")
        rid = (row["id"] or "").strip()
        if not rid or rid in seen:
            raise CliError(f"{path}: line {n}: id {rid!r} is " +
                           ("empty" if not rid else "given twice") + "; ids are unique")
        seen.add(rid)
        for c in COLUMNS:
            row[c] = (row.get(c) or "").strip()
    return columns, rows


def _int(row: dict, key: str, default: int | None = None) -> int:
    text = row[key]
    if not text and default is not None:
        return default
    if not text.isdigit() or int(text) < 1:
        raise Unsupported(f"{key} {text!r} is not a positive integer")
    return int(text)


def _bool(row: dict, key: str, default: bool) -> bool:
    text = row[key].lower()
    if not text:
        return default
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise Unsupported(f"{key} {row[key]!r} is not true or false")


def published_value(row: dict) -> float:
    try:
        value = float(row["value"])
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise Unsupported(f"value {row['value']!r} is not a positive number")
    return value


def row_settings(row: dict, hardware_file: str | None = None) -> SimSettings:
    """The simulation of one row, its compute by shape (Unsupported with the reason); with
    `hardware_file`, its entries win over the presets of the same name."""
    if row["metric"] not in METRICS:
        raise Unsupported(f"metric {row['metric']!r} is not one of {', '.join(METRICS)}")
    if row["strategy"] not in STRATEGIES:
        raise Unsupported(f"strategy {row['strategy']!r} is not simulated; choose one of "
                          f"{', '.join(STRATEGIES)}")
    if not row["hardware"]:
        raise Unsupported("hardware is empty; name a node preset (python -c 'from "
                          "zfbench.core.hardware import node_names; print(node_names())')")
    try:
        knobs = node_knobs(row["hardware"], _int(row, "gpus"), hardware_file)
        if row["gpu"]:
            knobs["gpu"] = row["gpu"]
        knobs.update(model=row["model"], micro_batch=_int(row, "micro_batch"),
                     seq=_int(row, "seq"), grad_accum=_int(row, "grad_accum", 1),
                     activation_checkpointing=_bool(row, "activation_checkpointing", True),
                     bind_cores=_bool(row, "bind_cores", False),
                     pin_memory=_bool(row, "pin_memory", True),
                     overlap_comm=_bool(row, "overlap_comm", True),
                     fused_param_upload=_bool(row, "fused_param_upload", False))
        if knobs["fused_param_upload"]:  # DeepSpeed 0.3-0.8, whose ZeRO-2 reduces each
            knobs["zero2_reduce"] = "reduce"  # owner's run (zfbench.sims.zero2_reduce)
        if row["precision"]:
            knobs["precision"] = row["precision"]
        if not knobs["overlap_comm"] and row["strategy"] not in ZERO2_STRATEGIES:
            raise Unsupported(f"overlap_comm false is simulated for "
                              f"{', '.join(ZERO2_STRATEGIES)} (DeepSpeed's ZeRO-2); "
                              f"leave it empty for {row['strategy']}")
        if knobs["fused_param_upload"] and row["strategy"] not in FUSED_UPLOAD_STRATEGIES:
            raise Unsupported(f"fused_param_upload is DeepSpeed's ZeRO-2 offload step "
                              f"({', '.join(FUSED_UPLOAD_STRATEGIES)}); leave it empty for "
                              f"{row['strategy']}")
        for key in ("offload_params", "offload_optimizer"):
            if row[key]:
                if not offloads_params(row["strategy"]):
                    raise Unsupported(f"{key} is a zero-infinity setting; leave it empty")
                knobs[key] = row[key]
        if _bool(row, "offload_activations", False):
            if not offloads_params(row["strategy"]):
                raise Unsupported("offload_activations is a zero-infinity setting "
                                  "(DeepSpeed's cpu_checkpointing); leave it empty")
            knobs["offload_activations"] = True
        settings = SimSettings.from_knobs(**knobs, steps=STEPS)
        if windowed_measure(row["strategy"]):  # its windows: warm-up, two skipped, one measured
            settings = settings.with_(steps=steps_needed(settings))
        return settings
    except (SimSettingsError, ValueError) as err:
        raise Unsupported(" ".join(str(err).split())) from None


def skip_of(settings: SimSettings, strategy: str) -> int:
    """Steps of `strategy`'s simulated row left out of its averages: its own rule."""
    return default_skip_steps(settings, windowed_measure(strategy))
