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

What a strategy reads from and hands to the engine is the protocol of
real/engine_protocol.py (`EngineForStrategy`, `StrategyForEngine`).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from zfbench.core.strategies import chunk_bounds
from zfbench.real import kernels
from zfbench.real.distributed import allreduce_sum_
from zfbench.real.engine_protocol import EngineForStrategy


class Strategy:
    """What every strategy shares: the engine's parameters, clock and lanes.

    Device-side work goes through the engine's backend (real/backend.py): every op names
    its lane and the buffers it reads and writes, and every cross-lane dependency is an
    explicit wait, so one schedule runs on CUDA streams and on the CPU lanes, and the
    hazard checker can prove it ordered."""

    name = "base"
    zeroes_grads = False  # its step zeroes the gradients in its own pass (the engine's not)

    def __init__(self, engine: EngineForStrategy) -> None:
        self.e = engine  # the engine, as real/engine_protocol.py declares it
        self.B = engine.backend
        self.named = engine.named_params
        self.params = [p for _, p in self.named]
        self.uploaded = None  # the h2d event after the last host job's uploads
        self._wires: dict[str, torch.Tensor] = {}

    @property
    def opt(self):
        """The AdamW hyper-parameters of the step being run: the config's, at the engine's
        lr of this step (a schedule moves it; a host job takes it when it is issued)."""
        opt = self.e.config.optimizer
        return opt if opt.lr == self.e.lr else dataclasses.replace(opt, lr=self.e.lr)

    def step(self, t: int) -> None:
        raise NotImplementedError

    def finish(self, flush_partial: bool = False) -> None:
        """Wait for and apply any pending asynchronous update."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- the link -------------------------------------------------------------------------
    def wire(self, name: str) -> torch.Tensor:
        """A pinned host buffer of the shard in the device's dtype: bf16/fp16 cross the
        link as themselves (2 B per element) and are converted on the host."""
        buf = self._wires.get(name)
        if buf is None:
            e = self.e
            buf = self.B.pinned(e.shard_hi - e.shard_lo, e.flat_params.dtype)
            self._wires[name] = self.B.name(buf, f"wire_{name}")
            self.B.mark_host(buf)
        return buf

    def grads_landing(self, t: int) -> torch.Tensor | None:
        """Where step t's gradients land on the host, free to be written during its
        backward (overlap_comm); None: this strategy sends them after backward."""
        return None

    def landing_for(self, dst: torch.Tensor, wire: str = "d2h") -> torch.Tensor:
        """The host buffer gradients bound for `dst` cross into: `dst` itself when it has
        the device's dtype, else the d2h wire named `wire` (converted on the host
        afterwards)."""
        return dst if dst.dtype == self.e.flat_params.dtype else self.wire(wire)

    def grads_down(self, t: int, dst: torch.Tensor, wire: str = "d2h"):
        """d2h: this rank's shard of the gradients, once the compute lane has produced
        them, into `dst` (fp32 host) or, in another dtype, into the d2h wire `wire`.
        Returns the host buffer they land in and the event the host waits for before
        reading it; the compute lane waits for the same event before it zeroes the
        gradients."""
        e, B = self.e, self.B
        if e.sent_down is not None:  # already sent, bucket by bucket, during backward
            (landed, done), e.sent_down = e.sent_down, None
            e.grads_read = done
            return landed, done
        B.wait("d2h", B.record("compute"), "d2h waits for the gradients")
        landed = self.landing_for(dst, wire)
        B.copy("d2h", "d2h_grad", t, landed, e.flat_grads[e.shard_lo:e.shard_hi])
        done = B.record("d2h")
        e.grads_read = done
        return landed, done

    def to_host_dtype(self, dst: torch.Tensor, landed: torch.Tensor, op: str) -> None:
        """On the host lane: the gradients that crossed in the device's dtype into fp32."""
        if landed is not dst:
            self.B.access("host", op, reads=(landed,), writes=(dst,))
            kernels.copy_(dst, landed)

    def h2d_wire(self, target: torch.Tensor, a: int, b: int) -> torch.Tensor | None:
        """The h2d wire's span for master[a:b] (shard-relative) bound for `target`, or
        None when `target` has the master's dtype (fp32: the master goes up itself)."""
        if target.dtype == self.host.master.dtype:
            return None
        return self.wire("h2d")[a:b]

    def params_up(self, t: int, target: torch.Tensor, a: int, b: int,
                  wire: torch.Tensor | None) -> None:
        """h2d, from the host worker: the parameters of master[a:b] (shard-relative) into
        the device buffer `target` at this rank's shard offset: from `wire`, the h2d wire's
        span the host chunk wrote them into (`h2d_wire`), or from the master itself
        (None: the device's dtype is fp32)."""
        e = self.e
        src = self.host.master[a:b] if wire is None else wire
        self.B.copy("h2d", "h2d_param", t, target[e.shard_lo + a:e.shard_lo + b], src)

    def _adam_upload_chunks(self, t: int, grad: torch.Tensor, step: int,
                            target: torch.Tensor):
        """One host-lane callable per chunk: AdamW on it at `step`, writing its new
        parameters into the h2d wire (16-bit weights) in the same pass
        (`kernels.host_adamw_`), then its parameters up
        into `target` (an h2d span); the last one records the event after every upload
        (`self.uploaded`)."""
        host, opt, B = self.host, self.opt, self.B
        jobs = []
        for a, b in host.chunks:
            def chunk(a=a, b=b) -> None:
                wire = self.h2d_wire(target, a, b)
                B.access("host", "host_optim", reads=(grad[a:b],),
                         writes=(host.master[a:b], host.m[a:b], host.v[a:b])
                         + ((wire,) if wire is not None else ()))
                host.adam_chunk(a, b, grad, step, opt, wire)
                self.params_up(t, target, a, b, wire)
            jobs.append(chunk)

        def uploaded() -> None:
            self.uploaded = B.record("h2d")
        return jobs + [uploaded]

    def _collect_pending(self, t: int) -> bool:
        """Wait for the pending host job and gather every rank's shard of its result into
        `self.upload`; False when nothing is pending."""
        e = self.e
        if self.pending is None and not self.pending_ready:
            return False
        e.host_lane.wait(self.pending, e.host_timeout_s)
        self.B.wait("compute", self.uploaded, "compute waits for the uploads")
        e.gather_params(self.upload, t)
        return True

    def _device_adam(self, params, grads, ms, vs, steps, scratch=None,
                     zero_grads: bool = False, grad_divisor: float = 1.0,
                     fused: bool | None = None) -> None:
        o = self.opt
        kernels.adamw_foreach_(params, grads, ms, vs, steps, lr=o.lr, beta1=o.betas[0],
                       beta2=o.betas[1], eps=o.eps, weight_decay=o.weight_decay,
                       scratch=scratch, zero_grads=zero_grads, grad_divisor=grad_divisor,
                       fused=fused)


class FlatAdamW:
    """The `device` strategy's optimizer over the engine's whole flat buffer: its fp32
    master (the buffer itself with fp32 weights), moments and scratch, and `update_`, the
    step's kernels. real/profile.py times this same update on the profile's flat buffers
    (`device_step_s_per_elem`, what the simulator prices the device strategy's step with),
    so the profile times what the engine runs (tests/test_profile_device_step.py).
    `zeroes_grads`: on the CPU lanes with fp32 weights the gradients are zeroed in the
    AdamW pass (`adamw_foreach_(..., zero_grads=True)`)."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.fp32 = flat.dtype == torch.float32
        self.zeroes_grads = self.fp32 and flat.device.type == "cpu"
        self.master = [flat] if self.fp32 else [flat.detach().float()]
        self.m = [torch.zeros_like(self.master[0])]
        self.v = [torch.zeros_like(self.master[0])]
        self.scratch = [torch.zeros_like(self.master[0])]
        # an fp32 copy of low-precision gradients, reused (fresh ones page-fault each step)
        self.grads32 = None if self.fp32 else [torch.zeros_like(self.master[0])]

    def update_(self, flat_params: torch.Tensor, flat_grads: torch.Tensor, step: int, opt,
                zero_grads: bool) -> None:
        """AdamW at `step` (`opt`: lr, betas, eps, weight_decay) from `flat_grads` (through
        their fp32 copy with 16-bit weights) into the master, then into `flat_params`."""
        grads = [flat_grads]
        if self.grads32 is not None:
            kernels.copy_(self.grads32[0], flat_grads)
            grads = self.grads32
        kernels.adamw_foreach_(self.master, grads, self.m, self.v, [step], lr=opt.lr,
                               beta1=opt.betas[0], beta2=opt.betas[1], eps=opt.eps,
                               weight_decay=opt.weight_decay, scratch=self.scratch,
                               zero_grads=zero_grads)
        if not self.fp32:
            kernels.copy_(flat_params, self.master[0])


class DeviceStrategy(Strategy):
    """Everything on the accelerator: AdamW over all parameters, fp32 state on device.

    It runs on the engine's flat buffers as one tensor (the same AdamW per element as per
    parameter, one weight decay for all): one fused kernel over contiguous memory, whatever
    the parameters' layout inside the buffer (`FlatAdamW`). On the CPU lanes with fp32
    weights the gradients are zeroed in that pass and the engine does not zero them again
    (`zeroes_grads`)."""

    name = "device"

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.adam = FlatAdamW(engine.flat_params)
        self.fp32 = self.adam.fp32
        self.zeroes_grads = self.adam.zeroes_grads
        self.master, self.m, self.v = self.adam.master, self.adam.m, self.adam.v
        self.count = 0

    def step(self, t: int) -> None:
        e = self.e
        with self.B.op("compute", "device_optim", t, reads=(e.flat_grads,),
                       writes=(e.flat_params, e.flat_grads)):
            clip = e.config.gradient_clipping
            if clip > 0:  # clip_grad_norm_'s rule on the flat buffer (all-reduced: whole)
                grads32 = self.adam.grads32
                norm = kernels.grad_norm(e.flat_grads, None if grads32 is None else grads32[0])
                e.flat_grads.mul_(torch.clamp(clip / (norm + 1e-6), max=1.0))
            self.count += 1
            self.adam.update_(e.flat_params, e.flat_grads, self.count, self.opt,
                              self.zeroes_grads)

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
        backend = engine.backend
        pin = engine.config.pin_memory  # CpuLanes: nothing to pin, plain buffers

        def new(name: str) -> torch.Tensor:
            buf = (backend.pinned(self.numel, torch.float32) if pin
                   else torch.zeros(self.numel, dtype=torch.float32))
            backend.mark_host(buf)
            return backend.name(buf, name)
        self.master = new("host.master")
        self.master.copy_(engine.flat_params[self.lo:self.hi].detach().float().cpu())
        self.m = new("host.m")
        self.v = new("host.v")
        self.grads = [new(f"host.grads[{i}]") for i in range(n_grad_buffers)]
        self.chunks = chunk_bounds(self.numel, engine.host_chunk_elems)

    def sync_master(self, flat_params: torch.Tensor) -> None:
        """The master shard from the device weights (a blocking d2h the caller declares):
        exact only for fp32 weights (bf16 or fp16 would round the master; ZenFlow then
        exchanges fp32 values instead, real/zenflow_shard.py)."""
        self.master.copy_(flat_params[self.lo:self.hi].detach())

    def adam_chunk(self, a: int, b: int, grad: torch.Tensor, step: int, opt,
                   wire: torch.Tensor | None = None) -> None:
        """AdamW on chunk [a, b) at `step`; its new parameters also rounded into `wire`
        (the h2d wire's span, 16-bit weights) in the same pass over memory."""
        kernels.host_adamw_(self.master[a:b], grad[a:b], self.m[a:b], self.v[a:b], wire,
                            step=step, lr=opt.lr, beta1=opt.betas[0], beta2=opt.betas[1],
                            eps=opt.eps, weight_decay=opt.weight_decay)

    def clip_(self, grad: torch.Tensor, clip: float) -> None:
        """Scale `grad` in place to global L2 norm `clip` (clip_grad_norm_ semantics)."""
        if clip > 0:
            square = kernels.sum_of_squares(grad)
            if self.dist.active:  # the global norm: sum of squares over the shards
                sq = torch.tensor([square], dtype=torch.float64)
                allreduce_sum_(self.dist, sq, host=True)
                square = float(sq)
            scale = clip / (math.sqrt(square) + 1e-6)
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
        # dpu with gradient buckets: step t's gradients land during its backward while
        # the pending host step still reads step t-1's, so the landing buffer (the fp32
        # gradient buffer, or the d2h wire with 16-bit weights) alternates between two
        self.landings = 2 if self.stale and engine.bucketed else 1
        fp32_landing = engine.flat_params.dtype == torch.float32
        self.host = HostState(engine, n_grad_buffers=self.landings if fp32_landing else 1)
        self.upload = (self.B.name(engine.new_device_flat(), "upload") if self.stale
                       else None)
        self.pending = None  # future of the host step whose parameters are not applied
        self.pending_ready = False  # restored from a checkpoint: upload holds a result

    def host_step_chunks(self, t: int, dst: torch.Tensor, landed: torch.Tensor,
                         step: int, target: torch.Tensor, clip: float):
        """Chunk callables: the gradients into fp32, (clip,) AdamW on each chunk, then its
        parameters up."""
        def prepare() -> None:
            self.to_host_dtype(dst, landed, "host_optim")
            if clip > 0:
                self.B.access("host", "host_optim", reads=(dst,), writes=(dst,))
                self.host.clip_(dst, clip)
        return [prepare] + self._adam_upload_chunks(t, dst, step, target)

    def grad_buffer(self, t: int) -> torch.Tensor:
        """The fp32 host gradient buffer of step t."""
        return self.host.grads[t % len(self.host.grads)]

    def landing_wire(self, t: int) -> str:
        return "d2h" if self.landings == 1 else f"d2h{t % 2}"

    def grads_landing(self, t: int) -> torch.Tensor | None:
        if self.stale and self.landings == 1:  # the pending host step still reads it
            return None
        return self.landing_for(self.grad_buffer(t), self.landing_wire(t))

    def step(self, t: int) -> None:
        e = self.e
        if self.stale:
            # the previous host step must be done: its parameters go up now (one step
            # late), and the gradient buffer and upload buffer are free again
            self.apply_pending(t)
        grad = self.grad_buffer(t)
        landed, done = self.grads_down(t, grad, self.landing_wire(t))
        target = self.upload if self.stale else e.flat_params
        # (with `stale`, the uploads overwrite `upload`, which apply_pending read before
        # the d2h: waiting for the d2h orders them after that read too; with buckets the
        # d2h ran during backward, before that read, so the job waits for it itself)
        after = [(done, "host waits for the d2h of the gradients")]
        if self.landings == 2:
            after.append((self.B.record("compute"),
                          "host waits until the pending update was applied"))
        job = e.host_lane.submit("host_optim", t, self.host_step_chunks(
            t, grad, landed, t + 1, target, e.config.gradient_clipping), after=after)
        if self.stale:
            self.pending = job
        else:
            e.host_lane.wait(job, e.host_timeout_s)
            e.grads_read = None  # the job read them after the d2h: zeroing may follow
            self.B.wait("compute", self.uploaded, "compute waits for the uploads")
            e.gather_params(e.flat_params, t)

    def apply_pending(self, t: int) -> None:
        """Put the previous host step's parameters into the device buffer."""
        e = self.e
        if not self._collect_pending(t):
            return
        with self.B.op("compute", "device_optim", t, reads=(self.upload,),
                       writes=(e.flat_params,)):
            kernels.copy_(e.flat_params, self.upload)
        self.pending, self.pending_ready = None, False

    def finish(self, flush_partial: bool = False) -> None:
        if self.stale:
            self.apply_pending(self.e.t)

    def state_dict(self) -> dict:
        e = self.e
        if self.pending is not None:
            e.host_lane.wait(self.pending, e.host_timeout_s)
            self.B.wait("compute", self.uploaded, "checkpoint waits for the uploads")
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
