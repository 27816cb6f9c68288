"""What a fresh host temporary's page faults cost, by size and thread count (issues 44/45).

    python bench/window_copy_faults.py --out bench/results/window_copy_faults
    python bench/window_copy_faults.py --sizes-mb 64 256 --threads 1 2 --repeats 3 --out DIR

DeepSpeed's ZenFlow window end on a GPU is one blocking `bit16.copy_(fp32)` (zfbench.sims.
window_copy): PyTorch converts it on the host into a new 16-bit tensor, which its CPU
allocator maps fresh and unmaps after (zfbench.real.rate_probe `fresh_page_seconds`: the
sources), so every window end faults its output in again. For each size of 16-bit output
(`--sizes-mb`) and each torch thread count (`--threads`) this times, alternating, median of
`--repeats` after one untimed run of each:

- `convert_fresh` / `convert_into`: fp32 -> bf16 into a new tensor / into a reused one
  (the profile's probe, `RateProbe.fresh_page_rates`, times the same pair);
- `touch_fresh` / `touch_reused`: `torch.empty(n, bf16).fill_(1)` / `fill_(1)` of a reused
  buffer (a first touch without the conversion).

and counts, per case run, the process's minor page faults and system CPU seconds
(getrusage: a count, not a timing). `fault_s_per_GB` is (fresh - reused) seconds per GB of
output; `fresh_page_GBps` its inverse, the rate the simulator takes. Writes
DIR/window_copy_faults.csv and .json (rows, machine, THP settings, load before and after).
Peak memory: 8 bytes per output element (a 1536 MB output: 6.4 GB).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real.rate_probe import (alternating_medians, fresh_page_bytes_per_s,  # noqa: E402
                                     fresh_page_seconds)

BF16 = torch.bfloat16


def counted(fn) -> tuple[int, float]:
    """(minor page faults, system CPU seconds) of the process during one `fn()`."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime


def touch_seconds(into: torch.Tensor, repeats: int) -> tuple[float, float]:
    """(fresh, reused): median seconds of a new 16-bit tensor of `into`'s size filled
    (its pages first touched) and of `into` itself filled; alternating, one untimed run."""
    return alternating_medians(lambda: torch.empty(into.numel(), dtype=into.dtype).fill_(1),
                               lambda: into.fill_(1), repeats)


def measure(size_mb: float, threads: int, repeats: int) -> list[dict]:
    """The rows of one output size on `threads` torch threads."""
    torch.set_num_threads(threads)
    n = int(size_mb * 1e6 / 2)
    out_bytes = 2 * n
    src = torch.empty(n, dtype=torch.float32).fill_(1.2345678)
    into = torch.empty(n, dtype=BF16).fill_(0)  # mapped before anything is timed
    rows = []
    for kind, (fresh_s, reused_s), fns in (
            ("convert", fresh_page_seconds(src, into, repeats),
             (lambda: src.to(BF16), lambda: into.copy_(src))),
            ("touch", touch_seconds(into, repeats),
             (lambda: torch.empty(n, dtype=BF16).fill_(1), lambda: into.fill_(1)))):
        faults_fresh, sys_fresh = counted(fns[0])
        faults_reused, sys_reused = counted(fns[1])
        rate = fresh_page_bytes_per_s(out_bytes, fresh_s, reused_s)
        rows.append({
            "kind": kind, "size_MB": out_bytes / 1e6, "threads": threads,
            "fresh_s": fresh_s, "reused_s": reused_s,
            "fault_s_per_GB": (fresh_s - reused_s) / (out_bytes / 1e9),
            "fresh_page_GBps": None if rate is None else rate / 1e9,
            "minor_faults_fresh": faults_fresh, "minor_faults_reused": faults_reused,
            "faults_per_MB_fresh": faults_fresh / (out_bytes / 1e6),
            "sys_cpu_s_fresh": sys_fresh, "sys_cpu_s_reused": sys_reused,
            "sys_cpu_s_per_GB_fresh": sys_fresh / (out_bytes / 1e9)})
    return rows


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--sizes-mb", type=float, nargs="+", default=[64, 256, 1024, 1536],
                    help="16-bit output sizes in MB (default: 64 256 1024 1536)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                    help="torch thread counts (default: 1 2)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats <= 0 or min(args.threads) <= 0 or min(args.sizes_mb) <= 0:
        ap.error("--sizes-mb, --threads and --repeats must be positive")
    load_before = os.getloadavg()
    rows = []
    for threads in args.threads:
        for size in progress(args.sizes_mb, desc=f"{threads} thread(s)"):
            rows += measure(size, threads, args.repeats)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "window_copy_faults.csv")
    write_json_atomic(args.out / "window_copy_faults.json", {
        "rows": rows, "machine": machine(), "torch": torch.__version__,
        "repeats": args.repeats, "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "transparent_hugepage": _read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "kernel": os.uname().release})
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"wrote {args.out}/window_copy_faults.csv and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
