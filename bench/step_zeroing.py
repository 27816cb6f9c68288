"""The engine's end-of-step gradient zeroing, two checkouts side by side (issue 45).

    python bench/step_zeroing.py --side main=/work/main/.venv/bin/python \
        --side branch=.venv/bin/python [--rounds 3] [--steps 12] [--out DIR]

Each side is a Python whose editable zfbench is the checkout to measure. Per round and
strategy, every side trains the no-flag run's model (tinyllama-1.1b[1L], fp32, batch 1,
seq 64, the CPU lanes with 1 + 1 threads) for 3 warm-up and `--steps` measured steps in
a fresh process, the sides' order swapping every round, and reports per measured step:

- `zero_cpu_ms`: CPU time of the thread that runs `Engine._zero_grads` inside it
  (resource.getrusage RUSAGE_THREAD; the zeroing the step runs, not `zero_grad()`);
- `process_cpu_s`, `wall_s`: the whole process's CPU seconds (both lanes,
  RUSAGE_SELF) and wall seconds of forward + backward + step.

Writes DIR/<cpu>_<date>_<time>.csv (default bench/results/step_zeroing/): one row per
run with the side, its git commit and the 1-minute load before and after.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DRIVER = r"""
import json, resource, sys, time
import torch
import zfbench.real as real
from zfbench.core.config_build import build_config
from zfbench.core.models import get_model
from zfbench.real.model import build_model

strategy, steps = sys.argv[1], int(sys.argv[2])
shape = get_model("tinyllama-1.1b").with_layers(1)
torch.manual_seed(0)
model = build_model(shape, seed=0)
cfg = build_config(strategy, micro_batch=1, lr=1e-4, weight_decay=0.01, clip=0.0,
                   zenflow={} if strategy == "zenflow" else None)
engine = real.initialize(model, cfg, device="cpu", device_threads=1, host_threads=1)
zero_ms = []
inner = engine._zero_grads

def timed(*a, **k):
    t0 = resource.getrusage(resource.RUSAGE_THREAD)
    inner(*a, **k)
    t1 = resource.getrusage(resource.RUSAGE_THREAD)
    zero_ms.append(1e3 * (t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime))
engine._zero_grads = timed
gen = torch.Generator().manual_seed(1)
rows = []
for i in range(3 + steps):
    ids = torch.randint(0, shape.vocab, (1, 65), generator=gen)
    r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    engine.backward(engine(ids[:, :-1], ids[:, 1:]))
    engine.step()
    r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    zero, calls = sum(zero_ms), len(zero_ms)
    zero_ms.clear()
    if i >= 3:
        rows.append({"process_cpu_s": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                     "wall_s": w1 - w0, "zero_cpu_ms": zero, "zero_calls": calls})
engine.finish()
engine.close()
print(json.dumps(rows))
"""


def _commit(python: str) -> str:
    code = "import zfbench, pathlib; print(pathlib.Path(zfbench.__file__).resolve().parents[1])"
    where = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True,
                           cwd=tempfile.gettempdir()).stdout.strip()  # not ./zfbench
    head = subprocess.run(["git", "-C", where, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    return f"{head}@{where}"


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--side", action="append", required=True,
                    help="NAME=PYTHON (a Python whose editable zfbench is the checkout)")
    ap.add_argument("--strategies", default="zenflow,zero-offload")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "step_zeroing")
    args = ap.parse_args(argv)
    sides = []
    for item in args.side:
        name, sep, python = item.partition("=")
        if not sep or not name or not Path(python).exists():
            ap.error(f"--side {item!r}: expected NAME=PYTHON with an existing Python")
        python = os.path.abspath(python)  # the runs start elsewhere; a venv link kept
        sides.append((name, python, _commit(python)))
    rows = []
    driver = Path(tempfile.mkdtemp()) / "driver.py"
    driver.write_text(DRIVER)
    for r in range(args.rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        for strategy in args.strategies.split(","):
            for name, python, commit in order:
                load0 = os.getloadavg()[0]
                out = subprocess.run([python, str(driver), strategy, str(args.steps)],
                                     capture_output=True, text=True, cwd=driver.parent,
                                     check=True).stdout
                steps = json.loads(out.strip().splitlines()[-1])
                row = {"round": r, "side": name, "commit": commit, "strategy": strategy,
                       "steps": len(steps), "load_1min_before": round(load0, 2),
                       "load_1min_after": round(os.getloadavg()[0], 2)}
                row["zero_calls"] = sum(s["zero_calls"] for s in steps)
                for key in ("zero_cpu_ms", "process_cpu_s", "wall_s"):
                    row[f"{key}_median"] = round(_median([s[key] for s in steps]), 5)
                rows.append(row)
                print(json.dumps(row), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    cpu = platform.processor() or "cpu"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d_%H%M")
    path = args.out / f"{''.join(c if c.isalnum() else '_' for c in cpu)}_{stamp}.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
