"""The engine's `device` step on the CPU lanes op by op, at a model's shapes: each way of
writing a weight gradient, and each pass the step makes over the whole gradient buffer.

Covers: issue 45 item 3 (the device step near plain PyTorch's): what bench/reference_step.py's
profiles show as `addmm_`, `mm`, `sum` and the fused AdamW, isolated. Scenario: one model's
distinct linear matrices (the decoder layer's and the head's, model slices as
zfbench.core.models names them), `--tokens` rows of synthetic activations, fp32, on
`--threads` torch threads (1: the engine's device lane on 2 cores). Variants per matrix:

    engine_addmm_      the engine's path (real/inplace_grads.py): `addmm_` into its
                       column-major slot of one flat buffer (beta 1: the slot is read)
    engine_mm_out      the first write after the engine zeroed its gradients: `mm` into
                       the same slot (beta 0)
    rowmajor_addmm_    `addmm_` into a row-major slot
    autograd_mm        autograd's MmBackward: `mm` into a fresh tensor (plain PyTorch)

and per step, over a flat buffer of the layer's and head's elements: `all_finite` (the
non-finite check, one sum), `zero_` (the engine's zeroing), torch's fused AdamW
(`adamw_foreach_`) and `host_adamw_` with the zeroing in its pass. Times are the calling
thread's CPU seconds (steadier than wall time on a shared machine) and wall seconds,
medians over --repeats rounds, the variants interleaved in each round.

    python bench/device_step_ops.py [--model "tinyllama-1.1b[1L]"] [--tokens 64]
        [--threads 1] [--repeats 7] [--out DIR]

Writes DIR/device_step_ops.csv (a row per op and matrix: cpu_s, wall_s, GFLOP/s or GB/s)
and device_step_ops.json (the rows and the machine).
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
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real import kernels  # noqa: E402

GEMMS = ("engine_addmm_", "engine_mm_out", "rowmajor_addmm_", "autograd_mm")
PASSES = ("all_finite", "zero_", "adamw_foreach_", "host_adamw_zero_grad")


def matrices(model: str) -> list[tuple[str, int, int]]:
    """(name, out, in) of each linear matrix of one decoder layer and the head."""
    s = get_model(model)
    kv = s.kv_heads * (s.hidden // s.heads)
    return [("q_proj", s.hidden, s.hidden), ("k_proj", kv, s.hidden),
            ("v_proj", kv, s.hidden), ("o_proj", s.hidden, s.hidden),
            ("gate_proj", s.intermediate, s.hidden), ("up_proj", s.intermediate, s.hidden),
            ("down_proj", s.hidden, s.intermediate), ("lm_head", s.vocab, s.hidden)]


def timed(fn) -> tuple[float, float]:
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    return time.thread_time() - c0, time.perf_counter() - w0


def gemm_ops(mats, tokens: int) -> dict[tuple[str, str], object]:
    total = sum(o * i for _, o, i in mats)
    col, row = torch.zeros(total), torch.zeros(total)
    gen = torch.Generator().manual_seed(0)
    ops, off = {}, 0
    for name, o, i in mats:
        c = col[off:off + o * i].view(i, o).t()  # the engine's column-major [o, i] slot
        r = row[off:off + o * i].view(o, i)
        off += o * i
        x, g = torch.randn(tokens, i, generator=gen), torch.randn(tokens, o, generator=gen)
        ops[("engine_addmm_", name)] = lambda c=c, x=x, g=g: c.t().addmm_(x.t(), g)
        ops[("engine_mm_out", name)] = lambda c=c, x=x, g=g: torch.mm(x.t(), g, out=c.t())
        ops[("rowmajor_addmm_", name)] = lambda r=r, x=x, g=g: r.addmm_(g.t(), x)
        ops[("autograd_mm", name)] = lambda x=x, g=g: g.t().mm(x)
    return ops


def pass_ops(total: int) -> dict[tuple[str, str], object]:
    p, g, m, v = (torch.randn(total) * 1e-3 for _ in range(4))
    v.abs_()
    hyper = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
    return {("all_finite", "all"): lambda: bool(kernels.all_finite(g)),
            ("zero_", "all"): lambda: kernels.zero_(g),
            ("adamw_foreach_", "all"): lambda: kernels.adamw_foreach_(
                [p], [g], [m], [v], [1], **hyper),
            ("host_adamw_zero_grad", "all"): lambda: kernels.host_adamw_(
                p, g, m, v, step=1, zero_grad=True, **hyper)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--model", default="tinyllama-1.1b[1L]")
    ap.add_argument("--tokens", type=int, default=64, help="rows of a micro-batch (batch x seq)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "reference_step_cpu")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.threads < 1 or args.repeats < 2:
        ap.error("--tokens and --threads must be >= 1 and --repeats >= 2")
    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run(args, argv)
    finally:
        torch.set_num_threads(before)


def run(args, argv) -> int:
    mats = matrices(args.model)
    total = sum(o * i for _, o, i in mats)
    ops = {**gemm_ops(mats, args.tokens), **pass_ops(total)}
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {k: [] for k in ops}
    for r in range(args.repeats + 1):  # round 0 warms up
        for key, fn in ops.items():
            t = timed(fn)
            if r:
                samples[key].append(t)
    shapes = {name: (o, i) for name, o, i in mats}
    rows = []
    for (op, name), ts in samples.items():
        cpu = statistics.median(t[0] for t in ts)
        row = {"op": op, "matrix": name, "tokens": args.tokens, "threads": args.threads,
               "cpu_s": cpu, "wall_s": statistics.median(t[1] for t in ts)}
        if name in shapes:
            o, i = shapes[name]
            row["gflop_per_cpu_s"] = 2 * args.tokens * o * i / cpu / 1e9
        else:
            row["elems"] = total
        rows.append(row)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, args.out / "device_step_ops.csv")
    write_json_atomic(args.out / "device_step_ops.json",
                      {"rows": rows, "provenance": provenance(argv, "bench/device_step_ops.py")})
    sums = frame.groupby("op", sort=False)[["cpu_s", "wall_s"]].sum()
    print(f"{args.model}, {args.tokens} tokens, {args.threads} thread(s); seconds per step "
          f"(weight-gradient GEMMs: all matrices; passes: {total / 1e6:.0f}M elements):")
    print(sums.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
