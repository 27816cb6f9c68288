"""Shared pieces of the engine tests: a small model that is not ours, configs, a loop."""

from __future__ import annotations

import torch
from torch import nn

import zfbench.real as real
from zfbench.core.config_build import build_config


class BiasMLP(nn.Module):
    """A model the engine knows nothing about: embedding, two biased linears, a norm."""

    def __init__(self, vocab: int = 32, hidden: int = 12, inner: int = 20, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(vocab, hidden)
        self.up = nn.Linear(hidden, inner)
        self.down = nn.Linear(inner, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        logits = self.out(self.norm(h))
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def batches(vocab: int = 32, batch: int = 4, seq: int = 6, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    while True:
        ids = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
        yield ids[:, :-1], ids[:, 1:]


def config(strategy: str, lr: float = 1e-2, wd: float = 0.01, clip: float = 0.0,
           **zenflow) -> dict:
    return build_config(strategy, micro_batch=4, lr=lr, weight_decay=wd, clip=clip,
                        zenflow=zenflow if strategy == "zenflow" else None)


def make_engine(model: nn.Module, cfg: dict, **kwargs):
    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("device_threads", 1)
    kwargs.setdefault("host_threads", 1)
    return real.initialize(model, cfg, **kwargs)


def train_steps(engine, data, steps: int, on_grads=None) -> list[float]:
    """Run `steps` steps; `on_grads(grads)` sees each step's gradients before `step()`."""
    losses = []
    for _ in range(steps):
        ids, labels = next(data)
        loss = engine(ids, labels)
        engine.backward(loss)
        if on_grads is not None:
            on_grads({n: p.grad.detach().clone() for n, p in engine.named_params})
        engine.step()
        losses.append(float(loss.detach()))
    return losses


def params_of(module: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def spawn_ranks(target, world: int, tmp_path, join_timeout_s: float = 240) -> list:
    """`target(rank, world, store, out)` in `world` spawned processes (a file store and the
    output folder under `tmp_path`); their exit codes, any still running killed."""
    import time

    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, world, str(tmp_path / "store"),
                                              str(tmp_path))) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + join_timeout_s
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]
