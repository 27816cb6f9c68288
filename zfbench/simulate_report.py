"""What `python -m zfbench.simulate` prints and writes: summary rows, the table, the files.

`summary_row` turns one simulated run into the summary's columns (units in the names:
`_s` seconds, `_bytes` bytes, `_per_s` per second, `_fraction` of the step, `_steps`
steps), `too_short_warning` is the one line naming runs too short to contain a steady
state, `format_table` prints the rows (speedup `-` when there is no zero-offload row),
and `write_outputs` lands every file through a staging directory and renames.

Part of the command `python -m zfbench.simulate` (split out of its main module for size):
like the command, it imports real/, sims/ or analysis/ (docs/design.md's arrows).
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pandas as pd

from analysis.breakdown import step_breakdown, summarize
from sims.costs import SimSettings
from sims.simulator import SimResult, steps_needed
from zfbench.trace import merge_chrome_traces, write_json_atomic


def summary_row(result: SimResult) -> dict:
    tl, c = result.timeline, result.costs
    row = {"strategy": result.strategy}
    row.update(summarize(tl.spans_frame(), tl.steps_frame(), result.skip_steps,
                         c.model_bytes, result.host_optim_params_per_step(),
                         None if c.calibration else result.flops_per_step(),
                         c.flops_per_s / c.mfu))
    s = result.settings
    row["tokens_per_s"] = s.micro_batch * s.seq * s.gpus / row["step_time_s"]
    fit = c.fits(result.strategy)
    row.update({"device_bytes_per_rank": fit["device_bytes_per_rank"],
                "device_capacity_bytes": fit["device_capacity_bytes"],
                "host_bytes": fit["host_bytes"], "host_capacity_bytes":
                fit["host_capacity_bytes"], "fits": fit["fits"]})
    return row


def add_speedups(rows: list[dict]) -> None:
    base = next((r for r in rows if r["strategy"] == "zero-offload"), None)
    for r in rows:
        r["speedup_vs_zero_offload"] = (base["step_time_s"] / r["step_time_s"]
                                        if base else math.nan)


def times(ratio: float) -> str:
    """A speedup, or "-" when there is no zero-offload row to compare with."""
    return "-" if ratio is None or ratio != ratio else f"{ratio:.2f}x"


def case_label(labels: dict) -> str:
    """`knob=value` of every swept knob, comma-separated ("" without a sweep)."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def too_short_warning(cases: list[tuple[dict, SimSettings]]) -> str | None:
    """One line naming the runs too short to contain a steady state (fewer steps than
    `sims.simulator.steps_needed`), or None when every run is long enough."""
    short = [f"{case_label(labels) + ': ' if labels else ''}{case.steps} steps, needs "
             f"{steps_needed(case)}" for labels, case in cases
             if case.steps < steps_needed(case)]
    if not short:
        return None
    return (f"warning: too short to contain a steady state (warm-up + 2 update windows "
            f"left out + 1 measured window; rows marked too_short): {'; '.join(short)}")


def format_table(rows: list[dict], sweep_knobs: list[str] = ()) -> str:
    head = list(sweep_knobs) + [
        "strategy", "step_s", "speedup", "stall%", "exp_io_s", "host_wait_s",
        "d2h_GB/s", "h2d_GB/s", "hostAdam_Gp/s", "pcie/model", "mfu%", "fits"]
    lines = []
    for r in rows:
        cells = [str(r[k]) for k in sweep_knobs] + [
            r["strategy"], f"{r['step_time_s']:.3f}", times(r["speedup_vs_zero_offload"]),
            f"{100 * r['stall_fraction']:.1f}", f"{r['exposed_io_s']:.3f}",
            f"{r['host_wait_s']:.3f}", f"{r['d2h_gb_per_s']:.1f}", f"{r['h2d_gb_per_s']:.1f}",
            f"{r.get('host_adam_params_per_s', 0) / 1e9:.2f}",
            f"{r.get('pcie_bytes_per_step_over_model_bytes', 0):.2f}",
            f"{100 * r['mfu']:.1f}" if "mfu" in r else "-",
            "yes" if r["fits"] else
            f"NO (dev {r['device_bytes_per_rank'] / 2**30:.0f}/"
            f"{r['device_capacity_bytes'] / 2**30:.0f} GiB)"]
        lines.append(cells)
    widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*row) for row in lines])


def json_ready(value):
    """NaN and infinities as null (JSON has no NaN); containers walked."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    return value


def _prefix(labels: dict, strategy: str) -> str:
    label = case_label(labels).replace("/", "_").replace(os.sep, "_")
    return f"{label}.{strategy}." if label else f"{strategy}."


def write_outputs(out: Path, head: dict, rows: list[dict], results: dict,
                  extras: dict[str, str] | None = None) -> None:
    """Write every file into a fresh temporary directory, then move them into `out`.
    `results` maps (labels as a tuple of items, strategy) to a SimResult; `head` is the
    summary.json's header (settings, sweep, provenance ...); `extras` more files by name
    (their text)."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        for name, text in (extras or {}).items():
            (staging / name).write_text(text)
        pd.DataFrame(rows).to_csv(staging / "summary.csv", index=False)
        write_json_atomic(staging / "summary.json", json_ready({**head, "rows": rows}))
        per_step = []
        for (items, strategy), result in results.items():
            labels = dict(items)
            tl = result.timeline
            tl.write_csv(staging, prefix=_prefix(labels, strategy))
            table = step_breakdown(tl.spans_frame(), tl.steps_frame())
            table.insert(0, "strategy", strategy)
            for i, (knob, value) in enumerate(labels.items()):
                table.insert(i, knob, value)
            per_step.append(table)
        pd.concat(per_step, ignore_index=True).to_csv(staging / "steps.csv", index=False)
        if all(not items for items, _ in results):
            write_json_atomic(staging / "trace.json", merge_chrome_traces(
                {strategy: r.timeline for (_, strategy), r in results.items()}))
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
