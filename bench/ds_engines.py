"""DeepSpeed and zfbench side by side on one model and ZenFlow config: import DeepSpeed
(pinned release, CPU accelerator), build either engine, run a step, and the sequential-mode
correctness cases of bench/vs_deepspeed.py (parameter differences after N steps, with and
without the same column selection). Used by that benchmark and by bench/ds_wallclock.py
(engines, steps and seeded batches); both are an optional extra.
"""

from __future__ import annotations

import copy
import socket
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DS_VERSION = "0.19.5"
INSTALL_HINT = (f"DeepSpeed is not installed. This benchmark is an optional extra:\n"
                f"    pip install -e '.[deepspeed]'     (or: pip install deepspeed=={DS_VERSION})\n"
                f"It needs g++ and ninja on PATH: DeepSpeed builds its CPU Adam op on first "
                f"use. Check afterwards that pip kept your torch version.")


# ------------------------------------------------------------------ DeepSpeed setup
def import_deepspeed(any_version: bool, device: str = "cpu"):
    """DeepSpeed imported on `device`'s accelerator ("cpu": gloo; "cuda": nccl), in a
    one-rank process group unless one exists."""
    os.environ.setdefault("DS_ACCELERATOR", device)
    try:
        import deepspeed
    except ImportError:
        print(INSTALL_HINT, file=sys.stderr)
        sys.exit(2)
    if deepspeed.__version__ != DS_VERSION and not any_version:
        sys.exit(f"deepspeed {deepspeed.__version__} found; this benchmark was checked with "
                 f"{DS_VERSION} (0.19.8 corrupts weights at initialize on CPU). "
                 f"pip install deepspeed=={DS_VERSION}, or pass --any-version")
    import logging

    from deepspeed.utils import logger
    logger.setLevel(logging.WARNING)
    if not torch.distributed.is_initialized():
        with socket.socket() as s:  # a free local port for the one-rank gloo group
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0",
                          WORLD_SIZE="1", LOCAL_RANK="0")
        deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")
    return deepspeed


def ds_config(batch: int, zenflow: dict | None, lr: float, wd: float, clip: float,
              strategy: str = "zenflow") -> dict:
    """zfbench's config of `strategy` (zfbench.core.config_build; "zenflow" or
    "zero-offload", which takes no ZenFlow section) as DeepSpeed takes it: without the
    `zfbench` section (`make_zf` puts it back), the ZenFlow section through
    `deepspeed_zenflow_section`, plus DeepSpeed's own keys."""
    from zfbench.core.config_build import build_config

    if strategy not in ("zenflow", "zero-offload"):
        raise ValueError(f"DeepSpeed runs zenflow or zero-offload here, not {strategy!r}")
    section = deepspeed_zenflow_section(zenflow)[0] if strategy == "zenflow" else None
    cfg = build_config(strategy, micro_batch=batch, lr=lr, weight_decay=wd, clip=clip,
                       pin_memory=False, zenflow=section)
    del cfg["zfbench"]
    cfg["steps_per_print"] = 1 << 30
    return cfg


# zfbench's `zero_optimization.zenflow` keys are DeepSpeed's (zfbench.core.config_zenflow
# mirrors deepspeed/runtime/zenflow/zenflow_config.py), so each knob maps to the key of the
# same name; what differs is which combinations DeepSpeed 0.19.5 accepts and how it reads
# them (runtime/zenflow/engine.py: configure_zenflow).
DS_ZENFLOW_KEYS = ("topk_ratio", "select_strategy", "select_interval", "update_interval",
                   "overlap_step", "full_warm_up_rounds", "auto_ratio",
                   "pt_reserved_cores_perc", "offload")


def deepspeed_zenflow_section(zf: dict) -> tuple[dict, list[str]]:
    """zfbench's ZenFlow section -> (DeepSpeed 0.19.5's `zero_optimization.zenflow`, notes
    on what DeepSpeed reads differently). Raises ValueError for a setting DeepSpeed cannot
    express: a key it lacks, or an integer select_interval under select_strategy "auto"
    (DeepSpeed raises; zfbench reads it as steps)."""
    extra = sorted(set(zf) - set(DS_ZENFLOW_KEYS))
    if extra:
        raise ValueError(f"DeepSpeed's zenflow section has no key {', '.join(extra)}")
    out = dict(zf)
    strategy = out.get("select_strategy", "auto")
    interval = out.get("select_interval", "auto")
    if strategy == "auto" and isinstance(interval, int):
        raise ValueError("select_strategy 'auto' with an integer select_interval: DeepSpeed "
                         "0.19.5 refuses it (zfbench reads the integer as steps); give "
                         "select_strategy 'step'")
    notes = []
    if strategy in ("auto", "epoch"):
        notes.append("select_strategy auto/epoch: DeepSpeed counts epochs only with a "
                     "training_data loader given to initialize; without one it selects once")
    if out.get("overlap_step"):
        notes.append("overlap_step: DeepSpeed's optimizer process keeps two sets of host "
                     "Adam moments, used by alternate windows (zfbench: one set), and a "
                     "reselection copies the device's weights into the host master while "
                     "an update may be pending; each window's update reaches the device "
                     "one window late, as in zfbench, except that DeepSpeed skips its "
                     "first wait-and-copy after warm-up, so the first window's update "
                     "lands two windows late, with the second's")
    return out, notes


def release_ds(dse, affinity, omp: str | None, threads: int) -> None:
    """Give back what a DeepSpeed engine took: its ZenFlow optimizer process, the core
    pinning of this process (overlap mode), OMP_NUM_THREADS and torch's thread count."""
    import contextlib

    proc = getattr(getattr(dse, "optimizer", None), "process", None)
    with contextlib.suppress(Exception):
        dse.destroy()
    if proc is not None and proc.is_alive():
        proc.terminate()
        proc.join(10)
    os.sched_setaffinity(0, affinity)
    os.environ.pop("OMP_NUM_THREADS", None)
    os.environ.update({} if omp is None else {"OMP_NUM_THREADS": omp})
    torch.set_num_threads(threads)


def make_ds(ds, model: nn.Module, cfg: dict, trainable_only: bool = False):
    """DeepSpeed's engine on `model`; `trainable_only` hands its optimizer only the
    parameters that require gradients (a partly frozen model)."""
    params = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    engine, *_ = ds.initialize(model=model, model_parameters=params,
                               config=copy.deepcopy(cfg))
    return engine


def make_zf(model: nn.Module, cfg: dict, device_threads: int, host_threads: int):
    import zfbench.real as real

    cfg = copy.deepcopy(cfg)
    cfg["zfbench"] = {"strategy": "zenflow"}
    return real.initialize(model, cfg, device="cpu", device_threads=device_threads,
                           host_threads=host_threads)


def train_step(engine, batch, phases: list | None = None, sync=None) -> float:
    """forward, backward, step; appends (forward_s, backward_s, step_s) to `phases`.
    `sync` (torch.cuda.synchronize on a GPU) ends each phase's clock when its queued work
    is done, not when it was issued."""
    sync = sync or (lambda: None)
    t0 = time.perf_counter()
    loss = engine(batch["input_ids"], batch["labels"])
    sync()
    t1 = time.perf_counter()
    engine.backward(loss)
    sync()
    t2 = time.perf_counter()
    engine.step()
    sync()
    if phases is not None:
        phases.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    return float(loss.detach())


class MatrixOnlyLM(nn.Module):
    """Embedding, up (ReLU), down, head: every parameter 2-D, so no 1-D parameter can sit
    before a matrix in DeepSpeed's gradient bucket and shift its column-score window."""

    def __init__(self, vocab: int = 64, hidden: int = 32, inner: int = 64, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)
        self.head = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
        self.vocab = vocab

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def seeded_batches(vocab: int, batch: int, seq: int, n: int, seed: int) -> list[dict]:
    from zfbench.real.data import synthetic_batches

    stream = synthetic_batches(vocab, batch, seq, seed=seed)
    return [next(stream) for _ in range(n)]


# ------------------------------------------------------------------ correctness
def torch_adamw_params(model: nn.Module, batches, lr, wd, steps) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd, foreach=False)
    for b in batches[:steps]:
        opt.zero_grad()
        model(b["input_ids"], b["labels"]).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def check_case(ds, name: str, make_model, zenflow: dict, steps: int, batch: int, seq: int,
               lr: float, wd: float, impose_ds_selection: bool = False) -> dict:
    cfg = ds_config(batch, zenflow, lr, wd, clip=0.0)
    ds_model, zf_model = make_model(), make_model()
    vocab = ds_model.vocab if hasattr(ds_model, "vocab") else ds_model.shape.vocab
    data = seeded_batches(vocab, batch, seq, steps, seed=1)
    dse = make_ds(ds, ds_model, cfg)
    torch.set_num_threads(2)
    ds_losses = [train_step(dse, b) for b in data]
    zfe = make_zf(zf_model, cfg, 1, 1)
    if impose_ds_selection:  # select once (S = 0): DeepSpeed's final set is its only one
        ds_sel = {n: p.selected_indices.long().sort().values
                  for n, p in dse.module.named_parameters() if p.dim() == 2}
        own_select = zfe.strategy.select

        def select(t: int) -> None:
            own_select(t)
            zfe.strategy.selected.update(ds_sel)
        zfe.strategy.select = select
    zf_losses = [train_step(zfe, b) for b in data]
    zfe.finish()
    zfe.close()
    ds_p = {n: p.detach().float().clone() for n, p in dse.module.named_parameters()}
    zf_p = {n: p.detach().float().clone() for n, p in zf_model.named_parameters()}
    init = {n: p.detach().clone() for n, p in make_model().named_parameters()}
    diffs = {n: float((ds_p[n] - zf_p[n]).abs().max()) for n in zf_p}
    moved = max(float((zf_p[n] - init[n]).abs().max()) for n in zf_p)
    sel = {}
    for n, p in dse.module.named_parameters():
        if p.dim() == 2 and n in zfe.strategy.selected:
            a = set(getattr(p, "selected_indices", torch.empty(0)).tolist())
            b = set(zfe.strategy.selected[n].tolist())
            sel[n] = len(a & b) / max(1, len(a | b))
    out = {"case": name, "zenflow": zenflow, "impose_ds_selection": impose_ds_selection,
           "steps": steps, "lr": lr, "weight_decay": wd,
           "n_params": sum(p.numel() for p in zf_p.values()),
           "max_abs_diff": max(diffs.values()), "max_abs_update": moved,
           "worst_params": dict(sorted(diffs.items(), key=lambda kv: -kv[1])[:4]),
           "max_abs_loss_diff": max(abs(a - b) for a, b in zip(ds_losses, zf_losses)),
           "selection_jaccard": sel,
           "weights_with_identical_selection": sum(v == 1.0 for v in sel.values()),
           "weights_2d": len(sel)}
    if zenflow["topk_ratio"] == 1.0 and zenflow["update_interval"] == 1:
        ref = torch_adamw_params(make_model(), data, lr, wd, steps)
        out["max_abs_diff_deepspeed_vs_torch_adamw"] = max(
            float((ds_p[n] - ref[n]).abs().max()) for n in ref)
        out["max_abs_diff_zfbench_vs_torch_adamw"] = max(
            float((zf_p[n] - ref[n]).abs().max()) for n in ref)
    dse.destroy() if hasattr(dse, "destroy") else None
    return out


def correctness(ds, args) -> list[dict]:
    from zfbench.real.model import build_model
    from zfbench.core.models import get_model

    tiny = get_model("tiny")
    base = {"select_strategy": "step", "select_interval": 0, "overlap_step": False,
            "full_warm_up_rounds": 0}
    cases = [
        ("A: tiny, topk 1.0, U 1 (= AdamW)", lambda: build_model(tiny, seed=0),
         dict(base, topk_ratio=1.0, update_interval=1)),
        ("B: 2-D-only model, topk 0.25, U 4", lambda: MatrixOnlyLM(seed=0),
         dict(base, topk_ratio=0.25, update_interval=4)),
        ("C: tiny, topk 0.25, U 4 (shipped score-window shift)",
         lambda: build_model(tiny, seed=0), dict(base, topk_ratio=0.25, update_interval=4)),
        ("D: as C, zfbench given DeepSpeed's selected columns",
         lambda: build_model(tiny, seed=0), dict(base, topk_ratio=0.25, update_interval=4)),
    ]
    rows = []
    for name, make, zf in cases:
        row = check_case(ds, name, make, zf, args.check_steps, 4, 16, lr=1e-3, wd=0.01,
                         impose_ds_selection=name.startswith("D"))
        print(f"  {name}: max |dparam| {row['max_abs_diff']:.3g} "
              f"(largest update {row['max_abs_update']:.3g}), identical selections "
              f"{row['weights_with_identical_selection']}/{row['weights_2d']}", flush=True)
        rows.append(row)
    return rows
