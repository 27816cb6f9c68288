"""ZeRO-Offload's host lane against AdamW alone, two checkouts side by side (issue 45).

    python bench/host_lane.py --side main=/work/main/.venv/bin/python \
        --side branch=.venv/bin/python [--rounds 2] [--steps 20] [--out DIR]

Each side is a Python whose editable zfbench is the checkout to measure. Per round, every
side runs `python -m zfbench.run --strategy zero-offload --steps N` (the no-flag run's
shape, one strategy), from a neutral directory, the sides' order swapping every round.
From each run's files: the host lane's rate (the table's `host_adam_params_per_s`:
parameters per busy second of its `host_optim` spans), AdamW alone (the profile the run
measured around itself, `calibration.host_adam_params_per_s`), the seconds per step the
host worker spent on the emulated link's copies (every h2d span where the side's CPU lanes
run the uploads on the host worker, `uploads_on_host_worker`; none where a link thread
runs them, real/cpu_link.py), and

- `host_over_adam_alone`: the host lane's rate over AdamW alone;
- `host_over_adam_plus_link`: the same against AdamW alone plus the link's copies the host
  worker ran itself (the issue's target, >= 0.85).

Writes DIR/<cpu>_<date>_<time>.csv and .json (default bench/results/host_lane/): one row per
run with the side, its git commit, the machine and the load averages before and after.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402

COLUMNS = ["round", "side", "python", "commit", "dirty", "loadavg_before", "loadavg_after",
           "uploads_on_host_worker", "step_time_s", "host_adam_params_per_s", "adam_alone_params_per_s",
           "h2d_bytes_per_s_probe", "host_optim_busy_s_per_step", "h2d_busy_s_per_step",
           "link_inside_host_s_per_step", "host_over_adam_alone", "host_over_adam_plus_link",
           "params", "steps_measured", "cpu_model", "date_utc"]


def _side(text: str) -> tuple[str, str]:
    name, sep, python = text.partition("=")
    if not sep or not name or not python:
        raise argparse.ArgumentTypeError(f"--side wants NAME=PYTHON, got {text!r}")
    return name, python


def checkout_of(python: str) -> Path:
    """The directory the side's zfbench is imported from (its checkout)."""
    out = subprocess.run([python, "-c", "import zfbench.real, os; "
                          "print(os.path.dirname(os.path.dirname(zfbench.real.__file__)))"],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return Path(out.stdout.strip())


def git_state(path: Path) -> tuple[str, bool]:
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--",
                                 "real", "zfbench", "sims", "analysis"],
                                capture_output=True, text=True).stdout.strip())
    return head, dirty


def uploads_on_host_worker(python: str) -> bool:
    """Whether the side's CPU lanes run the h2d copies on the host worker itself (without
    issue 45's link thread, real/cpu_link.py, off unless $ZFBENCH_CPU_LINK_THREAD=1 in the
    side's environment: then every upload of a host chunk lies inside the chunk's span)."""
    out = subprocess.run([python, "-c", "from zfbench.real import backend as b; "
                          "f = getattr(b, 'cpu_link_lanes', None); "
                          "print(f is not None and 'h2d' in f(1))"],
                         capture_output=True, text=True, check=True, cwd=tempfile.gettempdir())
    return out.stdout.strip() != "True"


def measure(run_dir: Path, on_host: bool) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    row = next(r for r in summary["rows"] if r["strategy"] == "zero-offload")
    cal = json.loads((run_dir / "profile.json").read_text())["calibration"]
    spans = pd.read_csv(run_dir / "zero-offload.spans.csv")
    steps = pd.read_csv(run_dir / "zero-offload.steps.csv")
    kept = sorted(steps.step)[-int(row["steps_measured"]):]
    spans = spans[spans.step.isin(kept)]
    dur = spans.t_end_s - spans.t_start_s
    n = len(kept)
    host_s = float(dur[(spans.lane == "host") & (spans.op == "host_optim")].sum()) / n
    h2d_s = float(dur[spans.lane == "h2d"].sum()) / n
    inside_s = h2d_s if on_host else 0.0
    rate, alone = float(row["host_adam_params_per_s"]), float(cal["host_adam_params_per_s"])
    params = rate * host_s
    return {"step_time_s": row["step_time_s"], "host_adam_params_per_s": rate,
            "adam_alone_params_per_s": alone, "h2d_bytes_per_s_probe": cal["h2d_bytes_per_s"],
            "host_optim_busy_s_per_step": host_s, "h2d_busy_s_per_step": h2d_s,
            "link_inside_host_s_per_step": inside_s,
            "host_over_adam_alone": rate / alone,
            "host_over_adam_plus_link": (params / alone + inside_s) / host_s,
            "params": round(params), "steps_measured": n}


def line_of(row: dict) -> str:
    return (f"round {row['round']} {row['side']:>8}: step {row['step_time_s']:.3f} s, host "
            f"{row['host_adam_params_per_s'] / 1e6:.0f} M/s, AdamW alone "
            f"{row['adam_alone_params_per_s'] / 1e6:.0f} M/s ({row['host_over_adam_alone']:.2f}x; "
            f"{row['host_over_adam_plus_link']:.2f}x with the uploads it ran), load "
            f"{row['loadavg_before']}->{row['loadavg_after']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--side", type=_side, action="append", required=True,
                    help="NAME=PYTHON, a Python whose zfbench is the checkout (repeat)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_lane")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 12:
        ap.error("--rounds must be >= 1 and --steps >= 12 (the run leaves its first 8 out)")
    sides = [(name, py, *git_state(checkout_of(py)), uploads_on_host_worker(py))
             for name, py in args.side]
    info = machine()
    rows = []
    plan = [(r, s) for r in range(args.rounds)
            for s in (sides if r % 2 == 0 else sides[::-1])]
    with tempfile.TemporaryDirectory() as tmp:
        for r, (name, py, commit, dirty, on_host) in progress(plan, desc="host lane runs",
                                                               unit="run"):
            out = Path(tmp) / f"{name}_{r}"
            before = os.getloadavg()
            subprocess.run([py, "-m", "zfbench.run", "--strategy", "zero-offload", "--steps",
                            str(args.steps), "--quiet", "--out", str(out)], check=True,
                           cwd=tmp, stdout=subprocess.DEVNULL)
            rows.append({"round": r, "side": name, "python": py, "commit": commit,
                         "dirty": dirty, "loadavg_before": round(before[0], 2),
                         "loadavg_after": round(os.getloadavg()[0], 2),
                         "uploads_on_host_worker": on_host, **measure(out, on_host),
                         "cpu_model": info["cpu_model"],
                         "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")})
    args.out.mkdir(parents=True, exist_ok=True)
    stem = (re.sub(r"[^A-Za-z0-9]+", "_", info["cpu_model"] or "cpu").strip("_")
            + dt.datetime.now(dt.timezone.utc).strftime("_%Y-%m-%d_%H%M"))
    with open(args.out / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (args.out / f"{stem}.json").write_text(json.dumps({"machine": info, "args": {
        "sides": args.side, "rounds": args.rounds, "steps": args.steps}, "rows": rows},
        indent=1, default=str))
    print("\n".join(map(line_of, rows)) + f"\nwrote {args.out / stem}.csv, .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
