"""Probe: what DeepSpeed's ZenFlow adds to the training thread on its CPU accelerator.

    python bench/zenflow_cpu_ops.py --model opt-350m --layers 2   # -> JSON on stdout or --out

Plain torch at the model's shapes on this CPU (no DeepSpeed), the ops that DeepSpeed 0.19.5's
ZenFlow issues and ZeRO-Offload does not (zfbench.sims.cpu_accelerator names where each
comes from in DeepSpeed's code):
- an embedding table's backward as autograd runs it (the lookup's backward, then
  AccumulateGrad into the weight's layout), with the weight column-major as ZenFlow keeps
  every 2-D weight (`table_col`) and row-major as ZeRO-Offload does (`table_row`), at the
  run's token count; for a table tied to the head, the backward of both uses (the lookup
  and the head's matmul) in the two layouts (`tied_col`, `tied_row`). What ZenFlow's
  layout adds is the difference: the copy into the column-major layout, a cross-layout
  sum where tied, and whatever else the layout changes in those ops (on a Zen 5 EPYC the
  untied [32000, 2048] table's backward ran 62 ms row-major, 487 ms column-major; the
  copy alone, the probe's earlier measure, 375-464 ms);
- the selective optimizer's ops on a matrix's top-k input columns, [rows, k] with k =
  int(topk * cols): `gather_cols` (weight[:, idx]), `scatter_cols` (weight[:, idx] = s),
  `gather_rows` (the transposed gradient's k rows), `copy` (e elements into fresh memory:
  DeepSpeed clones, and copies into a flat buffer it allocates anew each step),
  `adamw` (the single-tensor AdamW's in-place ops on one [rows, k] slice, its gradient the
  transposed view DeepSpeed passes).
Every op of every shape is timed once a round, `--repeats` rounds (so a burst of other
work on this shared host hits all ops alike); each op's median (seconds) is kept. From them
and DeepSpeed's op counts (zfbench.sims.cpu_accelerator STEP_OPS, BOUNDARY_OPS) each
parameter's selective work on a window's inner and last step is summed, and `op_s + elems
/ elems_per_s` fitted over the parameters (least squares, op_s >= 0; residuals kept); the
tables' layout rates are elements over the column-major backward's extra over the
row-major one (no rate where the extra is not positive). `link_fields` gives the link's
`thread_*` fields. The machine, torch's threads and the load average before and after are
in the output.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.real.rate_probe import round_robin_times  # noqa: E402
from zfbench.sims.cpu_accelerator import (BOUNDARY_OPS, STEP_OPS, TABLE_KINDS,  # noqa: E402
                                          selected_elems)  # noqa: E402

BETAS, LR, EPS, WD = (0.9, 0.999), 1e-3, 1e-8, 0.01


def col_major(rows: int, cols: int) -> torch.Tensor:
    """A [rows, cols] fp32 tensor stored column-major, as ZenFlow keeps a 2-D weight."""
    return torch.randn(cols, rows).t()


def _adamw_ops(p, g, m, v, step):
    """The single-tensor AdamW's ops on one slice (torch's algorithm, written out)."""
    step += 1
    p.mul_(1 - LR * WD)
    m.lerp_(g, 1 - BETAS[0])
    v.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
    denom = (v.sqrt() / (1 - BETAS[1] ** 2) ** 0.5).add_(EPS)
    p.addcdiv_(m, denom, value=-LR)


def selective_ops(rows: int, cols: int, k: int) -> dict:
    """The selective optimizer's ops on one [rows, cols] matrix's k sorted columns."""
    w, idx = col_major(rows, cols), torch.randperm(cols)[:k].sort().values
    s = w[:, idx]
    # the selected gradient as DeepSpeed hands it to AdamW: the flat buffer's [k, rows]
    # viewed transposed (`selected_grad.view(param.selected_shape).t()`,
    # runtime/zenflow/zenflow_stage_1_and_2.py line 372), so its strides cross the
    # gathered weights' (on a Zen 5 EPYC the AdamW ops on [5632, 204] took 6.2 ms with it
    # against 0.75 ms with a gradient laid out like the weights)
    g = torch.randn(k, rows).t()
    m, v = torch.zeros_like(s), torch.zeros_like(s)
    step = torch.zeros(())

    def adamw():
        _adamw_ops(s, g, m, v, step)
    adamw.tensors = {"param": s, "grad": g}  # for the tests: the two layouts

    return {"gather_cols": lambda: w[:, idx],
            "scatter_cols": lambda: w.__setitem__((slice(None), idx), s),
            "gather_rows": lambda: w.t()[idx, :],
            "copy": lambda: s.clone(),
            "adamw": adamw}


def vector_ops(n: int) -> dict:
    """A 1-D parameter's whole-tensor copy and AdamW (no column selection)."""
    p, g, m, v = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    step = torch.zeros(())
    return {"copy": lambda: p.clone(), "adamw": lambda: _adamw_ops(p, g, m, v, step)}


def layout_ops(rows: int, cols: int, tokens: int, tied: bool) -> dict:
    """An embedding table's backward, [rows, cols], over `tokens` looked-up rows, with the
    weight row-major and column-major: the lookup's backward and AccumulateGrad into the
    weight's layout (a fresh gradient each call, as each step's); where `tied`, also the
    head's matmul on the same weight (`tied_*`: both contributions summed into it)."""
    import torch.nn.functional as F

    idx = torch.randint(0, rows, (1, tokens))
    hidden = torch.randn(1, tokens, cols)
    weights = {"row": torch.randn(rows, cols).requires_grad_(),
               "col": col_major(rows, cols).requires_grad_()}

    def backward(w):
        def run():
            w.grad = None
            out = F.embedding(idx, w).sum()
            if tied:
                out = out + F.linear(hidden, w).sum()
            out.backward()
        run.weight = w  # for the tests: the gradient's layout and values
        return run

    kind = "tied" if tied else "table"
    return {f"{kind}_{layout}": backward(w) for layout, w in weights.items()}


def medians(ops: dict, repeats: int) -> dict:
    """Each op's median seconds, all ops timed once a round for `repeats` rounds."""
    times = round_robin_times(ops, progress(range(repeats), desc="zenflow cpu ops rounds"))
    return {key: statistics.median(t) for key, t in times.items()}


def fit(points: list[tuple[float, float]]) -> dict[str, float]:
    """`op_s + elems / elems_per_s` by least squares over (elems, seconds), op_s >= 0."""
    n = len(points)
    sx = sum(e for e, _ in points)
    sy = sum(t for _, t in points)
    sxx = sum(e * e for e, _ in points)
    sxy = sum(e * t for e, t in points)
    den = n * sxx - sx * sx
    slope = (n * sxy - sx * sy) / den if n > 1 and den > 0 else 0.0
    op_s = (sy - slope * sx) / n if n > 1 and den > 0 else 0.0
    if op_s < 0 or slope <= 0:  # through the origin
        op_s, slope = 0.0, sxy / sxx
    resid = [t / (op_s + slope * e) - 1 for e, t in points]
    return {"op_s": op_s, "elems_per_s": 1 / slope, "points": n,
            "max_abs_rel_residual": max(abs(r) for r in resid)}


def probe(model: str, layers: int | None, topk_ratio: float, repeats: int,
          tokens: int = 32) -> dict:
    """Each op's medians at the model's shapes (the tables' backward over `tokens`, the
    run's micro-batch x sequence), each parameter's selective work summed from them with
    DeepSpeed's op counts, and the fits (the module docstring)."""
    shape = get_model(model)
    if layers is not None:
        shape = shape.with_layers(layers)
    load_before = os.getloadavg()
    mats = sorted({(m.rows, m.cols) for m in shape.matrices()})
    tables = sorted({(m.rows, m.cols, shape.tied_embeddings and m.kind == "embedding")
                     for m in shape.matrices() if m.kind in TABLE_KINDS})
    vecs = sorted({v.numel for v in shape.vectors()})
    ops = {}
    for r, c in mats:
        k = selected_elems(r, c, topk_ratio) // r
        ops.update({("matrix", r, c, op): fn for op, fn in selective_ops(r, c, k).items()})
    for n in vecs:
        ops.update({("vector", n, 1, op): fn for op, fn in vector_ops(n).items()})
    for r, c, tied in tables:
        ops.update({("table", r, c, op): fn for op, fn in layout_ops(r, c, tokens,
                                                                      tied).items()})
    med = medians(ops, repeats)
    rows = [{"what": w, "rows": r, "cols": c, "op": op, "median_s": t}
            for (w, r, c, op), t in med.items()]
    # one point a parameter (a shape as often as the model has it), so the fit's total
    # over the model is the probe's (least squares with an intercept)
    params = [("matrix", m.rows, m.cols, selected_elems(m.rows, m.cols, topk_ratio))
              for m in shape.matrices()] + [("vector", v.numel, 1, v.numel)
                                            for v in shape.vectors()]
    per_param, points = {}, {"step": [], "boundary": []}
    for what, r, c, elems in params:
        row = per_param.setdefault((what, r, c), {"what": what, "rows": r, "cols": c,
                                                  "elems": elems, "count": 0})
        row["count"] += 1
        for name, counts in (("step", STEP_OPS), ("boundary", BOUNDARY_OPS)):
            row[f"{name}_s"] = sum(n * med[(what, r, c, op)]
                                   for op, n in counts[what].items())
            points[name].append((float(elems), row[f"{name}_s"]))
    totals = {f"{name}_s": sum(t for _, t in p) for name, p in points.items()}
    # the layout rates over the tables that take each: the token table tied to the head
    # is summed across layouts, every other table copied (zfbench.sims.cpu_accelerator)
    layout = {"copied_elems": 0, "copy_s": 0.0, "summed_elems": 0, "sum_extra_s": 0.0}
    for m in shape.matrices():
        if m.kind not in TABLE_KINDS:
            continue
        key = ("table", m.rows, m.cols)
        if shape.tied_embeddings and m.kind == "embedding":
            layout["summed_elems"] += m.numel
            layout["sum_extra_s"] += med[(*key, "tied_col")] - med[(*key, "tied_row")]
        else:
            layout["copied_elems"] += m.numel
            layout["copy_s"] += med[(*key, "table_col")] - med[(*key, "table_row")]
    return {"benchmark": "zenflow_cpu_ops", "model": model, "layers": layers,
            "topk_ratio": topk_ratio, "repeats": repeats, "tokens": tokens,
            "machine": machine(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "medians": rows, "per_parameter": list(per_param.values()),
            "selective_total": totals, "layout": layout,
            "fits": {name: fit(p) for name, p in points.items()}}


def link_fields(result: dict) -> dict:
    """The link's `thread_*` fields (zfbench.sims.cpu_accelerator) from a probe's result:
    the selective fits, and the layout rates as elements over seconds of the model's
    tables (a rate a model without such tables never uses is left out)."""
    layers = "" if result["layers"] is None else f"[{result['layers']}L]"
    src = (f"bench/zenflow_cpu_ops.py probe, {result['model']}{layers}, "
           f"{result['date_utc']} UTC, load {result['loadavg_before'][0]:.2f}")
    out = {}
    for name in ("step", "boundary"):
        f = result["fits"][name]
        out[f"thread_selective_{name}_op_s"] = {"value": f["op_s"], "source": src}
        out[f"thread_selective_{name}_elems_per_s"] = {"value": f["elems_per_s"],
                                                      "source": src}
    lay = result["layout"]
    for field, elems, sec in (("thread_layout_copy_elems_per_s", "copied_elems", "copy_s"),
                              ("thread_layout_add_extra_elems_per_s", "summed_elems",
                               "sum_extra_s")):
        if lay[elems] and lay[sec] > 0:
            out[field] = {"value": lay[elems] / lay[sec], "source": src}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--topk-ratio", type=float, default=0.1)
    p.add_argument("--tokens", type=int, default=32,
                   help="tokens of a micro-batch (batch x sequence) the tables look up")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if not 0 < args.topk_ratio <= 1:
        p.error(f"--topk-ratio must be in (0, 1] (ZenFlow's top-k share), got {args.topk_ratio}")
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1 (rounds of timing), got {args.repeats}")
    if args.tokens < 1:
        p.error(f"--tokens must be at least 1, got {args.tokens}")
    text = json.dumps(probe(args.model, args.layers, args.topk_ratio, args.repeats,
                            args.tokens), indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
