"""The learning rate of every step: the engine's optimizer face and DeepSpeed's schedules.

Owns:
- `EngineOptimizer`: what `initialize` returns as the optimizer. It is a
  `torch.optim.Optimizer` with one parameter group over the model's trainable parameters
  holding the AdamW hyper-parameters, so a torch scheduler (or DeepSpeed's) can drive
  `param_groups[0]["lr"]`; it does no arithmetic itself. The engine reads the group's lr
  at every accumulation boundary and hands it to the strategy, whose device and host
  AdamW use it for that step (an asynchronous host update keeps the lr of the step that
  issued it). `step()` is the engine's to call: a script calls `engine.step()`;
  `zero_grad()` zeroes the engine's gradients, as torch's would.
- `WarmupLR`, `WarmupDecayLR`: DeepSpeed 0.19.5's schedules as it documents them
  (deepspeed/runtime/lr_schedules.py; written here from that description). Built, they
  set the group's lr to warmup_min_lr; each `step()` (the engine calls it after every
  applied optimizer step, none after a skipped fp16 overflow step, as DeepSpeed does)
  moves to the next iteration i = 0, 1, ...: gamma(i) = log(i + 1) / log(warmup) or
  i / warmup during the warm-up, then 1 (WarmupLR) or max(0, (total - i) / max(1, total -
  warmup)) (WarmupDecayLR); lr = min + (max - min) x gamma. So optimizer step k runs at
  min for k = 0 and at iteration k - 1's lr after that.
- `scheduler_from_config`: the schedule of the config's `scheduler` section, or None.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from zfbench.core.config import OptimizerConfig
from zfbench.core.config_scheduler import SchedulerConfig


class EngineOptimizer(torch.optim.Optimizer):
    """The optimizer a DeepSpeed script gets back from `initialize` (module docstring)."""

    def __init__(self, params: list[torch.Tensor], opt: OptimizerConfig,
                 zero_grad: Callable[[], None]) -> None:
        super().__init__(params, dict(lr=opt.lr, betas=opt.betas, eps=opt.eps,
                                      weight_decay=opt.weight_decay))
        self._zero = zero_grad
        self._engine_stepping = False

    @property
    def lr(self) -> float:
        return float(self.param_groups[0]["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        if not self._engine_stepping:
            raise RuntimeError("optimizer.step(): zfbench's engine updates the parameters "
                               "in engine.step() (its strategy's device and host AdamW); "
                               "call engine.step() instead")
        return None if closure is None else closure()

    def engine_step(self) -> None:
        """Called by the engine after an applied update (torch's schedulers count it)."""
        self._engine_stepping = True
        try:
            self.step()
        finally:
            self._engine_stepping = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._zero()


class WarmupLR:
    """DeepSpeed's WarmupLR on `optimizer.param_groups` (module docstring)."""

    def __init__(self, optimizer, warmup_min_lr: float = 0.0, warmup_max_lr: float = 0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = "log") -> None:
        if warmup_type not in ("log", "linear"):
            raise ValueError(f"warmup_type must be 'log' or 'linear', not {warmup_type!r}")
        self.optimizer = optimizer
        self.min_lr, self.max_lr = float(warmup_min_lr), float(warmup_max_lr)
        self.warmup_num_steps = max(2, int(warmup_num_steps))
        self.warmup_type = warmup_type
        self.last_batch_iteration = -1
        self._apply()

    def _gamma(self, i: int) -> float:
        if i < self.warmup_num_steps:
            if self.warmup_type == "log":
                return math.log(i + 1) / math.log(self.warmup_num_steps)
            return i / self.warmup_num_steps
        return self._after_warmup(i)

    def _after_warmup(self, i: int) -> float:
        return 1.0

    def lr_at(self, i: int) -> float:
        """The lr at iteration i (-1: before the first step, warmup_min_lr)."""
        if i < 0:
            return self.min_lr
        return self.min_lr + (self.max_lr - self.min_lr) * self._gamma(i)

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.last_batch_iteration)

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = (self.last_batch_iteration + 1
                                     if last_batch_iteration is None
                                     else int(last_batch_iteration))
        self._apply()

    def get_lr(self) -> list[float]:
        return [self.lr_at(self.last_batch_iteration)] * len(self.optimizer.param_groups)

    def get_last_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = int(state["last_batch_iteration"])
        self._apply()


class WarmupDecayLR(WarmupLR):
    """DeepSpeed's WarmupDecayLR: WarmupLR, then linear decay to min at total_num_steps."""

    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr: float = 0.0,
                 warmup_max_lr: float = 0.001, warmup_num_steps: int = 1000,
                 warmup_type: str = "log") -> None:
        self.total_num_steps = int(total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps,
                         warmup_type)

    def _after_warmup(self, i: int) -> float:
        left = self.total_num_steps - self.warmup_num_steps
        return max(0.0, (self.total_num_steps - i) / max(1.0, left))


def scheduler_from_config(cfg: SchedulerConfig | None, optimizer) -> WarmupLR | None:
    """The schedule a config's `scheduler` section names, driving `optimizer`."""
    if cfg is None:
        return None
    common = dict(warmup_min_lr=cfg.warmup_min_lr, warmup_max_lr=cfg.warmup_max_lr,
                  warmup_num_steps=cfg.warmup_num_steps, warmup_type=cfg.warmup_type)
    if cfg.type == "WarmupDecayLR":
        return WarmupDecayLR(optimizer, cfg.total_num_steps, **common)
    return WarmupLR(optimizer, **common)
