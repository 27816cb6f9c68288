"""fp16 loss scaling with DeepSpeed's keys: a static scale, or a dynamic one.

The engine multiplies the loss by `scale` before backward, and at the optimizer step
either finds an overflow (a non-finite gradient: the step is skipped, nothing is written
to the optimizer state) or divides the gradients by `scale` before the strategy runs.
`update(overflow)` then moves the scale, by DeepSpeed's documented rule for the `fp16`
keys (`zfbench.core.config.LossScaleConfig`):

- `loss_scale > 0`: static; the scale never moves (overflowing steps are still skipped).
- `loss_scale == 0`: dynamic, starting at 2**initial_scale_power. An overflow uses up one
  unit of hysteresis; when none is left the scale halves (never below min_loss_scale).
  After `loss_scale_window` steps since the last overflow, the scale doubles and the
  hysteresis is refilled. With `consecutive_hysteresis` every overflow-free step refills it.
"""
from __future__ import annotations


class LossScaler:
    def __init__(self, cfg) -> None:
        self.dynamic = cfg.loss_scale == 0
        self.scale = float(2 ** cfg.initial_scale_power) if self.dynamic else \
            float(cfg.loss_scale)
        self.window = cfg.loss_scale_window
        self.min_scale = cfg.min_loss_scale
        self.hysteresis = cfg.hysteresis
        self.consecutive = cfg.consecutive_hysteresis
        self.left = self.hysteresis  # overflows tolerated before the next halving
        self.iteration = 0
        self.last_overflow = -1

    def update(self, overflow: bool) -> None:
        """Move the scale after one optimizer step (skipped when `overflow`)."""
        if self.dynamic:
            if overflow:
                if self.left <= 1:
                    self.scale = max(self.scale / 2, self.min_scale)
                else:
                    self.left -= 1
                self.last_overflow = self.iteration
            else:
                if self.consecutive:
                    self.left = self.hysteresis
                if (self.iteration - self.last_overflow) % self.window == 0:
                    self.scale *= 2
                    self.left = self.hysteresis
        self.iteration += 1

    def state_dict(self) -> dict:
        return {"scale": self.scale, "left": self.left, "iteration": self.iteration,
                "last_overflow": self.last_overflow}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.left = float(state["scale"]), int(state["left"])
        self.iteration, self.last_overflow = int(state["iteration"]), \
            int(state["last_overflow"])
