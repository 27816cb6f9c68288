"""Per-op busy seconds per step, measured beside simulated, from validate's traces.

`python -m zfbench.validate` writes `ops.csv` itself (since session 15); this reads the
`traces/<cell>.json` of an older validate run (Chrome traces holding a "<cell> measured"
and a "<cell> simulated" process) and writes the same table:

    python bench/trace_ops.py DIR/traces --skip 8 --out DIR/ops.csv

`--skip`: steps left out as warm-up (validate's --skip; default 8); the window runs to the
last step both sides have. Rank 0 only (validate runs one rank).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.analysis.validation import compare_ops  # noqa: E402
from zfbench.core.trace import write_csv_atomic  # noqa: E402


def spans_by_process(path: Path) -> dict[str, pd.DataFrame]:
    """Each process of a Chrome trace by name: its complete events as spans (lane = the
    thread's name, op, step, start and end in seconds)."""
    events = json.loads(path.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    procs, threads, rows = {}, {}, {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    for e in events:
        if e.get("ph") != "X" or "step" not in e.get("args", {}):
            continue
        lane = threads.get((e["pid"], e["tid"]))
        rows.setdefault(e["pid"], []).append(
            (lane, e["name"], int(e["args"]["step"]), e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6))
    cols = ["lane", "op", "step", "t_start_s", "t_end_s"]
    return {procs.get(pid, str(pid)): pd.DataFrame(r, columns=cols) for pid, r in rows.items()}


def cpu_lanes(path: Path) -> bool:
    """Whether the cell ran on the CPU lanes (its profile, validate's profiles/<cell>.json
    beside traces/, says `transfers: emulated`): there the host worker runs each upload
    inside its AdamW chunk's span."""
    profile = path.parent.parent / "profiles" / path.name
    if not profile.exists():
        return False
    return json.loads(profile.read_text())["calibration"].get("transfers") == "emulated"


def cell_ops(path: Path, skip: int) -> pd.DataFrame:
    procs = spans_by_process(path)
    measured = next(f for name, f in procs.items() if name.endswith(" measured)"))
    simulated = next(f for name, f in procs.items() if name.endswith(" simulated)"))
    measured, simulated = (f[f["lane"] != "steps"] for f in (measured, simulated))
    last = int(min(measured["step"].max(), simulated["step"].max()))
    nested = ("host", "h2d") if cpu_lanes(path) else None
    return compare_ops(measured, simulated, skip, last, nested).assign(cell=path.stem)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/trace_ops.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("traces", type=Path, help="validate's traces/ folder")
    p.add_argument("--skip", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    files = sorted(args.traces.glob("*.json"))
    if not files:
        print(f"error: no *.json trace in {args.traces}", file=sys.stderr)
        return 2
    table = pd.concat([cell_ops(f, args.skip) for f in files], ignore_index=True)
    table = table[["cell", "lane", "op", "measured_s_per_step", "simulated_s_per_step",
                   "measured_over_simulated"]]
    write_csv_atomic(table, args.out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
