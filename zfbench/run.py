"""`python -m zfbench.run`: train with the real engine and measure every op.

Covers: `--model`, `--layers` (a depth slice at full width), `--strategy` (one or all),
`--steps`, `--batch`, `--seq`, `--gpus`, `--config ds_config.json`,
`--device auto|cuda|cpu`, `--device-threads`, `--host-threads`, `--text`, `--out`.

Multi-rank: `--gpus N` (N > 1) launches N ranks through torch's elastic launcher (what
torchrun uses), each running this command; `torchrun --nproc-per-node N -m zfbench.run`
works the same (RANK / WORLD_SIZE / LOCAL_RANK are read from the environment). NCCL with
CUDA, gloo without. Data parallel, ZeRO-2: each rank trains on its `--batch` rows of a
global batch of `--batch * N`, gradients are all-reduced, each rank's host lane owns one
shard of the optimizer state, updated shards are all-gathered. Each rank gets an equal
share of the cores (`--device-threads` / `--host-threads` are per rank); rank 0 prints
and writes the files, with every rank's spans.
Scenario: with no flags, all four strategies run on a shape where host AdamW is slower
than forward+backward on this machine (the regime ZenFlow is for): TinyLlama-1.1B's first
layer at full width (its 32000 x 2048 embedding and head are untied, so a third of the
175M parameters are barely touched by compute but all of them are updated by Adam),
batch 1 x seq 4, bf16 weights and gradients on the device lane with fp32 master and
moments on the host (ZenFlow's mixed-precision setting), 30 steps each, about 80 s in all.
Measured on the 2-core dev machine (1 + 1 threads, bench/engine_overlap.py, four runs):
forward+backward 0.11-0.14 s, host AdamW alone (its uploads left out) 0.14-0.21 s
(1.15-1.76x), ZeRO-Offload stalls 61-67% of each step and ZenFlow 12-14%; ZenFlow's step
is 1.06-1.43x shorter. Then the breakdown table is printed: step time, stall,
exposed I/O, host wait, achieved link GB/s, host Adam parameters/s, compute utilization,
loss.

Before anything is allocated the memory need is estimated and a run that cannot fit is
refused with the numbers and the `--layers` that would fit. Files written to `--out`:
`summary.csv`/`.json` (the simulator's columns plus achieved rates), `<strategy>.steps.jsonl`
(one line per step), `<strategy>.spans.csv`/`.steps.csv` and `trace.json` (Chrome trace).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from analysis.breakdown import summarize
from real.memory import InsufficientMemoryError, check_fits
from real.distributed import env_world
from real.runner import RunSpec, train
from zfbench.config import STRATEGIES, ConfigError, load_config
from zfbench.models import UnknownModelError
from zfbench.trace import merge_chrome_traces, write_json_atomic

# The no-flag scenario (see above); the model and depth are RunSpec's defaults.
DEFAULT_SEQ = 4
DEFAULT_PRECISION = "bf16"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zfbench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = RunSpec()
    p.add_argument("--model", default=d.model, help=f"named shape (default {d.model})")
    p.add_argument("--layers", type=int, default=None,
                   help=f"depth slice at full width (default {d.layers} for the default "
                        f"model, all layers otherwise)")
    p.add_argument("--strategy", choices=STRATEGIES + ("all",), default="all")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch, help="micro-batch per GPU")
    p.add_argument("--seq", type=int, default=DEFAULT_SEQ,
                   help=f"tokens per sequence (default {DEFAULT_SEQ})")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                   help="device weights and gradients (host master and moments are fp32); "
                        f"default {DEFAULT_PRECISION}, or the --config file's")
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
                   "rank (default the other half of the rank's cores: cores / ranks)")
    p.add_argument("--text", help="train on a plain-text file (byte-level tokens); "
                   "'builtin' uses the standard library's pydoc topics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="directory for summary, per-step JSONL, spans, "
                   "Chrome trace")
    p.add_argument("--profile", action="store_true",
                   help="measure this machine's costs (per-block forward/backward, device "
                        "optimizer, selection, d2h/h2d alone and together, host Adam and "
                        "accumulation) and write OUT/profile.json for "
                        "python -m zfbench.simulate --profile")
    p.add_argument("--project", action="store_true",
                   help="run the --layers slice, calibrate, and report beside it the "
                        "simulated full-depth step time and stall of each strategy "
                        "(projected, not measured)")
    p.add_argument("--quiet", action="store_true")
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


def spec_from_args(args) -> RunSpec:
    for name in ("steps", "batch", "seq"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    layers = args.layers
    if layers is None and args.model == RunSpec().model:
        layers = RunSpec().layers
    config = args.config
    if config is not None:
        load_config(config)  # validate the file now, before anything runs
    return RunSpec(model=args.model, layers=layers, batch=args.batch, seq=args.seq,
                   steps=args.steps, seed=args.seed, device=args.device,
                   device_threads=args.device_threads, host_threads=args.host_threads,
                   text=args.text, config=config,
                   precision=args.precision or (None if config else DEFAULT_PRECISION))


def summary_row(result, model_bytes: float, params: int, flops_per_step: float) -> dict:
    tl = result.timeline
    skip = min(2 * 4, max(0, len(result.losses) - 2))  # leave the first windows out
    strategy = result.strategy
    per_step_params = 0.0 if strategy == "device" else float(params)
    zf = result.engine.config.zenflow
    if strategy == "zenflow" and zf is not None and zf.update_interval != "auto":
        per_step_params = params / int(zf.update_interval)
    row = {"strategy": strategy}
    row.update(summarize(tl.spans_frame(), tl.steps_frame(), skip, model_bytes,
                         per_step_params))
    row["achieved_flops_per_s"] = flops_per_step / row["step_time_s"]
    row["loss_first"] = result.losses[0]
    row["loss_last"] = result.losses[-1]
    row["skipped_steps"] = sum(r["skipped"] for r in result.engine.step_log)
    return row


def _times(ratio: float) -> str:
    """A speedup, or "-" when there is no zero-offload row to compare with."""
    return "-" if ratio != ratio else f"{ratio:.2f}x"


def format_table(rows: list[dict]) -> str:
    head = ["strategy", "step_s", "speedup", "stall%", "exp_io_s", "host_wait_s",
            "d2h_GB/s", "h2d_GB/s", "hostAdam_Mp/s", "GFLOP/s", "util%", "loss"]
    lines = []
    for r in rows:
        lines.append([r["strategy"], f"{r['step_time_s']:.3f}",
                      _times(r['speedup_vs_zero_offload']),
                      f"{100 * r['stall_fraction']:.1f}", f"{r['exposed_io_s']:.3f}",
                      f"{r['host_wait_s']:.3f}", f"{r['d2h_gb_per_s']:.2f}",
                      f"{r['h2d_gb_per_s']:.2f}",
                      f"{r.get('host_adam_params_per_s', 0) / 1e6:.0f}",
                      f"{r['achieved_flops_per_s'] / 1e9:.1f}",
                      f"{100 * r['compute_utilization']:.0f}",
                      f"{r['loss_first']:.3f}->{r['loss_last']:.3f}"])
    widths = [max(len(h), *(len(x[i]) for x in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:>{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*x) for x in lines])


def write_outputs(out: Path, rows: list[dict], results: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out))
    try:
        pd.DataFrame(rows).to_csv(staging / "summary.csv", index=False)
        write_json_atomic(staging / "summary.json", {"rows": rows})
        for strategy, result in results.items():
            result.timeline.write_csv(staging, prefix=f"{strategy}.")
            with open(staging / f"{strategy}.steps.jsonl", "w") as handle:
                for record, loss in zip(result.engine.step_log, result.losses):
                    handle.write(json.dumps({**record, "loss": loss}) + "\n")
        write_json_atomic(staging / "trace.json", merge_chrome_traces(
            {s: r.timeline for s, r in results.items()}))
        for path in staging.iterdir():
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_profile(spec: RunSpec, out: Path | None) -> Path:
    from real.profile import measure_profile

    path = (out or Path("runs/profile")) / "profile.json"
    profile = measure_profile(spec)
    write_json_atomic(path, profile)
    cal = profile["calibration"]
    print(f"profile: host Adam {cal['host_adam_params_per_s'] / 1e6:.0f} M params/s, "
          f"d2h {cal['d2h_bytes_per_s'] / 1e9:.1f} GB/s, h2d "
          f"{cal['h2d_bytes_per_s'] / 1e9:.1f} GB/s -> {path}")
    return path


def project(spec: RunSpec, shape, strategies: list[str], profile_path: Path) -> list[dict]:
    """Simulate the full-depth model with the slice's profile, one row per strategy."""
    from sims.costs import SimSettings
    from sims.simulator import simulate

    full = shape.name.split("[")[0]
    config = spec.engine_config("zenflow")
    zf = config.zenflow
    settings = SimSettings(model=full, layers=None, gpus=1, micro_batch=spec.batch,
                           seq=spec.seq, precision=config.precision, transfers="full",
                           profile=str(profile_path), steps=max(spec.steps, 24),
                           topk_ratio=zf.topk_ratio, update_interval=int(zf.update_interval),
                           overlap_step=zf.overlap_step, select_interval=0)
    rows = []
    for strategy in strategies:
        result = simulate(settings, strategy)
        tl = result.timeline
        row = summarize(tl.spans_frame(), tl.steps_frame(), result.skip_steps)
        rows.append({"model": full, "strategy": strategy, **row})
    base = next((r for r in rows if r["strategy"] == "zero-offload"), None)
    for r in rows:
        r["speedup_vs_zero_offload"] = base["step_time_s"] / r["step_time_s"] if base \
            else float("nan")
    return rows


def format_projection(rows: list[dict]) -> str:
    head = f"{'strategy':>16}  {'step_s':>8}  {'speedup':>8}  {'stall%':>6}  " \
           f"{'exp_io_s':>8}  {'host_wait_s':>11}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['strategy']:>16}  {r['step_time_s']:8.3f}  "
                     f"{_times(r['speedup_vs_zero_offload']):>8}  {100 * r['stall_fraction']:6.1f}  "
                     f"{r['exposed_io_s']:8.3f}  {r['host_wait_s']:11.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    try:
        world, launched = resolve_world(args)
        spec = spec_from_args(args)
        shape = spec.shape()
        strategies = list(STRATEGIES) if args.strategy == "all" else [args.strategy]
        elem = 2 if spec.engine_config(strategies[0]).precision != "fp32" else 4
        from real.engine import resolve_device

        use_cuda = resolve_device(spec.device).type == "cuda"
        check_gpu_count(world, use_cuda)
        if world > 1 and (args.profile or args.project):
            raise ValueError("--profile / --project measure one rank; run them without "
                             "--gpus")
        check_fits(shape, strategies, spec.batch, spec.seq, elem, use_cuda)
    except (ValueError, ConfigError, UnknownModelError, InsufficientMemoryError,
            RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if world > 1 and not launched:
        from real.launch import LaunchError, launch

        print(f"launching {world} ranks ({'nccl' if use_cuda else 'gloo'}) with torch's "
              f"elastic launcher", file=sys.stderr)
        try:
            launch(world, ["-m", "zfbench.run", *argv])
        except LaunchError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
        return 0
    if launched:
        return run_rank(args, spec, shape, strategies, elem, use_cuda)
    return run_all(args, spec, shape, strategies, elem)


def run_rank(args, spec, shape, strategies, elem, use_cuda) -> int:
    """One rank of a launched multi-rank run; rank 0 reports and writes the files."""
    import dataclasses

    from real.distributed import (DistributedError, bind_cores, init_from_env,
                                  rank_threads, shutdown)

    ctx = init_from_env(use_cuda)
    try:
        if args.bind_cores:
            bind_cores(ctx.rank, ctx.world)
        dev, host = rank_threads(ctx.world)
        spec = dataclasses.replace(spec, device_threads=spec.device_threads or dev,
                                   host_threads=spec.host_threads or host)
        if ctx.rank != 0:
            args.quiet, args.out = True, None
        try:
            return run_all(args, spec, shape, strategies, elem, ctx)
        except DistributedError as err:
            print(f"error: {err}", file=sys.stderr)
            return 1
    finally:
        shutdown()


def run_all(args, spec, shape, strategies, elem, ctx=None) -> int:
    lead = ctx is None or ctx.rank == 0
    ranks = 1 if ctx is None else ctx.world
    if lead:
        print(f"{shape.name}: {shape.total_params / 1e6:.1f}M parameters, {ranks} rank(s) x "
              f"batch {spec.batch} x seq {spec.seq}, {spec.steps} steps per strategy "
              f"(measured; {spec.device_threads or 'default'} device + "
              f"{spec.host_threads or 'default'} host threads per rank)", file=sys.stderr)
    results, rows = {}, []
    tokens = spec.batch * spec.seq
    flops = (shape.forward_flops_per_token(spec.seq) +
             shape.backward_flops_per_token(spec.seq)) * tokens
    for strategy in strategies:
        result = train(spec, strategy, progress=not args.quiet, dist=ctx)
        results[strategy] = result
        if not lead:
            continue
        rows.append(summary_row(result, shape.total_params * elem, shape.total_params,
                                flops))
    if not lead:
        return 0
    for r in rows:
        r["ranks"] = ranks
    base = next((r for r in rows if r["strategy"] == "zero-offload"), None)
    for r in rows:
        r["speedup_vs_zero_offload"] = base["step_time_s"] / r["step_time_s"] if base \
            else float("nan")
    print(format_table(rows))
    if args.profile or args.project:
        profile_path = write_profile(spec, args.out)
        if args.project:
            projected = project(spec, shape, strategies, profile_path)
            print(f"\nPROJECTED (simulated with the profile measured above, not measured): "
                  f"{projected[0]['model']} at full depth")
            print(format_projection(projected))
            rows.extend({**r, "projected": True} for r in projected)
    if args.out:
        write_outputs(args.out, rows, results)
        print(f"wrote {args.out}/summary.csv, per-step JSONL, spans and trace.json "
              f"(open in https://ui.perfetto.dev)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
