"""DeepSpeed's own step times on this CPU, for validating `python -m zfbench.predict`.

    /work/dsvenv/bin/python bench/ds_wallclock.py    # -> bench/results/predict_deepspeed/
    python bench/ds_wallclock.py --shapes "opt-350m[2L]:1:128" --windows 4 --repeats 2 --echo

Owns one measurement: per shape (`NAME:BATCH:SEQ`, NAME from zfbench.core.models), in ONE
process, on the same model init and seeded batches, three DeepSpeed 0.19.5 engines one after
another (engine order rotating per `--repeats`), all ZeRO-2 with offload_optimizer cpu and
`"wall_clock_breakdown": true, "steps_per_print": 1`:
`zero_offload` (no zenflow: the baseline predict reads), `zenflow_seq` (plus
`zero_optimization.zenflow`, overlap_step false) and `zenflow_overlap` (overlap_step true).

DeepSpeed prints its timer lines (`[Rank 0] time (ms) | fwd: ...`) with print() and its
progress with its logger: both go, as printed, to `<out>/<shape>__<engine>.log` (warm-up
included: give predict `--skip-steps <warmup_steps>` from summary.json). Each step is also
timed from outside (perf_counter around forward + backward + step) into steps.csv /
steps.jsonl, with `foreign_cpu_s` (CPU seconds other processes took meanwhile) and
`runq_wait_s` (seconds our threads waited for a core): on a shared machine run it under
`nice -n -10` and read `quiet_step_s_mean` (windows that waited < 5 %). summary.json:
machine (CPU model, ISA flags, cores, torch, deepspeed), every run's settings and steady
means, and `pooled` over repeats (logs then end in `__rN`).

Warm-up and windows as in bench/vs_deepspeed.py: full_warm_up_rounds 0, one selection at
step 0 (select_strategy step, select_interval 0) unless changed; the first
`--warmup-windows` update windows (U steps) are warm-up, the next `--windows` steady; a
run's step time is the mean over its steady steps (whole windows: one host-Adam boundary
each). Thread budgets as there: zero_offload and zenflow_seq get all cores; zenflow_overlap
gets cores//2 torch threads and DeepSpeed pins training to half the cores and its optimizer
process to the rest (restored after). Engines and the DeepSpeed import: bench/ds_engines.py;
what is observed around each step (machine, CPU accounting, DeepSpeed's printed timers):
bench/ds_wallclock_observe.py; steady means, pooling and the printed table:
bench/ds_wallclock_summary.py.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for p in (str(ROOT), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)
from ds_wallclock_observe import capture_deepspeed, cpu_sample, machine, parse_timers  # noqa: E402
from ds_wallclock_summary import pool, report, summarize  # noqa: E402

ENGINES = ("zero_offload", "zenflow_seq", "zenflow_overlap")
DEFAULT_SHAPES = "opt-350m[1L]:1:32,opt-350m[2L]:1:128,opt-350m[4L]:1:64,tinyllama-1.1b[1L]:1:32"
CSV_FIELDS = ("shape", "engine", "mode", "repeat", "device", "dtype", "batch", "seq", "step", "steady",
              "update", "step_s", "fwd_s", "bwd_s", "opt_s", "foreign_cpu_s", "own_cpu_s",
              "runq_wait_s")


# ------------------------------------------------------------------ one run
def default_engine_args(**given) -> argparse.Namespace:
    """What `engine_config` reads, at this script's command-line defaults (the scenario's
    ZenFlow knobs, lr 1e-4, weight decay 0.01, no clipping, fp32), `given` on top: for the
    scripts that build DeepSpeed's engines as this one does (bench/ds_trace.py,
    bench/ds_bucket_copy.py)."""
    from zfbench.core.config_zenflow import SCENARIO_ZENFLOW

    return argparse.Namespace(**{
        "topk_ratio": SCENARIO_ZENFLOW["topk_ratio"],
        "update_interval": SCENARIO_ZENFLOW["update_interval"],
        "select_interval": SCENARIO_ZENFLOW["select_interval"], "lr": 1e-4,
        "weight_decay": 0.01, "clip": 0.0, "dtype": "fp32", **given})


def engine_config(args, batch: int, engine: str) -> dict:
    from ds_engines import ds_config

    zenflow = {"topk_ratio": args.topk_ratio, "update_interval": args.update_interval,
               "select_strategy": "step", "select_interval": args.select_interval,
               "overlap_step": engine == "zenflow_overlap",
               "full_warm_up_rounds": 0}
    cfg = ds_config(batch, zenflow, args.lr, args.weight_decay, args.clip)
    if engine == "zero_offload":
        del cfg["zero_optimization"]["zenflow"]
    cfg.update(wall_clock_breakdown=True, steps_per_print=1)
    if args.dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def run_one(ds, args, spec: tuple, engine: str, rep: int, data: list, bar) -> tuple[list, dict]:
    import torch

    from ds_engines import make_ds, release_ds, train_step
    from zfbench.real.model import build_model
    from zfbench.core.models import get_model

    name, batch, seq = spec
    shape = get_model(name)
    U, overlap = args.update_interval, engine == "zenflow_overlap"
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2) if overlap else cores
    full_aff, omp = os.sched_getaffinity(0), os.environ.get("OMP_NUM_THREADS")
    cfg = engine_config(args, batch, engine)
    warm = args.warmup_windows * U
    tag = f"{name.replace('[', '-').replace(']', '')}_b{batch}_s{seq}__{engine}"
    log_path = args.out / f"{tag}{f'__r{rep}' if args.repeats > 1 else ''}.log"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    sync = torch.cuda.synchronize if args.device == "cuda" else None
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = build_model(shape, dtype=dtype, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    dse = make_ds(ds, model, cfg)
    init_s = time.perf_counter() - t0
    rows = []
    mode = "overlap" if overlap else "sequential"
    t_run = time.perf_counter()
    try:
        with capture_deepspeed(log_path, args.echo) as cap:
            for t, b in enumerate(data):
                update = dse.is_gradient_accumulation_boundary()
                busy0, own0, wait0 = cpu_sample(_pids(dse))
                phases: list = []
                loss = train_step(dse, to_device(b, args.device), phases, sync)
                fwd_s, bwd_s, opt_s = phases[0]
                busy1, own1, wait1 = cpu_sample(_pids(dse))  # its optimizer process is ours
                step_s = fwd_s + bwd_s + opt_s
                rows.append({"shape": name, "engine": engine, "mode": mode, "repeat": rep,
                             "device": args.device, "dtype": args.dtype, "batch": batch, "seq": seq, "step": t,
                             "steady": t >= warm, "update": bool(update), "step_s": step_s,
                             "fwd_s": fwd_s, "bwd_s": bwd_s, "opt_s": opt_s,
                             "foreign_cpu_s": max(0.0, (busy1 - busy0) - (own1 - own0)),
                             "own_cpu_s": own1 - own0, "runq_wait_s": max(0.0, wait1 - wait0),
                             "loss": loss, "timers": parse_timers(cap.take())})
                bar.set_postfix_str(f"{name} b{batch} s{seq} {engine} {step_s:.3f}s")
                bar.update()
        run_s = time.perf_counter() - t_run
        ds_affinity = sorted(os.sched_getaffinity(0))
        opt_affinity = [sorted(os.sched_getaffinity(pid)) for pid in _pids(dse)]
    finally:  # give back what DeepSpeed took: its optimizer process, the pinning, threads
        release_ds(dse, full_aff, omp, cores)
        del dse, model
        gc.collect()
    summary = summarize(rows, U, cores)
    if engine != "zero_offload":
        summary["timers_note"] = (f"fwd/bwd/bwd_inner/bwd_allreduce/step (no _microstep) are "
                                  f"printed once per window and sum its {U} micro-steps")
    summary.update(shape=name, device=args.device, batch=batch, seq=seq, engine=engine,
                   mode=mode, repeat=rep, n_params=n_params, dtype=args.dtype,
                   log=log_path.name, init_s=init_s, run_s=run_s, warmup_steps=warm, update_interval=U,
                   loadavg_after=list(os.getloadavg()), deepspeed_config=cfg,
                   threads={"torch_threads": threads, "cores": cores,
                            "training_affinity_during_run": ds_affinity,
                            "optimizer_process_affinity": opt_affinity})
    return rows, summary


def to_device(batch: dict, device: str) -> dict:
    """The batch's tensors on `device` (DeepSpeed moves the model at initialize, not the
    inputs)."""
    return batch if device == "cpu" else {k: v.to(device) for k, v in batch.items()}


def _pids(engine) -> tuple:
    proc = getattr(engine.optimizer, "process", None)  # zenflow_overlap's optimizer process
    return (proc.pid,) if proc is not None and proc.is_alive() else ()


# ------------------------------------------------------------------ main
def parse_shapes(text: str) -> list[tuple]:
    from zfbench.core.models import get_model

    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, batch, seq = (item.split(":") + ["1", "128"])[:3]
        get_model(name)  # refuses unknown names with the list of known ones
        out.append((name, int(batch), int(seq)))
    return out


def main(argv=None) -> int:
    from zfbench.core.config_zenflow import SCENARIO_ZENFLOW

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES,
                    help="comma list of NAME:BATCH:SEQ (NAME from zfbench.core.models)")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="DeepSpeed's accelerator: cpu (gloo) or cuda (nccl, one GPU)")
    ap.add_argument("--topk-ratio", type=float, default=SCENARIO_ZENFLOW["topk_ratio"])
    ap.add_argument("--update-interval", type=int, default=SCENARIO_ZENFLOW["update_interval"])
    ap.add_argument("--select-interval", type=int, default=SCENARIO_ZENFLOW["select_interval"])
    ap.add_argument("--warmup-windows", type=int, default=2)
    ap.add_argument("--windows", type=int, default=6, help="steady windows of U steps")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=0.0, help="gradient_clipping")
    ap.add_argument("--repeats", type=int, default=1, help="run each engine this often "
                    "per shape, the engine order rotating (logs get __rN)")
    ap.add_argument("--echo", action="store_true", help="also print DeepSpeed's lines")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "predict_deepspeed")
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if args.windows < 1 or args.repeats < 1:
        ap.error("--windows and --repeats must be >= 1")
    if set(engines) - set(ENGINES):
        ap.error(f"--engines {args.engines!r}: choose from {', '.join(ENGINES)}")
    specs = parse_shapes(args.shapes)
    from tqdm import tqdm

    from ds_engines import import_deepspeed, seeded_batches
    from vs_deepspeed import environment
    from zfbench.core.models import get_model

    ds = import_deepspeed(args.any_version, args.device)  # exits with the hint if missing
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # cleanup runs on kill too
    args.out.mkdir(parents=True, exist_ok=True)
    n_steps = (args.warmup_windows + args.windows) * args.update_interval
    result = {"benchmark": "ds_wallclock", "machine": machine(), "environment": environment(ds),
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "steps_per_run": n_steps, "nice": os.getpriority(os.PRIO_PROCESS, 0), "runs": []}
    t_all = time.perf_counter()
    total = len(specs) * len(engines) * n_steps * args.repeats
    with open(args.out / "steps.jsonl", "w") as fj, \
            open(args.out / "steps.csv", "w", newline="") as fc, tqdm(total=total) as bar:
        w = csv.DictWriter(fc, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for spec in specs:
            data = seeded_batches(get_model(spec[0]).vocab, spec[1], spec[2], n_steps, 0)
            runs = [(r, e) for r in range(1, args.repeats + 1)  # order rotates per repeat
                    for e in engines[(r - 1) % len(engines):] + engines[:(r - 1) % len(engines)]]
            for rep, engine in runs:
                rows, summary = run_one(ds, args, spec, engine, rep, data, bar)
                fj.writelines(json.dumps(r) + "\n" for r in rows)
                w.writerows(rows)
                result["runs"].append(summary)
                tqdm.write(f"{spec[0]} b{spec[1]} s{spec[2]} {engine} r{rep}: "
                           f"{summary.get('step_s_mean', float('nan')):.4f} s/step steady mean "
                           f"(init {summary['init_s']:.1f} s, run-queue wait "
                           f"{100 * summary.get('runq_wait_share', 0):.0f}%)")
                (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    result["total_s"] = time.perf_counter() - t_all
    result["environment"]["loadavg_end"] = list(os.getloadavg())
    result["pooled"] = pool(result["runs"])
    (args.out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")
    report(result["pooled"])
    print(f"\nwrote {args.out}/summary.json, steps.csv, steps.jsonl and {len(result['runs'])} "
          f"logs in {result['total_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
