"""`python -m zfbench.simulate`: simulate every strategy on a node and print the table.

Covers: every knob of `zfbench.sims.costs.SimSettings` as a flag, `--strategy` to pick one,
`--sweep KNOB=v1,v2,...` for one summary table over a knob (several: the grid), `--node`
and `--nodes`/`--gpus-per-node` for presets and several nodes, `--profile FILE` for a
measured machine, `--jobs N|auto` for worker processes, `--out DIR` for files.
Scenario: `python -m zfbench.simulate --pcie gen4` simulates llama2-7b on 4 x a100-80g
behind PCIe gen4 and prints step time, stall and the achieved rates per strategy.
`--update-interval auto` resolves to window lengths by a stated rule
(`zfbench.sims.update_windows`), named in the header and summary.json. A case that is the
very setting a constant was calibrated on is marked (`calibrated on this case`,
docs/published.md). Runs too short for warm-up + two update windows + one measured window
warn and mark their rows `too_short`; bad input is one `error: ...` line, exit 2.

Files written to `--out`, all complete or none: `summary.csv`, `summary.json`,
`steps.csv`, the timeline `<strategy>.spans.parquet` / `.steps.parquet` (where pyarrow
imports; else, or with `--timeline-format csv`, `.spans.csv` / `.steps.csv`, which
`Timeline.read_parquet` / `read_csv` read back) and `trace.json` (Chrome trace, no sweep),
whose steps `--trace-steps` draws: `left-out+10` by default, `N`, or `all`.
docs/commands.md ("simulate", "Files") has every flag, example and file in detail.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

from zfbench.core import hardware
from zfbench.core.strategies import ZERO_STAGE_STRATEGIES
from zfbench.sims.costs import STRATEGIES, SimSettings, SimSettingsError
from zfbench.sims.settings import on_node
from zfbench.sims.simulator import steps_needed
from zfbench.sims.strategies import GRAD_ACCUM_STRATEGIES
from zfbench.cli_checks import (ZENFLOW_KNOBS, CliError, OneLineParser, check_out_dir,
                                check_profile, fail, zenflow_flags)
from zfbench.core.provenance import machine
from zfbench.report import format_table, staging_dir
from zfbench.simulation import (DEFAULT_KNOBS, DEFAULTS, KNOBS, TRACE_STEPS_DEFAULT, FilePlan,
                                TraceRule, auto_jobs, case_label, parse_value, run,
                                too_short_warning, write_outputs)
from zfbench.core.trace import columnar_format
from zfbench.validate.calibrated import mark

__all__ = ["main", "parse_sweep"]

PROG = "python -m zfbench.simulate"
ALIASES = {"batch": "micro_batch", "cores": "host_cores"}


def parse_sweep(text: str) -> tuple[str, list]:
    if "=" not in text:
        raise SimSettingsError(f"--sweep wants KNOB=v1,v2,... (got {text!r})")
    knob, values = text.split("=", 1)
    knob = knob.strip().replace("-", "_")
    knob = ALIASES.get(knob, knob)
    if knob not in KNOBS and knob != "node":
        raise SimSettingsError(f"--sweep: unknown knob {knob!r}; knobs are: node, "
                               f"{', '.join(KNOBS)}")
    parse = str if knob == "node" else (lambda v: parse_value(knob, v))  # nodes: on_node
    parsed = [parse(v.strip()) for v in values.split(",") if v.strip()]
    if not parsed:
        raise SimSettingsError(f"--sweep {knob}: no values given")
    return knob, parsed


def parse_sweeps(texts: list[str]) -> list[tuple[str, list]]:
    """Every `--sweep`, each knob at most once (the grid is their cartesian product)."""
    sweeps = [parse_sweep(t) for t in texts]
    knobs = [k for k, _ in sweeps]
    twice = sorted({k for k in knobs if knobs.count(k) > 1})
    if twice:
        raise SimSettingsError(f"--sweep {', '.join(twice)} given more than once; give "
                               f"each knob one --sweep with all its values")
    return sweeps


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in KNOBS:
        default = DEFAULT_KNOBS[name]
        extra = {"update_interval": " (steps, or auto)",
                 "auto_windows": " (with update_interval auto: N, N1,N2,... or a "
                                 "windows.csv; default: an assumed constant 4-step window)",
                 "precision": " (with --profile: the profile's)"}.get(name, "")
        # the ZenFlow knobs as every command spells them, the older spelling an alias
        flags = (zenflow_flags(name) if name in ZENFLOW_KNOBS
                 else ("--" + name.replace("_", "-"),))
        p.add_argument(*flags, dest=name, default=None,
                       metavar=type(default).__name__.upper() if default is not None else "V",
                       help=f"default: {default}{extra}")
    p.add_argument("--batch", dest="micro_batch", help="alias of --micro-batch")
    p.add_argument("--node", metavar="NAME",
                   help=f"a node preset ({', '.join(hardware.node_names())}) or a node "
                        f"of the --hardware file: its GPU, PCIe link, host, networks, "
                        f"switch pairing and drives, each flag given overriding its part; "
                        f"--gpus is then the run's total (above the node's GPUs: whole "
                        f"nodes joined by its inter_net), --nodes N N whole nodes")
    p.add_argument("--strategy", choices=STRATEGIES + ("all",), default="all")
    p.add_argument("--sweep", action="append", default=[],
                   help="KNOB=v1,v2,... e.g. pcie=gen3,gen4,gen5; repeat for a grid")
    p.add_argument("--out", type=Path, help="directory for the summary, spans and trace")
    p.add_argument("--trace-steps", default=TRACE_STEPS_DEFAULT, metavar="RULE",
                   help=f"steps trace.json draws of each strategy and rank: left-out+N "
                        f"(the steps left out of the averages, i.e. warm-up and two update "
                        f"windows, plus the last N), N (the last N) or all (default: "
                        f"{TRACE_STEPS_DEFAULT}); spans files always hold every step")
    p.add_argument("--timeline-format", choices=("auto", "csv", "parquet"), default="auto",
                   help="spans/steps files: parquet needs pyarrow; auto: parquet where "
                        "pyarrow imports, else csv")
    p.add_argument("--jobs", default="auto", metavar="N",
                   help="worker processes for the runs (default auto: one per usable CPU "
                        "for long runs)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def settings_from_args(args) -> dict:
    """The knobs the flags give, plus a profile's shape and precision where not given."""
    given = {k: parse_value(k, getattr(args, k)) for k in KNOBS
             if getattr(args, k) is not None}
    if "gpus" in given and given.get("gpus_per_node") is not None:
        ranks = given.get("nodes", 1) * given["gpus_per_node"]
        if given["gpus"] != ranks:  # the settings refuse the rest (nodes without G)
            raise SimSettingsError(
                f"--gpus {given['gpus']} contradicts --nodes {given.get('nodes', 1)} x "
                f"--gpus-per-node {given.get('gpus_per_node')} = {ranks} ranks; give --gpus "
                f"for one node, or --nodes with --gpus-per-node")
    if given.get("profile"):
        for knob, value in profile_defaults(given["profile"]).items():
            given.setdefault(knob, value)
    return given


def profile_defaults(path: str) -> dict:
    """A measured profile describes one machine and one shape: simulate that shape on one
    rank with the engine's data path, in the precision it was measured in (profiles from
    before the precision was recorded: fp32 for a CPU-emulated one), unless the flags say
    otherwise."""
    import re

    cal = check_profile(path)
    match = re.fullmatch(r"(.+?)(?:\[(\d+)L\])?", cal["model"])
    out = {"model": match.group(1), "micro_batch": cal["batch"], "seq": cal["seq"],
           "gpus": 1, "gpus_per_switch": 1, "transfers": "full"}
    if match.group(2):
        out["layers"] = int(match.group(2))
    precision = cal.get("precision") or ("fp32" if cal.get("transfers") == "emulated"
                                         else None)
    if precision is not None:
        out["precision"] = precision
    return out


def build_cases(given: dict, sweeps: list[tuple[str, list]],
                node: str | None = None) -> list[tuple[dict, SimSettings]]:
    """(labels, settings) for every combination of the swept values, each validated; on
    the node preset `node` (or the swept `node`), its knobs where none is given."""
    knobs = [k for k, _ in sweeps]
    if node is not None and "node" in knobs:
        raise SimSettingsError("give --node or --sweep node=..., not both")
    cases = []
    for combo in itertools.product(*(values for _, values in sweeps)):
        labels = dict(zip(knobs, combo))
        knobs_of_case = {**given, **{k: v for k, v in labels.items() if k != "node"}}
        node_of_case = labels.get("node", node)
        if node_of_case is not None:
            try:
                knobs_of_case = on_node(node_of_case, knobs_of_case)
            except SimSettingsError as err:
                raise SimSettingsError(f"{case_label(labels) + ': ' if labels else ''}"
                                       f"{err}") from None
        if "update_interval" in labels and labels["update_interval"] != "auto" and \
                "auto_windows" not in labels:  # --auto-windows is for the auto cases
            knobs_of_case.pop("auto_windows", None)
        try:
            cases.append((labels, SimSettings.from_knobs(**knobs_of_case)))
        except SimSettingsError as err:
            raise SimSettingsError(f"{case_label(labels) + ': ' if labels else ''}{err}") \
                from None
    return cases


def check_zero_stage(cases, strategies: list[str]) -> None:
    """--zero-stage 3 with only strategies it does not apply to is an error."""
    if any(case.zenflow.zero_stage == 3 for _, case in cases) and \
            not any(s in ZERO_STAGE_STRATEGIES for s in strategies):
        raise SimSettingsError(
            f"--zero-stage 3 applies to {', '.join(ZERO_STAGE_STRATEGIES)} (zero-infinity "
            f"is ZeRO-3 always, the others ZeRO-2); simulate --strategy "
            f"{ZERO_STAGE_STRATEGIES[0]} or all, or leave --zero-stage out")


def check_fits(settings: SimSettings, strategies: list[str]) -> None:
    """Asking for one strategy that cannot fit is an error that says by how much."""
    from zfbench.sims.costs import CostModel

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
    stage3 = ", --zero-stage 3" if strategies[0] in ZERO_STAGE_STRATEGIES and \
        settings.zenflow.zero_stage == 2 else ""
    raise SimSettingsError(f"{strategies[0]} does not fit: {'; '.join(parts)}. Try more "
                           f"--gpus, a smaller --micro-batch or --seq, "
                           f"--activation-checkpointing true{stage3}, or an offload "
                           f"strategy.")


def zero3_where_needed(cases, strategies: list[str], given: dict, sweeps
                       ) -> tuple[list, list[str]]:
    """The cases with ZenFlow on ZeRO-3 where it does not fit on ZeRO-2 but does on
    ZeRO-3 and no --zero-stage was given (nor swept), and one line per case saying so."""
    from zfbench.sims.costs import CostModel

    chosen = [s for s in strategies if s in ZERO_STAGE_STRATEGIES]
    if not chosen or "zero_stage" in given or "zero_stage" in dict(sweeps):
        return cases, []
    out, notes, gib = [], [], 2 ** 30
    for labels, case in cases:
        if case.zenflow.zero_stage == 2 and case.machine.profile is None:
            two = CostModel(case, chosen[0]).fits(chosen[0])
            stage3 = case.with_(zero_stage=3)
            three = CostModel(stage3, chosen[0]).fits(chosen[0])
            if not two["fits"] and three["fits"]:
                where = f"{case_label(labels)}: " if labels else ""
                notes.append(
                    f"note: {where}{', '.join(chosen)} on ZeRO-2 does not fit (device "
                    f"{two['device_bytes_per_rank'] / gib:.1f} GiB per GPU, host "
                    f"{two['host_bytes'] / gib:.0f} GiB; the GPU has "
                    f"{two['device_capacity_bytes'] / gib:.1f} GiB, the host "
                    f"{two['host_capacity_bytes'] / gib:.0f} GiB): simulated on ZeRO-3 "
                    f"(--zero-stage 3: parameters partitioned over the {case.machine.ranks} GPUs, "
                    f"{three['device_bytes_per_rank'] / gib:.1f} GiB per GPU)")
                case = stage3
        out.append((labels, case))
    return out, notes


def accumulating(cases, strategies: list[str], every: bool) -> list[str]:
    """With --grad-accum above 1, the strategies whose accumulation is simulated: `all`
    keeps those (and says which it leaves out); one named that is not is an error."""
    if all(case.scenario.grad_accum == 1 for _, case in cases):
        return strategies
    kept = [s for s in strategies if s in GRAD_ACCUM_STRATEGIES]
    left = [s for s in strategies if s not in kept]
    if left and not every:
        raise SimSettingsError(f"--grad-accum above 1 is simulated for "
                               f"{', '.join(GRAD_ACCUM_STRATEGIES)}, not {', '.join(left)}")
    if left:
        print(f"note: --grad-accum above 1: {', '.join(left)} left out (its accumulation "
              f"is not simulated)", file=sys.stderr)
    return kept


def auto_resolution(case: SimSettings) -> dict | None:
    """What update_interval "auto" resolved to in this case (None with a fixed one)."""
    plan = case.window_plan()
    return plan.describe(case.measurement.steps, case.zenflow.full_warm_up_rounds,
                         case.zenflow.select_interval) if plan.auto else None


def header(case: SimSettings, flags: set, sweeps, node: str | None = None) -> str:
    """The settings line (and the sweep's), printed above the table."""
    m, sc, zf, inf = case.machine, case.scenario, case.zenflow, case.infinity
    where = f"the machine measured in {m.profile}" if m.profile else \
        f"{m.gpus} x {m.gpu}, PCIe {m.pcie}, host {m.host}" if m.nodes == 1 and \
        m.gpus_per_node is None else \
        f"{m.nodes} nodes x {m.gpus_on_node} x {m.gpu} ({m.inter_net} between nodes), " \
        f"PCIe {m.pcie}, host {m.host} per node"
    if node is not None:
        where += f" (node {node})"
    precision = sc.precision + (" (the profile's)" if m.profile and "precision" not in flags
                                else "")
    interval = case.window_plan().rule if zf.update_interval == "auto" else zf.update_interval
    line = (f"{sc.model}{'' if sc.layers is None else f'[{sc.layers}L]'} on {where}; "
            f"micro-batch {sc.micro_batch} x seq {sc.seq}"
            + (f" x {sc.grad_accum} micro-steps" if sc.grad_accum > 1 else "")
            + f", {precision}; zenflow topk "
            f"{zf.topk_ratio}, U={interval}, overlap={zf.overlap_step}"
            + (", moments offloaded" if zf.offload else "") + "; zero-infinity "
            f"parameters on {'gpu' if inf.offload_params == 'none' else inf.offload_params}, "
            f"optimizer state on {inf.optimizer_placement}"
            + (f" ({m.nvme_drives} x {m.nvme})"
               if "nvme" in (inf.offload_params, inf.optimizer_placement) else "")
            + f", prefetch {inf.prefetch_buckets}"
            + (", activation checkpoints on the host" if inf.offload_activations else "")
            + (f", Linears in {inf.tiling} tiles" if inf.tiling > 1 else "")
            + (f"; {', '.join(ZERO_STAGE_STRATEGIES)} on ZeRO-3 (parameters partitioned)"
               if zf.zero_stage == 3 else "")
            + f"; {case.measurement.steps} steps (simulated)")
    if sweeps:
        line += "\nsweep: " + " x ".join(f"{k}={','.join(map(str, v))}" for k, v in sweeps)
    return line


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        check_out_dir(args.out)
        given = settings_from_args(args)
        sweeps = parse_sweeps(args.sweep)
        node = hardware.get_node(args.node, given.get("hardware")).name if args.node \
            else None
        cases = build_cases(given, sweeps, node)  # every case validated before simulating
        strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
        strategies = accumulating(cases, strategies, args.strategy == "all")
        check_zero_stage(cases, strategies)
        cases, notes = zero3_where_needed(cases, strategies, given, sweeps)
        for _, case in cases:
            check_fits(case, strategies)
        trace = TraceRule.parse(args.trace_steps)
        fmt = timeline_format(args.timeline_format)
        jobs = auto_jobs(cases, strategies) if args.jobs == "auto" else parse_jobs(args.jobs)
    except (CliError, SimSettingsError, ValueError) as err:
        return fail(err)
    flags = {k for k in KNOBS if getattr(args, k) is not None}
    print(header(cases[0][1], flags, sweeps, node))
    for line in notes:
        print(line)
    warning = too_short_warning(cases)
    if warning:
        print(warning, file=sys.stderr)
    if not args.out:
        rows = mark(run(cases, strategies, args.quiet, jobs)[0], cases)
        print(format_table(rows, [k for k, _ in sweeps]))
        return 0
    try:
        with staging_dir(args.out) as stage:  # the runs write their timelines into it
            plan = FilePlan(stage, trace, fmt, chrome_trace=not sweeps)
            rows, results = run(cases, strategies, args.quiet, jobs, plan,
                                meanwhile=machine)  # torch's import beside the runs
            mark(rows, cases)
            print(format_table(rows, [k for k, _ in sweeps]))
            chose = {"zero_stage": 3} if notes and all(
                case.zenflow.zero_stage == 3 for _, case in cases) else {}  # every case switched
            write_outputs(args.out, {**summary_head(argv, {**given, **chose}, sweeps, cases,
                                                    node), "notes": notes}, rows,
                          results, trace=trace, fmt=fmt, staging=stage)
    except OSError as err:
        return fail(f"writing {args.out}: {err}")
    print(f"wrote {args.out}/summary.csv, summary.json, steps.csv, spans ({fmt})"
          + ("" if sweeps else f", trace.json ({trace.describe()}; open in "
                               f"https://ui.perfetto.dev)"))
    return 0


def summary_head(argv, given: dict, sweeps, cases, node: str | None = None) -> dict:
    """summary.json's header: the settings every case shares (with a node preset, `node`
    and the knobs it set where every case has the same), the sweep, what "auto" resolved
    to per case, and the provenance."""
    from zfbench.core.provenance import provenance

    knobs = [k for k, _ in sweeps]
    shared = {k: v for k, v in {**DEFAULTS.as_dict(), **given}.items() if k not in knobs}
    if node is not None or "node" in knobs:  # the knobs a node set, where cases agree
        settings = [case.as_dict() for _, case in cases]
        for k, v in settings[0].items():
            if k in knobs:
                continue
            if all(other[k] == v for other in settings):
                shared[k] = v
            else:
                shared.pop(k, None)
        if node is not None:
            shared["node"] = node
    if "nodes" not in knobs and "gpus_per_node" not in knobs:  # `gpus` is one node's
        shared["ranks"] = cases[0][1].machine.ranks
    return {"settings": shared,  # every case's; the swept knobs are under "sweep"
            "sweep": {k: v for k, v in sweeps},
            "update_interval_auto": auto_resolution(cases[0][1]),
            "cases": [{"labels": labels, "steps": case.measurement.steps,
                       "ranks": case.machine.ranks,
                       "steps_needed": steps_needed(case),
                       "too_short": case.measurement.steps < steps_needed(case),
                       "update_interval_auto": auto_resolution(case)}
                      for labels, case in cases],
            "provenance": provenance(argv, PROG)}


def timeline_format(name: str) -> str:
    """The spans files' format: "auto" is parquet where pyarrow imports, else csv."""
    if name == "auto":
        return columnar_format()
    if name == "parquet" and columnar_format() != "parquet":
        raise ValueError("--timeline-format parquet needs pyarrow (pip install pyarrow, or "
                         "the real-model extra); csv works without it")
    return name


def parse_jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ValueError(f"--jobs wants a positive number of processes or auto (got {text!r})")
    return jobs


if __name__ == "__main__":
    sys.exit(main())
