"""zfbench against DeepSpeed's own ZenFlow on this machine (optional extra, never in CI).

    pip install -e '.[deepspeed]'        # deepspeed==0.19.5 beside torch (CPU build is fine)
    python bench/vs_deepspeed.py          # writes bench/results/vs_deepspeed.{json,csv}
    python bench/vs_deepspeed.py --modes overlap --rounds 3 --skip-check

DeepSpeed runs as a library only, in this process: one rank, gloo, DS_ACCELERATOR=cpu,
ZeRO-2 with `offload_optimizer.device: cpu`, fp32, `zero_optimization.zenflow`. Its CPU
Adam op is built with g++ and ninja on first use (minutes; cached under
~/.cache/torch_extensions). 0.19.5 is the release this was checked with; 0.19.8 corrupts
the weights at initialize on CPU, so other versions are refused unless --any-version.

Three parts, all on the same model, seeded batches and ZenFlow config for both engines:

* timing (per mode, `overlap` and/or `sequential`): after warm-up, DeepSpeed and zfbench
  run alternately in blocks of whole update windows, the order swapping every round. After
  each block the host side is let go idle (untimed), so one engine's pending host Adam
  never runs inside the other's block, and each block's first window (which starts with an
  idle host) is left out. Step time = median over the remaining windows of window time / U;
  ratio = zfbench / DeepSpeed (below 1: zfbench faster), beside its floor (`floor_ratio`:
  zfbench's forward + backward over DeepSpeed's step). Same thread budget: overlap mode
  gives each side 1 compute thread + 1 host-Adam core (DeepSpeed's own 50 % split of 2
  cores: it pins the training thread and a separate optimizer process); sequential mode
  gives each all cores for compute and host Adam in turn.
* host Adam rate: zfbench's from its timeline (parameters updated / busy seconds of its
  `host_optim` spans, with and without the h2d copy done inside them); DeepSpeed's in
  sequential mode by timing its CPU Adam `step` from outside; and both kernels on the
  model's flat size with the host thread budget (DeepSpeedCPUAdam.step vs
  zfbench.real.host_adam.host_adamw_), interleaved.
* correctness (sequential, fp32, clipping off, explicit weight decay): max |param
  difference| after N steps for (A) topk_ratio 1.0, U 1 (both must equal torch AdamW),
  (B) topk_ratio 0.25, U 4 on a model with only 2-D weights (DeepSpeed's column-score
  window is then not shifted, so both select the same columns), (C) the same on `tiny`,
  whose 1-D norm weights shift DeepSpeed's score windows: selections differ, reported,
  and (D) case C again with DeepSpeed's selected columns imposed on zfbench, which shows
  whether the selection accounts for the whole difference.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ds_engines import (correctness, ds_config, import_deepspeed,  # noqa: E402
                        make_ds, make_zf, seeded_batches, train_step)


# ------------------------------------------------------------------ timing
def zf_host_rate(engine, steps: set[int]) -> dict:
    spans = [s for s in engine.timeline.spans if s.step in steps]
    busy = sum(s.duration_s for s in spans if s.lane == "host" and s.op == "host_optim")
    # the uploads the host worker ran itself, inside its spans; since issue 45 the CPU
    # lanes' link thread runs them beside it (real/cpu_link.py): none
    on_host = "h2d" not in getattr(engine.backend, "links", {})
    h2d = sum(s.duration_s for s in spans
              if on_host and s.lane == "h2d" and s.op == "h2d_param")
    updates = len({s.step for s in spans if s.op == "host_optim"})
    n = updates * engine.layout.total
    per_op: dict[str, float] = {}
    for s in spans:
        key = f"{s.lane}.{s.op}"
        per_op[key] = per_op.get(key, 0.0) + s.duration_s / len(steps)
    return {"timeline_mean_s_per_step": per_op, "host_updates": updates,
            "host_optim_busy_s": busy,
            "host_adam_params_per_s": n / busy if busy else None,
            "host_adam_params_per_s_without_h2d": n / (busy - h2d) if busy > h2d else None}


def settle(kind: str, engine, timeout_s: float = 60.0) -> None:
    """Untimed: wait until the engine's host side has nothing left to do."""
    end = time.perf_counter() + timeout_s
    if kind == "zfbench":
        while not engine.host_lane.idle() and time.perf_counter() < end:
            time.sleep(0.005)
        return
    proc = getattr(engine.optimizer, "process", None)  # DeepSpeed's optimizer process
    if proc is None:
        return
    import psutil

    p, last = psutil.Process(proc.pid), -1.0
    while time.perf_counter() < end:
        now = sum(p.cpu_times()[:2])
        if now == last:
            return
        last = now
        time.sleep(0.05)


def timing(ds, args, mode: str) -> dict:
    from zfbench.real.model import build_model
    from zfbench.core.models import get_model

    U, overlap = args.update_interval, mode == "overlap"
    zenflow = {"topk_ratio": args.topk_ratio, "update_interval": U, "select_strategy": "step",
               "select_interval": args.select_interval, "overlap_step": overlap,
               "full_warm_up_rounds": 0}
    cfg = ds_config(args.batch, zenflow, args.lr, 0.01, args.clip)
    cores = len(os.sched_getaffinity(0))
    dev_t, host_t = (max(1, cores // 2), max(1, cores - cores // 2)) if overlap else (cores, cores)
    shape = get_model(args.model)
    shape = shape.with_layers(args.layers) if args.layers else shape
    block, warm = args.windows_per_block * U, args.warmup_windows * U
    data = seeded_batches(shape.vocab, args.batch, args.seq, warm + args.rounds * block, 0)
    full_aff = os.sched_getaffinity(0)

    dse = make_ds(ds, build_model(shape, seed=0), cfg)
    ds_host = []
    if not overlap:  # time DeepSpeed's host CPU Adam from outside
        opt, inner = dse.optimizer.optimizer, dse.optimizer.optimizer.step

        def timed_step(*a, **k):
            t0 = time.perf_counter()
            out = inner(*a, **k)
            ds_host.append(time.perf_counter() - t0)
            return out
        opt.step = timed_step
    torch.set_num_threads(dev_t)
    for b in data[:warm]:
        train_step(dse, b)
    settle("deepspeed", dse)
    ds_aff = os.sched_getaffinity(0)  # DeepSpeed pins its training thread (overlap mode)
    if args.unpin_deepspeed:
        ds_aff = full_aff
    os.sched_setaffinity(0, full_aff)
    zfe = make_zf(build_model(shape, seed=0), cfg, dev_t, host_t)
    for b in data[:warm]:
        train_step(zfe, b)
    settle("zfbench", zfe)
    n_params = zfe.layout.total
    engines = {"deepspeed": (dse, ds_aff), "zfbench": (zfe, full_aff)}
    windows = {"deepspeed": [], "zfbench": []}
    all_steps = {"deepspeed": [], "zfbench": []}
    phases = {"deepspeed": [], "zfbench": []}
    loads: list[float] = []
    paired: list[float] = []  # per round: zfbench / deepspeed, adjacent blocks
    zf_steps: set[int] = set()
    ds_host.clear()
    for r in range(args.rounds):
        order = ("deepspeed", "zfbench") if r % 2 == 0 else ("zfbench", "deepspeed")
        chunk = data[warm + r * block: warm + (r + 1) * block]
        for kind in order:
            engine, aff = engines[kind]
            os.sched_setaffinity(0, aff)
            torch.set_num_threads(dev_t)
            if kind == "zfbench":
                zf_steps.update(range(zfe.t, zfe.t + block))
            ph: list = []
            for b in chunk:
                train_step(engine, b, ph)
            settle(kind, engine)
            times = [sum(x) for x in ph]
            all_steps[kind] += times
            phases[kind] += ph[U:]
            windows[kind] += [sum(times[i:i + U]) / U for i in range(U, block, U)]
        loads.append(os.getloadavg()[0])
        last = {k: statistics.median(w[1 - args.windows_per_block:]) for k, w in windows.items()}
        paired.append(last["zfbench"] / last["deepspeed"])
        print(f"  {mode} round {r + 1}/{args.rounds} (load {loads[-1]:.1f}): deepspeed "
              f"{last['deepspeed']:.4f} s/step, zfbench {last['zfbench']:.4f} s/step, "
              f"ratio {paired[-1]:.3f}", flush=True)
    os.sched_setaffinity(0, full_aff)
    zfe.finish()
    zfe.close()
    out = {"mode": mode, "model": shape.name, "n_params": n_params, "batch": args.batch,
           "seq": args.seq, "zenflow": zenflow, "gradient_clipping": args.clip,
           "rounds": args.rounds, "steps_per_block": block, "warmup_steps": warm,
           "loadavg_1min_after_each_round": loads,
           "threads": {"cores": cores, "zfbench_device_threads": dev_t,
                       "zfbench_host_threads": host_t, "deepspeed_torch_threads": dev_t,
                       "deepspeed_training_affinity": sorted(ds_aff),
                       "deepspeed_host": ("separate optimizer process, pinned to the other "
                                          f"{cores - len(ds_aff)} core(s)") if overlap else
                       f"in-process CPU Adam, {dev_t} OpenMP threads"}}
    for kind in ("deepspeed", "zfbench"):
        out[kind] = {"step_time_s": statistics.median(windows[kind]),
                     "step_time_s_mean": statistics.fmean(windows[kind]),
                     "step_time_s_min_window": min(windows[kind]),
                     "step_time_s_max_window": max(windows[kind]),
                     "step_time_s_median_single_step": statistics.median(all_steps[kind]),
                     "steady_windows": len(windows[kind]),
                     "phase_mean_s": {name: statistics.fmean(x[i] for x in phases[kind])
                                      for i, name in enumerate(("forward", "backward", "step"))},
                     "step_times_s": [round(x, 5) for x in all_steps[kind]]}
    out["zfbench"].update(zf_host_rate(zfe, zf_steps))
    if ds_host:
        out["deepspeed"].update({"host_updates": len(ds_host), "host_optim_busy_s": sum(ds_host),
                                 "host_adam_params_per_s": len(ds_host) * n_params / sum(ds_host)})
    out["ratio_zfbench_over_deepspeed"] = (out["zfbench"]["step_time_s"]
                                           / out["deepspeed"]["step_time_s"])
    out["floor_ratio"] = floor_ratio(out)
    out["ratio_per_round"] = paired
    out["ratio_median_of_rounds"] = statistics.median(paired)
    del dse
    return out


def adam_kernels(n: int, threads: int, repeats: int) -> dict:
    """DeepSpeedCPUAdam.step vs zfbench.real.host_adam.host_adamw_ on one flat fp32 buffer of n."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    from zfbench.real.host_adam import host_adamw_

    torch.set_num_threads(threads)  # DeepSpeed's op uses torch's OpenMP runtime
    gen = torch.Generator().manual_seed(0)
    p_ds = nn.Parameter(torch.randn(n, generator=gen))
    p_ds.grad = torch.randn(n, generator=gen) * 1e-3
    opt = DeepSpeedCPUAdam([p_ds], lr=1e-4, weight_decay=0.01, adamw_mode=True)
    p, g = p_ds.detach().clone(), p_ds.grad.clone()
    m, v = torch.zeros(n), torch.zeros(n)
    times = {"deepspeed": [], "zfbench": []}
    for i in range(repeats + 1):
        for kind in (("deepspeed", "zfbench") if i % 2 else ("zfbench", "deepspeed")):
            t0 = time.perf_counter()
            if kind == "deepspeed":
                opt.step()
            else:
                host_adamw_(p, g, m, v, step=i + 1, lr=1e-4, beta1=0.9, beta2=0.999,
                            eps=1e-8, weight_decay=0.01)
            if i:  # the first call of each allocates / first-touches its state
                times[kind].append(time.perf_counter() - t0)
    rate = {k: n / statistics.median(t) for k, t in times.items()}
    return {"n_params": n, "threads": threads, "repeats": repeats,
            "deepspeed_cpu_adam_params_per_s": rate["deepspeed"],
            "zfbench_host_adamw_params_per_s": rate["zfbench"],
            "ratio_zfbench_over_deepspeed": rate["zfbench"] / rate["deepspeed"]}


# ------------------------------------------------------------------ output
def environment(ds) -> dict:
    import numpy

    return {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "python": platform.python_version(), "torch": torch.__version__,
            "deepspeed": ds.__version__, "numpy": numpy.__version__,
            "platform": platform.platform(), "cpu": _cpu_model(),
            "cores": os.cpu_count(), "affinity": sorted(os.sched_getaffinity(0)),
            "loadavg_start": list(os.getloadavg()),
            "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), **_git()}


def _git() -> dict:
    """The zfbench code measured: commit, and whether real/ or zfbench/ differ from it."""
    import subprocess

    def run(*cmd):
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    return {"git_commit": run("rev-parse", "HEAD"),
            "engine_code_dirty": bool(run("status", "--porcelain", "real", "zfbench"))}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _flat(d: dict, prefix: str = ""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        elif not isinstance(v, list):
            yield f"{prefix}{k}", v


def csv_rows(result: dict) -> list[dict]:
    """Long format: one row per number (nested keys dotted, per-step lists left out)."""
    return [{"part": part, "case": item[key], "metric": m, "value": v}
            for part, key in (("timing", "mode"), ("host_adam_kernel", "threads"),
                              ("correctness", "case"))
            for item in result[part] for m, v in _flat(item) if m != key]


def floor_ratio(timing: dict) -> float:
    """zfbench's mean forward + backward over DeepSpeed's step: the ratio zfbench would
    reach with a step phase of nothing. Both engines run the same model on the same threads,
    so what DeepSpeed spends beyond that compute is what the ratio can gain on; it moves
    with the VM (session 28: 0.348x overlap on a day DeepSpeed ran 17% faster than the
    day before, bench/results/vs_deepspeed_s28/)."""
    phases = timing["zfbench"]["phase_mean_s"]
    return (phases["forward"] + phases["backward"]) / timing["deepspeed"]["step_time_s"]


def print_table(result: dict) -> None:
    print("\n== step time (median over steady windows, s/step) ==")
    print(f"{'mode':<11}{'model':<14}{'deepspeed':>10}{'zfbench':>10}{'zf/ds':>7}{'rounds':>8}"
          f"{'floor':>7}{'ds host Adam':>15}{'zf host Adam':>15}")
    for t in result["timing"]:
        dh, zh = t["deepspeed"].get("host_adam_params_per_s"), t["zfbench"]["host_adam_params_per_s"]
        print(f"{t['mode']:<11}{t['model']:<14}{t['deepspeed']['step_time_s']:>10.4f}"
              f"{t['zfbench']['step_time_s']:>10.4f}{t['ratio_zfbench_over_deepspeed']:>7.3f}"
              f"{t['ratio_median_of_rounds']:>8.3f}{floor_ratio(t):>7.3f}"
              f"{(f'{dh / 1e6:.0f} M/s' if dh else 'n/a'):>15}"
              f"{(f'{zh / 1e6:.0f} M/s' if zh else 'n/a'):>15}")
    print("(floor: zfbench's forward + backward alone over DeepSpeed's step, the ratio with a "
          "step phase of nothing)")
    print("\n== mean phase times of steady steps, s (DeepSpeed runs its device-side "
          "selective Adam inside backward, zfbench inside step) ==")
    for t in result["timing"]:
        for kind in ("deepspeed", "zfbench"):
            ph = t[kind]["phase_mean_s"]
            print(f"{t['mode']:<11}{kind:<11}" + "".join(
                f"{name} {v:.4f}  " for name, v in ph.items()))
    print("\n== host Adam kernels on the model's flat size (params/s) ==")
    for k in result["host_adam_kernel"]:
        print(f"{k['threads']} thread(s), {k['n_params'] / 1e6:.1f} M params: DeepSpeedCPUAdam "
              f"{k['deepspeed_cpu_adam_params_per_s'] / 1e6:.0f} M/s, zfbench host_adamw_ "
              f"{k['zfbench_host_adamw_params_per_s'] / 1e6:.0f} M/s "
              f"(ratio {k['ratio_zfbench_over_deepspeed']:.2f})")
    print("\n== parameters after N sequential steps ==")
    for c in result["correctness"]:
        extra = ""
        if "max_abs_diff_deepspeed_vs_torch_adamw" in c:
            extra = (f"; vs torch AdamW: ds {c['max_abs_diff_deepspeed_vs_torch_adamw']:.2g},"
                     f" zf {c['max_abs_diff_zfbench_vs_torch_adamw']:.2g}")
        print(f"{c['case']}: max |ds - zf| {c['max_abs_diff']:.3g} after {c['steps']} steps "
              f"(largest update {c['max_abs_update']:.3g}); identical selections "
              f"{c['weights_with_identical_selection']}/{c['weights_2d']}{extra}")


def main(argv=None) -> int:
    from zfbench.core.config_zenflow import SCENARIO_ZENFLOW

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="opt-350m")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--modes", default="overlap,sequential")
    ap.add_argument("--topk-ratio", type=float, default=SCENARIO_ZENFLOW["topk_ratio"])
    ap.add_argument("--update-interval", type=int, default=SCENARIO_ZENFLOW["update_interval"])
    ap.add_argument("--select-interval", type=int, default=SCENARIO_ZENFLOW["select_interval"])
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--clip", type=float, default=0.0, help="gradient_clipping (both)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--windows-per-block", type=int, default=3)
    ap.add_argument("--warmup-windows", type=int, default=3)
    ap.add_argument("--kernel-repeats", type=int, default=10)
    ap.add_argument("--check-steps", type=int, default=12)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--unpin-deepspeed", action="store_true",
                    help="run DeepSpeed's training thread on all cores, not the core it pins")
    ap.add_argument("--any-version", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args(argv)
    if args.windows_per_block < 2:
        ap.error("--windows-per-block must be >= 2 (each block's first window is left out)")
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - {"overlap", "sequential"}:
        ap.error(f"--modes {args.modes!r}: expected overlap and/or sequential")
    ds = import_deepspeed(args.any_version)
    result = {"benchmark": "vs_deepspeed", "environment": environment(ds),
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "timing": [], "host_adam_kernel": [], "correctness": []}
    if not args.skip_check:
        print("correctness (sequential, fp32):", flush=True)
        result["correctness"] = correctness(ds, args)
    if not args.skip_timing:
        for mode in modes:
            print(f"timing, {mode}:", flush=True)
            result["timing"].append(timing(ds, args, mode))
        n = result["timing"][0]["n_params"] if result["timing"] else 1 << 24
        cores = len(os.sched_getaffinity(0))
        for threads in sorted({max(1, cores - cores // 2), cores}):
            result["host_adam_kernel"].append(adam_kernels(n, threads, args.kernel_repeats))
    result["environment"]["loadavg_end"] = list(os.getloadavg())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vs_deepspeed.json").write_text(json.dumps(result, indent=2) + "\n")
    with open(args.out / "vs_deepspeed.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["part", "case", "metric", "value"])
        w.writeheader()
        w.writerows(csv_rows(result))
    print_table(result)
    print(f"\nwrote {args.out / 'vs_deepspeed.json'} and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
