"""How fast the SimPy simulator and `python -m zfbench.simulate` run: 1,000 steps, files or not.

    python bench/sim_speed.py [--steps 1000] [--model llama2-7b] [--gpus 4] [--pcie gen4]
                              [--jobs auto] [--goal-s 15] [--every-rank] [--out DIR]

Three measurements in one process, one after the other:
1. `simulate()` of each strategy (`zfbench.sims.costs.STRATEGIES`) alone, in this process: wall
   time, CPU time, simulated steps per wall second, SimPy events processed per wall
   second (`SimResult.sim_events / wall`) and spans recorded (row "simulate: all" sums
   them): the simulator's own speed. With `--every-rank`, each strategy is also simulated
   right after with every rank (`simulate(..., every_rank=True)`, the reference path of
   zfbench.sims.replicas; rows "simulate every rank"), side by side in the same process.
2. The command `zfbench.simulate.main` for every strategy, without `--out`.
3. The same command with `--out` into a temporary directory (summary, steps.csv, every
   span in Parquet or CSV, a windowed trace.json), which is then deleted.
(2) and (3) run with the same `--jobs` (auto: one worker process per usable CPU); their
wall times are set side by side (ratio files/no files), with CPU time of this process and
its workers, and (3)'s bytes written (trace.json and in all). The goal (--goal-s, 15 s,
issue 45's target) is for (3): 1,000 steps of llama2-7b on 4 x a100-80g behind PCIe gen4,
every strategy, files included, on a 2-core machine.

Writes DIR/sim_speed.json and DIR/sim_speed.csv (one row per measurement; the machine: CPU
model, ISA flags, cores, torch, Python and SimPy versions; load averages before and after;
date) and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import simpy  # noqa: E402
from zfbench.core.progress import progress  # noqa: E402

from zfbench.sims.costs import STRATEGIES, SimSettings  # noqa: E402
from zfbench.sims.simulator import simulate  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.simulate.command import main as simulate_main  # noqa: E402
from zfbench.simulation import auto_jobs  # noqa: E402
from zfbench.core.trace import write_json_atomic  # noqa: E402

GOAL_TOTAL_WALL_S = 15.0
CSV_COLUMNS = ["measurement", "strategy", "steps", "model", "gpus", "pcie", "jobs", "wall_s",
               "cpu_s", "sim_steps_per_s", "sim_events", "sim_events_per_s", "spans",
               "spans_per_s", "events_per_span", "files_over_no_files_wall_ratio",
               "trace_json_bytes", "out_bytes", "timeline_format", "cpu_count", "cpu_model",
               "cpu_flags", "torch_version", "python_version", "simpy_version", "date_utc"]


def machine_info() -> dict:
    """The machine (zfbench.core.provenance: CPU model, ISA flags, cores, torch) and the date."""
    m = machine()
    return {**m, "simpy_version": simpy.__version__,
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def cpu_now() -> float:
    """CPU seconds of this process and of its finished (waited-for) worker processes."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def measure(settings: SimSettings, strategy: str, every_rank: bool = False) -> dict:
    wall0, cpu0 = time.perf_counter(), cpu_now()
    result = simulate(settings, strategy, every_rank=every_rank)
    wall, cpu = time.perf_counter() - wall0, cpu_now() - cpu0
    spans = len(result.timeline)
    return {"measurement": "simulate every rank" if every_rank else "simulate",
            "strategy": strategy, "wall_s": wall, "cpu_s": cpu,
            "sim_steps_per_s": settings.measurement.steps / wall, "sim_events": result.sim_events,
            "sim_events_per_s": result.sim_events / wall, "spans": spans,
            "spans_per_s": spans / wall, "events_per_span": result.sim_events / max(spans, 1)}


def command(argv: list[str], out: Path | None) -> dict:
    """`zfbench.simulate.main(argv)` timed, with `--out out` when given, its stdout kept."""
    full = argv + (["--out", str(out)] if out else [])
    wall0, cpu0 = time.perf_counter(), cpu_now()
    devnull = open(os.devnull, "w")
    stdout, sys.stdout = sys.stdout, devnull
    try:
        code = simulate_main(full)
    finally:
        sys.stdout = stdout
        devnull.close()
    wall, cpu = time.perf_counter() - wall0, cpu_now() - cpu0
    if code != 0:
        raise SystemExit(f"python -m zfbench.simulate {' '.join(full)} exited {code}")
    row = {"measurement": "command --out" if out else "command", "strategy": "all",
           "wall_s": wall, "cpu_s": cpu}
    if out:
        files = [p for p in out.iterdir() if p.is_file()]
        row["trace_json_bytes"] = (out / "trace.json").stat().st_size
        row["out_bytes"] = sum(p.stat().st_size for p in files)
        row["timeline_format"] = "parquet" if any(p.suffix == ".parquet" for p in files) \
            else "csv"
    return row


def table(rows: list[dict]) -> str:
    head = (f"{'measurement':<20} {'strategy':<18} {'wall s':>8} {'cpu s':>8} "
            f"{'steps/s':>9} {'events/s':>11} {'spans':>10} {'trace MB':>9} {'out MB':>8}")
    lines = [head, "-" * len(head)]

    def cell(r: dict, key: str, width: int, spec: str, scale: float = 1.0) -> str:
        value = r.get(key)
        return f"{'-':>{width}}" if value is None else f"{value / scale:{width}{spec}}"

    for r in rows:
        lines.append(f"{r['measurement']:<20} {r['strategy']:<18} {r['wall_s']:8.2f} "
                     f"{r['cpu_s']:8.2f} {cell(r, 'sim_steps_per_s', 9, '.1f')} "
                     f"{cell(r, 'sim_events_per_s', 11, ',.0f')} "
                     f"{cell(r, 'spans', 10, ',.0f')} "
                     f"{cell(r, 'trace_json_bytes', 9, '.1f', 1e6)} "
                     f"{cell(r, 'out_bytes', 8, '.1f', 1e6)}")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict], machine: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    flags = " ".join(machine.get("cpu_flags") or [])
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**machine, "cpu_flags": flags, **row})
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000, help="simulated steps per strategy")
    ap.add_argument("--model", default="llama2-7b")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--pcie", default="gen4")
    ap.add_argument("--jobs", default="auto", help="the command's --jobs")
    ap.add_argument("--goal-s", type=float, default=GOAL_TOTAL_WALL_S,
                    help="goal for the command's wall time with --out, seconds")
    ap.add_argument("--every-rank", action="store_true",
                    help="also simulate each strategy with every rank (the reference path)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args(argv)

    settings = SimSettings.from_knobs(model=args.model, gpus=args.gpus, steps=args.steps,
                                      pcie=args.pcie)
    machine = machine_info()
    load_before = load_average()
    sims, every = [], []
    bar = progress(STRATEGIES, desc="simulating", unit="strategy")
    for strategy in bar:
        bar.set_postfix_str(strategy)
        sims.append(measure(settings, strategy))
        if args.every_rank:
            every.append(measure(settings, strategy, every_rank=True))
    bar.close()
    total = {"measurement": "simulate", "strategy": "all",
             **{k: sum(r[k] for r in sims) for k in ("wall_s", "cpu_s", "sim_events",
                                                    "spans")}}
    total.update({"sim_steps_per_s": len(sims) * args.steps / total["wall_s"],
                  "sim_events_per_s": total["sim_events"] / total["wall_s"],
                  "spans_per_s": total["spans"] / total["wall_s"],
                  "events_per_span": total["sim_events"] / max(total["spans"], 1)})

    argv_cmd = ["--model", args.model, "--gpus", str(args.gpus), "--steps", str(args.steps),
                "--pcie", args.pcie, "--jobs", args.jobs, "--quiet"]
    print("running the command without and with --out ...", file=sys.stderr)
    no_files = command(argv_cmd, None)
    tmp = Path(tempfile.mkdtemp(prefix="sim_speed-"))
    try:
        files = command(argv_cmd, tmp / "out")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    ratio = files["wall_s"] / no_files["wall_s"]
    files["files_over_no_files_wall_ratio"] = ratio
    load_after = load_average()
    rows = sims + [total] + every + [no_files, files]
    jobs = auto_jobs([({}, settings)], list(STRATEGIES)) if args.jobs == "auto" \
        else int(args.jobs)
    for r in rows:
        r.update({"steps": args.steps, "model": args.model, "gpus": args.gpus,
                  "pcie": args.pcie,
                  "jobs": 1 if r["measurement"].startswith("simulate") else jobs})
    meets = files["wall_s"] <= args.goal_s

    print(f"{args.steps} steps of {args.model} on {args.gpus} GPUs, PCIe {args.pcie}; "
          f"{machine['cpu_count']} CPUs ({machine['cpu_model']}; "
          f"{' '.join(machine['cpu_flags'])}), Python {machine['python_version']}, "
          f"SimPy {machine['simpy_version']}, torch {machine['torch_version']}; "
          f"load average before {load_before}, after {load_after}")
    print(table(rows))
    verdict = "meets" if meets else "MISSES"
    print(f"command with files {files['wall_s']:.2f} s, without {no_files['wall_s']:.2f} s "
          f"(ratio {ratio:.2f}); trace.json {files['trace_json_bytes'] / 1e6:.1f} MB, "
          f"{files['out_bytes'] / 1e6:.1f} MB in all ({files['timeline_format']} spans): "
          f"{verdict} the goal of <= {args.goal_s:g} s")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine, "load_average_before": load_before,
               "load_average_after": load_after, "settings": settings.as_dict(),
               "command": "python -m zfbench.simulate " + " ".join(argv_cmd),
               "command_jobs": jobs, "strategies_run": list(STRATEGIES),
               "goal_wall_s": args.goal_s, "command_wall_s": no_files["wall_s"],
               "command_with_files_wall_s": files["wall_s"],
               "files_over_no_files_wall_ratio": ratio, "meets_goal": meets,
               "simulate_total": total, "strategies": sims,
               "strategies_every_rank": every, "rows": rows}
    json_path = write_json_atomic(out / "sim_speed.json", payload)
    csv_path = out / "sim_speed.csv"
    write_csv(csv_path, rows, machine)
    print(f"wrote {json_path} and {csv_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
