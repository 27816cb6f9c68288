"""The host lane's element-wise kernels per dtype pair, side by side in one run, beside the
machine's own memory bandwidth.

    python bench/host_kernels.py [--elems 64M] [--repeats 5] [--threads 1,2] [--out DIR]

For each thread count it times, round-robin so that machine noise hits them alike:
- `accumulate` (real/host_accum.py, what ZenFlow's host accumulation and the rate probe
  call) of fp32, bf16 and fp16 gradients into an fp32 window, and for the 16-bit ones
  torch's plain mixed-dtype `window.add_(grads, alpha)` it replaces;
- the conversions the offloading strategies run on the host: fp32 -> bf16/fp16 (the
  parameters into the h2d wire) and bf16/fp16 -> fp32 (gradients out of the d2h wire);
- a same-dtype fp32 `a += b` as the bandwidth reference (12 B per element: two reads,
  one write).
Each row: best and median seconds, elements/s, GB/s (bytes each kernel must move) and
the share of the fp32 `a += b` reference's GB/s. Writes DIR/host_kernels.csv and .json
with the machine (CPU model, ISA flags, cores, torch version).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real import host_accum  # noqa: E402

SIZE = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}
NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KMG" else text) * mult)


def kernels(n: int) -> dict[str, tuple]:
    """name -> (function, bytes moved per call)."""
    window = torch.zeros(n)
    fp32 = torch.randn(n) * 1e-3
    out = {"fp32 a += b (reference)": (lambda: window.add_(fp32), 12 * n)}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        grads = fp32.to(dtype)
        moved = n * (8 + SIZE[dtype])  # read window and grads, write window
        out[f"accumulate {NAME[dtype]} -> fp32"] = (
            lambda g=grads: host_accum.accumulate_(window, g, 0.25), moved)
        if dtype is not torch.float32:
            out[f"plain add_ {NAME[dtype]} -> fp32 (mixed dtype)"] = (
                lambda g=grads: window.add_(g, alpha=0.25), moved)
            wire = torch.empty(n, dtype=dtype)
            out[f"convert fp32 -> {NAME[dtype]}"] = (lambda w=wire: w.copy_(fp32),
                                                     n * (4 + SIZE[dtype]))
            out[f"convert {NAME[dtype]} -> fp32"] = (lambda g=grads: window.copy_(g),
                                                     n * (4 + SIZE[dtype]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elems", default="64M")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    n = parse_size(args.elems)
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        table = kernels(n)
        times: dict[str, list[float]] = {name: [] for name in table}
        for name, (fn, _) in table.items():
            fn()  # warm: pages touched, kernels chosen
        for _ in range(args.repeats):
            for name, (fn, _) in table.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        for name, (_, moved) in table.items():
            best = min(times[name])
            rows.append({"threads": threads, "kernel": name, "elems": n,
                         "best_s": best, "median_s": statistics.median(times[name]),
                         "elems_per_s": n / best, "gb_per_s": moved / best / 1e9})
        print(f"{threads} thread(s), {n / 1e6:.0f}M elements", flush=True)
    frame = pd.DataFrame(rows)
    ref = frame[frame["kernel"] == "fp32 a += b (reference)"].set_index("threads")["gb_per_s"]
    frame["share_of_reference_bandwidth"] = frame["gb_per_s"] / frame["threads"].map(ref)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "host_kernels.csv")
    write_json_atomic(args.out / "host_kernels.json",
                      {"provenance": provenance(argv, "python bench/host_kernels.py"),
                       "rows": frame.to_dict("records")})
    print(frame[["threads", "kernel", "best_s", "gb_per_s",
                 "share_of_reference_bandwidth"]].to_string(index=False))
    print(f"wrote {args.out}/host_kernels.csv, host_kernels.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
