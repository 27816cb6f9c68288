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
Memory is estimated before anything is allocated: a named model that cannot fit is
measured through a proxy slice and projected onto the GPU node (zfbench.run.proxy); a
slice you chose that cannot fit is refused, naming one that would.
Files written to `--out`: `summary.csv`/`.json`, `steps.csv`, `<strategy>.steps.jsonl`,
the timeline `<strategy>.spans.csv`/`.steps.csv` and `trace.json`.
docs/commands.md ("run") has every flag, example and file in detail.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from contextlib import nullcontext
from pathlib import Path

from zfbench.real.memory import InsufficientMemoryError, check_fits
from zfbench.real.distributed import env_world
from zfbench.real.host_fused import status as host_kernels_status
from zfbench.real.runner import RunSpec, train
from zfbench.core.strategies import windowed_of
from zfbench.cli_checks import (CliError, OneLineParser, add_zenflow_flags, check_input_file,
                                check_out_dir, fail, positive_int, zenflow_flags,
                                zenflow_given)
from zfbench.core.config import STRATEGIES, ConfigError, EngineConfig
from zfbench.core.memory_model import element_bytes
# SIMULATED_ONLY: strategies the simulator has and the engine does not (zero-infinity: no
# ZeRO-3 path in real/); asking the engine for one is a one-line error naming the simulator
from zfbench.core.strategies import SIMULATED_ONLY, buckets_on
from zfbench.core.models import UnknownModelError
from zfbench.core.provenance import provenance
from zfbench.run.probe import (SHAPE_FLAGS, decide_precision, describe_scenario,
                               is_default_scenario, size_default)
from zfbench.report import add_speedups, format_table
from zfbench.run.report import (MEMORY_NOTE, StepWork, describe_config, host_share_note,
                                measurement_window, memory_columns, memory_room,
                                peak_flops, project, summary_row, write_outputs)
from zfbench.core.trace import write_json_atomic

from zfbench.run.defaults import DEFAULT_SEQ, gpu_sized
from zfbench.run.proxy import measure_proxy, print_projection
from zfbench.run.expect import print_expectation


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m zfbench.run", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RunSpec()
    p.add_argument("--model", default=d.model, help=f"named shape (default {d.model})")
    p.add_argument("--layers", type=int, default=None,
                   help=f"depth slice at full width (default {d.layers} for the default "
                        f"model, all layers otherwise)")
    p.add_argument("--strategy", choices=STRATEGIES + SIMULATED_ONLY + ("all",),
                   default="all", help="one strategy or all (the simulator's "
                   f"{', '.join(SIMULATED_ONLY)} is refused: the engine does not implement it)")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps per "
                   f"strategy (default {d.steps})")
    p.add_argument("--batch", type=int, default=None, help="micro-batch per GPU "
                   "(default: the --config file's, else 1)")
    p.add_argument("--grad-accum", type=int, default=None, help="micro-steps per optimizer "
                   "step (default: the --config file's gradient_accumulation_steps, else 1)")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ,
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
                   "Chrome trace")
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
    # the launcher's choice of a proxy (zfbench.run.proxy), handed to the ranks it starts
    p.add_argument("--proxy-record", help=argparse.SUPPRESS)
    return p


def resolve_world(args) -> tuple[int, bool]:
    """(ranks, launched): the world size, and whether this process is one launched rank."""
    found = env_world()
    if args.gpus is not None and args.gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {args.gpus}")
    if found is None:
        return (args.gpus or 1), False
    if args.gpus is not None and args.gpus != found[1]:
        raise ValueError(f"--gpus {args.gpus} contradicts the launcher's WORLD_SIZE "
                         f"{found[1]}; leave --gpus out under torchrun")
    return found[1], True


def check_gpu_count(world: int, use_cuda: bool) -> None:
    import torch

    if use_cuda and world > torch.cuda.device_count():
        n = torch.cuda.device_count()
        raise ValueError(f"--gpus {world} asks for {world} ranks with a GPU each, but "
                         f"torch sees only {n} CUDA device{'s' if n != 1 else ''}; use "
                         f"--gpus {n} or fewer, or --device cpu (gloo, emulated)")


def spec_from_args(args, world: int = 1, strategies=STRATEGIES) -> RunSpec:
    """The run's settings: the --config file first, then only the flags given."""
    return spec_and_configs(args, world, strategies)[0]


def spec_and_configs(args, world: int = 1, strategies=STRATEGIES
                     ) -> tuple[RunSpec, dict[str, EngineConfig]]:
    """`spec_from_args`, and every strategy's engine config, resolved once (each is valid
    before anything runs; a ConfigError names the flags given)."""
    for name in ("steps", "batch", "seq", "grad_accum", "layers", "device_threads",
                 "host_threads"):
        if getattr(args, name) is not None:
            positive_int("--" + name.replace("_", "-"), getattr(args, name))
    layers = args.layers
    if layers is None and args.model == RunSpec.model:
        layers = RunSpec.layers
    config = args.config
    if config is not None:
        check_input_file(config, "--config")
    if args.text not in (None, "builtin"):
        check_input_file(args.text, "--text")
    check_out_dir(args.out)
    if (args.profile or args.project) and args.out is None:
        check_out_dir(Path("runs/profile"), "--profile (no --out: runs/profile)")
    spec = RunSpec(model=args.model, layers=layers, batch=args.batch, seq=args.seq,
                   steps=args.steps, seed=args.seed, device=args.device,
                   device_threads=args.device_threads, host_threads=args.host_threads,
                   text=args.text, config=config, grad_accum=args.grad_accum, world=world,
                   precision=args.precision,  # None: the file's, else measured
                   zenflow=zenflow_given(args))
    try:
        return spec, engine_configs(spec, strategies, world)
    except ConfigError as err:
        given = [f for f, v in (("--batch", args.batch), ("--grad-accum",
                                args.grad_accum), ("--gpus", args.gpus)) if v]
        given += [zenflow_flags(k)[0] for k in spec.zenflow]
        hint = f" ({' and '.join(given)} given on the command line)" if given else ""
        raise ConfigError(err.key, str(err).split(": ", 1)[1] + hint) from None


def engine_configs(spec: RunSpec, strategies, world: int) -> dict[str, EngineConfig]:
    """Each strategy's effective engine config for `spec` on `world` ranks."""
    return {s: spec.engine_config(s, world) for s in strategies}


def write_profile(spec: RunSpec, out: Path | None) -> Path:
    from zfbench.real.profile import measure_profile

    path = (out or Path("runs/profile")) / "profile.json"
    profile = measure_profile(spec)
    write_json_atomic(path, profile)
    cal = profile["calibration"]
    lanes = "".join(f", {name} {lane['host_adam_params_per_s'] / 1e6:.0f} M on "
                    f"{lane['host_threads']}" for name, lane in
                    (cal.get("host_lanes") or {}).items())
    print(f"profile: host Adam {cal['host_adam_params_per_s'] / 1e6:.0f} M params/s on "
          f"{cal['host_threads']} thread(s){lanes}, d2h {cal['d2h_bytes_per_s'] / 1e9:.1f} "
          f"GB/s, h2d {cal['h2d_bytes_per_s'] / 1e9:.1f} GB/s -> {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
    except CliError as err:
        return fail(err)
    args.argv = argv
    if args.strategy in SIMULATED_ONLY:
        return fail(f"the engine does not implement {args.strategy} (ZeRO-3 with offloaded "
                    f"parameters); simulate it: python -m zfbench.simulate --strategy "
                    f"{args.strategy}")
    try:
        world, launched = resolve_world(args)
        strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
        spec, configs = spec_and_configs(args, world, strategies)
        validated = copy.copy(spec)  # the spec `configs` were resolved for
        shape = spec.shape()
        if args.hazard_check:
            if world > 1:
                raise ValueError("--hazard-check runs one rank (tests/test_hazards.py "
                                 "checks two); drop --gpus")
            from zfbench.run.hazards import check_schedules
            return check_schedules(args, spec, strategies)
        from zfbench.real.engine import resolve_device

        use_cuda = resolve_device(spec.device).type == "cuda"
        check_gpu_count(world, use_cuda)
        if world > 1 and (args.project or (args.profile and use_cuda)):
            raise ValueError("--project (and --profile with CUDA) measure one rank; run "
                             "them without --gpus" if args.project else
                             "--profile with CUDA measures one rank (a GPU of its own); "
                             "run it without --gpus")
        first = configs[strategies[0]]
        elem = element_bytes(first.precision)
        bucketed = buckets_on(first.precision, first.overlap_comm)
        topk = memory_topk(configs)  # the config's, as `fits` reports it
        given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
        args.proxy = json.loads(args.proxy_record) if args.proxy_record else None
        try:
            check_fits(shape, strategies, spec.batch, spec.seq, elem, use_cuda,
                       ranks=world, bucketed=bucketed, **topk)
        except InsufficientMemoryError as err:
            if "--layers" in given or "[" in args.model or launched:
                raise  # a slice the user chose, or ranks torchrun started: refuse
            spec, shape, argv = measure_proxy(args, argv, spec, strategies, elem,
                                              use_cuda, world, bucketed, err, given, topk)
        args.scenario = None
        if use_cuda and not given & set(SHAPE_FLAGS):  # a GPU-sized run, not the slice
            spec = gpu_sized(spec, strategies, world, args)
            shape, elem = spec.shape(), element_bytes(spec.precision)
            argv = argv + ["--model", spec.model, "--seq", str(spec.seq), "--batch",
                           str(spec.batch), "--precision", spec.precision]
        if is_default_scenario(argv, use_cuda, world):  # sized on this machine
            args.scenario = size_default(spec, quiet=args.quiet)
            spec.seq, spec.precision = args.scenario["seq"], args.scenario["precision"]
            args.precision_probe = {k: args.scenario[k] for k in ("precision", "ratio")}
        elif spec.precision is None and spec.config is None:  # the default: measure it
            args.precision_probe = decide_precision(spec, shape, use_cuda, world, launched,
                                                    quiet=args.quiet)
            spec.precision = args.precision_probe["precision"]
        if spec.precision is not None and "--precision" not in argv:
            elem = element_bytes(spec.precision)
            bucketed = buckets_on(spec.precision, first.overlap_comm)
            check_fits(shape, strategies, spec.batch, spec.seq, elem, use_cuda, ranks=world,
                       bucketed=bucketed, **topk)
            argv = argv + ["--precision", spec.precision]  # the same choice on every rank
        if args.proxy is not None and not launched:  # the rates in the run's precision
            from zfbench.run.proxy import measure_host_rates

            args.proxy.update(measure_host_rates(shape.total_params, spec.precision or
                                                 first.precision, args.proxy["threads"]))
            argv = argv + ["--proxy-record", json.dumps(args.proxy)]
        if spec != validated:  # a proxy, the GPU-sized run or the precision decided since
            configs = engine_configs(spec, strategies, world)
    except (ValueError, ConfigError, UnknownModelError, InsufficientMemoryError,
            RuntimeError, KeyError) as err:
        return fail(err)
    if world > 1 and not launched:
        from zfbench.real.launch import LaunchError, launch

        print(f"launching {world} ranks ({'nccl' if use_cuda else 'gloo'}) with torch's "
              f"elastic launcher", file=sys.stderr)
        try:
            launch(world, ["-m", "zfbench.run", *argv])
        except LaunchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    if launched:
        return run_rank(args, spec, shape, strategies, elem, use_cuda, configs)
    return run_all(args, spec, shape, strategies, elem, configs)


def memory_topk(configs: dict[str, EngineConfig]) -> dict:
    """The top-k ratio the memory check counts ZenFlow's device state with: the run's
    zenflow config's (as the `fits` column reports it), none without zenflow."""
    cfg = windowed_of(configs)
    if cfg is None:
        return {}
    return {"topk_ratio": cfg.zenflow.topk_ratio}




def run_rank(args, spec, shape, strategies, elem, use_cuda, configs) -> int:
    """One rank of a launched multi-rank run; rank 0 reports and writes the files."""
    from zfbench.real.distributed import DistributedError, bind_cores, init_from_env, shutdown

    ctx = init_from_env(use_cuda)
    try:
        if args.bind_cores:
            bind_cores(ctx.rank, ctx.world)
        if ctx.rank != 0:
            args.quiet, args.out = True, None
        try:
            return run_all(args, spec, shape, strategies, elem, configs, ctx)
        except DistributedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    finally:
        shutdown()


def run_all(args, spec, shape, strategies, elem, configs, ctx=None) -> int:
    """Train every strategy with its config (`configs`, resolved for this run's ranks by
    `main`), print the table and write the files (rank 0)."""
    lead = ctx is None or ctx.rank == 0
    ranks = 1 if ctx is None else ctx.world
    windows = {s: measurement_window(c) for s, c in configs.items()}
    skip = max(w[0] for w in windows.values())  # the same steps left out of every row
    proxy = getattr(args, "proxy", None)
    if lead and proxy is not None:
        from zfbench.run.proxy import describe_proxy

        for line in describe_proxy(proxy, spec.batch, spec.seq):
            print(line, file=sys.stderr)
    if lead:
        print(f"{shape.name}: {shape.total_params / 1e6:.1f}M parameters, {ranks} rank(s) x "
              f"batch {spec.batch} x seq {spec.seq}, {spec.steps} optimizer steps per "
              f"strategy (measured)", file=sys.stderr)
        notes = []
        scenario = getattr(args, "scenario", None)
        if scenario is not None:
            print("  " + describe_scenario(scenario), file=sys.stderr)
        for cfg in configs.values():
            print("  " + describe_config(cfg, use_cuda=engine_on_cuda(spec)),
                  file=sys.stderr)
            notes += [n for n in cfg.notes if n not in notes]
        for note in notes:
            print(f"  warning: {note}", file=sys.stderr)
        for s, (_, needed) in windows.items():
            if spec.steps < max(needed, skip + 2):
                print(f"  warning: {s}: {spec.steps} steps are too short to measure it "
                      f"({skip} steps are left out as warm-up, then one full window): use "
                      f"--steps {max(needed, skip + 2)} or more; its row is marked "
                      f"too_short", file=sys.stderr)
    results, rows = {}, []
    tokens = spec.batch * spec.grad_accum * spec.seq
    flops = (shape.forward_flops_per_token(spec.seq) +
             shape.backward_flops_per_token(spec.seq)) * tokens
    use_cuda = engine_on_cuda(spec)
    precision = configs[strategies[0]].precision
    peak, mfu_note = peak_flops(use_cuda, precision) if lead else (None, "")
    work = StepWork(shape.total_params * elem, shape.total_params, flops, tokens, peak)
    room = memory_room(use_cuda) if lead else None  # before any strategy allocates
    # this machine's profile around the strategies (zfbench.run.expect): the no-flag run,
    # --profile, and a proxy's ranks sharing this CPU
    expect = (getattr(args, "scenario", None) is not None or args.profile or
              proxy is not None) and (ranks == 1 or not use_cuda)
    calibration = None
    if expect:
        from zfbench.run.expect import Calibration

        from zfbench.real.distributed import available_cores

        calibration = Calibration(spec, ctx, None if getattr(args, "bind_cores", False)
                                  else available_cores())
        calibration.begin()
    for strategy in strategies:
        with calibration.around(strategy) if calibration else nullcontext():
            result = train(spec, strategy, progress=not args.quiet, dist=ctx,
                           config=configs[strategy])
        results[strategy] = result
        if not lead:
            continue
        zf = configs[strategy].zenflow
        memory = memory_columns(shape, strategy, spec.batch, spec.seq, elem,
                                zf.topk_ratio if zf is not None else None, ranks, room,
                                buckets_on(configs[strategy].precision,
                                           configs[strategy].overlap_comm))
        row = summary_row(result, work, skip, max(windows[strategy][1], skip + 2), memory)
        row.update(device_threads=result.engine.device_threads,
                   host_threads=result.engine.host_threads)
        rows.append(row)
    if not lead:
        if calibration is not None:  # the collectives are timed on every rank
            calibration.finish(args.out or Path("runs/profile"))
        return 0
    add_speedups(rows)
    print(format_table(rows, loss=True))
    if use_cuda:
        from zfbench.real.distributed import available_cores
        note = host_share_note(rows, True, max(1, available_cores() // ranks))
        if note is not None:
            print(note, file=sys.stderr)
    if args.profile or args.project or expect:
        if calibration is not None:
            profile_path = calibration.finish(args.out or Path("runs/profile"))
            print(f"profile: the mean of one measured before and one after the strategies, "
                  f"host and link rates also around each -> {profile_path}")
        else:
            profile_path = write_profile(spec, args.out)
        if expect:
            rows_here = print_expectation(spec, configs, strategies, rows, profile_path,
                                          calibration.paths, ranks)
            if args.out:
                args.expectation = rows_here
        if args.project:
            projected = project(spec, shape, strategies, profile_path,
                                configs.get("zenflow"))
            print(f"\nPROJECTED (simulated with the profile measured above, not measured): "
                  f"{projected[0]['model']} at full depth")
            print(format_table(projected))
            rows.extend({**r, "projected": True} for r in projected)
    if proxy is not None:
        rows.extend(print_projection(proxy, configs, strategies, ranks, rows))
    if args.out:
        meta = {"settings": run_settings(spec, shape, ranks, args),
                **({"proxy": proxy} if proxy is not None else {}),
                **({"simulated_here": args.expectation}
                   if getattr(args, "expectation", None) else {}),
                "configs": {s: c.as_dict() for s, c in configs.items()},
                "column_notes": {"mfu": mfu_note, "fits": MEMORY_NOTE},
                # which path the host chunk's kernels took ('cpp' or 'torch', real/host_fused.py)
                "host_kernels": host_kernels_status(load=False),
                **provenance(args.argv, "python -m zfbench.run")}
        write_outputs(args.out, rows, results, meta)
        print(f"wrote {args.out}/summary.csv, summary.json, steps.csv, per-step JSONL, "
              f"spans and trace.json (open in https://ui.perfetto.dev)")
    return 0






def engine_on_cuda(spec: RunSpec) -> bool:
    from zfbench.real.engine import resolve_device

    return resolve_device(spec.device).type == "cuda"


def run_settings(spec: RunSpec, shape, ranks: int, args) -> dict:
    """The run's own settings as summary.json records them (the configs sit beside)."""
    return {"model": spec.model, "layers": spec.layers, "shape": shape.name,
            "params": shape.total_params, "ranks": ranks, "micro_batch": spec.batch,
            "grad_accum": spec.grad_accum, "seq": spec.seq, "steps": spec.steps,
            "seed": spec.seed, "device": spec.device, "device_threads":
            spec.device_threads, "host_threads": spec.host_threads, "text": spec.text,
            "config_file": spec.config if isinstance(spec.config, str) else None,
            "precision": spec.precision,
            "precision_probe": getattr(args, "precision_probe", None),
            "scenario_probe": getattr(args, "scenario", None)}


if __name__ == "__main__":
    sys.exit(main())
