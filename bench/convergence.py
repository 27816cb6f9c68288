"""Accuracy at convergence: SmolLM2-135M fine-tuned until its held-out loss plateaus, per
strategy and seed, on two tasks (issue 28).

    python bench/convergence.py                 # topics ~25 min, LM ~60 min on 2 shared cores
    python bench/convergence.py --full          # the hour-plus version
    python bench/convergence.py --tasks topics --variants zenflow zenflow-u1 --seeds 0

Tasks (both from text on disk, no hub):
* `lm`: next-token loss on the standard library's `pydoc_data.topics` text (tokenized by
  SmolLM2's own tokenizer; the last 10 % of the tokens held out; `--eval-windows`
  consecutive held-out windows are the validation set), as `zfbench.accuracy`;
* `topics`: which of 8 pydoc topics a paragraph comes from (`zfbench.real.topic_task`,
  construction in docs/convergence.md): a verbalizer classifier over the LM head's
  letter logits, validation loss for the plateau, test accuracy reported.

Variants: `device` (AdamW on the device), `zero-offload`, `zero-offload-dpu` (delayed
parameter update), `zenflow` at the paper's settings (top-k 0.1, update interval 4,
overlap on, reselection every `--select-interval` steps), and for ablations
`zenflow-<knobs>` with knobs `k<ratio>`, `u<interval|auto>`, `s<select interval>`,
`ov0`/`ov1` (overlap off/on), e.g. `zenflow-k0.05-u1-s4-ov0`. `deepspeed-zenflow[-knobs]`
and `deepspeed-zero-offload` run the same settings through DeepSpeed's own engine (the
`[deepspeed]` extra, deepspeed==0.19.5, on CPU; bench/ds_engines.py): ZeRO-2 with
`offload_optimizer.device: cpu`, the ZenFlow section mapped key for key
(`ds_engines.deepspeed_zenflow_section`), a fresh copy of the model per run. DeepSpeed has
no flush of a partial window, so its final numbers are the device's parameters at the
stop; `stop_val_loss`/`stop_test_acc` (the evaluation at the stop, before any flush) are
comparable across both engines.

Plateau criterion: the validation loss is measured every `--eval-every` steps (on the
parameters the device holds at that step); a run stops when `--patience` evaluations in
a row have not improved the best so far by more than `--min-delta` nats, after
`--min-steps`, or at `--max-steps` (then `plateaued` is false). After the stop every
pending asynchronous update is applied (`finish(flush_partial=True)`) and the final
numbers are measured: held-out loss (both tasks), test loss and accuracy (topics).
Every run starts from the same pretrained weights; a seed fixes the batch order, the same
for every variant.

Sized for 2 shared cores by default: only the last `--last-blocks 2` decoder blocks'
2-D weights train (7.1M parameters; the frozen prefix is computed once per batch and
shared by every variant, as `zfbench.accuracy` does), LM batches of 4 x 32 tokens,
topic batches of 8 paragraphs of 24 tokens + prompt. `--full` trains the last 6 blocks
with LM batches of 8 x 64 tokens and a step cap of 600.

Files under `--out` (default bench/results/convergence):
    curves.csv    task, variant, seed, step, train_loss (mean since the last eval),
                  val_loss, test_loss, test_acc (topics), train_s (training seconds so far)
    runs.csv      task, variant, seed, steps, plateaued, best_val_loss, best_step,
                  final_val_loss, final_test_loss, final_test_acc, train_s,
                  stop_val_loss, stop_test_acc (the evaluation at the stop, before the flush)
    summary.csv   task, variant, n, mean and std (ddof 1) and min/max of final_val_loss,
                  final_test_acc, steps
    summary.json  the settings, the command, the machine, torch version, runtime;
                  with --append the earlier study's and each appended run's under `appended`
                  (with the deepspeed version where DeepSpeed ran)
With `--append` the rows of this invocation replace those of the same (task, variant,
seed) in the existing files and every other row is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "bench"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from zfbench.core.config_build import build_config  # noqa: E402
from zfbench.core.config_zenflow import SCENARIO_ZENFLOW  # noqa: E402

STUDY_VARIANTS = ("device", "zero-offload", "zero-offload-dpu", "zenflow")
DS_PREFIX = "deepspeed-"  # the variant through DeepSpeed's own engine
# deepspeed-zenflow-...-lag1: DeepSpeed's overlap without its skipped first wait-and-copy
# (`first_update_round_after_warmup` cleared after initialize), so the first window's host
# update reaches the device one window late as every later one does (and as in zfbench);
# its two alternating sets of host Adam moments stay. An experiment on DeepSpeed's code,
# not a DeepSpeed setting.
DS_LAG1 = "lag1"
# The paper's ZenFlow settings (arXiv 2505.12242 and DeepSpeed's ZenFlow tutorial config):
# top-k 0.1 of the columns, update interval 4, the host update overlapped with compute.
PAPER_ZENFLOW = {**SCENARIO_ZENFLOW, "topk_ratio": 0.1, "update_interval": 4,
                 "overlap_step": True, "select_strategy": "step", "full_warm_up_rounds": 0}


def parse_variant(name: str, select_interval: int) -> tuple[str, dict | None]:
    """`device`/`zero-offload`/... -> (strategy, None); `zenflow[-knob...]` -> ("zenflow",
    the ZenFlow section: the paper's settings with the knobs applied). A `deepspeed-`
    prefix (zero-offload and zenflow only) gives the same; `is_deepspeed` tells them apart."""
    if is_deepspeed(name):
        base = "-".join(p for p in name[len(DS_PREFIX):].split("-") if p != DS_LAG1)
        if DS_LAG1 in name.split("-") and not base.startswith("zenflow"):
            raise ValueError(f"{name!r}: {DS_LAG1} is a knob of DeepSpeed's ZenFlow only")
        if base != "zero-offload" and not base.startswith("zenflow"):
            raise ValueError(f"{name!r}: DeepSpeed runs zero-offload and zenflow[-knobs] here")
        return parse_variant(base, select_interval)
    if not name.startswith("zenflow"):
        if name not in ("device", "zero-offload", "zero-offload-dpu"):
            raise ValueError(f"unknown variant {name!r}")
        return name, None
    zf = {**PAPER_ZENFLOW, "select_interval": select_interval}
    for part in name.split("-")[1:]:
        if part in ("auto", "uauto"):
            zf["update_interval"] = "auto"
        elif part.startswith("ov") and part[2:] in ("0", "1"):
            zf["overlap_step"] = part == "ov1"
        elif part[:1] in "kus" and part[1:]:
            key = {"k": "topk_ratio", "u": "update_interval", "s": "select_interval"}[part[0]]
            zf[key] = float(part[1:]) if part[0] == "k" else int(part[1:])
        else:
            raise ValueError(f"bad zenflow knob {part!r} in {name!r}")
    if isinstance(zf["update_interval"], int) and 0 < zf["select_interval"] < \
            zf["update_interval"]:
        zf["select_interval"] = zf["update_interval"]  # the config rule: S >= U or 0
    return "zenflow", zf


def is_deepspeed(name: str) -> bool:
    return name.startswith(DS_PREFIX)


class Plateau:
    """Stop when `patience` evaluations in a row do not beat the best by > min_delta."""

    def __init__(self, patience: int, min_delta: float, min_steps: int = 0) -> None:
        self.patience, self.min_delta, self.min_steps = patience, min_delta, min_steps
        self.best, self.best_step, self.bad = float("inf"), -1, 0

    def update(self, step: int, value: float) -> bool:
        """Record the evaluation after `step` steps; True when training should stop."""
        if value < self.best - self.min_delta:
            self.best, self.best_step, self.bad = value, step, 0
        else:
            self.bad += 1
            if value < self.best:
                self.best, self.best_step = value, step
        return step >= self.min_steps and self.bad >= self.patience


# ---------------------------------------------------------------------- the tasks
class LMTask:
    name = "lm"

    def __init__(self, lm, first, train_ids, heldout_ids, args) -> None:
        from zfbench.real import hf_model as hm
        self.hm, self.lm, self.first, self.args = hm, lm, first, args
        self.module = hm.TailLM(lm, first)
        self.train_ids = train_ids
        self.val = [(hm.prefix_hidden(lm, x, first), y) for x, y in
                    hm.heldout_windows(heldout_ids, args.seq, 8, args.eval_windows)]
        self._batches: dict[int, list] = {}
        self._streams: dict[int, object] = {}

    def batch(self, seed: int, step: int):
        cached = self._batches.setdefault(seed, [])
        if seed not in self._streams:
            self._streams[seed] = self.hm.token_batches(self.train_ids, self.args.batch,
                                                        self.args.seq, seed)
        while len(cached) <= step:
            x, y = next(self._streams[seed])
            cached.append((self.hm.prefix_hidden(self.lm, x, self.first), y))
        return cached[step]

    def evaluate(self, module=None) -> dict:
        """On `module` (default: the task's own; a DeepSpeed run trains a copy)."""
        return {"val_loss": self.hm.eval_loss(self.module if module is None else module,
                                              self.val)}


class TopicsTask:
    name = "topics"

    def __init__(self, lm, first, tokenizer, args) -> None:
        from zfbench.real import hf_model as hm
        from zfbench.real import topic_task as tt
        self.tt, self.args = tt, args
        self.task = tt.build_task(classes=args.classes)
        labels = tt.label_token_ids(tokenizer, len(self.task.classes))
        self.module = tt.TopicHead(lm, first, labels)
        self.data = {}
        for split, examples in self.task.splits.items():
            ids, y = tt.encode_examples(examples, tokenizer, args.prefix_tokens)
            self.data[split] = (hm.prefix_hidden(lm, ids, first) if first else ids, y)
        self.counts = {s: np.bincount(y.numpy(), minlength=len(labels)).tolist()
                       for s, (_, y) in self.data.items()}

    def _chunks(self, split):
        x, y = self.data[split]
        return [(x[i:i + 64], y[i:i + 64]) for i in range(0, len(y), 64)]

    def batch(self, seed: int, step: int):
        x, y = self.data["train"]
        rng = np.random.default_rng([seed, 0x7091C, step])
        pick = rng.choice(len(y), size=self.args.topic_batch, replace=False)
        return x[pick], y[pick]

    def evaluate(self, module=None) -> dict:
        """On `module` (default: the task's own; a DeepSpeed run trains a copy)."""
        module = self.module if module is None else module
        val, _ = self.tt.evaluate(module, self._chunks("val"))
        test, acc = self.tt.evaluate(module, self._chunks("test"))
        return {"val_loss": val, "test_loss": test, "test_acc": acc}


# ---------------------------------------------------------------------- one run
@contextlib.contextmanager
def open_engine(module, variant: str, args, micro: int, lr: float):
    """Yield (engine, the module it trains, finish): zfbench's engine on `module` itself,
    or DeepSpeed's on a copy of it (DeepSpeed flattens the parameters it trains into its
    buffers and hooks them, so each run gets its own). Closes the engine afterwards."""
    import torch

    strategy, zf = parse_variant(variant, args.select_interval)
    if not is_deepspeed(variant):
        import zfbench.real as real
        config = build_config(strategy, micro_batch=micro, lr=lr,
                              weight_decay=args.weight_decay, clip=args.clip, zenflow=zf)
        engine = real.initialize(module, config, device="cpu",
                                 device_threads=args.device_threads,
                                 host_threads=args.host_threads)
        try:
            yield engine, module, lambda: engine.finish(flush_partial=True)
        finally:
            engine.close()
        return
    from ds_engines import ds_config, import_deepspeed, make_ds, release_ds
    ds = import_deepspeed(args.any_version)
    module = copy.deepcopy(module)
    cfg = ds_config(micro, zf, lr, args.weight_decay, args.clip, strategy=strategy)
    state = (os.sched_getaffinity(0), os.environ.get("OMP_NUM_THREADS"),
             torch.get_num_threads())
    engine = make_ds(ds, module, cfg, trainable_only=True)
    if DS_LAG1 in variant.split("-"):
        if not hasattr(engine.optimizer, "first_update_round_after_warmup"):
            release_ds(engine, *state)
            raise RuntimeError(f"{variant}: this DeepSpeed's optimizer has no "
                               "first_update_round_after_warmup (overlap_step off?)")
        engine.optimizer.first_update_round_after_warmup = False
    try:
        yield engine, module, lambda: None  # DeepSpeed has no flush of a partial window
    finally:
        release_ds(engine, *state)
        del engine
        import gc
        gc.collect()


def run_one(task, init: dict, variant: str, seed: int, args, lr: float) -> tuple[list, dict]:
    import torch

    with torch.no_grad():
        for name, p in task.module.named_parameters():
            if name in init:
                p.copy_(init[name])
    micro = args.topic_batch if task.name == "topics" else args.batch
    torch.manual_seed(seed)
    stop = Plateau(args.patience, args.min_delta, args.min_steps)
    curve, losses, train_s, step, plateaued = [], [], 0.0, 0, False
    row = {"task": task.name, "variant": variant, "seed": seed}
    with open_engine(task.module, variant, args, micro, lr) as (engine, module, finish):
        curve.append({**row, "step": 0, "train_loss": float("nan"), "train_s": 0.0,
                      **task.evaluate(module)})
        while step < args.max_steps:
            t0 = time.perf_counter()
            x, y = task.batch(seed, step)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            train_s += time.perf_counter() - t0
            losses.append(float(loss.detach()))
            step += 1
            if step % args.eval_every == 0:
                ev = task.evaluate(module)
                curve.append({**row, "step": step, "train_loss": float(np.mean(losses)),
                              "train_s": train_s, **ev})
                losses = []
                if stop.update(step, ev["val_loss"]):
                    plateaued = True
                    break
        finish()
        final = task.evaluate(module)
    result = {**row, "steps": step, "plateaued": plateaued, "best_val_loss": stop.best,
              "best_step": stop.best_step, "train_s": train_s,
              **{f"final_{k}": v for k, v in final.items()}, **stop_metrics(curve[-1])}
    return curve, result


def stop_metrics(last_eval: dict) -> dict:
    """The evaluation at the stop (the curve's last row), before any flush."""
    return {f"stop_{k}": last_eval[k] for k in ("val_loss", "test_acc") if k in last_eval}


def merge(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """`old` without the (task, variant, seed) runs that `new` has, then `new` (runs or
    curves rows)."""
    key = ["task", "variant", "seed"]
    if old.empty:
        return new.reset_index(drop=True)
    done = set(map(tuple, new[key].itertuples(index=False)))
    keep = old[[tuple(r) not in done for r in old[key].itertuples(index=False)]]
    return pd.concat([keep, new], ignore_index=True)


def backfill_stop(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """Fill missing stop_val_loss / stop_test_acc from each run's last evaluation in
    `curves` (runs written before these columns existed)."""
    runs = runs.copy()
    last = curves.sort_values("step").groupby(["task", "variant", "seed"]).tail(1)
    last = last.set_index(["task", "variant", "seed"])
    for col in ("val_loss", "test_acc"):
        if col not in last:
            continue
        stop = f"stop_{col}"
        if stop not in runs:
            runs[stop] = np.nan
        idx = [tuple(r) for r in runs[["task", "variant", "seed"]].itertuples(index=False)]
        fill = [last[col].get(i, np.nan) for i in idx]
        runs[stop] = runs[stop].where(runs[stop].notna(), pd.Series(fill, index=runs.index))
    return runs


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    metrics = [m for m in ("final_val_loss", "final_test_acc", "final_test_loss",
                           "stop_val_loss", "stop_test_acc", "steps", "train_s") if m in runs]
    rows = []
    for (task, variant), g in runs.groupby(["task", "variant"], sort=False):
        r = {"task": task, "variant": variant, "n": len(g),
             "plateaued": int(g["plateaued"].sum())}
        for m in metrics:
            v = g[m].astype(float)
            if v.isna().all():
                continue
            r |= {f"{m}_mean": v.mean(), f"{m}_std": v.std(ddof=1) if len(v) > 1 else 0.0,
                  f"{m}_min": v.min(), f"{m}_max": v.max()}
        rows.append(r)
    return pd.DataFrame(rows)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python bench/convergence.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=["topics", "lm"], choices=["topics", "lm"])
    p.add_argument("--variants", nargs="+", default=list(STUDY_VARIANTS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--full", action="store_true",
                   help="the long version: last 6 blocks, LM batches 8 x 64, cap 600 steps")
    p.add_argument("--last-blocks", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="LM sequences per step")
    p.add_argument("--seq", type=int, default=32, help="LM tokens per sequence")
    p.add_argument("--topic-batch", type=int, default=8, help="paragraphs per step")
    p.add_argument("--prefix-tokens", type=int, default=24)
    p.add_argument("--classes", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4, help="LM learning rate")
    p.add_argument("--topic-lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--select-interval", type=int, default=16)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--patience", type=int, default=3)
    p.add_argument("--min-delta", type=float, default=0.005)
    p.add_argument("--min-steps", type=int, default=40)
    p.add_argument("--max-steps", type=int, default=200)
    p.add_argument("--eval-windows", type=int, default=48)
    p.add_argument("--device-threads", type=int, default=1)
    p.add_argument("--host-threads", type=int, default=1)
    p.add_argument("--cache", default=None)
    p.add_argument("--append", action="store_true",
                   help="keep the runs already in --out; this invocation's replace only "
                        "those of the same task, variant and seed")
    p.add_argument("--any-version", action="store_true",
                   help="accept a deepspeed other than 0.19.5 (deepspeed-* variants)")
    p.add_argument("--out", type=Path, default=ROOT / "bench/results/convergence")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.full:
        args.last_blocks, args.batch, args.seq, args.max_steps = 6, 8, 64, 600
    for v in args.variants:
        parse_variant(v, args.select_interval)
    started = time.perf_counter()
    ds_version = None
    if any(map(is_deepspeed, args.variants)):  # fail before loading anything
        from ds_engines import import_deepspeed
        ds_version = import_deepspeed(args.any_version).__version__
    import torch

    from ds_wallclock_observe import machine
    from zfbench.real import hf_model as hm
    from zfbench.real.data import default_text
    torch.set_num_threads(args.device_threads)
    tok = hm.load_tokenizer(args.cache)
    lm = hm.load_pretrained(args.cache)
    trainable = hm.freeze_all_but(lm, args.last_blocks)
    # every task's runs start from these weights: the tasks share `lm`, and a task's last
    # run leaves its weights trained (results before 2026-11-25 18:40 lacked this reset:
    # their LM runs started from the last topic run's weights; docs/results.md says so)
    pretrained = {n: p.detach().clone() for n, p in lm.named_parameters() if p.requires_grad}
    first = len(hm.decoder_blocks(lm)) - args.last_blocks
    tasks = []
    for name in args.tasks:
        if name == "lm":
            ids = hm.encode_text(default_text(), tok, args.cache)
            tasks.append(LMTask(lm, first, hm.split_ids(ids, "train"),
                                hm.split_ids(ids, "heldout"), args))
        else:
            tasks.append(TopicsTask(lm, first, tok, args))
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    curves, runs = [], []
    head = {"command": "python bench/convergence.py " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "paper_zenflow": PAPER_ZENFLOW, "trainable_params": trainable,
            "machine": machine(), "torch": torch.__version__,
            "python": platform.python_version(), "load_avg_start": os.getloadavg()}
    if ds_version:
        from ds_engines import deepspeed_zenflow_section
        head["deepspeed"] = ds_version
        head["deepspeed_zenflow"] = {
            v: dict(zip(("section", "notes"), deepspeed_zenflow_section(
                parse_variant(v, args.select_interval)[1])))
            for v in args.variants if is_deepspeed(v) and parse_variant(v, 0)[0] == "zenflow"}
    old_runs, old_curves, old_head = pd.DataFrame(), pd.DataFrame(), None
    if args.append and (out / "runs.csv").exists():
        old_runs, old_curves = pd.read_csv(out / "runs.csv"), pd.read_csv(out / "curves.csv")
        old_head = json.loads((out / "summary.json").read_text())
    for task in tasks:
        with torch.no_grad():
            for n, p in lm.named_parameters():
                if n in pretrained:
                    p.copy_(pretrained[n])
        if task.name == "topics":
            head["topics"] = {"classes": list(task.task.classes), "counts": task.counts}
        init = {n: p.detach().clone() for n, p in task.module.named_parameters()
                if p.requires_grad}
        head.setdefault("pretrained", {})[task.name] = task.evaluate()
        lr = args.lr if task.name == "lm" else args.topic_lr
        for seed in args.seeds:
            for variant in args.variants:
                curve, result = run_one(task, init, variant, seed, args, lr)
                curves += curve
                runs.append(result)
                acc = (f", test acc {result['final_test_acc']:.3f}"
                       if "final_test_acc" in result else "")
                print(f"{task.name} {variant} seed {seed}: {result['steps']} steps "
                      f"({'plateau' if result['plateaued'] else 'cap'}), val loss "
                      f"{result['final_val_loss']:.4f}{acc}, {result['train_s']:.0f} s "
                      f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
                # written after every run: a cut-short study keeps what it measured
                head |= {"runtime_s": time.perf_counter() - started,
                         "load_avg_end": os.getloadavg(), "complete": False}
                runs_df = write_results(out, curves, runs, head, old_curves, old_runs,
                                        old_head)
    head["complete"] = True
    runs_df = write_results(out, curves, runs, head, old_curves, old_runs, old_head)
    print(summarize(runs_df).to_string(index=False))
    return 0


def write_results(out: Path, curves: list, runs: list, head: dict, old_curves, old_runs,
                  old_head) -> pd.DataFrame:
    """curves.csv, runs.csv, summary.csv, summary.json: this invocation's rows merged into
    the old ones (--append; empty frames otherwise). Returns the runs written."""
    curves_df = merge(old_curves, pd.DataFrame(curves))
    runs_df = backfill_stop(merge(old_runs, pd.DataFrame(runs)), curves_df)
    curves_df.to_csv(out / "curves.csv", index=False)
    runs_df.to_csv(out / "runs.csv", index=False)
    summarize(runs_df).to_csv(out / "summary.csv", index=False)
    if old_head is not None:
        mine = {**head, "runs": sorted({f"{r['task']}/{r['variant']}/{r['seed']}"
                                        for r in runs})}
        appended = [a for a in old_head.get("appended", [])
                    if a.get("command") != head["command"]]
        doc = {**old_head, "appended": appended + [mine]}
    else:
        doc = head
    (out / "summary.json").write_text(json.dumps(doc, indent=2, default=str))
    return runs_df


if __name__ == "__main__":
    sys.exit(main())
