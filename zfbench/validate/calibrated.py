"""The constants calibrated from single published rows: which row sets which preset
number, the sourced judgment each falls back to, and which simulated cases are the very
setting a row was calibrated on.

This module owns three things.

- `CALIBRATIONS`: every calibration row of the bundled dataset with the preset field it
  sets (the `CALIBRATION_ROWS` of zfbench.sims.host_step for hosts and of
  zfbench.sims.compute_efficiency for GPUs), the row ids the one list.
- Judged hardware: `judged_entries` / `write_judged_hardware` write a hardware file in
  which the calibrated fields hold their judgments (`zfbench.core.hardware.judgments`)
  and every other number the preset's; simulating with it is the leave-one-source-out
  check of `python -m zfbench.validate --published`.
- The same setting (`same_setting`, `calibrated_on`): a simulated case stands for a
  calibration row when its strategy is the row's and, on the presets' own numbers (no
  --profile, --hardware or, for `default_mfu`, --mfu), its `SETTING_KNOBS` (GPU, host,
  ranks, nodes, host cores, model, layers, micro-batch, sequence, micro-steps,
  precision) equal the row's (zfbench.validate.rows.row_settings). `simulate` and
  `predict` mark such cases (docs/commands.md, docs/published.md): a number so marked
  reproduces the row by construction and predicts nothing about it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from zfbench.core import hardware
from zfbench.sims import compute_efficiency, host_step
from zfbench.sims.costs import SimSettings
from zfbench.validate.rows import bundled_path, read_rows, row_settings


@dataclass(frozen=True)
class Calibration:
    """Row `row_id` of the bundled dataset sets `field` of the `section` preset `preset`."""

    row_id: str
    section: str
    preset: str
    field: str

    @property
    def label(self) -> str:
        """`<preset> <field>`: what validate prints beside the row."""
        return f"{self.preset} {self.field}"


CALIBRATIONS: tuple[Calibration, ...] = tuple(
    [Calibration(rid, "hosts", preset, f) for rid, (preset, f)
     in host_step.CALIBRATION_ROWS.items()]
    + [Calibration(rid, "gpus", preset, f) for rid, (preset, f)
       in compute_efficiency.CALIBRATION_ROWS.items()])
BY_ROW = {c.row_id: c for c in CALIBRATIONS}

# The knobs a case must share with a calibration row's settings (module docstring): the
# machine (GPU, host and the cores it gives each rank: ranks per node, nodes, host cores),
# the model (and its layers) and the batch (micro-batch, sequence, micro-steps,
# precision). Not the links nor DeepSpeed's switches (overlap_comm, bind_cores, pinned
# memory, the fused upload, activation checkpointing): a case that differs from the row
# only in those is still the setting the constant was taken from.
SETTING_KNOBS = ("gpu", "host", "nodes", "gpus_on_node", "host_cores", "model", "layers",
                 "micro_batch", "seq", "grad_accum", "precision")


def judged_entries(calibrations) -> dict:
    """{section: {preset: entry}}: each preset named by `calibrations` in the hardware
    file layout, its calibrated fields at their judgments (value and source)."""
    fields: dict[tuple[str, str], list[str]] = {}
    for c in calibrations:
        fields.setdefault((c.section, c.preset), []).append(c.field)
    out: dict = {}
    for (section, preset), names in fields.items():
        found = hardware.judgments(section, preset)
        missing = [f for f in names if f not in found]
        if missing:
            raise ValueError(f"{preset}: {', '.join(missing)} has no judgment in "
                             f"zfbench/data/hardware.json")
        obj = hardware.lookup(section, preset)
        sources = {**obj.sources, **{f: found[f][1] for f in names}}
        judged = replace(obj, sources=sources, **{f: found[f][0] for f in names})
        out.setdefault(section, {})[preset] = hardware.entry_of(section, judged)
    return out


def write_judged_hardware(calibrations, path: Path) -> str:
    """`judged_entries` written as a hardware file at `path`; its path as a string."""
    path.write_text(json.dumps({"description": "presets with calibrated numbers at their "
                                               "judgments (zfbench.validate.calibrated)",
                                **judged_entries(calibrations)}, indent=1))
    return str(path)


def knobs_of(settings: SimSettings) -> tuple:
    """The values of `SETTING_KNOBS` in `settings`."""
    knobs = {**settings.as_dict(), "gpus_on_node": settings.machine.gpus_on_node}
    return tuple(knobs[k] for k in SETTING_KNOBS)


def same_setting(settings: SimSettings, strategy: str, row: dict,
                 calibration: Calibration) -> bool:
    """Whether the case (`settings`, `strategy`) is the setting `row` (a calibration
    row, its columns as zfbench.validate.rows.read_rows gives them) was calibrated on
    (module docstring)."""
    if strategy != row["strategy"] or settings.machine.profile is not None or \
            settings.machine.hardware is not None:
        return False
    if calibration.field == "default_mfu" and settings.machine.mfu is not None:
        return False
    return knobs_of(settings) == knobs_of(row_settings(row))


@lru_cache(maxsize=1)
def _bundled_calibration_rows() -> tuple[tuple[dict, Calibration], ...]:
    _, rows = read_rows(bundled_path())
    return tuple((r, BY_ROW[r["id"]]) for r in rows if r["id"] in BY_ROW)


def calibrated_on(settings: SimSettings, strategy: str) -> list[str]:
    """The bundled calibration rows whose setting the case is (`same_setting`), by id."""
    return [row["id"] for row, c in _bundled_calibration_rows()
            if same_setting(settings, strategy, row, c)]


def mark(rows: list[dict], cases: list[tuple[dict, SimSettings]]) -> list[dict]:
    """Each summary row (of `zfbench.simulation.run` over `cases`: it carries its case's
    sweep labels and its strategy) with `calibrated_on`: the ids `calibrated_on` gives,
    space-separated ("": none)."""
    for r in rows:
        case = next(c for labels, c in cases
                    if all(r.get(k) == v for k, v in labels.items()))
        r["calibrated_on"] = " ".join(calibrated_on(case, r["strategy"]))
    return rows
