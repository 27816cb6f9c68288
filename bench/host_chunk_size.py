"""The engine's host chunk against its size: what cutting the host AdamW into chunks costs.

    python bench/host_chunk_size.py [--elems 96M] [--threads 1,2] [--chunks 1M,4M,16M,64M]
        [--repeats 5] [--out bench/results/host_chunk_size]

The engine runs its host AdamW in chunks (zfbench.core.strategies `engine_host_chunk_elems`:
4M elements, 2M a host thread from three threads on): each chunk one call of
`kernels.host_adamw_` (one OpenMP parallel region of the host lane's threads), its
parameters written into the 16-bit wire
in the same pass, so that each chunk's upload can start when it is ready and an urgent
accumulation can run between two chunks. On one H200's host (8 threads, bench/results/gpu/
NVIDIA-H200/2026-11-27/call2/contention) the engine's chunks with the bf16 wire ran at
0.76-0.83 of AdamW alone over the whole buffer without a wire; the wire's 2 more bytes per
parameter (30 against 28) explain 0.93 of it. This separates the rest: on a worker thread
with the given torch threads (as the host lane runs, `zfbench.real.rate_probe.in_thread`),
round-robin so a drifting machine reaches every variant alike, it times

- `whole`: AdamW over the whole buffer in one call, no wire (the probe's "AdamW alone");
- `whole_wire`: the same writing the bf16 wire (the chunk's bytes, no chunking);
- `chunks_<size>`: the engine's chunk loop with the wire, at each `--chunks` size;
- `chunks_nowire_4M`: the engine's chunking without the wire.

Rates are G parameters per second (median of `--repeats`), each also over `whole`; the
chunking's cost per call is (chunked - whole_wire) seconds over the number of chunks.
Writes DIR/host_chunk_size.csv and .json (the machine: CPU model, flags, cores, torch;
the load before and after). CPU only (the host kernels): runs on a GPU's host as anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from kernels import parse_size, write_rows  # noqa: E402  (bench/kernels.py)
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.strategies import (ENGINE_HOST_CHUNK_ELEMS, chunk_bounds,  # noqa: E402
                                     engine_host_chunk_elems)
from zfbench.real import kernels  # noqa: E402
from zfbench.real.rate_probe import in_thread, round_robin_times  # noqa: E402

HP = dict(step=3, lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def chunk_loop(bufs, wire, size: int):
    """The engine's host update (real/strategies.py `HostState.adam_chunk`, chunk by
    chunk), over `bufs` = (master, grad, m, v), into `wire` (or none)."""
    p, g, m, v = bufs
    bounds = chunk_bounds(p.numel(), size)

    def run():
        for a, b in bounds:
            kernels.host_adamw_(p[a:b], g[a:b], m[a:b], v[a:b],
                                None if wire is None else wire[a:b], **HP)
    return run, len(bounds)


def variants(bufs, wire, sizes: list[int]) -> dict[str, tuple]:
    """name -> (callable, calls per run)."""
    out = {"whole": chunk_loop(bufs, None, bufs[0].numel()),
           "whole_wire": chunk_loop(bufs, wire, bufs[0].numel())}
    for size in sizes:
        out[f"chunks_{label(size)}"] = chunk_loop(bufs, wire, size)
    out[f"chunks_nowire_{label(ENGINE_HOST_CHUNK_ELEMS)}"] = chunk_loop(
        bufs, None, ENGINE_HOST_CHUNK_ELEMS)
    return out


def label(elems: int) -> str:
    return f"{elems >> 20}M" if elems % (1 << 20) == 0 else str(elems)


def rows_for(threads: int, n: int, cases: dict, times: dict) -> list[dict]:
    whole = statistics.median(times["whole"])
    whole_wire = statistics.median(times["whole_wire"])
    rows = []
    for name, (_, calls) in cases.items():
        med = statistics.median(times[name])
        base = whole if "nowire" in name or name == "whole" else whole_wire
        rows.append({"threads": threads, "variant": name, "elems": n, "calls": calls,
                     "median_s": med, "best_s": min(times[name]),
                     "g_params_per_s": n / med / 1e9, "over_whole": whole / med,
                     "per_call_overhead_us": (max(0.0, med - base) / calls * 1e6
                                              if calls > 1 else 0.0)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--elems", default="96M", help="parameters of the flat buffer")
    ap.add_argument("--threads", default="1,2", help="the host lane's torch threads, a list")
    ap.add_argument("--chunks", default="1M,4M,16M,64M", help="chunk sizes, a list")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_chunk_size")
    args = ap.parse_args(argv)
    n = parse_size(args.elems)
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
        sizes = [parse_size(c) for c in args.chunks.split(",") if c.strip()]
    except ValueError:
        ap.error("--threads and --chunks are comma lists of integers (sizes may end in K, M, G)")
    if n < 1 or not threads or min(threads) < 1 or not sizes or min(sizes) < 1:
        ap.error("--elems, every --threads and every --chunks must be at least 1")
    gen = torch.Generator().manual_seed(0)
    bufs = (torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 1e-3,
            torch.zeros(n), torch.zeros(n))
    wire = torch.empty(n, dtype=torch.bfloat16)
    cases = variants(bufs, wire, sizes)
    load = {"before": os.getloadavg()}
    rows = []
    for t in threads:
        times = in_thread(lambda: round_robin_times(
            {k: fn for k, (fn, _) in cases.items()}, args.repeats), t)
        rows += rows_for(t, n, cases, times)
        got = {r["variant"]: r for r in rows if r["threads"] == t}
        print(f"{t} thread(s): " + ", ".join(
            f"{k} {r['g_params_per_s']:.2f} G/s ({r['over_whole']:.2f})"
            for k, r in got.items()), flush=True)
    load["after"] = os.getloadavg()
    write_rows(args.out, "host_chunk_size", rows,
               provenance(argv, "python bench/host_chunk_size.py"), load,
               engine_chunk_elems={t: engine_host_chunk_elems(t) for t in threads})
    print(f"wrote {args.out}/host_chunk_size.csv, host_chunk_size.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
