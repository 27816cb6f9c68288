"""`python -m zfbench.advise`: the best offloading setup for a model on a node, as a
DeepSpeed config, with its error bar.

This module owns the command: its flags, the checks before any work, the printed advice
and the files. `--model M --node N` (or `--profile FILE`, a machine measured by
`python -m zfbench.run --profile`; `--gpu/--host/--pcie/--gpus` override a node's parts)
searches the setups of zfbench.advise.space that fit the memory model at the global
batch (`--global-batch`, default 8 sequences per GPU of `--seq` tokens): a coarse grid,
then a refinement around the best (zfbench.advise.search), and ranks them by
`--objective throughput` (simulated tokens/s) or `time-to-quality` (step time x the steps
to quality zfbench's convergence runs measured, zfbench.advise.quality), each row with
the error bar of its regime (zfbench.advise.error_bars). The default ZenFlow setup is
always a row, so the pick is never slower than it. `--out` (default runs/advise) gets
advice.csv, advice.json, ds_config.json and front.png/.pdf (zfbench.advise.files).
Bad input (an impossible global batch, an unknown model or node, a model that fits no
setup) is one `error:` line, exit 2. docs/commands.md ("advise") has an example.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from zfbench.advise.ds_config import ds_config, runs_on_engine
from zfbench.advise.error_bars import regime_errors
from zfbench.advise.files import write_all
from zfbench.advise.quality import TASK_LABEL, NoConvergenceData, QualityModel
from zfbench.advise.ranking import OBJECTIVE_COLUMN, OBJECTIVES, rank, scorer
from zfbench.advise.search import Evaluator, search
from zfbench.advise.space import KNOB_ORDER, Space, default_zenflow, memory
from zfbench.cli_checks import CliError, OneLineParser, check_out_dir, check_profile, fail
from zfbench.core import hardware
from zfbench.core.scenario import GPU_NODE
from zfbench.core.strategies import SIM_STRATEGIES
from zfbench.sims.costs import SimSettings, SimSettingsError
from zfbench.sims.settings import on_node
from zfbench.simulation import usable_cpus

PROG = "python -m zfbench.advise"
PER_GPU_DEFAULT = 8  # sequences per GPU when --global-batch is not given (a judgment)
SHOWN = 8  # rows printed; the files hold them all


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help=f"default {GPU_NODE.model} (with --profile: the "
                   f"profile's)")
    p.add_argument("--node", metavar="NAME",
                   help=f"a node preset: {', '.join(hardware.node_names())}")
    p.add_argument("--profile", metavar="FILE", help="a measured machine (python -m "
                   "zfbench.run --profile); instead of --node")
    for flag in ("gpu", "host", "pcie"):
        p.add_argument(f"--{flag}", help=f"override the node's {flag}")
    p.add_argument("--gpus", type=int, help="the run's GPUs in all (default: the node's)")
    p.add_argument("--seq", type=int, default=GPU_NODE.seq, help=f"default {GPU_NODE.seq}")
    p.add_argument("--precision", default=GPU_NODE.precision, choices=("bf16", "fp16"))
    p.add_argument("--global-batch", type=int, metavar="SEQUENCES",
                   help=f"sequences per optimizer step over all GPUs (default "
                        f"{PER_GPU_DEFAULT} per GPU)")
    p.add_argument("--objective", choices=OBJECTIVES, default="throughput")
    p.add_argument("--strategies", metavar="A,B",
                   help=f"search only these (default all: {', '.join(SIM_STRATEGIES)})")
    p.add_argument("--jobs", default="auto", metavar="N",
                   help="worker processes (default auto: one per usable CPU)")
    p.add_argument("--out", type=Path, default=Path("runs/advise"),
                   help="directory for the files (default runs/advise)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def base_settings(args) -> tuple[SimSettings, str]:
    """The machine, model and batch shape every setup shares, and its description."""
    if args.profile:
        if args.node:
            raise CliError("give --node or --profile, not both: a profile is the machine "
                           "it was measured on")
        from zfbench.simulate.command import profile_defaults

        fixed = [f"--{k}" for k in ("model", "gpu", "host", "pcie", "gpus")
                 if getattr(args, k) is not None]
        if fixed:
            raise CliError(f"--profile simulates the machine and model it measured; "
                           f"leave out {', '.join(fixed)}")

        check_profile(args.profile)
        knobs = {**profile_defaults(args.profile), "profile": args.profile}
        return SimSettings.from_knobs(**knobs), f"the machine measured in {args.profile}"
    if not args.node:
        raise CliError("give --node NAME (a node preset: "
                       f"{', '.join(hardware.node_names())}) or --profile FILE")
    given = {k: v for k, v in (("model", args.model or GPU_NODE.model), ("gpu", args.gpu),
                               ("host", args.host), ("pcie", args.pcie),
                               ("gpus", args.gpus), ("seq", args.seq),
                               ("precision", args.precision)) if v is not None}
    base = SimSettings.from_knobs(**on_node(args.node, given))
    m = base.machine
    return base, f"{args.node} ({m.ranks} x {m.gpu}, PCIe {m.pcie}, {m.host})"


def per_gpu_batch(global_batch: int | None, ranks: int) -> int:
    if global_batch is None:
        return PER_GPU_DEFAULT
    if global_batch < 1 or global_batch % ranks:
        near = max(ranks, round(max(global_batch, 1) / ranks) * ranks)
        raise CliError(f"--global-batch {global_batch} cannot be split over {ranks} GPUs "
                       f"(it must be a positive multiple of {ranks}, e.g. {near})")
    return global_batch // ranks


def parse_strategies(text: str | None) -> tuple[str, ...]:
    if not text:
        return SIM_STRATEGIES
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    wrong = [n for n in names if n not in SIM_STRATEGIES]
    if wrong or not names:
        raise CliError(f"--strategies: unknown {', '.join(wrong) or '(none given)'}; "
                       f"choose from {', '.join(SIM_STRATEGIES)}")
    return names


def parse_jobs(text: str) -> int:
    if text == "auto":
        return usable_cpus()
    if not text.isdigit() or int(text) < 1:
        raise CliError(f"--jobs wants a positive number of processes or auto (got {text!r})")
    return int(text)


def smallest_fitting_node(base: SimSettings, space: Space) -> str | None:
    """The node preset of least GPU memory in all where some coarse setup fits at one
    sequence per GPU (None: none does)."""
    nodes = sorted(hardware.node_names(), key=lambda n: (
        hardware.get_node(n).gpus * hardware.get_node(n).gpu.memory_bytes, n))
    for name in nodes:
        try:
            sc = base.scenario
            there = SimSettings.from_knobs(**on_node(name, {
                "model": sc.model, "seq": sc.seq, "precision": sc.precision}))
        except SimSettingsError:  # a GPU without this precision
            continue
        if any(memory(there, s)["fits"] for s in space.lightest(1)):
            return name
    return None


def no_fit_message(base: SimSettings, space: Space, per_gpu: int, where: str) -> str:
    node = smallest_fitting_node(base, space)
    hint = (f"the smallest node preset where it fits (1 sequence per GPU): {node}"
            if node else "no node preset fits it either, not even ZeRO-Infinity with "
            "parameters and optimizer state on NVMe")
    return (f"{base.scenario.model} at {per_gpu} sequences per GPU of {base.scenario.seq} "
            f"tokens fits no "
            f"setup on {where} ({', '.join(space.strategies)}: the memory model, "
            f"zfbench.sims.costs.CostModel.fits); {hint}")


def fmt(value, spec: str) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) \
        else format(value, spec)


def table(rows: list[dict], objective: str) -> str:
    head = ["#", "step_s", "tokens/s", "err%", "steps_x", "penalty", "tq_s/dev-step",
            "setup"]
    cells = [[str(r["rank"]) + ("=" if r["within_error_of_next"] else ""),
              fmt(r["step_s"], ".3f"), fmt(r["tokens_per_s"], ".0f"),
              fmt(r["error_pct"], ".0f"), fmt(r["steps_factor"], ".2f"),
              fmt(r["quality_penalty_nats"], "+.3f"),
              fmt(r["time_to_quality_s_per_device_step"], ".3f"),
              r["setup"] + (" (default ZenFlow)" if r["default_zenflow"] else "")]
             for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    lines = ["  ".join(x.rjust(w) if i < len(head) - 1 else x
                       for i, (x, w) in enumerate(zip(line, widths)))
             for line in [head, *cells]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    try:
        args = build_parser().parse_args(argv)
        check_out_dir(args.out)
        strategies = parse_strategies(args.strategies)
        jobs = parse_jobs(args.jobs)
        base, where = base_settings(args)
        per_gpu = per_gpu_batch(args.global_batch, base.machine.ranks)
        quality = None
        try:
            quality = QualityModel.load()
        except NoConvergenceData:
            if args.objective != "throughput":
                raise
        space = Space(strategies=strategies)
        if not any(memory(base, s)["fits"] for s in space.lightest(per_gpu)):
            raise CliError(no_fit_message(base, space, per_gpu, where))
    except (CliError, SimSettingsError, ValueError, NoConvergenceData, OSError) as err:
        return fail(err)
    score = scorer(args.objective, quality)
    default = default_zenflow(strategies, per_gpu)
    sc, ranks = base.scenario, base.machine.ranks
    print(f"{sc.model} on {where}; global batch {per_gpu * ranks} = {per_gpu} x "
          f"{ranks} GPUs x seq {sc.seq}, {sc.precision}; objective "
          f"{args.objective}")
    evaluator = Evaluator(base, jobs, args.quiet)
    try:
        errors_later = evaluator.submit(regime_errors, True)
        results = search(space, per_gpu, evaluator, score)
        errors = errors_later.result()
    finally:
        evaluator.close()
    rows = rank(results, args.objective, quality, errors, default)
    if not rows:  # fits, but the simulator refused every setup that does
        refused = next((r["refused"] for r in results.values() if r.get("refused")), "")
        return fail(f"no setup that fits could be simulated: {refused}")
    pick = rows[0]
    print(f"{evaluator.simulated} setups simulated, {len(results)} checked against the "
          f"memory model, {len(rows)} fit ({time.perf_counter() - started:.0f} s)")
    print(table(rows[:SHOWN], args.objective))
    print(f"('=' after a rank: within the error bar of the next; steps_x and penalty: "
          f"{TASK_LABEL})")
    print(summary_lines(rows, pick, args.objective))
    setup = next(s for s in results if s.label() == pick["setup"])
    config = ds_config(setup, base.scenario.precision)
    head = {"model": base.scenario.model, "where": where, "settings": base.as_dict(),
            "global_batch": per_gpu * base.machine.ranks, "per_gpu_batch": per_gpu,
            "objective": args.objective, "objective_column": OBJECTIVE_COLUMN[args.objective],
            "setups_simulated": evaluator.simulated, "setups_checked": len(results),
            "searched": {k: list(space.values[k]) for k in KNOB_ORDER},
            "quality_task": TASK_LABEL, "errors": {k: vars(v) for k, v in errors.items()},
            "pick": pick, "ds_config_runs_on_zfbench_engine": runs_on_engine(setup)}
    try:
        names = write_all(args.out, rows, head, config,
                          f"{base.scenario.model} on {where}, global batch "
                          f"{per_gpu * base.machine.ranks}")
    except OSError as err:
        return fail(f"writing {args.out}: {err}")
    print(f"wrote {args.out}/{', '.join(names)} "
          f"({time.perf_counter() - started:.0f} s)")
    if not runs_on_engine(setup):
        print(f"note: {setup.strategy} is simulated only: zfbench's engine does not run "
              f"ds_config.json (DeepSpeed does)")
    return 0


def summary_lines(rows: list[dict], pick: dict, objective: str) -> str:
    """The pick in words: its error bar, its neighbour, the default ZenFlow setup."""
    unit = "tokens/s" if objective == "throughput" else "s per device step"
    column = OBJECTIVE_COLUMN[objective]
    spec = ",.0f" if pick[column] >= 1000 else ".4g"
    lines = [f"pick: {pick['setup']}: {fmt(pick[column], spec)} {unit} "
             f"({fmt(pick[column + '_lo'], spec)}-{fmt(pick[column + '_hi'], spec)} at "
             f"its regime's error {fmt(pick['error_pct'], '.0f')}%: {pick['error_source']})"]
    if pick["within_error_of_next"] and len(rows) > 1:
        lines.append(f"  within the error bar of #2 ({rows[1]['setup']}): the simulator "
                     f"cannot tell them apart")
    default = next((r for r in rows if r["default_zenflow"]), None)
    if default is not None:
        lines.append(f"  default ZenFlow setup: #{default['rank']}, step "
                     f"{default['step_s']:.3f} s against the pick's {pick['step_s']:.3f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
