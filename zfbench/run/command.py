"""`python -m zfbench.run`: train with the real engine and measure every op.

Covers: `--model`, `--layers` (a depth slice at full width), `--strategy` (one or all),
`--steps`, `--batch`, `--seq`, `--gpus`, `--config ds_config.json`,
`--device auto|cuda|cpu`, `--device-threads`, `--host-threads`, `--text`, `--out`.
Multi-rank: `--gpus N` launches N data-parallel ranks (ZeRO-2) through torch's elastic
launcher, as `torchrun --nproc-per-node N -m zfbench.run` does; NCCL with CUDA, gloo
without; rank 0 prints and writes the files.
Scenario: with no flags, all four strategies run on a shape where host AdamW is slower
than forward+backward on this machine (the regime ZenFlow is for): TinyLlama-1.1B's first
layer at full width (its untied 32000 x 2048 embedding and head are barely touched by
compute but updated by Adam), batch 1, the sequence length sized on the machine at hand
(zfbench.run.probe), 30 steps each, in the precision measured for this CPU. It prints the
breakdown table (the simulator's, zfbench.report) and the loss, then this machine's
profile and the simulator's expectation beside each measured strategy (zfbench.run.expect).
Everything is decided first (zfbench.run.plan: memory, a proxy, the shape, the precision),
then executed (zfbench.run.execute), then reported (`report`); launched ranks get `--plan`.
Files written to `--out` (default runs/run, without `plan.json`): `plan.json`, `summary.csv`/`.json`, `steps.csv`,
`<strategy>.steps.jsonl`, the timeline `<strategy>.spans.csv`/`.steps.csv`, `trace.json`;
an earlier run's files of those names that this run did not write are removed.
docs/commands.md ("run") has every flag, example and file in detail.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from zfbench.cli_checks import CliError, OneLineParser, add_zenflow_flags, fail
from zfbench.core.config import STRATEGIES, ConfigError
from zfbench.core.memory_model import element_bytes
from zfbench.core.models import UnknownModelError
from zfbench.core.provenance import provenance
# SIMULATED_ONLY: strategies the simulator has and the engine does not (zero-infinity: no
# ZeRO-3 path in real/); asking the engine for one is a one-line error naming the simulator
from zfbench.core.strategies import SIMULATED_ONLY
from zfbench.real.distributed import env_world
from zfbench.real.host_fused import status as host_kernels_status
from zfbench.real.memory import InsufficientMemoryError, check_configs_fit
from zfbench.real.runner import RunSpec
from zfbench.report import add_speedups, format_table
from zfbench.run.defaults import DEFAULT_SEQ, RESULTS_DIR
from zfbench.run.execute import Execution, execute
from zfbench.run.expect import print_expectation
from zfbench.run.host_target import host_target_line
# spec_from_args, engine_configs: the flags resolved without a probe (the tests read them)
from zfbench.run.plan import (PLAN_FILE, RunPlan, check_gpu_count, engine_configs,  # noqa: F401
                              plan, requested_strategies, resolve_world, spec_and_configs,
                              spec_from_args)
from zfbench.run.proxy import print_projection
from zfbench.run.report import (MEMORY_NOTE, StepWork, host_share_note, measurement_window,
                                memory_columns, peak_flops, project, summary_row,
                                write_outputs)

PLAN_ERRORS = (ValueError, ConfigError, UnknownModelError, InsufficientMemoryError,
               RuntimeError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m zfbench.run", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RunSpec()
    # a shape flag not given stays None, resolved by the plan (zfbench.run.plan)
    p.add_argument("--model", default=None, help=f"named shape (default {d.model})")
    p.add_argument("--layers", type=int, default=None,
                   help=f"depth slice at full width (default {d.layers} for the default "
                        f"model, all layers otherwise)")
    p.add_argument("--strategy", choices=STRATEGIES + SIMULATED_ONLY + ("all",),
                   default="all", help="one strategy or all (the simulator's "
                   f"{', '.join(SIMULATED_ONLY)} is refused: the engine does not implement it)")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per "
                   f"strategy (default {d.steps})")
    p.add_argument("--batch", type=int, default=None, help="micro-batch per GPU "
                   "(default: the --config file's, else 1)")
    p.add_argument("--grad-accum", type=int, default=None, help="micro-steps per optimizer "
                   "step (default: the --config file's gradient_accumulation_steps, else 1)")
    p.add_argument("--seq", type=int, default=None,
                   help=f"tokens per sequence (default {DEFAULT_SEQ})")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                   help="device weights and gradients (host master and moments are fp32); "
                        "default: the --config file's; without one, bf16 on CUDA and, on "
                        "the emulated accelerator, bf16 only where this CPU runs it about "
                        "as fast as fp32 (measured in seconds, cached per machine)")
    p.add_argument("--gpus", type=int, default=None,
                   help="ranks (data parallel, ZeRO-2); >1 launches them with torch's "
                        "elastic launcher; under torchrun the default is its WORLD_SIZE")
    p.add_argument("--bind-cores", action="store_true",
                   help="pin each rank to its own block of cores (multi-rank)")
    p.add_argument("--config", help="DeepSpeed-style JSON config (ds_config.json)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--device-threads", type=int, help="torch threads of the device lane "
                   "per rank (emulated accelerator; default half of the rank's cores)")
    p.add_argument("--host-threads", type=int, help="torch threads of the host lane per "
                   "rank (default: the other half of the rank's cores; on a GPU all of "
                   "them, ZenFlow the share pt_reserved_cores_perc leaves)")
    p.add_argument("--text", help="train on a plain-text file (byte-level tokens); "
                   "'builtin' uses the standard library's pydoc topics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="directory for summary, per-step JSONL, spans, "
                   f"Chrome trace (default {RESULTS_DIR})")
    p.add_argument("--profile", action="store_true",
                   help="measure this machine's costs (per-block forward/backward, device "
                        "optimizer, selection, d2h/h2d alone and together, host Adam and "
                        "accumulation), write OUT/profile.json for "
                        "python -m zfbench.simulate --profile, and print the simulator's "
                        "expectation with it beside the measured rows (several ranks on "
                        "the CPU: they share its cores, the collectives measured too)")
    p.add_argument("--project", action="store_true",
                   help="run the --layers slice, calibrate, and report beside it the "
                        "simulated full-depth step time and stall of each strategy "
                        "(projected, not measured)")
    p.add_argument("--hazard-check", action="store_true",
                   help="run each strategy's real schedule on the CPU lanes under the "
                        "hazard checker: every cross-lane buffer access must follow a "
                        "wait (prints accesses checked and hazards; exit 1 on a hazard)")
    p.add_argument("--quiet", action="store_true")
    add_zenflow_flags(p)  # --zenflow.topk-ratio ... (zfbench.cli_checks)
    p.add_argument("--plan", type=Path, help="run the plan.json an earlier run wrote "
                   "(zfbench.run.plan: shape, precision, configs and probes as decided "
                   "then; the ranks a multi-rank run launches get only this); no other flag")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except CliError as err:
        return fail(err)
    if args.plan is not None:
        return run_plan_file(parser, args)
    try:
        if args.hazard_check:
            return hazard_check(args, argv)
        run = plan(args, argv)
    except PLAN_ERRORS as err:
        return fail(err)
    found = env_world()  # (rank, world, local rank) of a run torchrun started
    if run.out is not None and (found is None or found[0] == 0):
        run.write(run.out / PLAN_FILE)
    if found is not None:  # one of its ranks: each planned alike
        return run_rank(run)
    if run.world > 1:
        return launch_ranks(run)
    return report(run, execute(run))


def hazard_check(args, argv: list[str]) -> int:
    """--hazard-check: the schedules under the hazard checker (zfbench.run.hazards)."""
    from zfbench.run.hazards import check_schedules

    strategies = requested_strategies(args)
    world, _ = resolve_world(args)
    spec, _ = spec_and_configs(args, world, strategies)
    if world > 1:
        raise ValueError("--hazard-check runs one rank (tests/test_hazards.py checks two); "
                         "drop --gpus")
    return check_schedules(spec, strategies, args.quiet, args.out, argv)


def run_plan_file(parser: argparse.ArgumentParser, args) -> int:
    """`--plan PATH`: execute a written plan (what a launched rank gets, and nothing
    else); with several ranks and no launcher, launch them with it."""
    others = sorted(k for k, v in vars(args).items()
                    if k != "plan" and v != parser.get_default(k))
    try:
        if others:
            raise CliError(f"--plan takes no other flag (got {', '.join(others)}): the "
                           f"plan file fixes the whole run")
        run = RunPlan.read(args.plan)
        found = env_world()
        if found is not None and found[1] != run.world:
            raise ValueError(f"--plan {args.plan} plans {run.world} rank(s); the launcher "
                             f"started {found[1]}")
    except PLAN_ERRORS as err:
        return fail(err)
    if found is not None:
        return run_rank(run)
    if run.world > 1:
        return launch_ranks(run, args.plan)
    if run.out is not None:
        run.write(run.out / PLAN_FILE)
    return report(run, execute(run))


def rank_argv(plan_path: Path) -> list[str]:
    """What each launched rank runs: the plan, and nothing else by argv."""
    return ["-m", "zfbench.run", "--plan", str(plan_path)]


def launch_ranks(run: RunPlan, path: Path | None = None) -> int:
    """Start the plan's ranks with torch's elastic launcher, each given the plan file
    (OUT/plan.json, else one in a temporary directory)."""
    from zfbench.real.launch import LaunchError, launch

    print(f"launching {run.world} ranks ({'nccl' if run.use_cuda else 'gloo'}) with "
          f"torch's elastic launcher", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="zfbench-plan-") as scratch:
        if path is None:
            path = run.out / PLAN_FILE if run.out is not None else \
                run.write(Path(scratch) / PLAN_FILE)
        try:
            launch(run.world, rank_argv(path))
        except LaunchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    return 0


def run_rank(run: RunPlan) -> int:
    """One rank of a launched multi-rank run; rank 0 reports and writes the files."""
    from zfbench.real.distributed import (DistributedError, bind_cores, init_from_env,
                                          shutdown)

    try:  # this rank's own GPU (LOCAL_RANK) and share of the machine
        check_gpu_count(run.world, run.use_cuda)
        check_configs_fit(run.spec.shape(), run.configs, run.spec.seq, run.use_cuda)
    except PLAN_ERRORS as err:
        return fail(err)
    ctx = init_from_env(run.use_cuda)
    try:
        if run.bind_cores:
            bind_cores(ctx.rank, ctx.world)
        try:
            done = execute(run, ctx)
            return report(run, done) if done.lead else 0
        except DistributedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    finally:
        shutdown()


def measured_rows(run: RunPlan, ex: Execution, peak: float | None) -> list[dict]:
    """One summary row per strategy trained (zfbench.run.report.summary_row)."""
    spec, shape = run.spec, run.spec.shape()
    windows = {s: measurement_window(c) for s, c in run.configs.items()}
    skip = max(w[0] for w in windows.values())  # the same steps left out of every row
    tokens = spec.micro_batch * spec.grad_accum * spec.seq
    flops = (shape.forward_flops_per_token(spec.seq) +
             shape.backward_flops_per_token(spec.seq)) * tokens
    precision = run.configs[run.strategies[0]].precision
    work = StepWork(shape.total_params * element_bytes(precision), shape.total_params,
                    flops, tokens, peak)
    rows = []
    for strategy, result in ex.results.items():
        memory = memory_columns(shape, run.configs[strategy], spec.seq, ex.ranks, ex.room)
        profile = ex.profiles.get(strategy)
        calibration = (json.loads(Path(profile).read_text())["calibration"]
                       if profile is not None else None)
        row = summary_row(result, work, skip, max(windows[strategy][1], skip + 2), memory,
                          calibration)
        row.update(device_threads=result.engine.device_threads,
                   host_threads=result.engine.host_threads)
        rows.append(row)
    return rows


def report(run: RunPlan, ex: Execution) -> int:
    """Rank 0: the table, the simulator beside it where the plan asks, the files."""
    peak, mfu_note = peak_flops(run.use_cuda, run.configs[run.strategies[0]].precision)
    rows = measured_rows(run, ex, peak)
    add_speedups(rows)
    print(format_table(rows, loss=True))
    host_line = host_target_line(rows)
    if host_line is not None:
        print(host_line)
    if run.use_cuda:
        from zfbench.real.distributed import available_cores
        note = host_share_note(rows, True, max(1, available_cores() // ex.ranks))
        if note is not None:
            print(note, file=sys.stderr)
    if ex.profile_note is not None:
        print(ex.profile_note)
    expectation = None
    if ex.expect:
        expectation = print_expectation(run.spec, run.configs, list(run.strategies), rows,
                                        ex.profile_path, ex.profiles, ex.ranks)
    if run.project:
        projected = project(run.spec, run.spec.shape(), list(run.strategies),
                            ex.profile_path, run.configs.get("zenflow"))
        print(f"\nPROJECTED (simulated with the profile measured above, not measured): "
              f"{projected[0]['model']} at full depth")
        print(format_table(projected))
        rows.extend({**r, "projected": True} for r in projected)
    proxy = None if run.proxy is None else dict(run.proxy)  # the projection adds to it
    if proxy is not None:
        rows.extend(print_projection(proxy, run.configs, list(run.strategies), ex.ranks,
                                     rows))
    out = RESULTS_DIR if run.out is None else run.out
    write_outputs(out, rows, ex.results, summary_meta(run, ex, proxy, expectation, mfu_note),
                  written_before(out, run, ex))
    print(f"wrote {out}/summary.csv, summary.json, steps.csv, per-step JSONL, "
          f"spans and trace.json (open in https://ui.perfetto.dev)")
    return 0


def written_before(out: Path, run: RunPlan, ex: Execution) -> list[str]:
    """What the run wrote into `out` before its report (paths relative to it), kept when
    its files land: plan.json (with --out) and the profiles where they went there."""
    kept = [PLAN_FILE] if run.out is not None else []
    for path in (ex.profile_path, *ex.profiles.values()):
        if path is not None and Path(path).resolve().is_relative_to(out.resolve()):
            kept.append(Path(path).resolve().relative_to(out.resolve()).as_posix())
    return kept


def summary_meta(run: RunPlan, ex: Execution, proxy: dict | None,
                 expectation: list[dict] | None, mfu_note: str) -> dict:
    """What summary.json keeps beside the rows."""
    return {"settings": run_settings(run, ex.ranks),
            **({"proxy": proxy} if proxy is not None else {}),
            **({"simulated_here": expectation} if expectation else {}),
            "configs": {s: c.as_dict() for s, c in run.configs.items()},
            "column_notes": {"mfu": mfu_note, "fits": MEMORY_NOTE},
            # which path the host chunk's kernels took ('cpp' or 'torch', real/host_fused.py)
            "host_kernels": host_kernels_status(load=False),
            **provenance(list(run.command_line), "python -m zfbench.run")}


def run_settings(run: RunPlan, ranks: int) -> dict:
    """The run's own settings as summary.json records them (the configs sit beside)."""
    spec, shape = run.spec, run.spec.shape()
    return {"model": spec.model, "layers": spec.layers, "shape": shape.name,
            "params": shape.total_params, "ranks": ranks, "micro_batch": spec.micro_batch,
            "grad_accum": spec.grad_accum, "seq": spec.seq, "steps": spec.steps,
            "seed": spec.seed, "device": spec.device, "device_threads":
            spec.device_threads, "host_threads": spec.host_threads, "text": spec.text,
            "config_file": spec.config if isinstance(spec.config, str) else None,
            "precision": spec.precision, "precision_probe": run.precision_probe,
            "scenario_probe": run.scenario_probe}


if __name__ == "__main__":
    sys.exit(main())
