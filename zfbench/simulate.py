"""`python -m zfbench.simulate`: simulate the four strategies on a node and print the table.

Covers: every knob of `sims.costs.SimSettings` as a flag, `--strategy` to pick one,
`--sweep KNOB=v1,v2,...` for one summary table over a knob, `--out DIR` for files.
Scenario: `python -m zfbench.simulate --pcie gen4` simulates llama2-7b on 4 x a100-80g
behind PCIe gen4 and prints step time, stall and the achieved rates per strategy.

Files written to `--out` (all complete or none: everything is validated before the first
write, and each file lands through a rename): `summary.csv` and `summary.json` (one row
per strategy, or per sweep value and strategy), `steps.csv` (the per-step breakdown),
`<strategy>.spans.csv` / `<strategy>.steps.csv` (the timelines) and `trace.json` (a Chrome
trace with every strategy, open it at https://ui.perfetto.dev or chrome://tracing).
"""

from __future__ import annotations

import argparse
import json
import dataclasses
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from analysis.breakdown import step_breakdown, summarize
from sims.costs import STRATEGIES, SimSettings, SimSettingsError
from sims.simulator import SimResult, simulate
from zfbench.trace import merge_chrome_traces, write_json_atomic

DEFAULTS = SimSettings()
KNOBS = {f.name: f.type for f in dataclasses.fields(SimSettings)}


def parse_value(knob: str, text: str):
    """Turn a flag or sweep value into the knob's type, with an error naming the knob."""
    default = getattr(DEFAULTS, knob)
    kind = KNOBS[knob]
    try:
        if "bool" in str(kind):
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if "int" in str(kind) and "float" not in str(kind):
            return None if text.lower() == "none" else int(text)
        if "float" in str(kind):
            return None if text.lower() == "none" else float(text)
        return text if default is not None or text.lower() != "none" else None
    except ValueError:
        raise SimSettingsError(f"{knob}: cannot read {text!r} as {kind}") from None


def parse_sweep(text: str) -> tuple[str, list]:
    if "=" not in text:
        raise SimSettingsError(f"--sweep wants KNOB=v1,v2,... (got {text!r})")
    knob, values = text.split("=", 1)
    knob = knob.strip().replace("-", "_")
    aliases = {"pcie": "pcie", "batch": "micro_batch", "cores": "host_cores"}
    knob = aliases.get(knob, knob)
    if knob not in KNOBS:
        raise SimSettingsError(f"--sweep: unknown knob {knob!r}; knobs are: "
                               f"{', '.join(KNOBS)}")
    parsed = [parse_value(knob, v.strip()) for v in values.split(",") if v.strip()]
    if not parsed:
        raise SimSettingsError(f"--sweep {knob}: no values given")
    return knob, parsed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zfbench.simulate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in KNOBS:
        default = getattr(DEFAULTS, name)
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                       metavar=type(default).__name__.upper() if default is not None else "V",
                       help=f"default: {default}")
    p.add_argument("--batch", dest="micro_batch", help="alias of --micro-batch")
    p.add_argument("--strategy", choices=STRATEGIES + ("all",), default="all")
    p.add_argument("--sweep", help="KNOB=v1,v2,... e.g. pcie=gen3,gen4,gen5")
    p.add_argument("--out", type=Path, help="directory for the summary, spans and trace")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    given = {k: parse_value(k, getattr(args, k)) for k in KNOBS
             if getattr(args, k) is not None}
    if given.get("profile"):
        for knob, value in profile_defaults(given["profile"]).items():
            given.setdefault(knob, value)
    return SimSettings(**given)


def profile_defaults(path: str) -> dict:
    """A measured profile describes one machine and one shape: simulate that shape on one
    rank with the engine's data path unless the flags say otherwise."""
    import re

    try:
        with open(path) as handle:
            cal = json.load(handle)["calibration"]
    except (OSError, ValueError, KeyError) as err:
        raise SimSettingsError(f"--profile {path}: not a zfbench profile ({err}); make one "
                               f"with python -m zfbench.run --profile --out DIR") from None
    match = re.fullmatch(r"(.+?)(?:\[(\d+)L\])?", cal["model"])
    out = {"model": match.group(1), "micro_batch": cal["batch"], "seq": cal["seq"],
           "gpus": 1, "gpus_per_switch": 1, "transfers": "full"}
    if match.group(2):
        out["layers"] = int(match.group(2))
    if cal.get("transfers") == "emulated":
        out["precision"] = "fp32"
    return out


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


def check_fits(settings: SimSettings, strategies: list[str]) -> None:
    """Asking for one strategy that cannot fit is an error that says by how much."""
    from sims.costs import CostModel

    if len(strategies) != 1:
        return
    fit = CostModel(settings).fits(strategies[0])
    if fit["fits"]:
        return
    gib = 2 ** 30
    parts = []
    if fit["device_bytes_per_rank"] > fit["device_capacity_bytes"]:
        parts.append(f"device needs {fit['device_bytes_per_rank'] / gib:.1f} GiB per rank, "
                     f"the GPU has {fit['device_capacity_bytes'] / gib:.1f} GiB (short by "
                     f"{(fit['device_bytes_per_rank'] - fit['device_capacity_bytes']) / gib:.1f} GiB)")
    if fit["host_bytes"] > fit["host_capacity_bytes"]:
        parts.append(f"host needs {fit['host_bytes'] / gib:.1f} GiB, it has "
                     f"{fit['host_capacity_bytes'] / gib:.1f} GiB")
    raise SimSettingsError(f"{strategies[0]} does not fit: {'; '.join(parts)}. Try more "
                           f"--gpus, a smaller --micro-batch or --seq, "
                           f"--activation-checkpointing true, or an offload strategy.")


def format_table(rows: list[dict], sweep_knob: str | None = None) -> str:
    head = ([sweep_knob] if sweep_knob else []) + [
        "strategy", "step_s", "speedup", "stall%", "exp_io_s", "host_wait_s",
        "d2h_GB/s", "h2d_GB/s", "hostAdam_Gp/s", "pcie/model", "mfu%", "fits"]
    lines = []
    for r in rows:
        cells = ([str(r[sweep_knob])] if sweep_knob else []) + [
            r["strategy"], f"{r['step_time_s']:.3f}", f"{r['speedup_vs_zero_offload']:.2f}x",
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


def run(settings: SimSettings, strategies: list[str], sweep: tuple[str, list] | None,
        out: Path | None, quiet: bool = False) -> list[dict]:
    cases = [(None, settings)] if sweep is None else \
        [(v, settings.with_(**{sweep[0]: v})) for v in sweep[1]]
    check_fits(settings, strategies)
    rows, results = [], {}
    progress = tqdm(total=len(cases) * len(strategies), disable=quiet, desc="simulating",
                    unit="run", file=sys.stderr)
    for value, case in cases:
        case_rows = []
        for strategy in strategies:
            progress.set_postfix_str(f"{strategy}" + (f" {sweep[0]}={value}" if sweep else ""))
            result = simulate(case, strategy)
            row = summary_row(result)
            if sweep:
                row = {sweep[0]: value, **row}
            case_rows.append(row)
            results[(value, strategy)] = result
            progress.update()
        add_speedups(case_rows)
        rows.extend(case_rows)
    progress.close()
    if out is not None:
        write_outputs(out, settings, rows, results, sweep)
    return rows


def write_outputs(out: Path, settings: SimSettings, rows, results, sweep) -> None:
    """Write every file into a fresh temporary directory, then move them into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        frame = pd.DataFrame(rows)
        frame.to_csv(staging / "summary.csv", index=False)
        write_json_atomic(staging / "summary.json", {"settings": settings.as_dict(),
                                                     "sweep": sweep and sweep[0],
                                                     "rows": rows})
        per_step = []
        for (value, strategy), result in results.items():
            tl = result.timeline
            prefix = f"{strategy}." if sweep is None else f"{sweep[0]}={value}.{strategy}."
            tl.write_csv(staging, prefix=prefix)
            table = step_breakdown(tl.spans_frame(), tl.steps_frame())
            table.insert(0, "strategy", strategy)
            if sweep:
                table.insert(0, sweep[0], value)
            per_step.append(table)
        pd.concat(per_step, ignore_index=True).to_csv(staging / "steps.csv", index=False)
        if sweep is None:
            write_json_atomic(staging / "trace.json", merge_chrome_traces(
                {s: results[(None, s)].timeline for s in (k[1] for k in results)}))
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(args)
        sweep = parse_sweep(args.sweep) if args.sweep else None
        if sweep:  # validate every sweep value before simulating anything
            for v in sweep[1]:
                settings.with_(**{sweep[0]: v})
        strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
        rows = run(settings, strategies, sweep, args.out, args.quiet)
    except (SimSettingsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    s = settings
    where = f"the machine measured in {s.profile}" if s.profile else \
        f"{s.gpus} x {s.gpu}, PCIe {s.pcie}, host {s.host}"
    print(f"{s.model}{'' if s.layers is None else f'[{s.layers}L]'} on {where}; "
          f"micro-batch {s.micro_batch} x seq {s.seq}, "
          f"{s.precision}; zenflow topk {s.topk_ratio}, U={s.update_interval}, "
          f"overlap={s.overlap_step}; {s.steps} steps (simulated)")
    print(format_table(rows, sweep[0] if sweep else None))
    if args.out:
        print(f"wrote {args.out}/summary.csv, steps.csv, spans"
              + ("" if sweep else ", trace.json (open in https://ui.perfetto.dev)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
