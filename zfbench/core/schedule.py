"""The ZenFlow step schedule as pure functions, shared by the real engine and the simulator.

This module owns "which iteration does what": warm-up steps, selection steps, update
boundaries (when a host window closes), the window list, the top-k count, the adaptive
update-interval tracker, and the steps a measurement leaves out of its averages
(`measurement_window`). It knows nothing about tensors (no torch import).

Notation (reference/zenflow.md "Counters and boundaries"): t is the 0-based iteration,
W = full_warm_up_rounds, U = update_interval in steps, S = resolved select interval in
steps (0 = select once). Everywhere here U=None means update_interval "auto": only the
*forced* boundaries are known from (t, W, S) - every warm-up step, and the step just
before a reselection - and the AutoIntervalTracker adds the rest at run time.
Interpretation: in auto mode a reselection still flushes the window first, as it does
with a fixed U, because the host update at a boundary must see the same selected set
that was in force while its window was accumulated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


def _check(t: int, W: int, U: int | None, S: int) -> None:
    if t < 0 or W < 0 or S < 0:
        raise ValueError(f"need t, W, S >= 0; got t={t}, W={W}, S={S}")
    if U is not None and U < 1:
        raise ValueError(f"need U >= 1 (or None for auto); got U={U}")


def is_warmup(t: int, W: int) -> bool:
    """The first W iterations are plain synchronous offload steps."""
    _check(t, W, None, 0)
    return t < W


def is_selection_step(t: int, W: int, S: int) -> bool:
    """Columns are (re)selected at t == W, then at every multiple of S (S=0: never)."""
    _check(t, W, None, S)
    return t >= W and (t == W or (S != 0 and t % S == 0))


def is_update_boundary(t: int, W: int, U: int | None, S: int) -> bool:
    """Does the host window close (host Adam applied) at the end of iteration t?

    Fixed U: t + 1 < W, or (t + 1 - W) mod U == 0, or (S != 0 and (t + 1) mod S == 0).
    The middle term also makes the last warm-up step (t = W - 1) a boundary, so every
    warm-up step is one. U=None (auto): only the forced boundaries (warm-up, and the
    step before a reselection); OR it with the tracker's `boundary_next`.
    """
    _check(t, W, U, S)
    if t + 1 <= W:
        return True
    if S != 0 and (t + 1) % S == 0:
        return True
    return U is not None and (t + 1 - W) % U == 0


# update_interval "auto" where its windows are not known yet (planning a run's steps, a
# simulation without --auto-windows): an assumed constant window of this many steps,
# zfbench's fixed default update_interval (not measured), named as an assumption
AUTO_ASSUMED_WINDOW_STEPS = 4
# The steps left out of a measurement of a strategy without update windows: the delayed
# update's first lag (FIXED_SKIP_STEPS) of a run of FIXED_RUN_STEPS (a judgment, not
# measured); the strategy record says which rule a strategy has (`measure`).
FIXED_SKIP_STEPS, FIXED_RUN_STEPS = 2, 4


def assumed_window_steps(update_interval: int | str) -> int:
    """One window's length in steps before a run: `update_interval`, or for "auto"
    AUTO_ASSUMED_WINDOW_STEPS (its windows are chosen at run time)."""
    return AUTO_ASSUMED_WINDOW_STEPS if update_interval == "auto" else int(update_interval)


def measurement_window(windowed: bool, W: int, lengths) -> tuple[int, int]:
    """(steps left out of the averages, steps a run needs), the one rule the engine's
    report, the simulator and zfbench.validate share. Windowed (ZenFlow's measure): the
    W warm-up steps and the first two host windows are left out (the first window has no
    pending update to wait for) and one more window is measured; `lengths` are the
    windows' lengths in steps, cycled. Otherwise FIXED_SKIP_STEPS of FIXED_RUN_STEPS."""
    if not windowed:
        return FIXED_SKIP_STEPS, FIXED_RUN_STEPS
    lengths = tuple(lengths)
    skip = W + lengths[0] + lengths[1 % len(lengths)]
    return skip, skip + lengths[2 % len(lengths)]


def selected_elements(matrices, vector_numel: int, topk_ratio: float) -> int:
    """ZenFlow's elements updated on the device every step: the top-k columns (all rows)
    of every 2-D weight in `matrices` (`rows`, `cols`), and every 1-D parameter."""
    return sum(m.rows * topk_count(m.cols, topk_ratio) for m in matrices) + vector_numel


def topk_count(cols: int, ratio: float) -> int:
    """Columns kept on the device: max(1, floor(ratio * cols)), ratio in (0, 1].

    The product is taken in floating point, as the formula is written (so e.g.
    0.29 * 100 = 28.999... gives 28).
    """
    if isinstance(cols, bool) or not isinstance(cols, int) or cols < 1:
        raise ValueError(f"cols must be an integer >= 1; got {cols!r}")
    if not (0.0 < ratio <= 1.0):
        raise ValueError(f"ratio must be in (0, 1]; got {ratio!r}")
    return max(1, math.floor(ratio * cols))


@dataclass(frozen=True)
class StepPlan:
    t: int
    warmup: bool
    select: bool
    boundary: bool


def plan_steps(n_steps: int, W: int, U: int | None, S: int) -> list[StepPlan]:
    """The schedule of iterations 0 .. n_steps - 1 (U=None: forced boundaries only)."""
    if n_steps < 0:
        raise ValueError(f"n_steps must be >= 0; got {n_steps}")
    return [StepPlan(t, is_warmup(t, W), is_selection_step(t, W, S),
                     is_update_boundary(t, W, U, S)) for t in range(n_steps)]


def windows(n_steps: int, W: int, U: int | None, S: int) -> list[tuple[int, int]]:
    """Inclusive [start, end] iteration ranges of the host windows after warm-up.

    Each window ends at a boundary; the last one is cut at n_steps - 1 if the run ends
    inside it (so the windows partition W .. n_steps - 1 exactly).
    """
    out: list[tuple[int, int]] = []
    start = W
    for p in plan_steps(n_steps, W, U, S)[W:]:
        if p.boundary or p.t == n_steps - 1:
            out.append((start, p.t))
            start = p.t + 1
    return out


@dataclass
class AutoIntervalTracker:
    """Adaptive update interval (zenflow.md "Adaptive update interval").

    Protocol, per post-warm-up iteration t (warm-up steps are not observed):
      boundary = is_update_boundary(t, W, None, S) or tracker.boundary_next
      tracker.observe(stats_of_t)      # returns the new boundary_next
      ... the step ...
      if boundary: tracker.flush()     # records the window length, resets

    Interpretation, per 2-D weight i over the n steps observed since the window opened:
      mean_i = (1/n) * sum_k critic_ik / (10 * topk_ratio)          (running mean)
      sum_i  =         sum_k (total_ik - critic_ik) / (10 * (1 - topk_ratio))
    weight i "fires" when sum_i >= mean_i; when the fired count is at least
    auto_ratio * n_weights (1e-9 tolerance against float rounding), the next step is a
    boundary. The observe() of a boundary step is counted in its window's length; its
    return value is then superseded by flush(). Edge cases: topk_ratio == 1 leaves no
    unselected columns, so the unselected term is 0 (a weight fires only when its
    critic mean is 0); an empty list (no 2-D weights) never fires.
    """
    topk_ratio: float
    auto_ratio: float
    chosen_windows: list[int] = field(default_factory=list, init=False)
    boundary_next: bool = field(default=False, init=False)
    steps_in_window: int = field(default=0, init=False)
    _critic_sum: list[float] = field(default_factory=list, init=False, repr=False)
    _rest_sum: list[float] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self):
        if not 0.0 < self.topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1]; got {self.topk_ratio!r}")
        if not 0.0 < self.auto_ratio <= 1.0:
            raise ValueError(f"auto_ratio must be in (0, 1]; got {self.auto_ratio!r}")

    def observe(self, per_weight: list[tuple[float, float]]) -> bool:
        """Add one step's (total_l1, critic_l1) per 2-D weight; True if t+1 is a boundary."""
        if self.steps_in_window and len(per_weight) != len(self._critic_sum):
            raise ValueError(f"got {len(per_weight)} weights; this window has "
                             f"{len(self._critic_sum)}")
        if not self.steps_in_window:
            self._critic_sum = [0.0] * len(per_weight)
            self._rest_sum = [0.0] * len(per_weight)
        r = self.topk_ratio
        for i, (total, critic) in enumerate(per_weight):
            total, critic = float(total), float(critic)
            if not (math.isfinite(total) and math.isfinite(critic)) or min(total, critic) < 0:
                raise ValueError(f"weight {i}: need finite norms >= 0; got "
                                 f"total={total!r}, critic={critic!r}")
            self._critic_sum[i] += critic / (10.0 * r)
            if r < 1.0:
                self._rest_sum[i] += max(0.0, total - critic) / (10.0 * (1.0 - r))
        self.steps_in_window += 1
        n = self.steps_in_window
        fired = sum(rest >= crit / n
                    for rest, crit in zip(self._rest_sum, self._critic_sum))
        n_w = len(self._critic_sum)
        self.boundary_next = n_w > 0 and fired >= self.auto_ratio * n_w - 1e-9
        return self.boundary_next

    def flush(self) -> None:
        """The window closed: record its length (if any step was observed) and reset."""
        if self.steps_in_window:
            self.chosen_windows.append(self.steps_in_window)
        self.steps_in_window = 0
        self.boundary_next = False
        self._critic_sum, self._rest_sum = [], []
