"""The one report of `python -m zfbench.run` (measured) and `python -m zfbench.simulate`
(simulated): the summary's columns, the printed table, and the summary and steps files.

Owns:
- `SUMMARY_COLUMNS`: the columns every summary row carries, in this order, from either
  source (units in the names: `_s` seconds, `_bytes` bytes, `_per_s` per second,
  `_fraction` of the step, `mfu` and `compute_utilization` fractions, `steps_` and
  `ranks` counts). A value a source cannot give is NaN (JSON null), never left out:
  e.g. `mfu` of a run on the CPU lane, which has no datasheet peak. `complete_row` fills
  them; `MEASURED_ONLY` names the columns only a real run adds (loss, threads ...), a
  sweep adds one column per swept knob in front.
- `format_table`: the printed table (`TABLE_HEAD`, the same columns and units for both
  sources; a sweep's knobs in front, a run's loss at the end) and `render`, the one
  routine that right-aligns cells into columns (zfbench.predict prints through it too).
- The files: `write_summary` (summary.csv and summary.json: the header, then the rows),
  `steps_rows` / `write_steps` (steps.csv: one row per strategy, rank and step with
  `zfbench.analysis.breakdown.BREAKDOWN_COLUMNS`), `staging_dir` and `land` (every file
  written into a hidden staging directory, then renamed into place, then the files of
  the command's own names (`Owned`) this run did not write removed: one run's files).
"""

from __future__ import annotations

import math
import os
import posixpath
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pandas as pd

from zfbench.core.trace import FORMATS, write_json_atomic
from zfbench.core.strategies import BASELINE, SIM_STRATEGIES

SUMMARY_COLUMNS = (
    "strategy", "ranks", "steps_measured", "steps_left_out", "steps_needed", "too_short",
    "step_time_s", "compute_s", "exposed_io_s", "host_wait_s", "stall_s",
    "stall_fraction", "speedup_vs_zero_offload",
    "d2h_bytes_per_step", "h2d_bytes_per_step", "net_bytes_per_step",
    "pcie_bytes_per_step_over_model_bytes", "d2h_gb_per_s", "h2d_gb_per_s",
    "host_busy_fraction", "host_adam_params_per_s", "compute_utilization",
    "achieved_flops_per_s", "mfu", "tokens_per_s",
    "device_bytes_per_rank", "device_capacity_bytes", "host_bytes", "host_capacity_bytes",
    "fits")

# Columns only a measured run has: the loss it trained to, the steps fp16 loss scaling
# skipped, the torch threads of each lane, the host lane against the rates probed around
# it (zfbench.run.host_target).
MEASURED_ONLY = ("loss_first", "loss_last", "skipped_steps", "device_threads",
                 "host_threads", "host_link_s_per_step", "host_over_adam_alone",
                 "host_over_adam_plus_link")

# The printed table: header, then how each cell is made from a row ("-" for NaN/None).
TABLE_HEAD = ("strategy", "step_s", "speedup", "stall%", "exp_io_s", "host_wait_s",
              "d2h_GB/s", "h2d_GB/s", "hostAdam_Gparam/s", "pcie/model", "TFLOP/s",
              "mfu%", "fits")


# The column a table gains where a row's numbers were calibrated on its very setting
# (zfbench.validate.calibrated): the published rows' ids.
CALIBRATED_HEAD = "calibrated on this case"


def missing(value) -> bool:
    """None or NaN: a value the source could not give."""
    return value is None or (isinstance(value, float) and value != value)


def complete_row(row: dict) -> dict:
    """`row` with every `SUMMARY_COLUMNS` entry (NaN where missing), those first in order,
    the rest (swept knobs excepted, see `ordered_rows`) after in their own order."""
    out = {k: row.get(k, math.nan) for k in SUMMARY_COLUMNS}
    out.update((k, v) for k, v in row.items() if k not in out)
    return out


def ordered_rows(rows: list[dict], leading: list[str] | tuple = ()) -> list[dict]:
    """Every row completed, the `leading` columns (a sweep's knobs) first."""
    done = []
    for row in rows:
        full = complete_row(row)
        done.append({**{k: row[k] for k in leading if k in row}, **full})
    return done


def add_speedups(rows: list[dict]) -> None:
    """`speedup_vs_zero_offload`: zero-offload's step time over each row's (NaN without a
    zero-offload row)."""
    base = next((r for r in rows if r["strategy"] == BASELINE), None)
    for r in rows:
        r["speedup_vs_zero_offload"] = (base["step_time_s"] / r["step_time_s"]
                                        if base else math.nan)


def times(ratio: float) -> str:
    """A speedup, or "-" when there is no zero-offload row to compare with."""
    return "-" if missing(ratio) else f"{ratio:.2f}x"


def number(value, spec: str, scale: float = 1.0) -> str:
    """`value / scale` formatted by `spec`, or "-" where the source could not give it."""
    return "-" if missing(value) else format(value / scale, spec)


def fits_cell(row: dict) -> str:
    """"yes", "NO (dev|host need/capacity GiB)", or "-" when unknown."""
    fits = row.get("fits")
    if missing(fits):
        return "-"
    if fits:
        return "yes"
    gib = 2 ** 30
    for need, cap, name in (("device_bytes_per_rank", "device_capacity_bytes", "dev"),
                            ("host_bytes", "host_capacity_bytes", "host")):
        n, c = row.get(need), row.get(cap)
        if not missing(n) and not missing(c) and n > c:
            return f"NO ({name} {n / gib:.0f}/{c / gib:.0f} GiB)"
    return "NO"


def table_cells(r: dict) -> list[str]:
    """One row of the table, in `TABLE_HEAD`'s order."""
    short = r.get("too_short")
    return [r["strategy"] + (" (too short)" if not missing(short) and short else ""),
            number(r.get("step_time_s"), ".3f"), times(r.get("speedup_vs_zero_offload")),
            number(r.get("stall_fraction"), ".1f", 0.01),
            number(r.get("exposed_io_s"), ".3f"), number(r.get("host_wait_s"), ".3f"),
            number(r.get("d2h_gb_per_s"), ".3g"), number(r.get("h2d_gb_per_s"), ".3g"),
            number(r.get("host_adam_params_per_s"), ".3g", 1e9),
            number(r.get("pcie_bytes_per_step_over_model_bytes"), ".2f"),
            number(r.get("achieved_flops_per_s"), ".3g", 1e12),
            number(r.get("mfu"), ".1f", 0.01), fits_cell(r)]


def render(head: list[str] | tuple, cells: list[list[str]]) -> str:
    """The header and rows right-aligned, each column as wide as its widest cell."""
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*c) for c in cells])


def format_table(rows: list[dict], sweep_knobs: list[str] | tuple = (),
                 loss: bool = False) -> str:
    """The table both commands print: `TABLE_HEAD`, a sweep's knobs in front and, for a
    measured run (`loss`), the loss it went from and to at the end; where a row carries a
    `calibrated_on` (zfbench.validate.calibrated), a last column with it."""
    marked = any(r.get("calibrated_on") for r in rows)
    head = list(sweep_knobs) + list(TABLE_HEAD) + (["loss"] if loss else []) + \
        ([CALIBRATED_HEAD] if marked else [])
    cells = []
    for r in rows:
        line = [str(r[k]) for k in sweep_knobs] + table_cells(r)
        if loss:
            line.append("-" if missing(r.get("loss_first")) else
                        f"{r['loss_first']:.3f}->{r['loss_last']:.3f}")
        if marked:
            line.append(r.get("calibrated_on") or "")
        cells.append(line)
    table = render(head, cells)
    return "\n".join(line.rstrip() for line in table.split("\n")) if marked else table


def json_ready(value):
    """NaN and infinities as null (JSON has no NaN); containers walked."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def write_summary(stage: Path, head: dict, rows: list[dict],
                  leading: list[str] | tuple = ()) -> None:
    """summary.csv (the rows) and summary.json (`head`, then the rows) into `stage`."""
    rows = ordered_rows(rows, leading)
    pd.DataFrame(rows).to_csv(stage / "summary.csv", index=False)
    write_json_atomic(stage / "summary.json", json_ready({**head, "rows": rows}))


def steps_rows(table: pd.DataFrame, strategy: str, labels: dict | None = None
               ) -> pd.DataFrame:
    """steps.csv's rows of one run: its labels (a sweep's knobs), `strategy`, then the
    breakdown's columns (`zfbench.analysis.breakdown.step_breakdown`), one row per rank
    and step."""
    table = table.copy()
    table.insert(0, "strategy", strategy)
    for i, (knob, value) in enumerate((labels or {}).items()):
        table.insert(i, knob, value)
    return table


def write_steps(stage: Path, tables: list[pd.DataFrame],
                texts: list[str | None] | None = None) -> None:
    """steps.csv: every run's `steps_rows`, one after the other. `texts`: each table's
    rows as `steps_text` made them beforehand (in the run's worker process), used where
    every table has the same columns and dtypes: then the file is the same bytes as the
    tables' concatenation written whole (each value's text does not depend on the rows
    around it)."""
    path = stage / "steps.csv"
    if texts and len(texts) == len(tables) and None not in texts and tables and all(
            list(t.columns) == list(tables[0].columns) and
            list(t.dtypes) == list(tables[0].dtypes) for t in tables):
        with open(path, "w", newline="") as handle:
            handle.write(tables[0].iloc[:0].to_csv(index=False))
            handle.writelines(texts)
        return
    pd.concat(tables, ignore_index=True).to_csv(path, index=False)


def steps_text(table: pd.DataFrame) -> str:
    """`table`'s rows as steps.csv holds them, without the header (`write_steps`)."""
    return table.to_csv(index=False, header=False)


@contextmanager
def staging_dir(out: Path):
    """A fresh hidden directory inside `out` (made if missing), removed on the way out."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class Owned:
    """The file names a command owns in its output directory, as paths relative to it:
    `names` (fnmatch patterns: "summary.csv", "inferred_hardware.*.json") and
    `per_strategy` (templates, "{}" a strategy of the record, zfbench.core.strategies:
    "{}.steps.jsonl", "profiles/{}.json"; `labelled`: a sweep case's "<label>." may come
    before the strategy). A name it does not own (a user's notes.txt) is never removed."""

    names: tuple[str, ...] = ()
    per_strategy: tuple[str, ...] = ()
    labelled: bool = False

    def owns(self, rel: str) -> bool:
        if any(fnmatchcase(rel, pattern) for pattern in self.names):
            return True
        for template in self.per_strategy:
            head, tail = template.split("{}")
            if len(rel) > len(head) + len(tail) and rel.startswith(head) \
                    and rel.endswith(tail):
                middle = rel[len(head):len(rel) - len(tail)]
                strategy = middle.rsplit(".", 1)[-1] if self.labelled else middle
                if "/" not in middle and strategy in SIM_STRATEGIES:
                    return True
        return False

    def stale(self, out: Path, written) -> list[Path]:
        """The files in `out` it owns that are not in `written` (relative paths), looked
        for in `out` and in the folders its patterns name."""
        folders = {posixpath.dirname(p) for p in (*self.names, *self.per_strategy)}
        keep = {Path(p).as_posix() for p in written}
        found = []
        for folder in sorted(folders):
            where = out / folder
            if where.is_dir():
                found += [f for f in sorted(where.iterdir()) if f.is_file() and
                          f.relative_to(out).as_posix() not in keep and
                          self.owns(f.relative_to(out).as_posix())]
        return found


# What a timeline leaves per run: `<prefix>spans.<fmt>` and `<prefix>steps.<fmt>`
# (zfbench.core.trace.write_timeline), as `Owned.per_strategy` templates.
TIMELINE_FILES = tuple(f"{{}}.{kind}.{fmt}" for kind in ("spans", "steps")
                       for fmt in FORMATS)


def remove_stale(out: Path, owned: Owned, written) -> list[Path]:
    """Remove from `out` every file `owned` claims that this run did not write
    (`written`, paths relative to `out`): a later run with fewer strategies or cases
    leaves none of an earlier run's files beside its own. Returns what it removed."""
    gone = owned.stale(out, written)
    for path in gone:
        path.unlink(missing_ok=True)
    return gone


def land(stage: Path, out: Path, owned: Owned | None = None, kept=()) -> list[Path]:
    """Move every file written into `stage` into `out` (a rename each); then, with
    `owned`, remove the files of `out` it claims that neither came from `stage` nor are
    in `kept` (what the run wrote into `out` itself, relative paths): `remove_stale`.

    Guaranteed: a run that dies before landing leaves `out` as it was (the staging
    directory holds every half-written file); every file in `out` is whole (renames);
    once `land` returns, `out` holds exactly this run's files of the names `owned`
    claims, beside every file it does not claim. Landing writes nothing, only renames
    then removes, so only a crash inside that short window leaves the new files beside
    some stale ones (the next landing removes them)."""
    names = [path.name for path in stage.iterdir()]
    for name in names:
        os.replace(stage / name, out / name)
    return [] if owned is None else remove_stale(out, owned, [*names, *kept])
