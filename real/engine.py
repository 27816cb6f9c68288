"""The engine: DeepSpeed's shape (`initialize`, `engine(batch)`, `backward`, `step`).

`initialize(model, config)` takes any `torch.nn.Module` and a DeepSpeed-style config (dict
or JSON path, validated by `zfbench.core.config`), and returns an `Engine` running one of
the four strategies (DeepSpeed's own `initialize`, with all its arguments, is
real/deepspeed_api.py's). The engine owns what all strategies share:

- the parameters and gradients as views into flat device buffers (`flat_grads`; weight
  gradients accumulated in place by `zfbench.real.inplace_grads`);
- the lanes behind real/backend.py: CUDA streams, events and pinned buffers, or without
  CUDA an emulated accelerator (the calling thread as device lane, a `HostLane` worker for
  the host optimizer, so overlap and stalls are real); `hazard_check=True` runs the CPU
  lanes under real/hazards.py's checker;
- the span recorder and per-step log; gradient accumulation as DeepSpeed does it (loss
  divided, update only at the boundary); fp16 loss scaling (`zfbench.real.loss_scale`);
  refusal of non-finite gradients (`zfbench.nonfinite`);
- checkpoints that capture a pending asynchronous update (real/checkpoint.py, DeepSpeed's
  tags and `latest`, one file per rank); each step's learning rate (real/lr_schedule.py:
  the strategy's AdamW uses the lr of the step that issues the update); DeepSpeed's names
  for all of it (real/engine_surface.py);
- data parallelism (`dist`, a `zfbench.real.distributed.DistContext`): the flat gradients
  all-reduced before the step, the host state covering only this rank's shard
  `[shard_lo, shard_hi)` (ZeRO-2), updated shards all-gathered back (`gather_params`), both
  collectives `net` spans with their bytes; ZeRO-3 (zenflow): `zero3`, real/zero3.py.
"""

from __future__ import annotations

import os

import torch

from zfbench.real import kernels
from zfbench.real.backend import CpuLanes, CudaBackend, cpu_link_lanes
from zfbench.real.checkpoint import EngineCheckpoint
from zfbench.real.engine_surface import DeepSpeedSurface
from zfbench.real.engine_protocol import StrategyForEngine
from zfbench.real.flat import LOW_PRECISION, FlatLayout
from zfbench.core.strategies import (engine_host_chunk_elems, gradient_buckets_apply,
                                     has_windows)
from zfbench.real.grad_buckets import GradBuckets
from zfbench.real.hazards import HazardChecker
from zfbench.real.distributed import (DistContext, allgather_flat, allreduce_mean_,
                                      broadcast_from_rank0,
                                      default_thread_split,  # noqa: F401 - re-exported
                                      join_launch, lane_threads)
from zfbench.real.host_lane import HostLane
from zfbench.real.inplace_grads import InplaceGrads
from zfbench.real.inplace_grads import wanted as inplace_grads_wanted
from zfbench.real.loss_scale import LossScaler
from zfbench.real.lr_schedule import EngineOptimizer, scheduler_from_config
from zfbench.real.recorder import SpanRecorder
from zfbench.real.strategies import DelayedOffloadStrategy, DeviceStrategy, OffloadStrategy
from zfbench.real.zenflow import ZenFlowStrategy
from zfbench.real.zenflow_zero3 import ZenFlowZero3Strategy
from zfbench.real.zero3 import Zero3Params
from zfbench.core.config import ConfigError, EngineConfig, load_config

# The engine's registry: each class under the zfbench.core.strategies record's name it
# implements (tests/test_strategy_record.py: exactly the record's ENGINE_STRATEGIES).
STRATEGY_CLASSES = {cls.name: cls for cls in (DeviceStrategy, OffloadStrategy,
                                              DelayedOffloadStrategy, ZenFlowStrategy)}
from zfbench.real.flat import DTYPES as COMM_DTYPES  # noqa: E402


class NonFiniteGradientError(FloatingPointError):
    """A NaN or inf gradient with `zfbench.nonfinite: raise`."""


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda asked for, but torch sees no CUDA device; "
                           "use --device cpu (the emulated accelerator) or auto")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be auto, cuda or cpu, not {device!r}")
    return torch.device(device)


class Engine(EngineCheckpoint, DeepSpeedSurface):
    def __init__(self, model: torch.nn.Module, config: EngineConfig, *, device: str = "auto",
                 device_threads: int | None = None, host_threads: int | None = None,
                 steps_per_epoch: int | None = None, host_chunk_elems: int | None = None,
                 host_timeout_s: float = 600.0, rank: int = 0,
                 dist: DistContext | None = None, hazard_check: bool = False,
                 waits_dropped: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.dist = dist if dist is not None else DistContext(rank, 1, rank, "none")
        if config.world_size != self.dist.world:
            raise ConfigError("world_size", f"the config was resolved for {config.world_size}"
                              f" rank(s) but the engine runs on {self.dist.world}: load it "
                              f"with load_config(..., world_size={self.dist.world}) or pass "
                              f"the dict to real.initialize")
        rank = self.dist.rank
        self.device = resolve_device(device)
        self.use_cuda = self.device.type == "cuda"
        if self.use_cuda and self.device.index is None:  # this rank's GPU, by index
            self.device = torch.device("cuda", torch.cuda.current_device())
        # ZenFlow's pt_reserved_cores_perc: the device (training) lane's share of the
        # rank's cores; the other strategies split them evenly on the CPU lanes and give
        # the host step all of them on a GPU (real/distributed.py `lane_threads`)
        reserved = config.zenflow.pt_reserved_cores_perc if config.zenflow else None
        split = lane_threads(reserved, self.use_cuda, self.dist.world, self.dist.active)
        self.device_threads = device_threads or split[0]
        self.host_threads = host_threads or split[1]
        if not self.use_cuda:
            torch.set_num_threads(self.device_threads)
        self.steps_per_epoch = steps_per_epoch
        # None: the engine's rule for its host lane's threads (core/strategies.py)
        self.host_chunk_elems = host_chunk_elems or engine_host_chunk_elems(self.host_threads)
        self.host_timeout_s = host_timeout_s
        self.model = model.to(self.device)
        self.recorder = SpanRecorder(rank, use_cuda=self.use_cuda)
        hazards = HazardChecker() if hazard_check else None
        self.backend = (CudaBackend(self.recorder, self.device, hazards, waits_dropped)
                        if self.use_cuda else CpuLanes(self.recorder, hazards, waits_dropped,
                                                       cpu_link_lanes(self.host_threads)))
        self._flatten_parameters()
        # ZeRO-3: the rank owns a shard of the parameters, modules gather them (real/zero3.py)
        self.zero3 = (Zero3Params(self) if config.zero_stage == 3 and has_windows(config.strategy)
                      else None)
        # the lr: the optimizer's group holds it, a schedule moves it (real/lr_schedule.py)
        self.optimizer = EngineOptimizer([p for _, p in self.named_params],
                                         config.optimizer, self._zero_grads)
        self.lr_scheduler = scheduler_from_config(config.scheduler, self.optimizer)
        self.lr = self.optimizer.lr  # the lr of the step being run (strategies read it)
        self.global_steps = 0  # optimizer steps, skipped ones included (DeepSpeed's count)
        self.skipped_steps = 0
        self.training_dataloader = None  # set by initialize(training_data=...)
        self.grads_read = None  # the d2h event after the last read of the gradients
        self.host_lane = HostLane(self.recorder, self.host_threads,
                                  device=self.device if self.use_cuda else None,
                                  backend=self.backend)
        self.t = 0
        self.micro_step = 0  # micro-steps since the last optimizer step (accumulation)
        self._micro_losses: list[torch.Tensor] = []
        self.loss_scaler = LossScaler(config.loss_scale) if config.precision == "fp16" \
            else None
        self.step_log: list[dict] = []
        self._step_start: float | None = None
        self._loss: float | None = None
        # overlap_comm: gradient buckets are all-reduced (several ranks) and go down
        # during backward (real/grad_buckets.py); not with fp16 (its gradients are still
        # scaled)
        # ZeRO-3 (zenflow): reduce-scattered once after backward, not in buckets
        self.bucketed = gradient_buckets_apply(config.strategy, config.precision,
                                               config.overlap_comm) and self.zero3 is None
        cls = STRATEGY_CLASSES[config.strategy] if self.zero3 is None else ZenFlowZero3Strategy
        self.strategy: StrategyForEngine = cls(self)
        if self.zero3 is not None:  # the strategy read the weights: now they are released
            self.zero3.release_all()
            self.flat_params = self.flat_params.new_empty(0)  # its storage freed
        self.buckets = None
        # the step's zeroing leaves the slots backward writes over (real/inplace_grads.py
        # `deferrable`): not with gradient buckets (sent down during backward) or ZeRO-3
        self.defer_zero = (self.inplace_grads is not None and not self.bucketed
                           and self.zero3 is None)
        self._zero_cache = None
        self.sent_down = None  # (host buffer, d2h event) of this step's bucketed d2h
        if self.bucketed:
            self.buckets = GradBuckets(self, config.bucket_elems)
            if self.inplace_grads is not None:
                self.inplace_grads.notify = self.buckets.contributed

    # -- parameters as views into one flat buffer -------------------------------------
    def _flatten_parameters(self) -> None:
        self.named_params = [(n, p) for n, p in self.model.named_parameters()
                             if p.requires_grad]
        if not self.named_params:
            raise ValueError("the model has no trainable parameters")
        dtypes = {p.dtype for _, p in self.named_params}
        if len(dtypes) != 1:
            raise ValueError(f"all trainable parameters must share one dtype, got {dtypes}")
        want = LOW_PRECISION.get(self.config.precision)
        dtype = want or dtypes.pop()
        self.layout = FlatLayout(self.named_params, column_major=self.config.column_major)
        self.flat_params = torch.empty(self.layout.total, dtype=dtype, device=self.device)
        for slot, (_, p) in zip(self.layout.slots, self.named_params):
            view = self.layout.view(self.flat_params, slot.name)
            view.copy_(p.detach())
            p.data = view
        self.param_bytes = self.flat_params.element_size()
        self.grad_bytes = self.layout.total * self.param_bytes
        self.dist.set_total(self.layout.total)
        self.shard_lo, self.shard_hi = self.dist.lo, self.dist.hi
        if not self.dist.active:
            self.shard_lo, self.shard_hi = 0, self.layout.total
        self.shard_grad_bytes = (self.shard_hi - self.shard_lo) * self.param_bytes
        if self.dist.active:  # replicas start from rank 0's weights, as in DeepSpeed
            broadcast_from_rank0(self.dist, self.flat_params)
        self.backend.name(self.flat_params, "flat_params")
        # Gradients are views into one buffer: one d2h copy, one all-reduce, one zero,
        # and (InplaceGrads) weight gradients accumulated straight into it.
        self.flat_grads = self.backend.name(torch.zeros_like(self.flat_params), "flat_grads")
        self.inplace_grads = (InplaceGrads([p for _, p in self.named_params])
                              if inplace_grads_wanted(self.config.inplace_grads,
                                                      self.use_cuda) else None)
        self._bind_grad_views()

    def _bind_grad_views(self) -> None:
        """Point every `p.grad` at its slot of `flat_grads`; a gradient autograd replaced
        (or a caller set to None) is copied back (or zeroed) first."""
        self._grad_views = []
        for slot, (_, p) in zip(self.layout.slots, self.named_params):
            view = self.layout.view(self.flat_grads, slot.name)
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view
            self._grad_views.append(view)
        self.grads_released = False
        if self.inplace_grads is not None:
            self.inplace_grads.unbound = False

    def _release_grads(self) -> None:
        """After a zeroing that left slots stale (`_zero_grads(defer=True)`): every
        `p.grad` reads None, as after DeepSpeed's step (its optimizer's
        `zero_grad(set_to_none=True)`), until `backward` binds the slots again."""
        for _, p in self.named_params:
            p.grad = None
        self.grads_released = self.inplace_grads.unbound = True

    def _rebind_grads(self) -> None:
        """Before backward: the slots `_release_grads` let go are each `p.grad` again (a
        `.grad` the caller set since is left to the step to copy in)."""
        for (_, p), view in zip(self.named_params, self._grad_views):
            if p.grad is None:
                p.grad = view
        self.grads_released = self.inplace_grads.unbound = False

    def new_device_flat(self) -> torch.Tensor:
        return torch.zeros_like(self.flat_params)

    def compute(self, op: str, t: int, reads=(), writes=()):
        """A block of device work (real/backend.py's `op` on the compute lane)."""
        return self.backend.op("compute", op, t, reads=reads, writes=writes)

    # -- data parallel collectives ----------------------------------------------------
    def reduce_grads(self, t: int, lo: int = 0, hi: int | None = None) -> None:
        """All-reduce (average) the flat gradient buffer, or its elements [lo, hi) (one
        gradient bucket, real/grad_buckets.py), across ranks."""
        dtype = COMM_DTYPES.get(self.config.comm_dtype, self.flat_grads.dtype)
        if self.zero3 is not None:  # ZeRO-3: each rank keeps the mean of its shard
            self.zero3.reduce_scatter(t, self.flat_grads, dtype)
            return
        part = self.flat_grads[lo:hi]
        grads = (part,)
        if dtype == part.dtype:
            with self.backend.op("net", "allreduce", t, reads=grads, writes=grads,
                                 nbytes=part.numel() * part.element_size()):
                allreduce_mean_(self.dist, part)
            return
        # communication_data_type: the all-reduce runs on a copy in that dtype
        with self.backend.op("compute", "allreduce_cast", t, reads=grads, writes=grads,
                             span=False):
            wire = part.to(dtype)
            with self.backend.op("net", "allreduce", t,
                                 nbytes=wire.numel() * wire.element_size()):
                allreduce_mean_(self.dist, wire)
            part.copy_(wire)

    def gather_params(self, target: torch.Tensor, t: int) -> None:
        """All-gather every rank's updated shard of `target` (a no-op with one rank, and
        on ZeRO-3: each rank keeps its shard, the next use gathers it)."""
        if not self.dist.active or self.zero3 is not None:
            return
        nbytes = self.dist.shard * self.dist.world * target.element_size()
        with self.backend.op("net", "allgather", t, reads=(target,), writes=(target,),
                             nbytes=nbytes):
            allgather_flat(self.dist, target)

    # -- the training loop API --------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self._step_start is None:
            self._step_start = self.recorder.now()
        with self.compute("forward", self.t, reads=(self.flat_params,)):
            with Zero3Params.around(self.zero3, "forward"):
                if self.inplace_grads is None:
                    return self.model(*args, **kwargs)
                self.inplace_grads.reset()
                with self.inplace_grads:
                    return self.model(*args, **kwargs)

    def backward(self, loss: torch.Tensor, retain_graph: bool = False,
                 scale_wrt_gas: bool = True) -> None:
        """Backward of `loss` divided by gradient_accumulation_steps (not with
        `scale_wrt_gas` False) and times the fp16 loss scale, accumulating into the flat
        gradient buffer, as DeepSpeed does."""
        # a tensor: reading it now would hold the backward's launch until the forward ends
        self._micro_losses.append(loss.detach())
        factor = 1.0 / self.config.grad_accum if scale_wrt_gas else 1.0
        if self.loss_scaler is not None:
            factor *= self.loss_scaler.scale
        if self.grads_released:  # the slots the step let go (`_release_grads`)
            self._rebind_grads()
        landing = None
        if self.buckets is not None and self.is_gradient_accumulation_boundary():
            landing = self.strategy.grads_landing(self.t)
            if landing is not None:
                self.buckets.arm(self.t, landing, self.buckets.expected(self.inplace_grads))
        with self.compute("backward", self.t, reads=(self.flat_params,),
                          writes=(self.flat_grads,)):
            with Zero3Params.around(self.zero3, "backward"):
                (loss * factor if factor != 1.0 else loss).backward(retain_graph=retain_graph)
            if self.inplace_grads is not None:  # unwritten deferred slots read as zeros
                self.inplace_grads.settle()
        if landing is not None:  # what backward did not complete goes down now
            self.sent_down = (landing, self.buckets.finish())

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the next `step()` updates the parameters (DeepSpeed's name)."""
        return (self.micro_step + 1) % self.config.grad_accum == 0

    def step(self, lr_kwargs: dict | None = None) -> None:
        """One micro-step: the optimizer step runs at the accumulation boundary only, at
        the optimizer's lr; an applied one then steps the lr schedule (`lr_kwargs` go to
        its `step`), as DeepSpeed does."""
        self.host_lane.check()
        boundary = self.is_gradient_accumulation_boundary()
        self.micro_step += 1
        if not boundary:
            return
        self.micro_step = 0
        start = self._step_start if self._step_start is not None else self.recorder.now()
        self.lr = self.optimizer.lr
        if self.inplace_grads is not None and self.inplace_grads.stale:  # no backward
            with self.compute("device_optim", self.t, writes=(self.flat_grads,)):
                self.inplace_grads.settle()
        self._bind_grad_views()
        # every rank then sees the same (non-)finite gradients; with buckets
        # (sent_down) each was all-reduced during backward already
        if self.dist.active and self.sent_down is None:
            self.reduce_grads(self.t)
        checked = self._down_checked()
        with self.compute("device_optim", self.t,
                          reads=(self.flat_grads,) if checked is None else ()):
            finite = (kernels.all_finite(self.flat_grads) if checked is None
                      else torch.tensor(checked))
            # the losses and the check read in one transfer: on a GPU each read waits
            # for the device, and a launch-bound step pays every wait
            *losses, finite = read_scalars(self._micro_losses + [finite])
            bad = [] if finite else self._nonfinite_params()
            if self.zero3 is not None:  # each rank holds only its shard's mean: a vote
                bad = self.zero3.agree_bad(bad)
        self._loss = sum(losses) / len(losses) if losses else None
        self._micro_losses = []
        record = {"step": self.t, "loss": self._loss, "skipped": False, "lr": self.lr}
        scaler = self.loss_scaler
        if scaler is not None:
            record["loss_scale"] = scaler.scale
            scaler.update(overflow=bool(bad))
            if bad:  # an fp16 overflow: skip the step, as DeepSpeed does
                record["skipped"] = record["overflow"] = True
            elif record["loss_scale"] != 1.0:
                with self.compute("device_optim", self.t, reads=(self.flat_grads,),
                                  writes=(self.flat_grads,)):
                    self.flat_grads.mul_(1.0 / record["loss_scale"])
        if bad and scaler is None:
            if self.config.nonfinite == "raise":
                raise NonFiniteGradientError(
                    f"step {self.t}: non-finite gradient in {bad[:5]}; nothing was "
                    f"written to the optimizer state (zfbench.nonfinite: 'skip' skips "
                    f"such steps instead)")
            record["skipped"] = True
        self.global_steps += 1
        if record["skipped"]:
            self.skipped_steps += 1
            self.sent_down = None  # the gradients that went down are not used
        else:
            with torch.no_grad():
                self.strategy.step(self.t)
            self.optimizer.engine_step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step(**(lr_kwargs or {}))
        # the gradients are zeroed once the d2h lane has read them (by the strategy's
        # step, in its pass, where it says so)
        self.backend.wait("compute", self.grads_read, "zeroing waits for the d2h")
        self.grads_read = None
        if record["skipped"] or not self.strategy.zeroes_grads:
            with self.compute("device_optim", self.t, writes=(self.flat_grads,)):
                self._zero_grads(defer=self.defer_zero)
        elif self.inplace_grads is not None:
            self.inplace_grads.zeroed()
        self.backend.end_step()  # the step ends when its device work has, then read
        self.recorder.resolve_cuda(block=False)
        end = self.recorder.now()
        record.update({"t_start_s": start, "t_end_s": end, "wall_s": end - start})
        self.step_log.append(record)
        if not record["skipped"]:
            self.recorder.mark_step(self.t, start, end)
            self.t += 1
        self._step_start = None

    def _down_checked(self) -> bool | None:
        """The CPU lanes' d2h with the non-finite check in its pass (one read of the
        gradients, not two): with one rank, fp32 gradients, no loss scale and no
        gradient buckets, this step's gradients go down into where the strategy lands
        them (`grads_landing`) before the check, and the strategy's `grads_down` takes
        them from `sent_down`, as it takes bucketed ones. Returns whether they are all
        finite, or None where this does not apply (the check then reads them itself).
        A skipped step leaves what went down unused. On a GPU the check stays a device op."""
        if (self.use_cuda or self.dist.active or self.loss_scaler is not None
                or self.sent_down is not None or self.zero3 is not None
                or self.flat_grads.dtype != torch.float32):
            return None
        landing = self.strategy.grads_landing(self.t)
        if landing is None or landing.dtype != torch.float32 \
                or landing.numel() != self.flat_grads.numel():
            return None
        B = self.backend
        B.wait("d2h", B.record("compute"), "d2h waits for the gradients")
        with B.op("d2h", "d2h_grad", self.t, reads=(self.flat_grads,), writes=(landing,),
                  nbytes=landing.numel() * landing.element_size()):
            finite = kernels.copy_checked_(landing, self.flat_grads)
        self.grads_read = B.record("d2h")
        self.sent_down = (landing, self.grads_read)
        return finite

    def _nonfinite_params(self) -> list[str]:
        """Names of parameters with a NaN or inf gradient, once the one-pass check
        (`kernels.all_finite`: no model-sized temporaries, measured 15x faster than
        isfinite or max-abs on CPU) found the sum non-finite; a sum that merely
        overflowed is not refused."""
        return [n for n, p in self.named_params
                if p.grad is not None and not bool(torch.isfinite(p.grad).all())]

    def _zero_grads(self, defer: bool = False) -> None:
        """Zero the gradients; with `defer`, not the slots the next backward writes over
        (`InplaceGrads.deferrable`: they read as zeros from the end of backward on), and
        then, so that no caller reads a stale slot, every `p.grad` is None until the next
        backward (`_release_grads`)."""
        ig = self.inplace_grads
        skip = ig.deferrable() if defer and ig is not None else frozenset()
        if not skip:
            kernels.zero_(self.flat_grads)
        for lo, hi in self._zero_ranges(skip) if skip else ():
            kernels.zero_(self.flat_grads[lo:hi])
        if ig is not None:  # the next backward writes weight gradients
            ig.zeroed(stale=skip)
        if skip:
            self._release_grads()

    def _zero_ranges(self, skip: frozenset[int]) -> list[tuple[int, int]]:
        """The flat-buffer ranges outside the slots of parameter ids `skip` (cached per
        `skip`)."""
        if self._zero_cache is None or self._zero_cache[0] != skip:
            names = {n for n, p in self.named_params if id(p) in skip}
            self._zero_cache = (skip, self.layout.ranges_except(names))
        return self._zero_cache[1]

    # -- results, checkpoints, shutdown -----------------------------------------------
    @property
    def timeline(self):
        return self.recorder.timeline

    def finish(self, flush_partial: bool = False) -> None:
        """Apply any pending asynchronous update (end of training); with `flush_partial`
        also run zenflow's host update on a window still open, so the last gradients count."""
        self.host_lane.check()
        with torch.no_grad():
            self.strategy.finish(flush_partial=flush_partial)
            if self.zero3 is not None:  # the trained model, assembled for its reader
                self.zero3.gather_all(self.t)

    def close(self) -> None:
        if self.zero3 is not None:
            self.zero3.close()
        if self.buckets is not None:
            self.buckets.close()
        self.host_lane.close()
        if self.use_cuda:
            self.recorder.resolve_cuda()
        self.backend.close()

    def release(self) -> None:
        """After close(): drop the model, parameters, gradients and optimizer state; the
        results stay (config, step log, timeline), so a finished run holds no model-sized
        memory while the next strategy runs."""
        self.strategy = None
        self.model = None
        self.optimizer = self.lr_scheduler = None  # its group holds the parameters
        self.named_params = []
        self.flat_params = self.flat_grads = None
        self.inplace_grads = None


def read_scalars(values: list[torch.Tensor]) -> list[float]:
    """0-d tensors as floats, read in one transfer (one wait for the device)."""
    if not values:
        return []
    return torch.stack([v.detach().reshape(()).float() for v in values]).tolist()


def initialize(model: torch.nn.Module, config: dict | str | os.PathLike | EngineConfig |
               None = None, *, dist: DistContext | None = None, **engine_kwargs) -> Engine:
    """`engine = real.initialize(model, config)`, as `deepspeed.initialize` is used: in
    a script launched by torchrun (or inside any initialized torch.distributed group) the
    engine joins that group (`join_launch`) unless `dist` names one; the config's batch
    triple is resolved for its world size (train = micro x accumulation x ranks); rank
    0's weights are broadcast to every replica."""
    if dist is None:
        dist = join_launch(resolve_device(engine_kwargs.get("device", "auto")).type == "cuda")
    if not isinstance(config, EngineConfig):
        config = load_config(config, world_size=dist.world)
    return Engine(model, config, dist=dist, **engine_kwargs)
