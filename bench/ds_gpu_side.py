"""zfbench beside DeepSpeed 0.19.5 on one GPU: the same model, batch, precision and
ZenFlow config, each engine taking the host cores DeepSpeed would (issue 45, item 4).

    python bench/ds_gpu_side.py --out DIR                      # qwen2.5-1.5b, 1 x 1024, bf16
    python bench/ds_gpu_side.py --device cpu --model "tiny" --seq 16 --dtype fp32 \
        --windows 1 --out DIR                                  # the same pipeline on a CPU

Three parts, each a separate process so neither engine's state leaks into the other:
1. bench/ds_wallclock.py runs DeepSpeed's engines (ZeRO-2, offload_optimizer cpu; by
   default `zero_offload` and `zenflow_overlap`) on `--device` and writes DIR/deepspeed/
   (summary.json with the exact DeepSpeed config of each engine, steps.csv, DeepSpeed's
   timer logs). DeepSpeed builds its CPU Adam with g++/ninja on first use; where that or
   the import fails, DIR/side_by_side.json records the error's last lines and what would
   be needed, and zfbench still runs.
2. `python -m zfbench.run --config <that config>` runs zfbench's engine of the same name
   (zero_offload -> zero-offload, zenflow_* -> zenflow) for the same number of steps into
   DIR/zfbench_<engine>/. Host cores: DeepSpeed's ZeRO-Offload CPU Adam takes every core
   and so does zfbench's on a GPU; DeepSpeed's overlapped ZenFlow splits the cores by
   pt_reserved_cores_perc and so does zfbench's.
3. Both step times under one rule (ds_wallclock's: the first `--warmup-windows` update
   windows left out, then whole windows; mean of the steps), zfbench's own summary step
   time beside it, and the ratio zfbench / DeepSpeed: DIR/side_by_side.{csv,json}.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ENGINE_STRATEGY = {"zero_offload": "zero-offload", "zenflow_seq": "zenflow",
                   "zenflow_overlap": "zenflow"}
NEEDS = ("DeepSpeed 0.19.5 and its pure-Python dependencies (`make wheels-deepspeed` on a "
         "machine with a package index, then carry wheels/deepspeed), g++ and ninja for "
         "its CPU Adam op (built on first use into ~/.cache/torch_extensions)")


def steady_mean(step_s: list[float], warm: int, U: int) -> float | None:
    """Mean step time over the whole update windows after the first `warm` steps."""
    steady = step_s[warm:]
    steady = steady[:len(steady) // U * U]
    return statistics.fmean(steady) if steady else None


def split_model(spec: str) -> tuple[str, list[str]]:
    """`NAME[kL]` (ds_wallclock's shape name) -> (NAME, zfbench.run's --layers flag)."""
    m = re.fullmatch(r"(.+)\[(\d+)L\]", spec)
    return (m.group(1), ["--layers", m.group(2)]) if m else (spec, [])


def deepspeed_arch_list(arch_list: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19.5's JIT builder can read it.

    Its builder sorts the entries by `int()` of each part, so an entry with an
    architecture suffix ("9.0a", "10.0f") stops its CPU Adam build before it starts (the
    lent H200's image sets one: ValueError "invalid literal for int() with base 10: '0a'",
    2026-11-28). The same list with the suffixes dropped names the same devices; "+PTX"
    is kept, repeats are dropped, the order is kept."""
    out: list[str] = []
    for entry in arch_list.replace(" ", ";").split(";"):
        m = re.fullmatch(r"(\d+)\.(\d+)[a-z]*(\+PTX)?", entry.strip())
        cleaned = f"{m.group(1)}.{m.group(2)}{m.group(3) or ''}" if m else entry.strip()
        if cleaned and cleaned not in out:
            out.append(cleaned)
    return ";".join(out)


def run_logged(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> int:
    """Run `cmd`, its output into `log` and to this terminal's tail; its exit code."""
    print("==", " ".join(cmd), flush=True)
    with open(log, "w") as f:
        try:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                                  timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired:
            f.write(f"\n[ds_gpu_side] killed after {timeout_s:.0f} s\n")
            return 124
    return proc.returncode


def tail(path: Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def zfbench_steps(run_dir: Path, strategy: str) -> list[float]:
    with open(run_dir / "steps.csv") as f:
        return [float(r["wall_s"]) for r in csv.DictReader(f)
                if r["strategy"] == strategy and r["rank"] == "0"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--model", default="qwen2.5-1.5b", help="NAME or NAME[kL]")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--engines", default="zero_offload,zenflow_overlap",
                    help=f"comma list of {', '.join(ENGINE_STRATEGY)}")
    ap.add_argument("--warmup-windows", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=600, help="per process")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINE_STRATEGY):
        ap.error(f"--engines {args.engines!r}: choose from {', '.join(ENGINE_STRATEGY)}")
    args.out.mkdir(parents=True, exist_ok=True)
    ds_dir = args.out / "deepspeed"
    ds_env = dict(os.environ)
    if ds_env.get("TORCH_CUDA_ARCH_LIST"):
        ds_env["TORCH_CUDA_ARCH_LIST"] = deepspeed_arch_list(ds_env["TORCH_CUDA_ARCH_LIST"])
    rc = run_logged([sys.executable, str(BENCH / "ds_wallclock.py"), "--device", args.device,
                     "--dtype", args.dtype, "--shapes", f"{args.model}:{args.batch}:{args.seq}",
                     "--engines", ",".join(engines), "--warmup-windows",
                     str(args.warmup_windows), "--windows", str(args.windows),
                     "--out", str(ds_dir)], args.out / "deepspeed.log", args.timeout_s,
                    env=ds_env)
    result: dict = {"benchmark": "ds_gpu_side", "args": {k: str(v) for k, v in vars(args).items()},
                    "deepspeed_exit_code": rc, "rows": [],
                    "torch_cuda_arch_list": {"given": os.environ.get("TORCH_CUDA_ARCH_LIST"),
                                             "deepspeed_saw": ds_env.get("TORCH_CUDA_ARCH_LIST")}}
    ds_runs = {}
    if (ds_dir / "summary.json").exists():
        ds_summary = json.loads((ds_dir / "summary.json").read_text())
        result.update(machine=ds_summary["machine"], environment=ds_summary["environment"])
        ds_runs = {r["engine"]: r for r in ds_summary["runs"]}
    if rc != 0:
        result["deepspeed_error"] = tail(args.out / "deepspeed.log")
        result["deepspeed_needs"] = NEEDS
    name, layers = split_model(args.model)
    for engine in engines:
        strategy, ds_run = ENGINE_STRATEGY[engine], ds_runs.get(engine)
        row = {"engine": engine, "zfbench_strategy": strategy, "model": args.model,
               "batch": args.batch, "seq": args.seq, "dtype": args.dtype,
               "device": args.device}
        if ds_run is None:
            result["rows"].append(dict(row, note="DeepSpeed did not run this engine"))
            continue
        U, warm = ds_run["update_interval"], ds_run["warmup_steps"]
        cfg_path = args.out / f"{engine}.ds_config.json"
        cfg_path.write_text(json.dumps(ds_run["deepspeed_config"], indent=2) + "\n")
        zf_dir = args.out / f"zfbench_{engine}"
        n_steps = warm + args.windows * U
        zrc = run_logged([sys.executable, "-m", "zfbench.run", "--device", args.device,
                          "--config", str(cfg_path), "--strategy", strategy, "--model", name,
                          *layers, "--seq", str(args.seq), "--steps", str(n_steps),
                          "--quiet", "--out", str(zf_dir)],
                         args.out / f"zfbench_{engine}.log", args.timeout_s)
        row.update(deepspeed_step_s=ds_run.get("step_s_mean"),
                   deepspeed_update_step_s=ds_run.get("update_step_s_mean"),
                   deepspeed_threads=ds_run.get("threads"), zfbench_exit_code=zrc)
        if zrc == 0:
            steps = zfbench_steps(zf_dir, strategy)
            with open(zf_dir / "summary.csv") as f:
                own = next(r for r in csv.DictReader(f) if r["strategy"] == strategy)
            row.update(zfbench_step_s=steady_mean(steps, warm, U),
                       zfbench_summary_step_s=float(own["step_time_s"]),
                       zfbench_steps=len(steps))
            if row["zfbench_step_s"] and row["deepspeed_step_s"]:
                row["zfbench_over_deepspeed"] = row["zfbench_step_s"] / row["deepspeed_step_s"]
        else:
            row["zfbench_error"] = tail(args.out / f"zfbench_{engine}.log")
        result["rows"].append(row)
    (args.out / "side_by_side.json").write_text(json.dumps(result, indent=2) + "\n")
    fields = ["engine", "zfbench_strategy", "model", "batch", "seq", "dtype", "device",
              "deepspeed_step_s", "zfbench_step_s", "zfbench_over_deepspeed",
              "zfbench_summary_step_s", "deepspeed_update_step_s"]
    with open(args.out / "side_by_side.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(result["rows"])
    for r in result["rows"]:
        print(f"{r['engine']}: DeepSpeed {r.get('deepspeed_step_s')} s, zfbench "
              f"{r.get('zfbench_step_s')} s, ratio {r.get('zfbench_over_deepspeed')}")
    print(f"wrote {args.out}/side_by_side.csv and .json")
    ok = rc == 0 and all(r.get("zfbench_exit_code") == 0 for r in result["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
