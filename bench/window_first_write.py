"""ZenFlow's host window with and without its zeroing pass, side by side (issue 45 item 1).

    python bench/window_first_write.py [--elems 54079488] [--update-interval 4]
        [--grad-dtypes fp32,bf16] [--threads 1] [--rounds 7] [--out DIR]

One window of the engine's host work on a shard of `--elems` parameters (default
bench/vs_deepspeed.py's opt-350m[2L]), with the engine's kernels (`zfbench.real.kernels`)
and host chunks (`ENGINE_HOST_CHUNK_ELEMS`), two ways, alternated round by round (the
order swapped every round):

- `zeroed` (the engine before): U accumulations that add into the window, then AdamW
  chunk by chunk zeroing the window chunk it read (`host_adamw_(..., zero_grad=True)`);
- `first_write` (the engine now): the window's first accumulation writes it
  (`accumulate_(..., fresh=True)`), U - 1 add, then AdamW chunk by chunk, no zeroing.

Each window is timed in the process's CPU seconds (`resource.getrusage`; the work runs on
this thread and its torch threads only) and in the wall clock; after the last round both
ways' windows, master and moments are compared bit for bit. Writes
DIR/<date>_<time>.csv (one row per round and way) and .json (the medians, the machine,
the load averages before and after).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.strategies import ENGINE_HOST_CHUNK_ELEMS  # noqa: E402
from zfbench.real import host_fused, kernels  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
HYPER = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Window:
    """One way's buffers: the fp32 window, master and moments, the landed gradients."""

    def __init__(self, n: int, grads: list[torch.Tensor]) -> None:
        gen = torch.Generator().manual_seed(25)
        self.window = torch.zeros(n)
        self.p = torch.randn(n, generator=gen)
        self.m, self.v = torch.zeros(n), torch.zeros(n)
        self.grads = grads
        self.chunks = [(a, min(a + ENGINE_HOST_CHUNK_ELEMS, n))
                       for a in range(0, n, ENGINE_HOST_CHUNK_ELEMS)]
        self.step = 0

    def run(self, first_write: bool) -> None:
        u = len(self.grads)
        for i, g in enumerate(self.grads):
            kernels.accumulate_(self.window, g, 1.0 / u, fresh=first_write and i == 0)
        self.step += 1
        w, p, m, v = self.window, self.p, self.m, self.v
        for a, b in self.chunks:
            kernels.host_adamw_(p[a:b], w[a:b], m[a:b], v[a:b], None, step=self.step,
                                zero_grad=not first_write, **HYPER)


def measure(n: int, u: int, dtype: torch.dtype, rounds: int) -> tuple[list[dict], bool]:
    gen = torch.Generator().manual_seed(45)
    grads = [(torch.randn(n, generator=gen) * 1e-3).to(dtype) for _ in range(u)]
    ways = {"zeroed": Window(n, grads), "first_write": Window(n, grads)}
    for name, w in ways.items():  # each once before it is timed
        w.run(name == "first_write")
    rows = []
    for r in progress(range(rounds), desc=f"{n} elems, {dtype}"):
        order = list(ways) if r % 2 == 0 else list(ways)[::-1]
        for name in order:
            c0, t0 = cpu_s(), time.perf_counter()
            ways[name].run(name == "first_write")
            rows.append({"grad_dtype": str(dtype).removeprefix("torch."), "round": r,
                         "way": name, "cpu_s": cpu_s() - c0,
                         "wall_s": time.perf_counter() - t0, "load1": os.getloadavg()[0]})
    a, b = ways["zeroed"], ways["first_write"]
    # the window: zeroed after its update, or left as it was (never read again before
    # the next window's first accumulation writes it); compare what the update read
    same = all(torch.equal(x.view(torch.int32), y.view(torch.int32))
               for x, y in ((a.p, b.p), (a.m, b.m), (a.v, b.v)))
    return rows, same


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--elems", type=int, default=54079488)
    ap.add_argument("--update-interval", type=int, default=4)
    ap.add_argument("--grad-dtypes", default="fp32,bf16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "window_first_write"))
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.grad_dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or args.elems < 1 or args.update_interval < 1 or args.threads < 1 \
            or args.rounds < 1:
        ap.error(f"--grad-dtypes takes {', '.join(DTYPES)} (got {bad}); --elems, "
                 f"--update-interval, --threads and --rounds must be >= 1")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows, equal = [], {}
    for d in dtypes:
        got, equal[d] = measure(args.elems, args.update_interval, DTYPES[d], args.rounds)
        rows += got
    load_after = os.getloadavg()
    summary = {}
    for d in dtypes:
        part = [r for r in rows if r["grad_dtype"] == str(DTYPES[d]).removeprefix("torch.")]
        med = {w: {k: statistics.median(r[k] for r in part if r["way"] == w)
                   for k in ("cpu_s", "wall_s")} for w in ("zeroed", "first_write")}
        summary[d] = {"median_per_window": med, "bits_equal": equal[d],
                      "first_write_over_zeroed_cpu": med["first_write"]["cpu_s"]
                      / med["zeroed"]["cpu_s"]}
        print(f"{d}: CPU s a window zeroed {med['zeroed']['cpu_s']:.4f}, first write "
              f"{med['first_write']['cpu_s']:.4f} "
              f"({summary[d]['first_write_over_zeroed_cpu']:.3f}x); wall "
              f"{med['zeroed']['wall_s']:.4f} / {med['first_write']['wall_s']:.4f}; "
              f"bits equal {equal[d]}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d_%H%M")
    with open(stem.with_suffix(".csv"), "w") as f:
        f.write("grad_dtype,round,way,cpu_s,wall_s,load1\n")
        for r in rows:
            f.write(f"{r['grad_dtype']},{r['round']},{r['way']},{r['cpu_s']:.6f},"
                    f"{r['wall_s']:.6f},{r['load1']:.2f}\n")
    stem.with_suffix(".json").write_text(json.dumps({
        "args": vars(args), "summary": summary, "load_before": load_before,
        "load_after": load_after, "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(), "torch": torch.__version__,
        "host_kernels": host_fused.status()}, indent=1, default=str))
    print(f"wrote {stem}.csv, .json")
    return 0 if all(equal.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
