"""`python -m zfbench.validate`: does the simulator predict what the engine measures here?

Scenario: three shapes of one model slice (by default `zfbench.run`'s: tinyllama-1.1b[1L],
bf16 on the device lane), sized from two calibrations (4 and 256 tokens) so that the host
Adam is longer than, about equal to, and shorter than forward+backward on this machine
(each shape's measured ratio printed as `host_adam_over_compute`); for each shape a
profile is measured (`zfbench.real.profile`) and every strategy runs on the engine, zenflow
at two (topk_ratio, update_interval) pairs and on ZeRO-3 at the first (`cell_plan`); the
simulator runs the same cells with that profile, host and link rates measured around each.
Written to `--out` (default runs/validate): `validate.csv`, `ops.csv` (busy seconds per
step by lane and op, measured beside simulated), `validate_summary.json`, `profiles/` and
`traces/`; rewritten as each shape finishes, an earlier run's others removed at the end.
A cell whose schedule signature differs exits non-zero; bad input: one `error:` line, 2.
On CUDA (`--device cuda`, or `auto` where torch sees a GPU) the profiles, probes and cells
run on the GPU in bf16 with zfbench.run's GPU defaults, the simulator takes the profile's
copy engines, and a shape beyond the model's positions grows its batch (at most MAX_BATCH).

    python -m zfbench.validate                 # full matrix
    python -m zfbench.validate --shapes longer # one shape (longer, equal, shorter)
    python -m zfbench.validate --quick         # tiny shapes, seconds (what CI runs)

`--published [FILE.csv] [--out DIR]` checks the simulator against measurements published
for real GPUs instead (zfbench.validate.published, docs/published.md).
docs/commands.md ("Calibration and validation") has every file in detail.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from zfbench.analysis.breakdown import summarize
from zfbench.analysis.validation import (compare_ops, compare_rows, error_summary,
                                         schedule_signature, signature_diff)
from zfbench.real.engine import resolve_device
from zfbench.real.memory import InsufficientMemoryError
from zfbench.core.strategies import has_windows, zero_stage_chosen
from zfbench.real.flat import device_dtype
from zfbench.real.profile import measure_profile
from zfbench.real.profile_record import mean_profile, with_rates
from zfbench.real.rate_probe import RateProbe, strategy_threads_of
from zfbench.real.runner import RunSpec, train
from zfbench.sims.settings import for_engine_run
from zfbench.sims.simulator import simulate
from zfbench.cli_checks import CliError, OneLineParser, check_out_dir, fail, positive_int
from zfbench.core.config import SCENARIO_ZENFLOW, STRATEGIES
from zfbench.core.trace import merge_chrome_traces, write_csv_atomic, write_json_atomic
from zfbench.report import Owned, remove_stale
from zfbench.run.defaults import DEFAULT_PRECISION
from zfbench.validate import published as validate_published
from zfbench.validate.shapes import (REGIMES, SIZING_SEQ, NoisySizingError, compute_s,
                                     fitting, host_adam_s, sized_shapes, sizing_profiles)

PAIRS = ((SCENARIO_ZENFLOW["topk_ratio"], SCENARIO_ZENFLOW["update_interval"]),  # the scenario
         (0.25, 2))
PROBE_REPEATS = 3  # host and link rates measured before and after each cell
# the strategies validated on ZeRO-3 too (the engine's `zero_optimization.stage` 3), at
# the first pair: those whose stage the simulator's `zero_stage` knob chooses (zenflow)
STAGE3 = tuple(s for s in STRATEGIES if zero_stage_chosen(s))


def zenflow_overrides(topk: float, interval: int, zero_stage: int = 2) -> dict:
    """zfbench's ZenFlow scenario with one (topk_ratio, update_interval) pair; on ZeRO-3
    with `zero_stage` 3 (the engine's `zero_optimization.stage`)."""
    return {**SCENARIO_ZENFLOW, "topk_ratio": topk, "update_interval": interval,
            **({"zero_stage": 3} if zero_stage == 3 else {})}


def cell_name(shape_name: str, strategy: str, pair, zero_stage: int = 2) -> str:
    """A cell's name: its profile's and trace's file name, `ops.csv`'s `cell`."""
    return f"{shape_name}.{strategy}" + (".zero3" if zero_stage == 3 else "") + (
        f".topk{pair[0]}-U{pair[1]}" if has_windows(strategy) else "")


# Every file validate writes into --out (a shape's profile and its cells' profiles and
# traces are named after the shape, `sized_shapes`: ratio2, ratio0.45 ...).
VALIDATE_FILES = Owned(names=("validate.csv", "validate_summary.json", "ops.csv",
                              "profiles/ratio*.json", "traces/ratio*.json"))


def shape_files(shape_name: str, pairs) -> list[str]:
    """The files one shape writes into profiles/ and traces/ (relative to --out)."""
    cells = [cell_name(shape_name, s, pair, stage) for s, pair, stage in cell_plan(pairs)]
    return [f"profiles/{shape_name}.json",
            *(f"{folder}/{cell}.json" for cell in cells for folder in ("profiles", "traces"))]


def cell_plan(pairs) -> list[tuple[str, tuple, int]]:
    """A shape's cells in the order they run, as (strategy, pair, ZeRO stage): every
    strategy on ZeRO-2 (zenflow at each pair), then `STAGE3`'s on ZeRO-3 at the first."""
    plan = [(strategy, pair, 2) for strategy in STRATEGIES
            for pair in (pairs if has_windows(strategy) else pairs[:1])]
    return plan + [(strategy, pairs[0], 3) for strategy in STAGE3]


def measure_cell(spec: RunSpec, strategy: str, pair, progress: bool, zero_stage: int = 2):
    """Run one cell on the engine; its timeline (the engine itself is let go)."""
    spec = replace(spec, overrides=zenflow_overrides(*pair, zero_stage)
                   if has_windows(strategy) else {})
    return train(spec, strategy, progress=progress).timeline


def simulate_cell(spec: RunSpec, strategy: str, pair, profile_path: Path, skip: int, tl,
                  zero_stage: int = 2):
    """Simulate one cell with the shape's profile; compare it with the measured timeline:
    the summary row, the schedule differences, the simulated timeline and the per-op
    seconds of both (`compare_ops`)."""
    measured = summarize(tl.spans_frame(), tl.steps_frame(), skip)
    config = replace(spec, overrides=zenflow_overrides(*pair, zero_stage)).engine_config(
        "zenflow")
    # every strategy with the pair's ZenFlow knobs, as before (only zenflow reads them)
    settings = for_engine_run(config, model=spec.model, layers=spec.layers, gpus=1,
                              micro_batch=spec.micro_batch, seq=spec.seq,
                              profile=str(profile_path), steps=spec.steps,
                              precision=spec.engine_config(strategy).precision)
    sim = simulate(settings, strategy).timeline
    simulated = summarize(sim.spans_frame(), sim.steps_frame(), skip)
    diffs = signature_diff(schedule_signature(tl.spans_frame(), skip, spec.steps - 1),
                           schedule_signature(sim.spans_frame(), skip, spec.steps - 1))
    # on the CPU lanes the host worker runs each upload inside its AdamW chunk's span
    nested = ("host", "h2d") if resolve_device(spec.device).type == "cpu" else None
    ops = compare_ops(tl.spans_frame(), sim.spans_frame(), skip, spec.steps - 1, nested)
    return compare_rows(measured, simulated), diffs, sim, ops


def validate(base: RunSpec, out: Path, skip: int, quick: bool, progress: bool,
             regimes: tuple[str, ...] = REGIMES, head: dict | None = None,
             budget_s: float | None = None) -> int:
    """Size, profile, run and simulate every shape of `regimes`; `head` (the settings and
    provenance) goes into validate_summary.json. With `budget_s`, a shape that would
    not finish in the time left (judged by the slowest shape so far) is left out, and the
    summary and output say which and how to run it."""
    started = time.perf_counter()
    head = dict(head or {})
    shape = base.shape()
    max_seq = (shape.max_positions - 2) if shape.max_positions else 4096
    print(f"calibrating {shape.name} at {SIZING_SEQ} tokens ...", file=sys.stderr)
    low, high = sizing_profiles(base, measure_profile, cap_tokens=quick)
    sized = {name: fitting(spec) for name, spec in sized_shapes(
        base, low, high, max_seq, QUICK_MAX_TOKENS if quick else None).items()}
    shapes = [(regime, name, spec) for regime, (name, spec) in zip(REGIMES, sized.items())
              if regime in regimes]
    pairs = PAIRS[:1] if quick else PAIRS
    rows, failures, ops = [], [], []
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    slowest, left_out, written = 0.0, [], []
    for done, (regime, shape_name, spec) in enumerate(shapes, 1):
        spent = time.perf_counter() - started
        if budget_s is not None and done > 1 and spent + slowest > budget_s:
            left_out = [r for r, _, _ in shapes[done - 1:]]
            head["left_out"] = {"shapes": left_out, "why": (
                f"the time budget of {budget_s / 60:.0f} min: {spent / 60:.1f} min spent, "
                f"a shape took up to {slowest / 60:.1f} min"),
                "run_them_with": f"{PROG} --shapes {','.join(left_out)}"}
            table, unique, summary = write_results(
                out, rows, failures, [name for _, name, _ in shapes[:done - 1]],
                complete=False, head=head, ops=ops)
            print(f"left out to stay within the time budget: shapes {', '.join(left_out)}"
                  f" ({head['left_out']['why']}); run them with "
                  f"{head['left_out']['run_them_with']}", file=sys.stderr)
            break
        shape_started = time.perf_counter()
        print(f"shape {done}/{len(shapes)}: {shape_name} ({regime}), batch {spec.micro_batch} x "
              f"seq {spec.seq}", file=sys.stderr)
        # the 4-token sizing profile is this shape's "before" profile when they coincide
        before = low if (spec.micro_batch, spec.seq) == (1, SIZING_SEQ[0]) else None
        shape_rows, shape_failures, shape_ops = validate_shape(
            spec, shape_name, regime, pairs, out, skip, progress, before)
        rows += shape_rows
        failures += shape_failures
        ops += shape_ops
        # every finished shape lands on disk: a long run stopped later keeps what it did
        table, unique, summary = write_results(out, rows, failures,
                                               [name for _, name, _ in shapes[:done]],
                                               complete=done == len(shapes), head=head,
                                               ops=ops)
        written += shape_files(shape_name, pairs)
        slowest = max(slowest, time.perf_counter() - shape_started)
    # an earlier run's files of shapes or cells this one did not write
    remove_stale(out, VALIDATE_FILES, [*written, "validate.csv", "validate_summary.json",
                                       *(["ops.csv"] if ops else [])])
    show = unique[["shape", "regime", "seq", "host_adam_over_compute", "strategy",
                   "zero_stage", "topk_ratio", "update_interval", "measured_step_time_s",
                   "simulated_step_time_s", "rel_error_step_time_s",
                   "measured_stall_fraction", "simulated_stall_fraction", "schedule_diffs"]]
    print(show.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(json.dumps(summary, indent=1))
    print(f"wrote {out}/validate.csv, validate_summary.json, ops.csv, profiles/, traces/")
    for line in failures:
        print(f"schedule mismatch: {line}", file=sys.stderr)
    return 1 if failures else 0


def validate_shape(spec: RunSpec, shape_name: str, regime: str, pairs, out: Path, skip: int,
                   progress: bool, before: dict | None = None
                   ) -> tuple[list[dict], list[str], list[pd.DataFrame]]:
    """Profile one shape, run its cells on the engine and the simulator: rows, mismatches
    and each cell's per-op seconds."""
    shape = spec.shape()
    # the machine drifts: the shape is profiled before and after its cells run (the
    # simulator gets the mean of the two), and the memory-bound host and link rates, which
    # drift most, are measured again right before and after each cell (zfbench.real.rate_probe)
    before = before or measure_profile(spec)
    cal = before["calibration"]
    probe = RateProbe(shape.total_params, device_dtype(cal["precision"]), cal["host_threads"],
                      device=resolve_device(spec.device),
                      strategy_threads=strategy_threads_of(cal))
    cells = []
    for strategy, pair, stage in cell_plan(pairs):
        ahead = probe.measure(PROBE_REPEATS)
        timeline = measure_cell(spec, strategy, pair, progress, stage)
        rates = mean_profile([ahead, probe.measure(PROBE_REPEATS)])
        cells.append((strategy, pair, stage, timeline, rates))
    probe.close()
    del probe
    profile = mean_profile([before, measure_profile(spec)])
    write_json_atomic(out / "profiles" / f"{shape_name}.json", profile)
    ratio = host_adam_s(profile, shape) / compute_s(profile, shape)
    rows, failures, ops = [], [], []
    for strategy, pair, stage, measured_tl, rates in cells:
        cell = cell_name(shape_name, strategy, pair, stage)
        profile_path = out / "profiles" / f"{cell}.json"
        write_json_atomic(profile_path, with_rates(profile, rates))
        row, diffs, sim_tl, cell_ops = simulate_cell(spec, strategy, pair, profile_path,
                                                     skip, measured_tl, stage)
        ops.append(cell_ops.assign(shape=shape_name, cell=cell))
        write_json_atomic(out / "traces" / f"{cell}.json", merge_chrome_traces(
            {f"{cell} measured": measured_tl, f"{cell} simulated": sim_tl}))
        for p in ([pair] if has_windows(strategy) else pairs):
            rows.append({"shape": shape_name, "regime": regime, "batch": spec.micro_batch,
                         "seq": spec.seq, "host_adam_over_compute": ratio,
                         "cell_host_adam_params_per_s": rates["host_adam_params_per_s"],
                         "topk_ratio": p[0], "update_interval": p[1],
                         "strategy": strategy, "zero_stage": stage,
                         "schedule_diffs": len(diffs), **row})
        failures.extend(f"{cell}: {d}" for d in diffs[:3])
    return rows, failures, ops


def write_results(out: Path, rows: list[dict], failures: list[str], shapes_done: list[str],
                  complete: bool, head: dict | None = None,
                  ops: list[pd.DataFrame] | None = None):
    """validate.csv, validate_summary.json and ops.csv (each cell's busy seconds per step
    by lane and op, measured beside simulated) for the shapes finished so far (each
    written whole through a rename); `complete` is false until the last shape is in."""
    table = pd.DataFrame(rows)
    # each (shape, pair) group ranks all four strategies on ZeRO-2; the shared baselines
    # appear in every pair's group, so the error statistics count each real cell once
    # (the ZeRO-3 cells among them, also summarised on their own: `zero3_*`)
    stage2 = table[table["zero_stage"] == 2]
    summary = error_summary(stage2, ["shape", "topk_ratio", "update_interval"])
    unique = table.drop_duplicates(["shape", "strategy", "zero_stage", "measured_step_time_s"])
    summary.update({k: v for k, v in error_summary(unique, ["shape"]).items()
                    if k.startswith(("step_time", "stall", "cells"))})
    stage3 = unique[unique["zero_stage"] == 3]
    if len(stage3):
        summary.update({f"zero3_{k}": v for k, v in error_summary(stage3, ["shape"]).items()
                        if k.startswith(("step_time", "stall", "cells"))})
    summary["schedule_mismatches"] = len(failures)
    summary["shapes_done"] = shapes_done
    summary["complete"] = complete
    summary.update(head or {})
    write_csv_atomic(table, out / "validate.csv")
    if ops:
        cols = ["shape", "cell", "lane", "op", "measured_s_per_step", "simulated_s_per_step",
                "measured_over_simulated"]
        write_csv_atomic(pd.concat(ops, ignore_index=True)[cols], out / "ops.csv")
    write_json_atomic(out / "validate_summary.json", summary)
    return table, unique, summary


PROG = "python -m zfbench.validate"
# `skip`: the --skip default, steps left out of both sides' averages of one shape. Not
# zfbench.core.schedule.measurement_window: validate runs every strategy of a shape over
# one fixed window, chosen to cover ZenFlow's warm-up and first windows at these shapes
# (a CLI default, which --skip changes)
FULL = {"steps": 24, "skip": 8}  # with the RunSpec default model and layers
QUICK = {"model": "tiny", "layers": 2, "steps": 14, "skip": 6}
QUICK_MAX_TOKENS = 256  # --quick's shapes stay seconds long, however noisy their sizing


def build_parser() -> OneLineParser:
    p = OneLineParser(prog=PROG, description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RunSpec()  # the shape of `python -m zfbench.run` with no flags
    p.add_argument("--model", help=f"named shape (default {d.model}; --quick: "
                   f"{QUICK['model']})")
    p.add_argument("--layers", type=int, help=f"depth slice at full width (default "
                   f"{d.layers}; --quick: {QUICK['layers']})")
    p.add_argument("--steps", type=int, help=f"default {FULL['steps']} (--quick: "
                   f"{QUICK['steps']})")
    p.add_argument("--skip", type=int, help=f"steps left out of the averages (default "
                   f"{FULL['skip']}; --quick: {QUICK['skip']})")
    p.add_argument("--budget-min", type=float, default=15.0,
                   help="stop before a shape that would not finish within this many "
                        "minutes of the start, keep what is done and say what was left "
                        "out (default 15; 0: no limit)")
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, one pair (CI); flags given still apply")
    p.add_argument("--shapes", default=",".join(REGIMES),
                   help="which of the three sized shapes to run, by regime of host Adam "
                        "against forward+backward (default all: " + ",".join(REGIMES) + ")")
    p.add_argument("--precision", choices=("fp32", "bf16"), default=None,
                   help="device weights and gradients (default: measured as python -m "
                        "zfbench.run measures it: bf16 only where this CPU runs it about "
                        "as fast as fp32)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="where the engine and the profiles run (auto: CUDA when there; "
                        "the simulator then takes the profile's CUDA copy engines)")
    p.add_argument("--device-threads", type=int)
    p.add_argument("--host-threads", type=int)
    p.add_argument("--out", type=Path, default=Path("runs/validate"))
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--published", nargs="?", const="", metavar="FILE.csv",
                   help="check the simulator against published GPU measurements instead "
                        "(the bundled file when FILE.csv is left out; docs/published.md); "
                        "takes only --out and --quiet")
    return p


def measured_precision(args) -> str:
    """bf16 where this CPU runs the base shape's forward+backward in bf16 about as fast
    as in fp32 (zfbench.real.precision_probe, cached per machine), else fp32."""
    from zfbench.real.engine import default_thread_split
    from zfbench.real.precision_probe import choose_precision

    try:
        shape = RunSpec(model=args.model, layers=args.layers).shape()
    except (ValueError, KeyError) as err:
        raise CliError(f"--model {args.model} --layers {args.layers}: {err}") from None
    probe = choose_precision(shape, 1, SIZING_SEQ[0],
                             args.device_threads or default_thread_split()[0])
    return probe["precision"]


def checked_args(argv: list[str] | None):
    """The parsed flags with every value and path checked (CliError otherwise), the
    regimes asked for, and the base RunSpec."""
    args = build_parser().parse_args(argv)
    d = RunSpec()
    defaults = QUICK if args.quick else {"model": d.model, "layers": d.layers, **FULL}
    for name, value in defaults.items():  # a flag given is never replaced
        if getattr(args, name) is None:
            setattr(args, name, value)
    regimes = tuple(r.strip() for r in args.shapes.split(",") if r.strip())
    if not regimes or set(regimes) - set(REGIMES):
        raise CliError(f"--shapes {args.shapes!r}: choose among {', '.join(REGIMES)} "
                       f"(comma-separated)")
    if args.budget_min < 0:
        raise CliError(f"--budget-min must be >= 0 (0: no limit), got {args.budget_min}")
    positive_int("--steps", args.steps, 2)
    positive_int("--skip", args.skip, 0)
    if args.layers is not None:
        positive_int("--layers", args.layers)
    for flag, value in (("--device-threads", args.device_threads),
                        ("--host-threads", args.host_threads)):
        if value is not None:
            positive_int(flag, value)
    if args.skip >= args.steps - 1:
        raise CliError(f"--skip {args.skip} leaves no steps of {args.steps}")
    check_out_dir(args.out)
    try:
        on_cuda = resolve_device(args.device).type == "cuda"
    except RuntimeError as err:  # --device cuda without one
        raise CliError(str(err)) from None
    if args.precision is None:  # as the run decides it: bf16 on CUDA, measured on a CPU
        args.precision = DEFAULT_PRECISION if on_cuda else measured_precision(args)
    base = RunSpec(model=args.model, layers=args.layers, micro_batch=1, seq=32, steps=args.steps,
                   device=args.device, device_threads=args.device_threads,
                   host_threads=args.host_threads, precision=args.precision)
    try:
        base.shape()
    except (ValueError, KeyError) as err:
        raise CliError(f"--model {args.model} --layers {args.layers}: {err}") from None
    return args, regimes, base


def main(argv: list[str] | None = None) -> int:
    from zfbench.core.provenance import provenance

    given = sys.argv[1:] if argv is None else list(argv)
    if any(a == "--published" or a.startswith("--published=") for a in given):
        return validate_published.main(given)  # against published GPU measurements
    try:
        args, regimes, base = checked_args(argv)
    except (CliError, ValueError) as err:
        return fail(err)
    pairs = PAIRS[:1] if args.quick else PAIRS
    settings = {**{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "shapes": list(regimes), "zenflow_pairs": [
                    {"topk_ratio": k, "update_interval_steps": u} for k, u in pairs],
                "zero3_cells": [{"strategy": name, "topk_ratio": pairs[0][0],
                                 "update_interval_steps": pairs[0][1]} for name in STAGE3],
                "probe_repeats": PROBE_REPEATS, "sizing_seq_tokens": list(SIZING_SEQ),
                "base_run": {k: v for k, v in asdict(base).items()
                             if isinstance(v, (int, float, str, bool, type(None)))}}
    head = {"settings": settings, "provenance": provenance(argv, PROG)}
    budget = args.budget_min * 60 if args.budget_min > 0 else None
    try:
        return validate(base, args.out, args.skip, args.quick, not args.quiet, regimes,
                        head, budget)
    except (InsufficientMemoryError, NoisySizingError) as err:
        return fail(err)


if __name__ == "__main__":
    sys.exit(main())
