"""`python -m zfbench.accuracy`: does ZenFlow fine-tune as well as the baselines?

Fine-tunes the pretrained SmolLM2-135M-Instruct (the `real-model` extra, `zfbench.real.hf_model`)
on the training split of real text (`--text builtin`: the standard library's
`pydoc_data.topics`, or any text file; tokenized by the model's own tokenizer; the last
10 % of the tokens are held out) with every `--variants` entry and every seed, through
`real.initialize` like any module. A seed fixes the batch order, identical for every
variant. Each run starts from the same pretrained weights; held-out loss and perplexity
are measured on the first `--eval-windows` consecutive windows of the held-out split.
Default variants: device, zero-offload-dpu, zenflow-k0.05-u4, zenflow-k0.1-u4,
zenflow-k0.1-auto.

Sized for a 2-core CPU: by default the last 2 decoder blocks train (the frozen prefix's
hidden state computed once per batch and shared, `--no-prefix-cache` to recompute), batch
2 x 32 tokens, 24 steps, seeds 0 1 2. The issue's target size: `--steps 300 --batch 4
--seq 64 --select-interval 32`, `--last-blocks 0` for the whole model.

Files under `--out` (default runs/, moved into place at the end): `accuracy/` (curves,
runs, summary, the auto intervals, and what figure 13 reads) and
`auto_interval/windows.csv` (figure 14, `simulate --auto-windows`). docs/commands.md
("Gradient statistics and accuracy") lists every file and column.
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

from zfbench.core.config import STRATEGIES
from zfbench.core.config_build import build_config
from zfbench.core.config_zenflow import SCENARIO_ZENFLOW
from zfbench.core.strategies import has_windows

DEFAULT_VARIANTS = ("device", "zero-offload-dpu", "zenflow-k0.05-u4", "zenflow-k0.1-u4",
                    "zenflow-k0.1-auto")


def parse_variant(name: str) -> tuple[str, dict]:
    """"zenflow-k<ratio>-u<interval>" or "zenflow-k<ratio>-auto" -> ("zenflow", {...});
    any other name must be a strategy."""
    if not name.startswith("zenflow"):
        if name not in STRATEGIES:
            raise ValueError(f"unknown variant {name!r}: a strategy {STRATEGIES} or "
                             f"zenflow-k<ratio>-u<interval|auto>")
        return name, {}
    parts = name.split("-")[1:]
    zf = {k: SCENARIO_ZENFLOW[k] for k in ("topk_ratio", "update_interval")}
    for part in parts:
        if part.startswith("k"):
            zf["topk_ratio"] = float(part[1:])
        elif part in ("auto", "uauto"):
            zf["update_interval"] = "auto"
        elif part.startswith("u"):
            zf["update_interval"] = int(part[1:])
        else:
            raise ValueError(f"bad zenflow variant {name!r}")
    return "zenflow", zf


def engine_config(variant: str, args) -> dict:
    strategy, zf = parse_variant(variant)
    zenflow = None
    if has_windows(strategy):  # the scenario, with the variant's k and U
        zenflow = {**SCENARIO_ZENFLOW, **zf, "select_interval": args.select_interval,
                   "full_warm_up_rounds": 0}
    return build_config(strategy, micro_batch=args.batch, lr=args.lr,
                        weight_decay=args.weight_decay, clip=args.clip, zenflow=zenflow)


def run_one(module, init, variant, seed, args, train_data, heldout_batches):
    import torch
    from zfbench.core.progress import progress

    import zfbench.real as real
    from zfbench.real import hf_model as hm
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in init:
                p.copy_(init[name])
    torch.manual_seed(seed)
    engine = real.initialize(module, engine_config(variant, args), device="cpu",
                             device_threads=args.device_threads,
                             host_threads=args.host_threads)
    data = iter(train_data)
    losses = []
    started = time.perf_counter()
    bar = progress(range(args.steps), desc=f"{variant:>18} s{seed}", unit="step")
    try:
        for _ in bar:
            ids, labels = next(data)
            loss = engine(ids, labels)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        engine.finish(flush_partial=True)
        wall = time.perf_counter() - started
        windows = list(getattr(engine.strategy, "chosen_windows", []) or [])
    finally:
        engine.close()
    held = hm.eval_loss(module, heldout_batches)
    return losses, held, wall, windows


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m zfbench.accuracy", description=__doc__,
                                allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--select-interval", type=int, default=8)
    p.add_argument("--last-blocks", type=int, default=2,
                   help="train only the last N blocks' 2-D weights; 0 = the whole model")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="recompute the frozen prefix every step (same numbers, slower)")
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--figure-zenflow", default="zenflow-k0.1-u4")
    p.add_argument("--text", default="builtin", help="a text file, or builtin")
    p.add_argument("--device-threads", type=int, default=max(1, os.cpu_count() or 2))
    p.add_argument("--host-threads", type=int, default=1)
    p.add_argument("--cache", default=None, help="model cache dir (default ~/.cache/zfbench)")
    p.add_argument("--out", default="runs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for v in args.variants:
        parse_variant(v)
    started = time.perf_counter()

    from zfbench.real import hf_model as hm
    from zfbench.real.data import default_text
    text = default_text() if args.text == "builtin" else Path(args.text).read_text()
    ids = hm.encode_text(text, hm.load_tokenizer(args.cache), args.cache)
    train_ids, heldout_ids = hm.split_ids(ids, "train"), hm.split_ids(ids, "heldout")
    lm = hm.load_pretrained(args.cache)
    trainable = hm.freeze_all_but(lm, args.last_blocks or None)
    heldout = hm.heldout_windows(heldout_ids, args.seq, 8, args.eval_windows)
    if args.last_blocks and not args.no_prefix_cache:
        # the frozen prefix is computed once per batch and shared by every variant
        first = len(hm.decoder_blocks(lm)) - args.last_blocks
        module = hm.TailLM(lm, first)

        def prepare(batches):
            return [(hm.prefix_hidden(lm, x, first), y) for x, y in batches]
    else:
        module = hm.CausalLMLoss(lm)

        def prepare(batches):
            return list(batches)
    heldout = prepare(heldout)
    init = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    base = hm.eval_loss(module, heldout)
    print(f"pretrained held-out loss {base:.4f} (ppl {hm.perplexity(base):.2f}); "
          f"{trainable / 1e6:.1f}M trainable parameters, {len(train_ids)} train / "
          f"{len(heldout_ids)} held-out tokens", file=sys.stderr)

    curves, runs, autos = [], [], []
    for seed in args.seeds:
        stream = hm.token_batches(train_ids, args.batch, args.seq, seed)
        train_data = prepare(next(stream) for _ in range(args.steps))
        for variant in args.variants:
            losses, held, wall, windows = run_one(module, init, variant, seed, args,
                                                  train_data, heldout)
            curves += [{"strategy": variant, "seed": seed, "step": i, "loss": l}
                       for i, l in enumerate(losses)]
            runs.append({"strategy": variant, "seed": seed, "heldout_loss": held,
                         "ppl": hm.perplexity(held), "wall_s": wall, "steps": args.steps})
            ends = np.cumsum(windows) - 1
            autos += [{"strategy": variant, "seed": seed, "window": i, "length": int(n),
                       "end_step": int(e)} for i, (n, e) in enumerate(zip(windows, ends))]
            print(f"{variant} seed {seed}: held-out loss {held:.4f} "
                  f"(ppl {hm.perplexity(held):.2f}), {wall:.0f} s", file=sys.stderr)

    runs_df = pd.DataFrame(runs)
    summary = runs_df.groupby("strategy", sort=False).agg(
        heldout_loss_mean=("heldout_loss", "mean"), heldout_loss_std=("heldout_loss", "std"),
        ppl_mean=("ppl", "mean"), ppl_std=("ppl", "std"), seeds=("seed", "nunique"),
        steps=("steps", "max"), wall_s_mean=("wall_s", "mean")).reset_index()
    pre = pd.DataFrame([{"strategy": "pretrained", "heldout_loss_mean": base,
                         "heldout_loss_std": 0.0, "ppl_mean": hm.perplexity(base),
                         "ppl_std": 0.0, "seeds": 0, "steps": 0, "wall_s_mean": 0.0}])
    summary = pd.concat([pre, summary], ignore_index=True)
    curves_df = pd.DataFrame(curves)
    autos_df = pd.DataFrame(autos, columns=["strategy", "seed", "window", "length",
                                            "end_step"])

    out = Path(args.out)
    tmp = out / ".accuracy.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "accuracy").mkdir(parents=True)
    (tmp / "auto_interval").mkdir(parents=True)
    curves_df.to_csv(tmp / "accuracy/curves.csv", index=False)
    runs_df.to_csv(tmp / "accuracy/runs.csv", index=False)
    summary.to_csv(tmp / "accuracy/summary.csv", index=False)
    autos_df.to_csv(tmp / "accuracy/auto_intervals.csv", index=False)
    figure_names = {"device": "device", "zero-offload": "zero-offload",
                    "zero-offload-dpu": "zero-offload-dpu", args.figure_zenflow: "zenflow"}
    for variant, name in figure_names.items():
        c = curves_df[curves_df.strategy == variant] if len(curves_df) else curves_df
        if len(c) == 0:
            continue
        mean = c.groupby("step")["loss"].mean()
        (tmp / f"accuracy/{name}.steps.jsonl").write_text(
            "".join(json.dumps({"step": int(s), "loss": float(v)}) + "\n"
                    for s, v in mean.items()))
    pd.DataFrame({"strategy": summary["strategy"].map(lambda s: figure_names.get(s, s)),
                  "metric": "heldout_perplexity", "value": summary["ppl_mean"]}).to_csv(
        tmp / "accuracy/quality.csv", index=False)
    if len(autos_df):
        first = autos_df[autos_df.seed == autos_df.seed.min()]
        first = first[first.strategy == first.strategy.iloc[0]]
        pd.DataFrame({"window": first["window"], "length_steps": first["length"],
                      "end_step": first["end_step"]}).to_csv(
            tmp / "auto_interval/windows.csv", index=False)
    head = {"command": "python -m zfbench.accuracy " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "settings": vars(args), "trainable_params": trainable,
            "train_tokens": int(len(train_ids)), "heldout_tokens": int(len(heldout_ids)),
            "pretrained_heldout_loss": base, "runtime_s": time.perf_counter() - started}
    (tmp / "accuracy/summary.json").write_text(json.dumps(head, indent=2, default=str))
    for sub in ("accuracy", "auto_interval"):
        (out / sub).mkdir(parents=True, exist_ok=True)
        for f in (tmp / sub).iterdir():
            os.replace(f, out / sub / f.name)
    shutil.rmtree(tmp, ignore_errors=True)
    print(summary.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
