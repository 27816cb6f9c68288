"""Every element-wise kernel the engine's strategies run, per dtype, beside the machine's
own memory bandwidth measured in the same run.

    python bench/kernels.py [--elems 16M] [--repeats 5] [--threads 1,2] [--out DIR]
        [--dtypes fp32,bf16,fp16]

(`--dtypes` keeps the run to some device dtypes: at sizes past the last-level cache the
buffers of all three take about 20 GB at 128M elements.)

What it times: the engine's own functions (`zfbench.real.kernels`, the attributes the
strategies call; tests/test_kernel_identity.py checks the calibration probe calls the
same ones), on the engine's layouts (2-D weights stored column by column), for device
weights and gradients in fp32, bf16 and fp16 with the host master in fp32 (the dtype
combinations the engine runs). Each row names the kernel, the strategies and lane that
run it, the dtypes, the path (`cpp`: real/host_fused.cpp's one pass; `torch`: torch's
ops), the elements, the bytes it must move (at least: each input read once, each output
written once; temporaries a kernel makes are its own cost, so they show up as a lower
share), best and median seconds, G elements/s, GB/s, and GB/s as a share of the
machine's bandwidth: the best GB/s of four streaming references measured round-robin
with the rest at the same thread count (`fp32 a += b`, 12 B per element; `a += b c`,
16 B; `a = b + s c`, 12 B; `a = b`, 8 B; the write-allocate reads of the last two not
counted, as STREAM does not). Shares above 1 mean the kernel streams faster than these
references reach on the machine (e.g. more streams per core in flight). The kernels that
only read (the norms, `all_finite`, `column_scores`) are also given as a share of the read
bandwidth: the best of two read-only references in the same round-robin (`a.sum()`, 4 B
per element; `dot(a, b)`, 8 B), since one core may read alone well below the rate it
streams reads and writes together. Bytes per element (s: the device dtype's size, 2 or 4):

    host_adamw_            28        p, g, m, v read; p, m, v written (fp32)
      + h2d wire           28 + s    the new parameters also written in the device dtype
      + zero window        +4        the gradient written with zeros (ZenFlow's window
                                     before its first accumulation wrote it, issue 45)
    adamw_foreach_         28        the same on the device (fp32 master or selected values)
    accumulate_            8 + s     fp32 window read and written, gradients read
      (a window's first)   4 + s     fp32 window written, not read; gradients read
    copy_ (conversions)    4 + s     one read, one write, in the two dtypes
    copy_ (same dtype)     2 s       an upload applied; the emulated link copies
    sum_of_squares         4         one read (the host clip's norm, fp32)
    grad_norm, all_finite  s         one read
    zero_, mul_ (scale)    s, 2 s    Tensor.zero_ / mul_ inline in the engine
    column_scores          s         per 2-D gradient element (one read)
    top_columns            4         per column (its scores read)
    gather_grads_          s + 4     per selected element: gradient read, fp32 written
    scatter_               4 + s     per selected element: fp32 read, weight written
Reference rows, the paths the fused kernels replace (issue 45), with the same bytes:
the host chunk as torch's ops (real/host_adam.host_adamw_, then `copy_` into the wire,
then `zero_`: two or three passes), the accumulation as real/host_accum.accumulate_
(converted chunk by chunk into a scratch), the conversions as torch's `Tensor.copy_`,
and torch's own mixed-dtype `window.add_`.
Writes DIR/kernels.csv and kernels.json (with the machine: CPU model, ISA flags, cores,
torch version, and the fused kernels' build).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.config_zenflow import DEFAULT_TOPK_RATIO  # noqa: E402
from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.schedule import topk_count  # noqa: E402
from zfbench.core.trace import write_csv_atomic, write_json_atomic  # noqa: E402
from zfbench.real import host_fused  # noqa: E402
from zfbench.real import kernels as K  # noqa: E402
from zfbench.real.host_accum import accumulate_ as torch_accumulate_  # noqa: E402
from zfbench.real.rate_probe import round_robin_times  # noqa: E402
from zfbench.real.host_adam import host_adamw_ as torch_host_adamw_  # noqa: E402
from zfbench.real.flat import selected_shape, take_columns  # noqa: E402

NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
OFFLOAD = "zero-offload, zero-offload-dpu, zenflow"
ALL = "device, " + OFFLOAD
# the streaming references: (row name, bytes per element); the bandwidth is their best
REFERENCES = (("fp32 a += b (bandwidth)", 12), ("fp32 a += b c (bandwidth)", 16),
              ("fp32 a = b + s c (bandwidth)", 12), ("fp32 a = b (bandwidth)", 8))
# the read-only references: the read bandwidth, their best, which the kernels that write
# nothing of their input's size are also held to (one core may read alone far slower than
# it streams reads and writes together: 34-40 GB/s against 59 on a 2-core EPYC Zen 5)
READ_REFERENCES = (("fp32 a.sum() (read bandwidth)", 4),
                   ("fp32 dot(a, b) (read bandwidth)", 8))
HP = dict(lr=1e-4, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01)
ROWS = 4096  # rows of the 2-D weight the column kernels work on (e.g. a 7B model's hidden)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if text[-1:] in "KMG" else text) * mult)


class Table:
    """name -> (function, elements, bytes per element, row description)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple] = {}

    def add(self, kernel: str, fn, elems: int, per_elem: float, strategies: str, lane: str,
            dtypes: str, function: str, path: str = "torch", reads_only: bool = False) -> None:
        key = f"{kernel} [{dtypes}]"
        self.rows[key] = (fn, elems, per_elem, {
            "kernel": kernel, "function": function, "path": path, "strategies": strategies,
            "lane": lane, "dtypes": dtypes, "elems": elems, "bytes_per_elem": per_elem,
            "bytes": elems * per_elem, "reads_only": reads_only})


def host_rows(t: Table, n: int) -> None:
    """The streaming references, the fp32 host kernels and the device's fp32 AdamW over a
    flat buffer."""
    a, b, c = torch.zeros(n), torch.randn(n) * 1e-3, torch.randn(n)
    (add, add_b), (fma, fma_b), (triad, triad_b), (copy, copy_b) = REFERENCES
    t.add(add, lambda: a.add_(b), n, add_b, "-", "-", "fp32 += fp32", "Tensor.add_")
    t.add(fma, lambda: a.addcmul_(b, c), n, fma_b, "-", "-", "fp32 += fp32 * fp32",
          "Tensor.addcmul_")
    t.add(triad, lambda: torch.add(b, c, alpha=0.5, out=a), n, triad_b, "-", "-",
          "fp32 = fp32 + s fp32", "torch.add(out=)")
    t.add(copy, lambda: a.copy_(c), n, copy_b, "-", "-", "fp32 = fp32", "Tensor.copy_")
    dp, dm, dv, ds = torch.randn(n), torch.zeros(n), torch.zeros(n), torch.zeros(n)
    g = torch.randn(n) * 1e-3
    t.add("adamw_foreach_ (whole model)",
          lambda: K.adamw_foreach_([dp], [g], [dm], [dv], [1], scratch=[ds], **HP),
          n, 28, "device", "compute", "fp32 master, grads, m, v", "real.adamw.adamw_foreach_")
    (total, total_b), (dot, dot_b) = READ_REFERENCES
    t.add(total, lambda: c.sum(), n, total_b, "-", "-", "fp32", "Tensor.sum", reads_only=True)
    t.add(dot, lambda: torch.dot(b, c), n, dot_b, "-", "-", "fp32 . fp32", "torch.dot",
          reads_only=True)
    t.add("sum_of_squares (host clip)", lambda: K.sum_of_squares(g), n, 4,
          OFFLOAD + " (clipping)", "host", "fp32", "real.kernels.sum_of_squares",
          host_fused.backend(), reads_only=True)
    t.add("vector_norm fp32 (reference: the host clip before)",
          lambda: torch.linalg.vector_norm(g), n, 4, "- (replaced by sum_of_squares)",
          "host", "fp32", "torch.linalg.vector_norm", reads_only=True)
    t.add("mul_ (scale)", lambda: g.mul_(1.0), n, 8,
          OFFLOAD + " (clip scale, zenflow 1/U)", "host", "fp32", "Tensor.mul_ (inline)")


def host_chunk_rows(t: Table, n: int, dtype: torch.dtype) -> None:
    """The host chunk (`host_adamw_`) as the engine runs it with `dtype` weights (the new
    parameters into the h2d wire unless fp32), without and with ZenFlow's zeroing, and
    the torch ops it replaces beside it."""
    s, d = torch.tensor([], dtype=dtype).element_size(), NAME[dtype]
    low = dtype != torch.float32
    p, g, m, v = torch.randn(n), torch.randn(n) * 1e-3, torch.zeros(n), torch.zeros(n)
    wire = torch.empty(n, dtype=dtype) if low else None
    per = 28 + (s if low else 0)
    into = f" -> {d} h2d wire" if low else ""
    fused = host_fused.backend()
    for zero in (False, True):
        what = "host_adamw_" + (" + zero window" if zero else "")
        who = ("- (zenflow's window before: its first accumulation writes it now)" if zero
               else OFFLOAD)

        def run(zero=zero):
            K.host_adamw_(p, g, m, v, wire, step=1, zero_grad=zero, **HP)

        def before(zero=zero):
            torch_host_adamw_(p, g, m, v, step=1, **HP)
            if low:
                wire.copy_(p)
            if zero:
                g.zero_()
        dtypes = f"fp32 master, grads, m, v{into}"
        t.add(what, run, n, per + 4 * zero, who, "host", dtypes,
              "real.host_fused.host_adamw_", fused)
        passes = 1 + low + zero
        t.add(f"{what}: torch ops, {passes} pass{'es' if passes > 1 else ''} (before)",
              before, n, per + 4 * zero, "- (replaced by host_adamw_)", "host", dtypes,
              "host_adam.host_adamw_" + (" + copy_" if low else "") + (" + zero_" if zero
                                                                      else ""))


def dtype_rows(t: Table, n: int, dtype: torch.dtype, ratio: float) -> None:
    """The kernels whose dtypes follow the device's: conversions, accumulation, the device
    lane's per-step kernels and ZenFlow's column kernels."""
    s, d = torch.tensor([], dtype=dtype).element_size(), NAME[dtype]
    fp32 = torch.randn(n) * 1e-3
    window, wire, flat = torch.zeros(n), fp32.to(dtype), fp32.to(dtype)
    low = dtype != torch.float32
    host_chunk_rows(t, n, dtype)
    t.add("accumulate_", lambda: K.accumulate_(window, wire, 0.25), n, 8 + s, "zenflow",
          "host", f"fp32 += {d}", "real.host_fused.accumulate_", host_fused.backend())
    t.add("accumulate_ (a window's first)",
          lambda: K.accumulate_(window, wire, 0.25, fresh=True), n, 4 + s, "zenflow",
          "host", f"fp32 = {d}", "real.host_fused.accumulate_", host_fused.backend())
    t.add("accumulate_: torch ops (before)", lambda: torch_accumulate_(window, wire, 0.25),
          n, 8 + s, "- (replaced by accumulate_)", "host", f"fp32 += {d}",
          "real.host_accum.accumulate_")
    if low:
        t.add("add_ mixed dtype (reference: the slow path)",
              lambda: window.add_(wire, alpha=0.25), n, 8 + s, "- (replaced by accumulate_)",
              "host", f"fp32 += {d}", "Tensor.add_")
        t.add("copy_ (grads out of the d2h wire)", lambda: K.copy_(fp32, wire), n, 4 + s,
              "zero-offload, zero-offload-dpu, zenflow warm-up (host); device (compute)",
              "host / compute", f"{d} -> fp32",
              "real.kernels.copy_", host_fused.backend())
        h2d = torch.empty(n, dtype=dtype)
        t.add("copy_ (master write-back)", lambda: K.copy_(h2d, fp32), n, 4 + s,
              "device (compute); the host chunk's wire before issue 45", "compute",
              f"fp32 -> {d}", "real.kernels.copy_", host_fused.backend())
        t.add("copy_: torch ops (before)", lambda: wire.copy_(fp32), n, 4 + s,
              "- (replaced by copy_)", "host / compute", f"fp32 -> {d}", "Tensor.copy_")
        t.add("copy_: torch ops (before)", lambda: fp32.copy_(wire), n, 4 + s,
              "- (replaced by copy_)", "host / compute", f"{d} -> fp32", "Tensor.copy_")
    other = torch.empty_like(flat)
    t.add("copy_ (same dtype)", lambda: K.copy_(other, flat), n, 2 * s,
          "zero-offload-dpu, zenflow (upload applied); link copies", "compute / d2h / h2d",
          f"{d} -> {d}", "real.kernels.copy_")
    t.add("all_finite", lambda: K.all_finite(flat), n, s, ALL, "compute", d,
          "real.kernels.all_finite", reads_only=True)
    zeros = torch.zeros_like(flat)
    t.add("zero_ (grads)", lambda: zeros.zero_(), n, s, ALL, "compute", d,
          "Tensor.zero_ (Engine._zero_grads)")
    if low:
        scratch = torch.empty(n)
        t.add("grad_norm (device clip)", lambda: K.grad_norm(flat, scratch), n, s,
              "device (clipping)", "compute", f"{d} via fp32 scratch",
              "real.kernels.grad_norm")
        t.add("vector_norm dtype=fp32 (reference: the slow path)",
              lambda: torch.linalg.vector_norm(flat, dtype=torch.float32), n, s,
              "- (replaced by grad_norm's scratch)", "compute", d, "torch.linalg.vector_norm",
              reads_only=True)
    if dtype == torch.float16:
        t.add("mul_ (loss-scale unscale)", lambda: zeros.mul_(1.0), n, 2 * s,
              ALL + " (fp16)", "compute", d, "Tensor.mul_ (inline)")
    # ZenFlow's column kernels on one 2-D weight stored column by column, as the engine
    cols = max(1, n // ROWS)
    storage = (torch.randn(cols, ROWS) * 1e-3).to(dtype)
    grad = storage.t()  # logical [rows, cols], column-major
    weight = storage.clone().t()
    k = topk_count(cols, ratio)
    scores = K.column_scores(grad)
    idx = K.top_columns(scores, k)
    shape = selected_shape(grad, k)
    out, values = torch.empty(shape), take_columns(weight, idx).float()
    staged = torch.empty(shape, dtype=dtype) if low else None
    sel = k * ROWS
    t.add("column_scores", lambda: K.column_scores(grad), cols * ROWS, s, "zenflow",
          "compute", f"{d} [{ROWS}x{cols}] -> fp32", "real.kernels.column_scores",
          reads_only=True)
    t.add("top_columns", lambda: K.top_columns(scores, k), cols, 4, "zenflow", "compute",
          f"fp32 [{cols}], k={k}", "real.kernels.top_columns")
    t.add("gather_grads_", lambda: K.gather_grads_(grad, idx, out, staged), sel, s + 4,
          "zenflow", "compute", f"{d} -> fp32, {ratio:g} of columns",
          "real.kernels.gather_grads_")
    t.add("scatter_", lambda: K.scatter_(weight, idx, values, staged), sel, 4 + s,
          "zenflow", "compute", f"fp32 -> {d}, {ratio:g} of columns", "real.kernels.scatter_")
    if dtype == torch.float32:  # the device AdamW on the selected values: always fp32
        vm, vv, vs = (torch.zeros(shape) for _ in range(3))
        t.add("adamw_foreach_ (selected columns)",
              lambda: K.adamw_foreach_([values], [out], [vm], [vv], [1], lr=1e-4,
                                       beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01,
                                       scratch=[vs]),
              sel, 28, "zenflow", "compute", f"fp32 [{k}x{ROWS}] values, grads, m, v",
              "real.adamw.adamw_foreach_")


def write_rows(out: Path, stem: str, rows: list[dict], prov: dict, load: dict,
               **extra) -> pd.DataFrame:
    """DIR/STEM.csv (the rows) and DIR/STEM.json (the provenance, the host kernels' build,
    the load averages, `extra`, the rows); returns the rows as a frame."""
    frame = pd.DataFrame(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_csv_atomic(frame, out / f"{stem}.csv")
    write_json_atomic(out / f"{stem}.json",
                      {"provenance": prov, "host_kernels": host_fused.status(), **extra,
                       "load_average_1_5_15_min": load, "rows": frame.to_dict("records")})
    return frame


def reference_rates(table: Table, times: dict, references) -> dict[str, float]:
    """Bytes per second of each of `references` ((row name, bytes per element)), at its
    best time."""
    return {desc["kernel"]: elems * per / min(times[key])
            for key, (_, elems, per, desc) in table.rows.items()
            if desc["kernel"] in dict(references)}


def measure(table: Table, repeats: int) -> dict[str, list[float]]:
    """Round-robin: every kernel once per round, so a noisy minute hits them all."""
    return round_robin_times({key: fn for key, (fn, *_) in table.rows.items()}, repeats)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--elems", default="16M", help="elements of each flat buffer")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--topk-ratio", type=float, default=DEFAULT_TOPK_RATIO)
    p.add_argument("--dtypes", default="fp32,bf16,fp16",
                   help="the device dtypes whose kernels run (the references always do)")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    n = parse_size(args.elems)
    by_name = {name: dtype for dtype, name in NAME.items()}
    chosen = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not chosen or set(chosen) - set(by_name):
        p.error(f"--dtypes {args.dtypes!r}: expected a comma list of {', '.join(by_name)}")
    table = Table()
    host_rows(table, n)
    for dtype in (by_name[d] for d in chosen):
        dtype_rows(table, n, dtype, args.topk_ratio)
    rows, load = [], {"before": os.getloadavg()}  # a shared machine: how busy it was
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        times = measure(table, args.repeats)
        refs, reads = (reference_rates(table, times, names)
                       for names in (REFERENCES, READ_REFERENCES))
        ref, read_ref = max(refs.values()), max(reads.values())
        for key, (_, elems, per_elem, desc) in table.rows.items():
            best = min(times[key])
            gbs = elems * per_elem / best
            rows.append({"threads": threads, **desc, "best_s": best,
                         "median_s": statistics.median(times[key]),
                         "g_elems_per_s": elems / best / 1e9, "gb_per_s": gbs / 1e9,
                         "bandwidth_gb_per_s": ref / 1e9, "share_of_bandwidth": gbs / ref,
                         "read_bandwidth_gb_per_s": read_ref / 1e9,
                         "share_of_read_bandwidth": (gbs / read_ref if desc["reads_only"]
                                                     else float("nan"))})
        print(f"{threads} thread(s): {len(table.rows)} kernels, {n / 2**20:.0f}M elements, "
              f"bandwidth {ref / 1e9:.1f} GB/s (" + ", ".join(
                  f"{k.removesuffix(' (bandwidth)')} {v / 1e9:.1f}" for k, v in refs.items())
              + f"), read bandwidth {read_ref / 1e9:.1f} GB/s (" + ", ".join(
                  f"{k.removesuffix(' (read bandwidth)')} {v / 1e9:.1f}"
                  for k, v in reads.items()) + ")", flush=True)
    load["after"] = os.getloadavg()
    frame = write_rows(args.out, "kernels", rows, provenance(argv, "python bench/kernels.py"),
                       load)
    with pd.option_context("display.width", 220, "display.max_colwidth", 52):
        print(frame[["threads", "kernel", "dtypes", "path", "best_s", "g_elems_per_s",
                     "gb_per_s", "share_of_bandwidth", "share_of_read_bandwidth"]]
              .to_string(index=False, na_rep="-"))
    print(f"wrote {args.out}/kernels.csv, kernels.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
