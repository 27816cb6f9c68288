"""`python -m zfbench.gradients`: gradient statistics of a real fine-tuning run.

Trains `--model` (smollm2-135m: the pretrained SmolLM2-135M-Instruct of the `real-model`
extra; tiny: `zfbench.core.models` "tiny", seeded init, byte-level text, no extra needed) with
the engine's `device` strategy (AdamW) on real text, and after every backward records
each 2-D weight's per-column squared and L1 gradient norms (`zfbench.real.gradcapture`); every
`--detail-every` steps, row / column / element skew and spatial locality from the whole
gradient. Then the same shape, randomly initialized, for `--random-steps` steps: the
skew is expected to come from pretraining. Statistics: `zfbench.analysis.gradstats`.

Sized for a shared 2-core CPU: by default the last 4 blocks' matrices, 20 steps of batch
2 x 32 tokens, locality up to d = 16. The full study: `--last-blocks 0 --steps 80
--max-d 64 --batch 4 --seq 64 --random-steps 8 --detail-every 8`.

Files under `--out` (default runs/, moved into place at the end): `gradients/` (column
norms, skew, cumulative share, locality, reselection, spatial, heatmap, summary.json) and
`grad_stats/` (what `python -m zfbench.figures --measured runs` reads for figures 11-12).
docs/commands.md ("Gradient statistics and accuracy") lists every file and column.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from zfbench.analysis import gradstats as gs
from zfbench.cli_checks import zenflow_flags
from zfbench.core.config_zenflow import DEFAULT_TOPK_RATIO


def write_table(frame: pd.DataFrame, path: Path) -> Path:
    """Parquet when pandas has an engine (pyarrow, in the real-model extra), else the
    CSV twin of the same stem (`zfbench.figures` reads either)."""
    try:
        frame.to_parquet(path, index=False)
        return path
    except ImportError:
        csv = path.with_suffix(".csv")
        frame.to_csv(csv, index=False)
        return csv


def detail_rows(fraction: float = DEFAULT_TOPK_RATIO):
    def fn(step, name, kind, g2):
        rows = []
        for unit, values in (("column", g2.sum(0)), ("row", g2.sum(1)), ("element", g2)):
            rows.append({"step": step, "layer": name, "kind": kind, "unit": unit,
                         **gs.top_shares(values)})
        for f in gs.FRACTIONS:
            rows.append({"step": step, "layer": name, "kind": kind,
                         "unit": f"spatial_{100 * f:g}pct", "fraction": f,
                         "share": gs.spatial_share(g2, f)})
        return rows
    return fn


def build(model_name: str, seed: int, cache: str | None, random_init: bool):
    """(module for the engine, train ids/batches factory, label)."""
    if model_name == "tiny":
        from zfbench.real.model import build_model
        from zfbench.core.models import get_model
        return build_model(get_model("tiny"), seed=seed + (1000 if random_init else 0))
    from zfbench.real import hf_model as hm
    lm = hm.load_pretrained(cache)
    if random_init:
        lm = hm.random_like(lm, seed)
    return hm.CausalLMLoss(lm)


def batches(args, seed: int):
    from zfbench.real.data import default_text
    text = default_text() if args.text == "builtin" else Path(args.text).read_text()
    if args.model == "tiny":
        from zfbench.real.data import text_batches
        stream = text_batches(text, args.batch, args.seq, seed, split="train")
        return ((b["input_ids"], b["labels"]) for b in stream)
    from zfbench.real import hf_model as hm
    ids = hm.encode_text(text, hm.load_tokenizer(args.cache), args.cache)
    return hm.token_batches(hm.split_ids(ids, "train"), args.batch, args.seq, seed)


def record(args, random_init: bool, steps: int, desc: str):
    import torch
    from zfbench.core.progress import progress

    import zfbench.real as real
    from zfbench.real.gradcapture import GradCapture
    torch.manual_seed(args.seed)
    model = build(args.model, args.seed, args.cache, random_init)
    if args.last_blocks and args.model != "tiny":
        from zfbench.real import hf_model as hm
        hm.freeze_all_but(model.lm, args.last_blocks)
    cfg = {"train_micro_batch_size_per_gpu": args.batch,
           "optimizer": {"type": "AdamW", "params": {"lr": args.lr, "weight_decay": 0.0}},
           "zero_optimization": {"stage": 2}, "zfbench": {"strategy": "device"}}
    engine = real.initialize(model, cfg, device="cpu", device_threads=args.threads,
                             host_threads=1)
    cap = GradCapture(engine.named_params, detail_every=args.detail_every,
                      detail_fn=detail_rows(args.topk_ratio))
    data = batches(args, args.seed)
    try:
        for step in progress(range(steps), desc=desc, unit="step"):
            ids, labels = next(data)
            loss = engine(ids, labels)
            engine.backward(loss)
            cap.capture(step)
            engine.step()
        engine.finish()
    finally:
        engine.close()
    return cap


def detail_skew(details: pd.DataFrame, source: str) -> pd.DataFrame:
    labels = [c for c in details.columns if c.startswith("top_")]
    d = details[details["unit"].isin(["row", "element"])]
    per = d.groupby(["unit", "layer", "kind"], sort=False).agg(
        steps=("step", "nunique"), **{c: (c, "mean") for c in labels}).reset_index()
    per["level"], per["name"] = "matrix", per["layer"]
    kinds = per.groupby(["unit", "kind"], sort=False).agg(
        steps=("steps", "max"), **{c: (c, "mean") for c in labels}).reset_index()
    kinds["level"], kinds["name"] = "kind", kinds["kind"]
    model = per.groupby("unit", sort=False).agg(
        steps=("steps", "max"), **{c: (c, "mean") for c in labels}).reset_index()
    model["level"], model["name"], model["kind"] = "model", "mean over matrices", "all"
    out = pd.concat([model, kinds, per.drop(columns="layer")], ignore_index=True)
    out.insert(0, "source", source)
    return out[["source", "unit", "level", "name", "kind", "steps", *labels]]


def spatial_table(details: pd.DataFrame, source: str) -> pd.DataFrame:
    d = details[details["unit"].str.startswith("spatial")]
    by_kind = d.groupby(["kind", "fraction"], sort=False)["share"].mean().reset_index()
    overall = d.groupby("fraction", sort=False)["share"].mean().reset_index()
    overall["kind"] = "all"
    out = pd.concat([overall, by_kind], ignore_index=True)
    out.insert(0, "source", source)
    return out[["source", "kind", "fraction", "share"]]


def figure_blocks(layers: list[str], n: int) -> list[str]:
    import re
    blocks = sorted({int(m.group(1)) for name in layers
                     if (m := re.search(r"layers\.(\d+)\.", name))})
    if not blocks:
        return layers
    pick = sorted({blocks[i] for i in np.linspace(0, len(blocks) - 1, n).round().astype(int)})
    return [name for name in layers if any(f"layers.{b}." in name for b in pick)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zfbench.gradients", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", choices=["smollm2-135m", "tiny"])
    p.add_argument("--steps", type=int, default=20, help="recorded steps (>= max-d + 1)")
    p.add_argument("--random-steps", type=int, default=3,
                   help="steps recorded on the randomly initialized model (0: skip)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--last-blocks", type=int, default=4,
                   help="train (and record) only the last N blocks' matrices; 0 = all "
                        "(smollm2-135m; tiny always records everything)")
    p.add_argument(*zenflow_flags("topk_ratio"), dest="topk_ratio", type=float,
                   default=DEFAULT_TOPK_RATIO)
    p.add_argument("--max-d", type=int, default=16)
    p.add_argument("--detail-every", type=int, default=10)
    p.add_argument("--figure-blocks", type=int, default=3)
    p.add_argument("--text", default="builtin", help="a text file, or builtin")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    p.add_argument("--cache", default=None, help="model cache dir (default ~/.cache/zfbench)")
    p.add_argument("--out", default="runs")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2")
    started = time.perf_counter()
    out = Path(args.out)
    tmp = out / ".gradients.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "gradients").mkdir(parents=True)
    (tmp / "grad_stats").mkdir(parents=True)

    cap = record(args, False, args.steps, f"{args.model} pretrained")
    norms = cap.frame()
    details = cap.detail_frame()
    sources = [("pretrained", norms, details)]
    if args.random_steps:
        rcap = record(args, True, args.random_steps, f"{args.model} random init")
        sources.append(("random", rcap.frame(), rcap.detail_frame()))
        write_table(sources[-1][1], tmp / "gradients/colnorms_random.parquet")
    write_table(norms, tmp / "gradients/colnorms.parquet")

    skew = pd.concat([gs.skew_table(n, source=s) for s, n, _ in sources] +
                     [detail_skew(d, s) for s, _, d in sources if not d.empty],
                     ignore_index=True)
    skew.to_csv(tmp / "gradients/skew.csv", index=False)
    pd.concat([gs.model_curve(n).assign(source=s) for s, n, _ in sources])[
        ["source", "top_fraction", "share"]].to_csv(tmp / "gradients/cumulative.csv", index=False)
    loc = gs.locality_table(norms, args.topk_ratio, args.max_d)
    loc.to_csv(tmp / "gradients/locality.csv", index=False)
    resel = gs.reselection_table(norms, args.topk_ratio)
    resel.to_csv(tmp / "gradients/reselection.csv", index=False)
    spatial = pd.concat([spatial_table(d, s) for s, _, d in sources if not d.empty],
                        ignore_index=True)
    spatial.to_csv(tmp / "gradients/spatial.csv", index=False)
    heat = gs.pooled_heatmap(cap.heatmap_grad)
    heat.insert(0, "weight", cap.heatmap_layer)
    heat.to_csv(tmp / "gradients/heatmap.csv", index=False)
    heat.to_csv(tmp / "grad_stats/heatmap.csv", index=False)
    fig_layers = figure_blocks(list(norms["layer"].cat.categories), args.figure_blocks)
    sub = norms[norms["layer"].isin(fig_layers)]
    write_table(pd.DataFrame({"weight": sub["layer"].astype(str), "step": sub["step"],
                              "col": sub["col"], "sq_norm": sub["sq_norm"]}),
                tmp / "grad_stats/column_norms.parquet")

    def model_share(source, unit="column", name=None):
        row = skew[(skew.source == source) & (skew.unit == unit) & (skew.level == "model")]
        if name is not None:
            row = row[row["name"] == name]
        return {c: float(row[c].iloc[0]) for c in row.columns if c.startswith("top_")} \
            if len(row) else None
    head = {
        "command": "python -m zfbench.gradients " + " ".join(argv if argv is not None
                                                             else sys.argv[1:]),
        "model": args.model, "steps": args.steps, "random_steps": args.random_steps,
        "batch": args.batch, "seq": args.seq, "lr": args.lr, "topk_ratio": args.topk_ratio,
        "matrices": int(norms["layer"].nunique()), "columns": int(len(norms) // args.steps),
        "column_share_pretrained": model_share("pretrained"),
        "column_share_random": model_share("random"),
        "column_share_pretrained_matrix_mean": model_share("pretrained", name="mean over "
                                                                            "matrices"),
        "column_share_random_matrix_mean": model_share("random", name="mean over matrices"),
        "row_share_pretrained": model_share("pretrained", "row"),
        "element_share_pretrained": model_share("pretrained", "element"),
        "overlap": {int(d): float(v) for d, v in loc[loc.kind == "all"][["d", "overlap"]]
                    .itertuples(index=False) if d in (1, 2, 4, 8, 16, 32, 64)},
        "jaccard": {int(d): float(v) for d, v in loc[loc.kind == "all"][["d", "jaccard"]]
                    .itertuples(index=False) if d in (1, 2, 4, 8, 16, 32, 64)},
        "runtime_s": time.perf_counter() - started,
    }
    (tmp / "gradients/summary.json").write_text(json.dumps(head, indent=2))
    for sub_dir in ("gradients", "grad_stats"):
        (out / sub_dir).mkdir(parents=True, exist_ok=True)
        for f in (tmp / sub_dir).iterdir():
            os.replace(f, out / sub_dir / f.name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(head, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
