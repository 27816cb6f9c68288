"""DeepSpeed's ZenFlow window end, its one large copy, timed part by part (issue 44/45).

    python bench/ds_window_copy.py [--elems N] [--repeats 3] --out DIR
    python bench/ds_window_copy.py --device cpu --elems 1000000 --out DIR   # the same on a CPU

On one H200 (bench/results/gpu/NVIDIA-H200/2026-11-28, call2/deepspeed_side) DeepSpeed
0.19.5's overlapped ZenFlow spent 0.84-2.28 s of every window end in
`optimizer_transmit_time`: one blocking `bit16_partition.copy_(fp32_partition)`, the fp32
master in host memory into the 16-bit weights on the GPU. The simulator ships that update
as 16-bit at the link's rate and predicts DeepSpeed's ZenFlow 50% too fast. This times the
copy as DeepSpeed runs it and the parts it may be made of, on buffers of `--elems`
(default qwen2.5-1.5b's parameters), so the simulator can cost it from measured parts:

- `deepspeed_copy`: `dst16.copy_(src32)` from pageable memory, blocking (DeepSpeed's line);
- `deepspeed_copy_shared`: the same from shared memory (`share_memory_()`), the memory
  DeepSpeed's fp32 snapshot (`stale_param`) lives in, never page-locked;
- `deepspeed_copy_pinned`: the same from page-locked memory;
- `convert_on_host_fresh`: `src32.to(bf16)` on the host into a new tensor;
- `convert_on_host_into`: the same conversion into a buffer reused across repeats;
- `upload16_pageable`: the converted 16-bit tensor copied up from pageable memory;
- `upload16_pinned`: a page-locked 16-bit tensor copied up (what zfbench's engine ships);
- `upload32_then_convert`: the fp32 master copied up from page-locked memory, then
  converted on the device.

The simulator (zfbench.sims.window_copy) assumes `deepspeed_copy` = `convert_on_host_into`
(at the host's CPU-Adam streaming rate) followed by `upload16_pageable` (at the lesser of
the link's and the driver's staging copy's rate): PyTorch converts a blocking CPU -> CUDA
copy on the host, into a fresh pageable temporary, then copies it up. What `deepspeed_copy`
takes beyond those two is unmodelled: `convert_on_host_fresh` minus `convert_on_host_into`
is the fresh temporary's page faults; `deepspeed_copy_shared` against `deepspeed_copy`
says whether shared memory changes the upload.

Each case is timed between device synchronisations (median over `--repeats` after one
untimed run). Writes DIR/ds_window_copy.csv (case, seconds, G elements/s, GB/s over the
bytes that cross the link) and .json (the rows, the machine, the GPU, torch).
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

from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402

DEFAULT_MODEL = "qwen2.5-1.5b"  # the model of the run whose window end this times


def timed(fn, sync, repeats: int) -> float:
    """Median seconds of `fn` between synchronisations, after one untimed run."""
    fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cases(n: int, device: torch.device) -> dict[str, tuple]:
    """name -> (function, bytes that cross the link), on buffers of `n` elements."""
    cuda = device.type == "cuda"
    src32 = torch.randn(n, dtype=torch.float32)
    dst16 = torch.empty(n, dtype=torch.bfloat16, device=device)
    src32_pinned = src32.pin_memory() if cuda else src32.clone()
    src32_shared = src32.clone().share_memory_()
    src16 = src32.to(torch.bfloat16)
    src16_pinned = src16.pin_memory() if cuda else src16.clone()
    into16 = torch.empty(n, dtype=torch.bfloat16)
    tmp32 = torch.empty(n, dtype=torch.float32, device=device)
    return {
        "deepspeed_copy": (lambda: dst16.copy_(src32), 2 * n),
        "deepspeed_copy_shared": (lambda: dst16.copy_(src32_shared), 2 * n),
        "deepspeed_copy_pinned": (lambda: dst16.copy_(src32_pinned), 2 * n),
        "convert_on_host_fresh": (lambda: src32.to(torch.bfloat16), 0),
        "convert_on_host_into": (lambda: into16.copy_(src32), 0),
        "upload16_pageable": (lambda: dst16.copy_(src16), 2 * n),
        "upload16_pinned": (lambda: dst16.copy_(src16_pinned, non_blocking=True), 2 * n),
        "upload32_then_convert": (lambda: dst16.copy_(tmp32.copy_(src32_pinned,
                                                                  non_blocking=True)), 4 * n),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--elems", type=int, default=get_model(DEFAULT_MODEL).total_params,
                    help=f"default: {DEFAULT_MODEL}'s parameters")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.elems <= 0 or args.repeats <= 0:
        ap.error("--elems and --repeats must be positive")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device here (--device cpu runs the same "
                 "cases on the CPU)")
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for name, (fn, link_bytes) in progress(list(cases(args.elems, device).items()),
                                           desc="copy"):
        s = timed(fn, sync, args.repeats)
        rows.append({"case": name, "elems": args.elems, "seconds": s,
                     "g_elems_per_s": args.elems / s / 1e9,
                     "link_bytes": link_bytes, "link_gb_per_s": link_bytes / s / 1e9})
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    write_csv_atomic(frame, args.out / "ds_window_copy.csv")
    write_json_atomic(args.out / "ds_window_copy.json", {
        "rows": rows, "machine": machine(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads()})
    print(frame.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    print(f"wrote {args.out}/ds_window_copy.csv and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
