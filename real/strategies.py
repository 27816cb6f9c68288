"""The baseline strategies of the real engine: `device`, `zero-offload`, `zero-offload-dpu`.

All strategies see the model's parameters as views into one flat device buffer
(`engine.flat_params`), so whole-model copies are single ops. The offloading ones keep
fp32 master weights and Adam moments in flat host buffers (`zfbench.real.flat`), move gradients
down on the device thread (the d2h lane), run host AdamW chunk by chunk on the host lane,
and bring parameters back up from the host worker (the h2d lane):

- `zero-offload`: the device waits for the whole host step; parameters go straight into
  the device buffer.
- `zero-offload-dpu`: the host step of step t runs behind the compute of step t+1. Its
  parameters land in an upload buffer and are applied before forward t+2, so every update
  reaches the device exactly one step late, whatever the speeds (deterministic).

With several ranks (ZeRO-2) the host state covers only the rank's shard of the flat
buffer, the gradient clipping norm is summed over ranks on the host lane's own group, and
each rank's updated shard is all-gathered into the device buffer before it is applied.
"""

from __future__ import annotations

import torch

from zfbench.real.adamw import adamw_foreach_
from zfbench.real.distributed import allreduce_sum_
from zfbench.real.host_adam import host_adamw_


class Strategy:
    """What every strategy shares: the engine's parameters, clock and lanes."""

    name = "base"

    def __init__(self, engine) -> None:
        self.e = engine
        self.named = engine.named_params
        self.params = [p for _, p in self.named]
        self.opt = engine.config.optimizer

    def step(self, t: int) -> None:
        raise NotImplementedError

    def finish(self, flush_partial: bool = False) -> None:
        """Wait for and apply any pending asynchronous update."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def _adam_upload_chunks(self, t: int, grad: torch.Tensor, step: int,
                            target: torch.Tensor, zero_after: bool = False):
        """One host-lane callable per chunk: AdamW on it at `step` (optionally zeroing the
        gradient chunk after), then its parameters up into `target` (an h2d span)."""
        host, opt, e = self.host, self.opt, self.e
        jobs = []
        for a, b in host.chunks:
            def chunk(a=a, b=b) -> None:
                host.adam_chunk(a, b, grad, step, opt)
                if zero_after:
                    grad[a:b].zero_()
                start = e.recorder.now()
                e.upload_range(target, host.master, a, b)
                e.recorder.add("h2d", "h2d_param", t, start, e.recorder.now(),
                               (b - a) * e.param_bytes)
            jobs.append(chunk)
        return jobs

    def _collect_pending(self, t: int) -> bool:
        """Wait for the pending host job and gather every rank's shard of its result into
        `self.upload`; False when nothing is pending."""
        e = self.e
        if self.pending is None and not self.pending_ready:
            return False
        e.host_lane.wait(self.pending, e.host_timeout_s)
        e.gather_params(self.upload, t)
        return True

    def _clip_device_grads(self) -> None:
        clip = self.e.config.gradient_clipping
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, clip)

    def _device_adam(self, params, grads, ms, vs, steps, scratch=None) -> None:
        o = self.opt
        adamw_foreach_(params, grads, ms, vs, steps, lr=o.lr, beta1=o.betas[0],
                       beta2=o.betas[1], eps=o.eps, weight_decay=o.weight_decay,
                       scratch=scratch)


class DeviceStrategy(Strategy):
    """Everything on the accelerator: AdamW over all parameters, fp32 state on device.

    It runs on the engine's flat buffers as one tensor (the same AdamW per element as per
    parameter, one weight decay for all): one fused kernel over contiguous memory, whatever
    the parameters' layout inside the buffer."""

    name = "device"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        flat = engine.flat_params
        self.fp32 = flat.dtype == torch.float32
        self.master = [flat] if self.fp32 else [flat.detach().float()]
        self.m = [torch.zeros_like(self.master[0])]
        self.v = [torch.zeros_like(self.master[0])]
        self.scratch = [torch.zeros_like(self.master[0])]
        # an fp32 copy of low-precision gradients, reused (fresh ones page-fault each step)
        self.grads32 = None if self.fp32 else [torch.zeros_like(self.master[0])]
        self.count = 0

    def step(self, t: int) -> None:
        e = self.e
        with e.recorder.span("compute", "device_optim", t):
            clip = e.config.gradient_clipping
            if clip > 0:  # the global L2 norm over every gradient, as per parameter
                torch.nn.utils.clip_grad_norm_([e.flat_grads], clip)
            self.count += 1
            grads = [e.flat_grads]
            if self.grads32 is not None:
                self.grads32[0].copy_(e.flat_grads)
                grads = self.grads32
            self._device_adam(self.master, grads, self.m, self.v, [self.count],
                              self.scratch)
            if not self.fp32:
                e.flat_params.copy_(self.master[0])

    def state_dict(self) -> dict:
        return {"m": self.m, "v": self.v, "count": self.count,
                "master": None if self.fp32 else self.master}

    def load_state_dict(self, state: dict) -> None:
        for dst, src in zip(self.m + self.v, state["m"] + state["v"]):
            dst.copy_(src)
        self.count = state["count"]
        if not self.fp32:
            for dst, src in zip(self.master, state["master"]):
                dst.copy_(src)


class HostState:
    """fp32 master weights, Adam moments and gradient buffers in host memory, for this
    rank's shard [lo, hi) of the flat buffer (all of it with one rank). Indices into
    these buffers, and `chunks`, are shard-relative."""

    def __init__(self, engine, n_grad_buffers: int = 1) -> None:
        self.lo, self.hi = engine.shard_lo, engine.shard_hi
        self.numel = self.hi - self.lo
        self.dist = engine.dist
        pin = engine.use_cuda and engine.config.pin_memory  # nothing to pin without CUDA

        def new() -> torch.Tensor:
            buf = torch.zeros(self.numel, dtype=torch.float32)
            return buf.pin_memory() if pin else buf
        self.master = new()
        self.master.copy_(engine.flat_params[self.lo:self.hi].detach().float().cpu())
        self.m = new()
        self.v = new()
        self.grads = [new() for _ in range(n_grad_buffers)]
        step = max(1, int(engine.host_chunk_elems))
        self.chunks = [(a, min(a + step, self.numel)) for a in range(0, self.numel, step)]

    def sync_master(self, flat_params: torch.Tensor) -> None:
        """The master shard from the device weights: exact only for fp32 weights (bf16 or
        fp16 would round the master; ZenFlow then exchanges fp32 values instead,
        real/zenflow_shard.py)."""
        self.master.copy_(flat_params[self.lo:self.hi].detach().float().cpu())

    def adam_chunk(self, a: int, b: int, grad: torch.Tensor, step: int, opt) -> None:
        host_adamw_(self.master[a:b], grad[a:b], self.m[a:b], self.v[a:b], step=step,
                    lr=opt.lr, beta1=opt.betas[0], beta2=opt.betas[1], eps=opt.eps,
                    weight_decay=opt.weight_decay)

    def clip_(self, grad: torch.Tensor, clip: float) -> None:
        """Scale `grad` in place to global L2 norm `clip` (clip_grad_norm_ semantics)."""
        if clip > 0:
            norm = float(torch.linalg.vector_norm(grad))
            if self.dist.active:  # the global norm: sum of squares over the shards
                sq = torch.tensor([norm * norm], dtype=torch.float64)
                allreduce_sum_(self.dist, sq, host=True)
                norm = float(sq.sqrt())
            scale = clip / (norm + 1e-6)
            if scale < 1:
                grad.mul_(scale)

    def state_dict(self) -> dict:
        return {"master": self.master, "m": self.m, "v": self.v, "grads": self.grads}

    def load_state_dict(self, state: dict) -> None:
        for dst, src in zip([self.master, self.m, self.v, *self.grads],
                            [state["master"], state["m"], state["v"], *state["grads"]]):
            dst.copy_(src)


class OffloadStrategy(Strategy):
    """ZeRO-Offload: gradients down, host AdamW over everything, parameters up."""

    name = "zero-offload"
    stale = False

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.host = HostState(engine)
        self.upload = engine.new_device_flat() if self.stale else None
        self.pending = None  # future of the host step whose parameters are not applied
        self.pending_ready = False  # restored from a checkpoint: upload holds a result

    def grads_down(self, t: int, dst: torch.Tensor, scale: float = 1.0) -> None:
        """The d2h lane: copy every gradient into the flat host buffer `dst`."""
        e = self.e
        with e.recorder.span("d2h", "d2h_grad", t, nbytes=e.shard_grad_bytes,
                             stream=e.d2h_stream):
            e.copy_grads_to(dst)
        if scale != 1.0:
            dst.mul_(scale)

    def host_step_chunks(self, t: int, grad: torch.Tensor, step: int, target: torch.Tensor,
                         clip: float):
        """Chunk callables: (clip, then) AdamW on each chunk, then its parameters up."""
        jobs = [lambda: self.host.clip_(grad, clip)] if clip > 0 else []
        return jobs + self._adam_upload_chunks(t, grad, step, target)

    def step(self, t: int) -> None:
        e = self.e
        if self.stale:
            # the previous host step must be done: its parameters go up now (one step
            # late), and the gradient buffer and upload buffer are free again
            self.apply_pending(t)
        self.grads_down(t, self.host.grads[0])
        target = self.upload if self.stale else e.flat_params
        job = e.host_lane.submit("host_optim", t, self.host_step_chunks(
            t, self.host.grads[0], t + 1, target, e.config.gradient_clipping))
        if self.stale:
            self.pending = job
        else:
            e.host_lane.wait(job, e.host_timeout_s)
            e.gather_params(e.flat_params, t)

    def apply_pending(self, t: int) -> None:
        """Put the previous host step's parameters into the device buffer."""
        e = self.e
        if not self._collect_pending(t):
            return
        with e.recorder.span("compute", "device_optim", t):
            e.flat_params.copy_(self.upload)
        self.pending, self.pending_ready = None, False

    def finish(self, flush_partial: bool = False) -> None:
        if self.stale:
            self.apply_pending(self.e.t)

    def state_dict(self) -> dict:
        e = self.e
        if self.pending is not None:
            e.host_lane.wait(self.pending, e.host_timeout_s)
        return {"host": self.host.state_dict(), "upload": self.upload,
                "pending": self.pending is not None or self.pending_ready}

    def load_state_dict(self, state: dict) -> None:
        self.host.load_state_dict(state["host"])
        if self.upload is not None:
            self.upload.copy_(state["upload"])
        self.pending, self.pending_ready = None, bool(state["pending"])


class DelayedOffloadStrategy(OffloadStrategy):
    """ZeRO-Offload with delayed parameter update (one step stale)."""

    name = "zero-offload-dpu"
    stale = True
