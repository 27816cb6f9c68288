"""ZenFlow in the real engine: top-k columns on the device, the rest accumulated on the host.

Implements docs/zenflow.md ("One step after warm-up", in its numbering):
1-2. At a selection step, score each 2-D weight's columns (L1, or sum of squares with
     `importance: l2sq`) on this iteration's gradient, keep the top k sorted, and zero the
     device moments of the selected slices (their step count is kept). After the first
     selection the host master first takes the device's values of the old selection and
     the 1-D parameters; a pending asynchronous update is applied before that.
3.   Every post-warm-up step the gradient goes down (d2h lane) and is accumulated on the
     host lane, divided by U (or summed, and divided by the window's length at the flush,
     with `update_interval: auto`); a window's first step writes its buffer (no zeroing).
4.   Not a boundary: device AdamW on the selection and 1-D parameters (real/zenflow_device.py).
5.   Boundary: host AdamW over the whole fp32 master on the window gradient (clipped by
     its global L2 norm), bias correction at step t + 1, then the master goes up; on the
     device the unselected columns take the host's values, the selected ones and 1-D
     parameters keep theirs, then this iteration's device AdamW runs.
With `overlap_step` the host update of a window is applied at the next boundary: exactly
one window late, so the result never depends on timing. Warm-up steps are synchronous host
steps on grad / U. With 16-bit weights the device keeps fp32 values of the selected
columns and 1-D parameters (`ZenFlowStrategy`'s docstring). Several ranks: each host lane
accumulates and updates its shard, the shards are all-gathered, and each rank scores the
columns on its shard of the reduced gradient, one all-reduce of the per-column partial
scores giving every rank the same top-k (`zfbench.select_comm: scores`; `allgather`
gathers the gradient shards instead, for comparison); both exchanges are `net` spans.
"""

from __future__ import annotations

import torch

from zfbench.real import kernels
from zfbench.real.flat import put_columns, selected_shape, take_columns
from zfbench.real.strategies import HostState, Strategy
from zfbench.real.zenflow_device import SelectedColumnsUpdate
from zfbench.real.zenflow_offload import OffloadedMoments, plan_buckets
from zfbench.real.zenflow_shard import (device_from_master, exchange_scores,
                                        master_from_device)
from zfbench.core.schedule import (AutoIntervalTracker, is_selection_step, is_update_boundary,
                              is_warmup, topk_count)


class ZenFlowStrategy(SelectedColumnsUpdate, Strategy):
    """ZenFlow's steps in the engine (the module docstring).

    With bf16 or fp16 weights the device keeps fp32 values of the selected columns
    (`selected_values`) and of the 1-D parameters (`vector_values`), updates those and writes
    them rounded into the weights, so updates below the weights' resolution add up. Every other
    device weight is the master's value rounded (a boundary or warm-up upload put it there),
    so a selection never copies the weights back: the old selection's fp32 values and the 1-D
    ones go into the master (the master stays fp32, docs/zenflow.md), and the new selection's
    fp32 values (and the 1-D ones) are read from the master, summed over ranks in one
    all-reduce where each rank holds a shard (real/zenflow_shard.py). With fp32 weights the
    device's values are exact and the whole shard is simply copied back, as before.
    """

    name = "zenflow"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        zf = engine.config.zenflow
        self.zf = zf
        self.W = zf.full_warm_up_rounds
        self.auto = zf.update_interval == "auto"
        self.U = None if self.auto else int(zf.update_interval)
        self.S = zf.select_interval_steps(engine.steps_per_epoch)
        self.host = HostState(engine, n_grad_buffers=3)  # staging + two window buffers
        self.upload = self.B.name(engine.new_device_flat(), "upload")
        self.matrices = [(n, p) for n, p in self.named if p.dim() == 2]
        self.vectors = [(n, p) for n, p in self.named if p.dim() != 2]
        self.selected: dict[str, torch.Tensor] = {}
        self.dm: dict[str, torch.Tensor] = {}
        self.dv: dict[str, torch.Tensor] = {}
        for name, p in self.vectors:
            self.dm[name] = torch.zeros_like(p, dtype=torch.float32)
            self.dv[name] = torch.zeros_like(p, dtype=torch.float32)
        # the device update's buffers (real/zenflow_device.py)
        self._init_device_update()
        self.by_name = dict(self.named)
        self.entry_names = [n for n, _ in self.matrices] + [n for n, _ in self.vectors]
        # zenflow.offload: every device moment lives in host memory (real/zenflow_offload.py)
        self.moments = self._offloaded_moments() if zf.offload else None
        if self.moments is not None:
            self.dm, self.dv = dict(self.moments.m), dict(self.moments.v)
        # bf16/fp16 weights: the 1-D parameters' fp32 values on the device (class docstring)
        self.low = engine.flat_params.dtype != torch.float32
        self.vector_values = ({name: p.detach().float() for name, p in self.vectors}
                              if self.low else {})
        self.device_count = 0
        self.parity = 0  # which window buffer accumulates
        self.window_len = 0
        self.accum_job = None
        self.pending = None
        self.pending_ready = False
        self.tracker = AutoIntervalTracker(zf.topk_ratio, zf.auto_ratio) if self.auto else None
        self.auto_boundary_next = False
        self.chosen_windows: list[int] = []

    def _offloaded_moments(self) -> OffloadedMoments:
        e = self.e
        entries = [(n, selected_shape(p, topk_count(p.shape[1], self.zf.topk_ratio)),
                    p.numel()) for n, p in self.matrices]
        entries += [(n, tuple(p.shape), p.numel()) for n, p in self.vectors]
        return OffloadedMoments(self.B, entries, plan_buckets(entries, e.config.bucket_elems),
                                e.flat_params.device,
                                pin=e.config.pin_memory)

    # -- schedule ---------------------------------------------------------------------
    def is_boundary(self, t: int) -> bool:
        if not self.auto:
            return is_update_boundary(t, self.W, self.U, self.S)
        return self.auto_boundary_next or is_update_boundary(t, self.W, None, self.S)

    @property
    def grad_divisor(self) -> float:
        return 1.0 if self.auto else float(self.U)

    # -- steps ------------------------------------------------------------------------
    def step(self, t: int) -> None:
        e = self.e
        if is_warmup(t, self.W):
            self.warmup_step(t)
            return
        if is_selection_step(t, self.W, self.S):
            self.select(t)
        window = self.host.grads[self.parity]
        # into staging (bf16: the wire, added as bf16) once the last accumulation read it
        landed, done = self.grads_down(t, self.grads_landing(t))
        alpha = 1.0 / self.grad_divisor
        # a window's first accumulation writes it (`fresh`): nothing zeroes a window
        # buffer after its host update read it, so its old values are never read
        fresh = self.window_len == 0

        def accumulate() -> None:
            self.B.access("host", "host_accum", reads=(landed,), writes=(window,))
            kernels.accumulate_(window, landed, alpha, fresh=fresh)
        self.accum_job = e.host_lane.submit(
            "host_accum", t, [accumulate], urgent=True,
            after=[(done, "host waits for the d2h of the gradients")])
        self.window_len += 1
        boundary = self.is_boundary(t)
        if self.auto:
            self.observe(t)
        if boundary:
            self.flush(t, window)
        self.device_update(t)

    def grads_landing(self, t: int) -> torch.Tensor | None:
        """The staging buffer (or the d2h wire), once the last accumulation read it."""
        e = self.e
        e.host_lane.wait(self.accum_job, e.host_timeout_s,
                         "the d2h waits until the last accumulation read its buffer")
        return self.landing_for(self.host.grads[2])

    def warmup_step(self, t: int) -> None:
        """A plain synchronous offload step on grad / U at step number t + 1."""
        e, host = self.e, self.host
        grad = host.grads[2]
        landed, done = self.grads_down(t, grad)
        target = self.params_target()
        job = e.host_lane.submit("host_optim", t, self.update_chunks(
            t, grad, target, scale=1.0, landed=landed, divisor=self.grad_divisor),
            after=[(done, "host waits for the d2h of the gradients")])
        e.host_lane.wait(job, e.host_timeout_s)
        self.B.wait("compute", self.uploaded, "compute waits for the uploads")
        e.gather_params(target, t)

    def params_target(self) -> torch.Tensor:
        """The device buffer a warm-up step's parameters go up into."""
        return self.e.flat_params

    def select(self, t: int) -> None:
        e = self.e
        B = self.B
        if t != 0:
            applied = self.apply_pending(t)
            # the device has values newer than the master; the d2h lane waits for them,
            # unless this step's gradients went down already (real/engine.py
            # `_down_checked`, or buckets) after the last write and nothing was applied
            if (not self.low or t > self.W) and (applied or e.sent_down is None):
                B.wait("d2h", B.record("compute"), "select's d2h waits for the weights")
            if not self.low:  # fp32 weights: the device's values are exact
                shard = e.flat_params[e.shard_lo:e.shard_hi]
                with B.op("d2h", "select", t, reads=(shard,), writes=(self.host.master,),
                          nbytes=e.shard_grad_bytes, blocking=True):
                    self.host.sync_master(e.flat_params)
            elif t > self.W:
                master_from_device(e, self.host, self._fp32_items(), t)
        shared = (exchange_scores(e, self.matrices, self.column_scores, t)
                  if e.dist.active else None)
        if self.moments is not None:  # the new selection's moments start at zero
            # after their last d2h: t != 0 synced the master above by a blocking d2h, so
            # this thread is past every earlier d2h; at the first selection none ran
            B.access(B.thread_lane(), "select", writes=(self.moments.host,))
            self.moments.host.zero_()
        with e.compute("select", t, reads=(e.flat_grads,)):
            for name, p in self.matrices:
                scores = shared[name] if shared is not None else self.column_scores(p.grad)
                k = topk_count(p.shape[1], self.zf.topk_ratio)
                idx = kernels.top_columns(scores, k)
                self.selected[name] = idx
                self._forget_columns(name)
                if self.moments is None:
                    # moments of the selected columns, laid out as the weight's columns
                    self.dm[name] = torch.zeros(selected_shape(p, k), dtype=torch.float32,
                                                device=p.device)
                    self.dv[name] = torch.zeros_like(self.dm[name])
            for name, _ in self.vectors:  # 1-D parameters: moments zeroed too
                if self.moments is None:
                    self.dm[name].zero_()
                    self.dv[name].zero_()
        if self.low:
            # the new columns, chosen on the compute lane, are read by the h2d lane (on a
            # GPU: `topk` is only queued when it returns); blocking: the compute lane's
            # later reads are ordered after it
            chosen = [self.selected[name] for name, _ in self.matrices]
            B.access("compute", "select", writes=chosen)
            B.wait("h2d", B.record("compute"), "select's h2d waits for the selection")
            device_from_master(e, self.host, self._fp32_items(from_device=False), t,
                               reads=chosen)

    def _fp32_items(self, from_device: bool = True) -> list:
        """(slot, columns or None, fp32 values) of the selection and the 1-D parameters."""
        slots = self.e.layout.by_name
        items = [(slots[n], self.selected[n],
                  self._work(n, p, self.selected[n], from_device).values)
                 for n, p in self.matrices]
        return items + [(slots[n], None, self.vector_values[n]) for n, _ in self.vectors]

    def column_scores(self, grad: torch.Tensor) -> torch.Tensor:
        return kernels.column_scores(grad, self.e.config.importance)

    def observe(self, t: int) -> None:
        per_weight = []
        for name, p in self.matrices:
            g = p.grad.float().abs()
            per_weight.append((float(g.sum()),
                               float(take_columns(g, self.selected[name]).sum())))
        self.auto_boundary_next = self.tracker.observe(per_weight)

    # -- host update of a window ------------------------------------------------------
    def update_chunks(self, t: int, grad: torch.Tensor, target: torch.Tensor, scale: float,
                      landed: torch.Tensor | None = None, divisor: float = 1.0):
        """Host chunks: the gradient (from the wire, into fp32; divided or scaled), clipped,
        AdamW chunk by chunk with each chunk's parameters up."""
        host, e = self.host, self.e
        clip = e.config.gradient_clipping

        def prepare() -> None:
            if landed is not None:
                self.to_host_dtype(grad, landed, "host_optim")
            self.B.access("host", "host_optim", reads=(grad,), writes=(grad,))
            if divisor != 1.0:
                grad.div_(divisor)
            if scale != 1.0:
                grad.mul_(scale)
            host.clip_(grad, clip)
        return [prepare] + self._adam_upload_chunks(t, grad, t + 1, target)

    def flush(self, t: int, window: torch.Tensor) -> None:
        e = self.e
        scale = 1.0 / self.window_len if self.auto else 1.0
        if self.auto:
            self.chosen_windows.append(self.window_len)
            self.tracker.flush()
            self.auto_boundary_next = False
        self.window_len = 0
        after = []
        if self.zf.overlap_step:
            # the last window's update goes on the device now, after this step's d2h: the
            # new uploads overwrite `upload` only once the compute lane has read it
            self.apply_pending(t)
            after.append((self.B.record("compute"), "uploads wait for the apply"))
        job = e.host_lane.submit("host_optim", t, self.update_chunks(
            t, window, self.upload, scale), after=after)
        self.parity ^= 1
        self.pending = job
        if not self.zf.overlap_step:
            self.apply_pending(t)

    def apply_pending(self, t: int) -> bool:
        """Unselected columns take the host's values; selected ones and 1-D keep theirs.
        Whether an update was pending (and is now applied)."""
        e = self.e
        if not self._collect_pending(t):
            return False
        with e.compute("device_optim", t, reads=(self.upload, e.flat_params),
                       writes=(e.flat_params,)):
            keep = [(p, self.selected[name], self._kept_columns(name, p))
                    for name, p in self.matrices]
            keep_vec = [(p, p.detach().clone()) for _, p in self.vectors]
            kernels.copy_(e.flat_params, self.upload)
            for p, idx, vals in keep:
                put_columns(p.data, idx, vals)
            for p, vals in keep_vec:
                p.data.copy_(vals)
        self.pending, self.pending_ready = None, False
        return True

    def _kept_columns(self, name: str, p: torch.Tensor) -> torch.Tensor:
        """A copy of `p`'s selected columns, for `apply_pending` to put back: with fp32
        weights into the selection's reusable values buffer (`_work`: no model-sized
        allocation at each window end; its values are the weight's then anyway), else
        into a fresh tensor (16-bit weights keep their fp32 values there)."""
        idx = self.selected[name]
        if self.low:
            return take_columns(p.detach(), idx)
        return take_columns(p.detach(), idx, out=self._work(name, p, idx, False).values)

    def finish(self, flush_partial: bool = False) -> None:
        """Apply what is pending; with `flush_partial`, first close the window still open
        (its host update runs at the last iteration's step number), so no gradient of the
        run is left out. The reference semantics discard it (flush_partial False)."""
        t = self.e.t - 1
        if flush_partial and self.window_len > 0 and t >= 0:
            if self.zf.overlap_step:
                self.apply_pending(t)
            self.e.host_lane.wait(self.accum_job, self.e.host_timeout_s)
            self.flush(t, self.host.grads[self.parity])
        self.apply_pending(self.e.t)

    # -- checkpoint -------------------------------------------------------------------
    def schedule_state(self) -> dict:
        """What a checkpoint keeps of the schedule (windows, counts, pending work), once
        the host's jobs are done."""
        e = self.e
        e.host_lane.wait(self.accum_job, e.host_timeout_s)
        if self.pending is not None:
            e.host_lane.wait(self.pending, e.host_timeout_s)
            self.B.wait("compute", self.uploaded, "checkpoint waits for the uploads")
        return {"host": self._host_state(), "upload": self.upload,
                "selected": self.selected, "device_count": self.device_count,
                "parity": self.parity, "window_len": self.window_len,
                "pending": self.pending is not None or self.pending_ready,
                "tracker": None if self.tracker is None else self.tracker.__dict__,
                "auto_boundary_next": self.auto_boundary_next,
                "chosen_windows": self.chosen_windows}

    def _host_state(self) -> dict:
        """The host state to save: a window buffer no open window holds is saved as zeros,
        as it was when the AdamW pass zeroed it (its stale values are never read: the
        next window's first accumulation writes it), so checkpoints keep their bytes."""
        state = self.host.state_dict()
        live = {self.parity} if self.window_len else set()
        state["grads"] = [g if i not in (0, 1) or i in live else torch.zeros_like(g)
                          for i, g in enumerate(state["grads"])]
        return state

    def load_schedule_state(self, state: dict) -> None:
        self.host.load_state_dict(state["host"])
        self.upload.copy_(state["upload"])
        device = self.e.flat_params.device  # saved with map_location="cpu"
        self.selected = {n: idx.to(device) for n, idx in state["selected"].items()}
        self.device_count, self.parity = state["device_count"], state["parity"]
        self.window_len = state["window_len"]
        self.pending, self.pending_ready = None, bool(state["pending"])
        if self.tracker is not None and state["tracker"] is not None:
            self.tracker.__dict__.update(state["tracker"])
        self.auto_boundary_next = state["auto_boundary_next"]
        self.chosen_windows = list(state["chosen_windows"])

    def state_dict(self) -> dict:
        state = self.schedule_state()
        if self.moments is not None:
            self.moments.settle("checkpoint reads the offloaded moments after their last d2h")
        return {**state, "dm": self.dm, "dv": self.dv,
                # bf16/fp16 weights: the device's fp32 values (the weights are rounded)
                "fp32_selected": ({n: w.values for n, w in self.selected_values.items()}
                                  if self.low else None),
                "fp32_vectors": self.vector_values if self.low else None}

    def load_state_dict(self, state: dict) -> None:
        self.load_schedule_state(state)
        device = self.e.flat_params.device  # saved with map_location="cpu"
        self._forget_columns()
        for name, values in (state.get("fp32_selected") or {}).items():
            p = dict(self.matrices)[name]
            self._work(name, p, self.selected[name], from_device=False).values.copy_(values)
        for name, values in (state.get("fp32_vectors") or {}).items():
            self.vector_values[name].copy_(values)
        if self.moments is not None:  # into the host buffer's views
            self.moments.settle("checkpoint writes the offloaded moments after their last d2h")
            for name in self.entry_names:
                self.dm[name].copy_(state["dm"][name])
                self.dv[name].copy_(state["dv"][name])
        else:
            self.dm = {n: m.to(device) for n, m in state["dm"].items()}
            self.dv = {n: v.to(device) for n, v in state["dv"].items()}
