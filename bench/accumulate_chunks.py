"""Host gradient accumulation (`window += alpha * grads`, bf16 into fp32) by chunking,
side by side in one process: torch's mixed-dtype `add_`, `accumulate_` with one fixed
CHUNK_ELEMS chunk shared by all threads (before session 12), `accumulate_` with
CHUNK_ELEMS per thread (now), and the same-dtype fp32 `add_` as the roofline.

    python bench/accumulate_chunks.py [--elems 256M] [--threads 1,2] [--repeats 5] [--out DIR]

Writes DIR/accumulate_chunks.json (rows, best of the repeats, and the machine). The H200
host's numbers (8 and 16 threads) are bench/results/gpu/NVIDIA-H200/after_fixes/.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_json_atomic  # noqa: E402
from zfbench.real.host_accum import CHUNK_ELEMS, accumulate_  # noqa: E402


def elems_of(text: str) -> int:
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--elems", default="256M")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    n = elems_of(args.elems)
    window, grads = torch.zeros(n), torch.randn(n).bfloat16()
    same = grads.float()
    rows = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for name, fn in (("same-dtype add_ (roofline)", lambda: window.add_(same)),
                         ("mixed-dtype add_", lambda: window.add_(grads)),
                         ("accumulate_, one fixed chunk (before)",
                          lambda: accumulate_(window, grads, chunk_elems=CHUNK_ELEMS)),
                         ("accumulate_, a chunk per thread (now)",
                          lambda: accumulate_(window, grads))):
            fn()
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            rows.append({"threads": threads, "kernel": name, "elems": n,
                         "best_s": min(times), "g_elems_per_s": n / min(times) / 1e9})
            print(f"{threads:>2} threads  {name:<40} {rows[-1]['g_elems_per_s']:6.2f} G/s")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "accumulate_chunks.json",
                      {"provenance": provenance(argv, "bench/accumulate_chunks.py"),
                       "rows": rows})
    print(f"wrote {args.out}/accumulate_chunks.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
