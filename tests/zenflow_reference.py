"""A plain, obviously-correct reference of the ZenFlow semantics (reference/zenflow.md).

Used by the tests to check the real engine step for step. Readability over speed:
per-parameter Python, explicit column bookkeeping, everything in float64 (parameters,
host master, host and device moments), so an fp32 engine can be compared with a
tolerance. Import it as `from zenflow_reference import ReferenceZenFlow` (pytest puts
tests/ on sys.path because tests/ has no __init__.py).

Vocabulary. "device" = the model's parameters (what `params()` returns); "master" =
the host fp32 master copy (float64 here); 2-D tensors are weights [rows, cols] whose
columns (dim 1, the input features) are selected; every other tensor is "1-D" and is
always fully selected.

One call of `step(grads)` is one iteration t (0-based, counted internally):

- Warm-up (t < W): window gradient = grad / U (U = 1 in auto mode), clipped; host AdamW
  on the whole master at step number t + 1; the whole master is copied into the device.
  No selection, no device optimizer, no accumulation. Synchronous also in overlap mode.
- Post-warm-up, in this order:
  1. Selection step (t >= W and (t == W or S != 0 and t % S == 0)):
     a. if t != 0: [overlap only] apply a pending host result first (see "Overlap");
        then master <- device weights (every parameter).
     b. new set per 2-D weight: top k = max(1, floor(ratio * cols)) columns by this
        iteration's gradient score (l1: sum |g[:, j]|; l2sq: sum g[:, j]^2); ties go to
        the lower index; stored sorted.
     c. device moments of every device-optimized tensor are zeroed, their step count
        kept (created at the first selection step with step 0). This includes the
        1-D parameters (they are "fully selected slices"); pass
        reset_1d_moments_on_reselect=False to keep theirs.
  2. Auto mode only: the boundary flag is read (forced boundary or the tracker's
     boundary_next from the previous step), then the tracker observes this step's
     (total L1, selected-columns L1) per 2-D weight, using the set chosen in 1.
  3. The host accumulator adds grad / U for every parameter (auto: adds grad).
  4. Not a boundary: device AdamW on the selected columns and 1-D parameters with
     grad / U (auto: grad), device state step += 1.
  5. Boundary: window gradient = accumulator (auto: accumulator / window length), then
     clipped by global L2 norm (clip_grad_norm_ semantics, eps 1e-6) when
     gradient_clipping > 0. Remember the device's selected columns and 1-D values;
     host AdamW on the whole master at step number t + 1; copy master into the device;
     put the remembered values back; then the device AdamW of step 4 on them. The
     accumulator is reset. In a fixed-U window cut short by a reselection the
     accumulator still holds sum / U (not the mean), as the reference text says.
  The device gradient is never clipped (only the host window gradient is).

Overlap (`overlap_step: true`), one host moment set, one-window lag:
- The master always holds the result of every host update submitted so far: the host
  Adam of a window is computed on the master at its boundary (at step number t + 1, the
  boundary's lr), exactly as in sequential mode, so the master sequence is identical in
  both modes. What is delayed is only the copy into the device: the result is kept as a
  snapshot `pending` (the real engine's worker computes it in the background; since it
  waits for window k-1 before submitting window k, it runs on the same master values).
- At a post-warm-up boundary: remember selected columns / 1-D values; if a result is
  pending, copy it into the device keeping the remembered values (as in step 5);
  device AdamW; then submit the closed window (host Adam on the master -> new pending).
  The first post-warm-up boundary has nothing pending: it only submits.
- Reselection while a result is pending ("no lost work"): at the selection step the
  pending result is applied first (keeping the OLD set's columns and the 1-D values),
  then master <- device. So around a reselection the window's result reaches the
  device at the start of the next window (earlier than one window later), and the
  device after that selection step equals the sequential schedule's.
- finish(): applies any pending result (keeping selected columns and 1-D values); no
  device step, no host step. An unclosed final window (the run ended before its
  boundary) is discarded in both modes. After finish() the device equals the sequential
  schedule's device at the same t.
- Warm-up steps are synchronous in both modes (nothing is pending across warm-up).

AdamW math is torch.optim.AdamW's with an explicit step number (see `adamw_update`);
optimizer.adam_w_mode False gives torch.optim.Adam's L2 weight decay instead.
"""
from __future__ import annotations

import math

import torch

from zfbench.core.config import OptimizerConfig, ZenFlowConfig
from zfbench.core.schedule import (AutoIntervalTracker, is_selection_step,
                              is_update_boundary, is_warmup, topk_count)

DTYPE = torch.float64
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_


def adamw_update(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                 exp_avg_sq: torch.Tensor, step: int, lr: float, betas, eps: float,
                 weight_decay: float, decoupled: bool = True) -> None:
    """One Adam(W) update in place, at bias-correction step number `step` (>= 1)."""
    beta1, beta2 = betas
    if decoupled:
        param.mul_(1.0 - lr * weight_decay)
    elif weight_decay != 0.0:
        grad = grad + weight_decay * param
    exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
    bias_correction1 = 1.0 - beta1 ** step
    bias_correction2 = 1.0 - beta2 ** step
    denom = exp_avg_sq.sqrt() / math.sqrt(bias_correction2) + eps
    param.sub_((lr / bias_correction1) * exp_avg / denom)


def column_scores(grad: torch.Tensor, importance: str) -> list[float]:
    """Score of each column j of a 2-D gradient: L1 norm or sum of squares."""
    scores = []
    for j in range(grad.shape[1]):
        col = grad[:, j]
        if importance == "l1":
            scores.append(float(col.abs().sum()))
        elif importance == "l2sq":
            scores.append(float((col * col).sum()))
        else:
            raise ValueError(f"importance must be 'l1' or 'l2sq'; got {importance!r}")
    return scores


def top_columns(grad: torch.Tensor, ratio: float, importance: str) -> torch.Tensor:
    """Sorted indices of the k best-scored columns (ties: lower index wins)."""
    scores = column_scores(grad, importance)
    k = topk_count(len(scores), ratio)
    ranked = sorted(range(len(scores)), key=lambda j: (-scores[j], j))
    return torch.tensor(sorted(ranked[:k]), dtype=torch.long)


class ReferenceZenFlow:
    """ZenFlow semantics, one parameter at a time. See the module docstring.

    Inspectable state (float64): `device` (= params()), `master`, `host_exp_avg`,
    `host_exp_avg_sq`, `accum`, `device_state[name] = {"step", "exp_avg",
    "exp_avg_sq"}` (2-D: shaped [rows, k]), `selected`, `pending` (overlap),
    `windows` (inclusive (start, end) of each closed post-warm-up window),
    `chosen_windows` (their lengths), `tracker` (auto mode), `history`.
    """

    def __init__(self, named_params: list[tuple[str, torch.Tensor]],
                 zenflow: ZenFlowConfig, optimizer: OptimizerConfig,
                 gradient_clipping: float = 0.0, importance: str = "l1",
                 steps_per_epoch: int | None = None, *,
                 reset_1d_moments_on_reselect: bool = True):
        if importance not in ("l1", "l2sq"):
            raise ValueError(f"importance must be 'l1' or 'l2sq'; got {importance!r}")
        self.names = [name for name, _ in named_params]
        if len(set(self.names)) != len(self.names):
            raise ValueError("parameter names must be unique")
        self.zf = zenflow
        self.opt = optimizer
        self.clip = float(gradient_clipping)
        self.importance = importance
        self.reset_1d = reset_1d_moments_on_reselect
        self.W = zenflow.full_warm_up_rounds
        self.S = zenflow.select_interval_steps(steps_per_epoch)
        self.U = None if zenflow.auto_update else int(zenflow.update_interval)
        self.overlap = zenflow.overlap_step

        init = {name: p.detach().to(DTYPE).clone() for name, p in named_params}
        self.device = {n: init[n].clone() for n in self.names}
        self.master = {n: init[n].clone() for n in self.names}
        self.host_exp_avg = {n: torch.zeros_like(init[n]) for n in self.names}
        self.host_exp_avg_sq = {n: torch.zeros_like(init[n]) for n in self.names}
        self.accum = {n: torch.zeros_like(init[n]) for n in self.names}
        self.device_state: dict[str, dict] = {}
        self.selected: dict[str, torch.Tensor] = {}
        self.pending: dict[str, torch.Tensor] | None = None
        self.tracker = (AutoIntervalTracker(zenflow.topk_ratio, zenflow.auto_ratio)
                        if self.U is None else None)
        self.window_start: int | None = None
        self.windows: list[tuple[int, int]] = []
        self.history: list[dict] = []
        self.t = 0

    # ------------------------------------------------------------ small helpers
    def is_2d(self, name: str) -> bool:
        return self.device[name].dim() == 2

    def params(self) -> dict[str, torch.Tensor]:
        """Current device parameter values (float64 copies)."""
        return {n: self.device[n].clone() for n in self.names}

    @property
    def chosen_windows(self) -> list[int]:
        return [end - start + 1 for start, end in self.windows]

    def _adam_args(self, lr: float) -> dict:
        return dict(lr=lr, betas=self.opt.betas, eps=self.opt.eps,
                    weight_decay=self.opt.weight_decay, decoupled=self.opt.adam_w_mode)

    def _clip(self, window: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scale the window gradient by clip / (global L2 norm + 1e-6) if < 1."""
        if self.clip <= 0.0:
            return window
        total_sq = 0.0
        for n in self.names:
            total_sq += float((window[n] * window[n]).sum())
        coef = self.clip / (math.sqrt(total_sq) + CLIP_EPS)
        if coef >= 1.0:
            return window
        return {n: window[n] * coef for n in self.names}

    def _host_adam(self, window: dict[str, torch.Tensor], step_number: int,
                   lr: float) -> None:
        """Host AdamW over the whole master (every parameter, every column)."""
        for n in self.names:
            adamw_update(self.master[n], window[n], self.host_exp_avg[n],
                         self.host_exp_avg_sq[n], step_number, **self._adam_args(lr))

    def _remember_device_side(self) -> dict[str, torch.Tensor]:
        """Current device values of the selected columns and of the 1-D parameters."""
        kept = {}
        for n in self.names:
            if self.is_2d(n):
                kept[n] = self.device[n][:, self.selected[n]].clone()
            else:
                kept[n] = self.device[n].clone()
        return kept

    def _copy_into_device_keeping(self, source: dict[str, torch.Tensor]) -> None:
        """device <- source, then the selected columns and 1-D values are put back."""
        kept = self._remember_device_side()
        for n in self.names:
            self.device[n] = source[n].clone()
        for n in self.names:
            if self.is_2d(n):
                self.device[n][:, self.selected[n]] = kept[n]
            else:
                self.device[n] = kept[n]

    def _device_adam(self, grads: dict[str, torch.Tensor], scale: float,
                     lr: float) -> None:
        """Device AdamW on the selected columns and the 1-D parameters."""
        for n in self.names:
            st = self.device_state[n]
            st["step"] += 1
            if self.is_2d(n):
                cols = self.selected[n]
                piece = self.device[n][:, cols].clone()
                adamw_update(piece, grads[n][:, cols] * scale, st["exp_avg"],
                             st["exp_avg_sq"], st["step"], **self._adam_args(lr))
                self.device[n][:, cols] = piece
            else:
                adamw_update(self.device[n], grads[n] * scale, st["exp_avg"],
                             st["exp_avg_sq"], st["step"], **self._adam_args(lr))

    def _apply_pending(self) -> bool:
        if self.pending is None:
            return False
        self._copy_into_device_keeping(self.pending)
        self.pending = None
        return True

    # ------------------------------------------------------------ the phases
    def _reselect(self, t: int, grads: dict[str, torch.Tensor]) -> bool:
        applied = False
        if t != 0:
            applied = self._apply_pending()  # overlap: no lost work
            for n in self.names:
                self.master[n] = self.device[n].clone()
        for n in self.names:
            if self.is_2d(n):
                self.selected[n] = top_columns(grads[n], self.zf.topk_ratio,
                                               self.importance)
                shape = (self.device[n].shape[0], len(self.selected[n]))
            else:
                shape = tuple(self.device[n].shape)
            st = self.device_state.get(n)
            if st is None:
                self.device_state[n] = {"step": 0,
                                        "exp_avg": torch.zeros(shape, dtype=DTYPE),
                                        "exp_avg_sq": torch.zeros(shape, dtype=DTYPE)}
            elif self.is_2d(n) or self.reset_1d:
                st["exp_avg"] = torch.zeros(shape, dtype=DTYPE)  # step count is kept
                st["exp_avg_sq"] = torch.zeros(shape, dtype=DTYPE)
        return applied

    def _warmup_step(self, t: int, grads: dict[str, torch.Tensor], lr: float) -> None:
        u = self.U if self.U is not None else 1
        window = self._clip({n: grads[n] / u for n in self.names})
        self._host_adam(window, t + 1, lr)
        for n in self.names:
            self.device[n] = self.master[n].clone()

    def step(self, grads: dict[str, torch.Tensor], lr: float | None = None) -> None:
        """One iteration t with this iteration's gradients (lr: this step's lr)."""
        if set(grads) != set(self.names):
            raise ValueError(f"grads keys {sorted(grads)} != params {sorted(self.names)}")
        g = {}
        for n in self.names:
            if tuple(grads[n].shape) != tuple(self.device[n].shape):
                raise ValueError(f"{n}: grad shape {tuple(grads[n].shape)} != "
                                 f"param shape {tuple(self.device[n].shape)}")
            g[n] = grads[n].detach().to(DTYPE).clone()
        lr = self.opt.lr if lr is None else float(lr)
        t = self.t
        rec = {"t": t, "warmup": False, "select": False, "boundary": False,
               "host_step": None, "applied_pending": False, "window": None, "lr": lr}

        if is_warmup(t, self.W):
            self._warmup_step(t, g, lr)
            rec.update(warmup=True, boundary=True, host_step=t + 1)
        else:
            select = is_selection_step(t, self.W, self.S)
            if select:
                rec["applied_pending"] = self._reselect(t, g)
            if self.window_start is None:
                self.window_start = t

            if self.U is None:  # auto: read the flag, then observe this step
                boundary = (is_update_boundary(t, self.W, None, self.S)
                            or self.tracker.boundary_next)
                stats = []
                for n in self.names:
                    if self.is_2d(n):
                        total = float(g[n].abs().sum())
                        critic = float(g[n][:, self.selected[n]].abs().sum())
                        stats.append((total, critic))
                self.tracker.observe(stats)
                scale = 1.0
            else:
                boundary = is_update_boundary(t, self.W, self.U, self.S)
                scale = 1.0 / self.U

            for n in self.names:
                self.accum[n] += g[n] * scale

            if boundary:
                length = t - self.window_start + 1
                divisor = length if self.U is None else 1
                window = self._clip({n: self.accum[n] / divisor for n in self.names})
                if self.overlap:
                    if self._apply_pending():
                        rec["applied_pending"] = True
                    self._device_adam(g, scale, lr)
                    self._host_adam(window, t + 1, lr)
                    self.pending = {n: self.master[n].clone() for n in self.names}
                else:
                    kept = self._remember_device_side()
                    self._host_adam(window, t + 1, lr)
                    for n in self.names:
                        self.device[n] = self.master[n].clone()
                    for n in self.names:
                        if self.is_2d(n):
                            self.device[n][:, self.selected[n]] = kept[n]
                        else:
                            self.device[n] = kept[n]
                    self._device_adam(g, scale, lr)
                for n in self.names:
                    self.accum[n].zero_()
                self.windows.append((self.window_start, t))
                rec["window"] = (self.window_start, t)
                self.window_start = None
                if self.tracker is not None:
                    self.tracker.flush()
                rec["host_step"] = t + 1
            else:
                self._device_adam(g, scale, lr)
            rec.update(select=select, boundary=boundary)

        rec["selected"] = {n: self.selected[n].tolist() for n in self.selected}
        self.history.append(rec)
        self.t += 1

    def finish(self) -> bool:
        """Overlap: apply a pending host result (keeping selected columns and 1-D
        values). Returns whether one was pending. Sequential mode: nothing to do."""
        return self._apply_pending()
