"""ZenFlow's device AdamW on the CPU lanes over a list of small tensors: torch's fused
kernel (a parallel region per tensor) against the segments loop (one region for the list,
real/host_segments.py), side by side in one process (issue 45).

    python bench/adamw_segments.py [--shapes 1024x1840,50272x51,4096x110,8192x62]
        [--threads 1,2] [--repeats 9] [--grad-divisor 4] [--out bench/results/adamw_segments]

The default list approximates the measured call of bench/vs_deepspeed.py's opt-350m[2L]
(seq 128, topk 0.1, U 4): 2063 tensors, 5.41 M elements (1840 weight columns of 1024 rows,
51 embedding columns of 50272, the rest vectors), each ROWSxCOUNT entry COUNT views of
ROWS elements into one buffer per quantity (as the columns of a weight); gradients divided
by `--grad-divisor` (U), refreshed before every call (untimed). For each thread count, the
calls alternate (torch's list call, the segments call, and for scale torch's call and the
segments call on one tensor of the same total size); the median of `--repeats`. The two
calls' results are compared bit for bit (a difference stops the run). Writes DIR/adamw_segments.csv (one row per
thread count and call) and .json (the rows, the machine, the load before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from zfbench.real import host_fused  # noqa: E402
from zfbench.real.host_segments import torch_adamw_segments_  # noqa: E402

STEP = 3
HYPER = {"lr": 1e-4, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01}


def shapes(text: str) -> list[int]:
    """'1024x1840,50272x51' -> 1840 lengths of 1024, then 51 of 50272."""
    out = []
    for part in text.split(","):
        rows, _, count = part.partition("x")
        if not (rows.isdigit() and count.isdigit() and int(rows) > 0):
            raise argparse.ArgumentTypeError(
                f"bad shape {part!r}: write ROWSxCOUNT, e.g. 1024x1840")
        out += [int(rows)] * int(count)
    return out


def threads_list(text: str) -> list[int]:
    """'1,2' -> [1, 2]: torch thread counts, each at least 1."""
    parts = [x for x in text.split(",") if x]
    if not parts or not all(x.isdigit() and int(x) >= 1 for x in parts):
        raise argparse.ArgumentTypeError(f"bad thread counts {text!r}: write e.g. 1,2")
    return [int(x) for x in parts]


def segments(lens: list[int], seed: int) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
    """p, g, m, v buffers and their views of `lens` elements, back to back."""
    total = sum(lens)
    gen = torch.Generator().manual_seed(seed)
    bufs = [torch.randn(total, generator=gen), torch.randn(total, generator=gen) * 1e-2,
            torch.randn(total, generator=gen) * 1e-3, torch.rand(total, generator=gen) * 1e-5]
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    return bufs, [[b[s:s + n] for s, n in zip(starts, lens)] for b in bufs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--shapes", type=shapes, default=shapes("1024x1840,50272x51,4096x110,8192x62"))
    ap.add_argument("--threads", type=threads_list, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--grad-divisor", type=float, default=4.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/adamw_segments")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if not args.grad_divisor > 0:
        ap.error(f"--grad-divisor must be positive (ZenFlow's U), got {args.grad_divisor}")
    load_before = os.getloadavg()
    backend = host_fused.backend()
    lens, rows = args.shapes, []
    for threads in progress(args.threads, desc="threads"):
        torch.set_num_threads(threads)
        lists = {"torch_fused_list": segments(lens, 45), "segments_list": segments(lens, 45),
                 "torch_fused_one_tensor": segments([sum(lens)], 46),
                 "segments_one_tensor": segments([sum(lens)], 46)}
        first_grads = {name: bufs[1].clone() for name, (bufs, _) in lists.items()}
        times = {name: [] for name in lists}
        for _ in range(args.repeats):
            for name, (bufs, segs) in lists.items():
                bufs[1].copy_(first_grads[name])  # each call divides them in place
                start = time.perf_counter()
                if name.startswith("torch"):
                    torch_adamw_segments_(*segs, STEP, *HYPER.values(), args.grad_divisor)
                else:
                    host_fused.adamw_segments_(*segs, step=STEP, **HYPER,
                                               grad_divisor=args.grad_divisor)
                times[name].append(time.perf_counter() - start)
        for kind in ("list", "one_tensor"):
            a, b = lists[f"torch_fused_{kind}"][0], lists[f"segments_{kind}"][0]
            if not all(torch.equal(x.view(torch.int32), y.view(torch.int32))
                       for x, y in zip(a, b)):
                raise SystemExit(f"the segments loop's bits differ from torch's ({kind})")
        for name, values in times.items():
            segs = lists[name][1]
            rows.append({"threads": threads, "call": name, "tensors": len(segs[0]),
                         "elements": sum(t.numel() for t in segs[0]),
                         "median_ms": 1e3 * statistics.median(values),
                         "min_ms": 1e3 * min(values), "max_ms": 1e3 * max(values),
                         "repeats": len(values)})
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    write_csv_atomic(frame, args.out / "adamw_segments.csv")
    write_json_atomic(args.out / "adamw_segments.json",
                      {"rows": rows, "machine": machine(), "torch": torch.__version__,
                       "backend": backend, "grad_divisor": args.grad_divisor,
                       "hyper": HYPER, "loadavg_before": load_before,
                       "loadavg_after": os.getloadavg()})
    print(frame.to_string(index=False))
    print(f"wrote {args.out}/adamw_segments.csv and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
