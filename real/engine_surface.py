"""The engine as a DeepSpeed script sees it: DeepSpeed's getters, modes and names.

`DeepSpeedSurface` is a mixin of `zfbench.real.engine.Engine`; it owns nothing but the
names DeepSpeed 0.19.5's `DeepSpeedEngine` gives a training script, each mapped onto the
engine's own state: `module`, `local_rank`, `global_rank`, `world_size`,
`train_batch_size()`, `train_micro_batch_size_per_gpu()`, `gradient_accumulation_steps()`,
`get_lr()`, `get_global_step()`, `global_samples`, `gradient_clipping()`,
`zero_optimization_stage()`, `bfloat16_enabled()` / `fp16_enabled()`,
`was_step_applied()`, `train()` / `eval()`, `forward(...)` (the same as calling the
engine: any signature goes through to the model) and `zero_grad()`.
`global_steps` (optimizer steps, skipped ones included, as DeepSpeed counts them),
`optimizer`, `lr_scheduler`, `training_dataloader` and `device` are plain attributes of
the engine. `is_gradient_accumulation_boundary`, `backward` and `step` are the engine's.
"""

from __future__ import annotations


class DeepSpeedSurface:
    """DeepSpeed's engine names over zfbench's engine (module docstring)."""

    # -- the model ------------------------------------------------------------------------
    @property
    def module(self):
        """The model the engine trains (its parameters are views into the flat buffer)."""
        return self.model

    def forward(self, *args, **kwargs):
        return self(*args, **kwargs)

    def train(self, mode: bool = True):
        self.model.train(mode)
        return self

    def eval(self):
        return self.train(False)

    @property
    def training(self) -> bool:
        return self.model.training

    def zero_grad(self) -> None:
        """Zero the accumulated gradients (engine.step() does it after every update)."""
        self._zero_grads()

    # -- ranks ----------------------------------------------------------------------------
    @property
    def local_rank(self) -> int:
        return self.dist.local_rank

    @property
    def global_rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world

    # -- the config's numbers -------------------------------------------------------------
    def train_batch_size(self) -> int:
        return self.config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self.config.micro_batch

    def gradient_accumulation_steps(self) -> int:
        return self.config.grad_accum

    def gradient_clipping(self) -> float:
        return self.config.gradient_clipping

    def zero_optimization_stage(self) -> int:
        return self.config.zero_stage

    def bfloat16_enabled(self) -> bool:
        return self.config.precision == "bf16"

    def fp16_enabled(self) -> bool:
        return self.config.precision == "fp16"

    # -- progress -------------------------------------------------------------------------
    def get_lr(self) -> list[float]:
        """The lr of the next optimizer step, one per parameter group (zfbench has one)."""
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def get_global_step(self) -> int:
        return self.global_steps

    @property
    def global_samples(self) -> int:
        return self.global_steps * self.config.train_batch_size

    def was_step_applied(self) -> bool:
        """Whether the last optimizer step updated the parameters (not an fp16 overflow
        or a skipped non-finite gradient)."""
        return bool(self.step_log) and not self.step_log[-1]["skipped"]
