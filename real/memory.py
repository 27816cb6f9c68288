"""Memory the engine will need, estimated before anything is allocated, and the refusal.

`estimate(shape, strategy, ...)` counts the engine's own buffers (flat parameters and
gradients, device optimizer state, upload buffer, host fp32 master, moments, gradient
buffers and 16-bit wires: zfbench.core.memory_model) plus activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models": s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit; doubled for
fp32). `check_fits` compares it with what the machine has (CUDA free memory, host
MemAvailable; on the emulated accelerator both live in the same RAM) and raises
`InsufficientMemoryError` naming needed vs available and the `--layers` that would fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zfbench.core.config_zenflow import SCENARIO_ZENFLOW
from zfbench.core import memory_model
from zfbench.core.memory_model import element_bytes, host_bytes_per_param
from zfbench.core.models import ModelShape
from zfbench.core.strategies import buckets_on, selects_on_device
from zfbench.core.schedule import selected_elements

# The top-k ratio a memory check assumes when it is not told: the scenario's.
TOPK_RATIO = SCENARIO_ZENFLOW["topk_ratio"]

GIB = 2 ** 30
# Framework overhead, allocator slack and the Python process itself (judgment: torch's
# CPU allocator and autograd's temporaries measured at 1.1-1.4x of the counted buffers
# for the shapes this engine runs; keep 30 % headroom).
HEADROOM = 1.3


class InsufficientMemoryError(MemoryError):
    """The run cannot fit; the message says by how much and what would fit."""


@dataclass(frozen=True)
class MemoryEstimate:
    device_bytes: float
    host_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.device_bytes + self.host_bytes


def activation_bytes(shape: ModelShape, batch: int, seq: int, elem_bytes: int) -> float:
    """The engine's activations: no recomputation, the loss on fp32 logits
    (zfbench.core.memory_model.activation_bytes)."""
    return memory_model.activation_bytes(shape, batch, seq, elem_bytes, logits=True)


def estimate(shape: ModelShape, strategy: str, batch: int, seq: int, elem_bytes: int = 4,
             topk_ratio: float = TOPK_RATIO, bucketed: bool = False,
             moments_offloaded: bool = False, bucket_elems: int = 500_000_000
             ) -> MemoryEstimate:
    """The engine's buffers for `strategy` (`bucketed`: the run sends gradients in
    buckets, zfbench.core.strategies.buckets_on; `moments_offloaded`: zenflow.offload,
    the device AdamW's fp32 m and v in host memory, `bucket_elems` a bucket), with
    HEADROOM."""
    p = shape.total_params
    selected = _selected(shape, strategy, topk_ratio)
    offloaded = moments_offloaded and selected > 0
    device = memory_model.engine_device_bytes(strategy, p, elem_bytes, selected,
                                              activation_bytes(shape, batch, seq, elem_bytes),
                                              offloaded, bucket_elems)
    # fp32 master, m, v and the strategy's gradient buffers (zfbench.core.memory_model)
    host = float(host_bytes_per_param(strategy, elem_bytes, bucketed) * p)
    if offloaded:
        host += offloaded_moment_bytes(shape, strategy, topk_ratio)
    return MemoryEstimate(device * HEADROOM, host * HEADROOM)


def _selected(shape: ModelShape, strategy: str, topk_ratio: float) -> float:
    """Elements the device AdamW updates (ZenFlow's selection and the vectors; else 0)."""
    if not selects_on_device(strategy):
        return 0.0
    return selected_elements(shape.matrices(), sum(v.numel for v in shape.vectors()),
                             topk_ratio)


def offloaded_moment_bytes(shape: ModelShape, strategy: str, topk_ratio: float) -> float:
    """zenflow.offload: one rank's fp32 m and v of the selected elements in host memory."""
    return 2 * memory_model.FP32_BYTES * _selected(shape, strategy, topk_ratio)


def _proc_bytes(path: str, field: str) -> float | None:
    """A `Field:  N kB` line of a /proc file, in bytes (None where it cannot be read)."""
    try:
        with open(path) as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def available_host_bytes() -> float:
    found = _proc_bytes("/proc/meminfo", "MemAvailable")
    if found is not None:
        return found
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def available_device_bytes(use_cuda: bool, ranks: int = 1) -> float | None:
    """Free memory of the GPU(s) the run will use. A launched rank (LOCAL_RANK set) asks
    its own GPU only; the launcher of several ranks does not touch the GPUs' memory (a
    query opens a CUDA context, ~0.3-0.5 GB that would stay for the whole run on every
    GPU): it takes the smallest total memory of devices 0 .. ranks - 1, and each rank
    then checks its own free memory; one process asks the current device."""
    if not use_cuda:
        return None
    import torch

    local = os.environ.get("LOCAL_RANK")
    if local is not None:
        return float(torch.cuda.mem_get_info(int(local))[0])
    if ranks > 1:
        count = max(1, min(ranks, torch.cuda.device_count()))
        return float(min(torch.cuda.get_device_properties(i).total_memory
                         for i in range(count)))
    return float(torch.cuda.mem_get_info(torch.cuda.current_device())[0])


def process_baseline_bytes() -> float:
    """What one more Python process with torch loaded costs: this process's resident
    memory, measured now (it has imported torch); 0 where /proc is missing."""
    return _proc_bytes("/proc/self/status", "VmRSS") or 0.0


def machine_need(shape: ModelShape, strategy: str, batch: int, seq: int, elem_bytes: int,
                 topk_ratio: float = TOPK_RATIO, ranks: int = 1,
                 baseline: float = 0.0, bucketed: bool = False,
                 moments_offloaded: bool = False,
                 bucket_elems: int = 500_000_000) -> MemoryEstimate:
    """Memory of the whole run on one machine with `ranks` processes: every rank holds
    its own device replica (parameters, gradients, activations, optimizer state on the
    device, plus the all-gather's staging buffer when ranks > 1) and 1/ranks of the host
    state; each rank and the launcher add one process `baseline`. Device bytes are per
    rank (each rank has its own GPU), host bytes are the machine's total (zenflow.offload's
    moments, `moments_offloaded`, are every rank's own)."""
    one = estimate(shape, strategy, batch, seq, elem_bytes, topk_ratio, bucketed,
                   moments_offloaded, bucket_elems)
    if ranks == 1:
        return one
    device = one.device_bytes + shape.total_params * elem_bytes * HEADROOM
    host = one.host_bytes + (ranks + 1) * baseline  # shards add up to one host state
    if moments_offloaded:  # the selected moments are not sharded: one copy per rank
        host += (ranks - 1) * offloaded_moment_bytes(shape, strategy, topk_ratio) * HEADROOM
    return MemoryEstimate(device, host)


# a suggested slice fits in this share of the memory available now, so that it still fits
# when the machine's other processes have taken some by the time it runs (judgment: the
# available memory of a shared 24 GiB machine was seen to move by 0.4 GiB in a minute)
SUGGESTION_SHARE = 0.8


def fitting_width_slice(shape: ModelShape, fits) -> ModelShape | None:
    """The widest slice of `shape` at a power-of-two width fraction (down to one attention
    head) of which some depth `fits`, at the greatest such depth; None if none does."""
    base = shape.base
    heads = base.heads
    while heads > 1:
        heads //= 2
        narrow = shape.with_width(heads / base.heads)
        depth = next((n for n in range(narrow.layers, 0, -1)
                      if fits(narrow.with_layers(n))), None)
        if depth is not None:
            return narrow.with_layers(depth)
    return None


class MemoryCheck:
    """Whether shapes fit this machine with `ranks` processes, every strategy of a run in
    turn (they run one by one), and what the largest shape's need is: the predicate both
    the refusal and `zfbench.run`'s choice of a proxy use."""

    def __init__(self, strategies: list[str], batch: int, seq: int, elem_bytes: int,
                 use_cuda: bool, topk_ratio: float = TOPK_RATIO,
                 host_bytes: float | None = None, device_bytes: float | None = None,
                 ranks: int = 1, baseline: float | None = None,
                 bucketed: bool = False) -> None:
        self.strategies, self.batch, self.seq = list(strategies), batch, seq
        self.elem_bytes, self.topk_ratio, self.ranks = elem_bytes, topk_ratio, ranks
        self.bucketed = bucketed
        self.host_avail = available_host_bytes() if host_bytes is None else host_bytes
        self.dev_avail = available_device_bytes(use_cuda, ranks) if device_bytes is None \
            else device_bytes
        if baseline is None:
            baseline = process_baseline_bytes() if ranks > 1 else 0.0
        self.baseline = baseline
        # per strategy (elem_bytes, bucketed, topk_ratio, moments offloaded, bucket
        # elements) where its config gave them
        self.knobs: dict[str, tuple[int, bool, float, bool, int]] = {}

    @classmethod
    def of_configs(cls, configs, seq: int, use_cuda: bool, **machine) -> "MemoryCheck":
        """The check of a run's strategies, each as its engine config
        (zfbench.core.config.EngineConfig) runs it: its micro-batch and ranks, its
        precision's bytes per element, its gradient buckets (precision and overlap_comm)
        and ZenFlow's top-k ratio and `offload` (its zenflow section, with the bucket
        size); `machine`: host_bytes, device_bytes, baseline."""
        first = next(iter(configs.values()))
        check = cls(list(configs), first.micro_batch, seq, element_bytes(first.precision),
                    use_cuda, ranks=first.world_size,
                    bucketed=buckets_on(first.precision, first.overlap_comm), **machine)
        check.knobs = {s: (element_bytes(c.precision), buckets_on(c.precision,
                                                                  c.overlap_comm),
                           TOPK_RATIO if c.zenflow is None else c.zenflow.topk_ratio,
                           c.zenflow is not None and c.zenflow.offload, c.bucket_elems)
                       for s, c in configs.items()}
        return check

    def need(self, s: ModelShape, strategy: str) -> MemoryEstimate:
        elem, bucketed, topk, offloaded, bucket = self.knobs.get(
            strategy, (self.elem_bytes, self.bucketed, self.topk_ratio, False, 500_000_000))
        return machine_need(s, strategy, self.batch, self.seq, elem, topk, self.ranks,
                            self.baseline, bucketed, offloaded, bucket)

    def machine_total(self, m: MemoryEstimate) -> float:
        """Emulated accelerator: every rank's device replica lives in the host's RAM."""
        return m.device_bytes * self.ranks + m.host_bytes

    def fits(self, s: ModelShape, share: float = 1.0) -> bool:
        """Whether every strategy fits in `share` of the memory available."""
        for strategy in self.strategies:
            m = self.need(s, strategy)
            if self.dev_avail is None:  # emulated accelerator: one pool of RAM
                if self.machine_total(m) > share * self.host_avail:
                    return False
            elif m.device_bytes > share * self.dev_avail or \
                    m.host_bytes > share * self.host_avail:
                return False
        return True

    def suggestable(self, s: ModelShape) -> bool:
        """Fits with room to spare: still fits when others take some memory."""
        return self.fits(s, SUGGESTION_SHARE)

    def where(self, shape: ModelShape) -> str:
        """Needed vs available for `shape`'s most demanding strategy, in words."""
        worst = max((self.need(shape, s) for s in self.strategies), key=self.machine_total)
        if self.dev_avail is not None:
            return ("device %.1f GiB needed, %.1f GiB free; host %.1f GiB needed, %.1f GiB "
                    "available" % (worst.device_bytes / GIB, self.dev_avail / GIB,
                                   worst.host_bytes / GIB, self.host_avail / GIB))
        return ("%.1f GiB needed (device and host share this machine's RAM%s), %.1f GiB "
                "available" % (self.machine_total(worst) / GIB,
                               f"; {self.ranks} ranks, each with its own replica"
                               if self.ranks > 1 else "", self.host_avail / GIB))


def check_fits(shape: ModelShape, strategies: list[str], batch: int, seq: int,
               elem_bytes: int, use_cuda: bool, topk_ratio: float = TOPK_RATIO,
               host_bytes: float | None = None, device_bytes: float | None = None,
               ranks: int = 1, baseline: float | None = None,
               bucketed: bool = False) -> None:
    """Raise `InsufficientMemoryError` unless every strategy fits (they run one by one)
    with `ranks` processes on this machine."""
    refuse_unless_fits(shape, MemoryCheck(strategies, batch, seq, elem_bytes, use_cuda,
                                          topk_ratio, host_bytes, device_bytes, ranks,
                                          baseline, bucketed))


def check_configs_fit(shape: ModelShape, configs, seq: int, use_cuda: bool,
                      **machine) -> None:
    """`check_fits` for a run's strategies as their engine configs run them
    (`MemoryCheck.of_configs`: batch, ranks, precision, buckets and top-k from each)."""
    refuse_unless_fits(shape, MemoryCheck.of_configs(configs, seq, use_cuda, **machine))


def refuse_unless_fits(shape: ModelShape, check: MemoryCheck) -> None:
    """Raise `InsufficientMemoryError` naming needed vs available and what would fit,
    unless `check` says `shape` fits."""
    if check.fits(shape):
        return
    strategies, ranks = check.strategies, check.ranks
    fitting = [n for n in range(shape.layers, 0, -1)
               if check.suggestable(shape.with_layers(n))]
    with_ranks = f" with {ranks} ranks" if ranks > 1 else ""
    narrow = None if fitting else fitting_width_slice(shape, check.suggestable)
    hint = (f"--layers {fitting[0]} would fit{with_ranks}" if fitting else
            f"not even one layer fits at full width; the width slice --model "
            f"'{narrow.name}' would ({narrow.slice_summary()}){with_ranks}" if narrow else
            "not even one layer of one attention head fits: use a smaller --batch/--seq "
            "or a smaller model" + (", or fewer --gpus" if ranks > 1 else ""))
    raise InsufficientMemoryError(f"{shape.name} with {', '.join(strategies)} does not fit: "
                                  f"{check.where(shape)}. {hint}.")
