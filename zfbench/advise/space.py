"""The setups advise searches: one `Setup` (a strategy and the knobs it reads), the
`Space` of values each knob may take, and a setup's simulator settings.

This module owns which knobs are searched and which are held, and why:
- searched, because the simulator models them (zfbench/sims/settings.py `SimSettings`):
  the strategy; micro-batch x gradient accumulation for the global batch (accumulation
  only where the simulator runs it: the strategy record's `sim_grad_accum`, so ZenFlow's
  micro-batch is the whole per-GPU batch); activation checkpointing; `pin_memory` (the
  strategies that offload); `overlap_comm` (those the simulator runs as DeepSpeed's
  ZeRO-2, `sim_zero2`); ZenFlow's `topk_ratio`, `update_interval` (auto included),
  `select_interval` and `pt_reserved_cores_perc`; ZeRO-Infinity's offload targets
  (`offload_params`, `offload_optimizer`);
- held: the bucket sizes (`reduce_bucket_size`, `allgather_bucket_size`: the simulator
  fixes DeepSpeed's defaults, sims/device_memory.py, and moves gradients per decoder
  layer, so a bucket size would change no simulated number); ZeRO-Infinity's
  `prefetch_buckets` at 1 (a count of layers, which DeepSpeed's
  `stage3_prefetch_bucket_size`, in elements, does not say); `overlap_step` (on:
  ZenFlow's design; off is another algorithm); `bind_cores` and `fused_param_upload` (a launcher flag and an old
  DeepSpeed's path, not a ds_config key); the node, model, seq and precision (given).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field, replace

from zfbench.core.config_zenflow import DEFAULT_TOPK_RATIO, SCENARIO_ZENFLOW
from zfbench.core.strategies import (SIM_STRATEGIES, STRATEGY, has_windows, offloads,
                                     offloads_params)
from zfbench.sims.costs import CostModel, SimSettings

# DeepSpeed's (and zfbench's config parser's) default share of a rank's cores kept for
# training by ZenFlow's pinning (zfbench.core.config_zenflow.ZenFlowConfig).
DEFAULT_RESERVED = 0.5
KNOB_ORDER = ("activation_checkpointing", "pin_memory", "overlap_comm", "topk_ratio",
              "update_interval", "select_interval", "pt_reserved_cores_perc",
              "offload_params", "offload_optimizer")


@dataclass(frozen=True)
class Setup:
    """One strategy and the knobs it reads (None: a knob it does not read)."""
    strategy: str
    micro_batch: int
    grad_accum: int
    activation_checkpointing: bool = True
    pin_memory: bool | None = None
    overlap_comm: bool | None = None
    topk_ratio: float | None = None
    update_interval: int | str | None = None
    select_interval: int | None = None
    pt_reserved_cores_perc: float | None = None
    offload_params: str | None = None
    offload_optimizer: str | None = None

    def knobs(self) -> dict:
        """The SimSettings fields this setup sets (its knobs that apply)."""
        return {k: v for k, v in asdict(self).items() if k != "strategy" and v is not None}

    def label(self) -> str:
        short = {"activation_checkpointing": "ckpt", "pin_memory": "pin",
                 "overlap_comm": "ovc", "topk_ratio": "k", "update_interval": "U",
                 "select_interval": "S", "pt_reserved_cores_perc": "pt",
                 "offload_params": "params", "offload_optimizer": "optim"}
        parts = [f"mb{self.micro_batch}x{self.grad_accum}"]
        for k in KNOB_ORDER:
            v = getattr(self, k)
            if v is not None:
                parts.append(f"{short[k]}={'on' if v is True else 'off' if v is False else v}")
        return f"{self.strategy} " + " ".join(parts)


def applies(strategy: str, knob: str) -> bool:
    """Whether `strategy` reads `knob` in the simulator (the strategy record's traits)."""
    s = STRATEGY[strategy]
    return {"activation_checkpointing": True,
            "pin_memory": offloads(strategy) or offloads_params(strategy),
            "overlap_comm": s.sim_zero2,
            "topk_ratio": has_windows(strategy), "update_interval": has_windows(strategy),
            "select_interval": has_windows(strategy),
            "pt_reserved_cores_perc": has_windows(strategy),
            "offload_params": offloads_params(strategy),
            "offload_optimizer": offloads_params(strategy)}[knob]


# Each knob's default (the first a setup gets, and the default ZenFlow setup's).
DEFAULTS = {"activation_checkpointing": True, "pin_memory": True, "overlap_comm": True,
            "topk_ratio": DEFAULT_TOPK_RATIO, "update_interval":
            SCENARIO_ZENFLOW["update_interval"], "select_interval":
            SCENARIO_ZENFLOW["select_interval"], "pt_reserved_cores_perc": DEFAULT_RESERVED,
            "offload_params": "cpu", "offload_optimizer": "cpu"}


@dataclass(frozen=True)
class Space:
    """The values each knob may take (`values`) and the coarse grid's subset (`coarse`);
    `strategies` those searched; `micro_batches` None: every divisor of the per-GPU batch."""
    strategies: tuple[str, ...] = SIM_STRATEGIES
    values: dict = field(default_factory=lambda: {
        "activation_checkpointing": (True, False), "pin_memory": (True, False),
        "overlap_comm": (True, False), "topk_ratio": (0.05, 0.075, 0.1, 0.15, 0.2),
        "update_interval": (1, 2, 4, 8, 16, "auto"), "select_interval": (0, 16, 64),
        "pt_reserved_cores_perc": (0.25, 0.5, 0.75),
        "offload_params": ("none", "cpu", "nvme"), "offload_optimizer": ("cpu", "nvme")})
    coarse: dict = field(default_factory=lambda: {
        "activation_checkpointing": (True, False), "topk_ratio": (0.05, 0.1, 0.2),
        "update_interval": (1, 4, 16), "offload_params": ("none", "cpu", "nvme")})
    micro_batches: tuple[int, ...] | None = None

    def knob_values(self, strategy: str, knob: str, coarse: bool = False) -> tuple:
        if not applies(strategy, knob):
            return (None,)
        if coarse:
            return self.coarse.get(knob, (DEFAULTS[knob],))
        return self.values[knob]

    def splits(self, strategy: str, per_gpu: int, coarse: bool = False
               ) -> list[tuple[int, int]]:
        """(micro-batch, accumulation) pairs giving `per_gpu` rows per GPU per step; the
        coarse grid's: the largest micro-batch and the middle one of the divisors."""
        micro = [m for m in range(1, per_gpu + 1) if per_gpu % m == 0]
        if self.micro_batches is not None:
            micro = [m for m in micro if m in self.micro_batches]
        if not STRATEGY[strategy].sim_grad_accum:
            micro = [m for m in micro if m == per_gpu]
        if coarse and micro:
            micro = sorted({micro[len(micro) // 2], micro[-1]})
        return [(m, per_gpu // m) for m in micro]

    def setups(self, strategy: str, per_gpu: int, coarse: bool = False) -> list[Setup]:
        """Every valid combination for one strategy (the coarse grid's with `coarse`, where
        ZeRO-Infinity's optimizer state goes with its parameters to NVMe, else to the
        host; the refinement tries the other placements)."""
        knobs = [self.knob_values(strategy, k, coarse) for k in KNOB_ORDER]
        out = []
        for micro, accum in self.splits(strategy, per_gpu, coarse):
            for combo in itertools.product(*knobs):
                setup = Setup(strategy, micro, accum, **dict(zip(KNOB_ORDER, combo)))
                if coarse and setup.offload_params == "nvme":  # the state with them
                    setup = replace(setup, offload_optimizer="nvme")
                if valid(setup):
                    out.append(setup)
        return out

    def lightest(self, per_gpu: int) -> list[Setup]:
        """Per strategy, the coarse grid's setups of least memory: the smallest
        micro-batch, activation checkpointing on (if none of these fits, no setup does:
        the other knobs the memory model reads are all on the coarse grid)."""
        out = []
        for name in self.strategies:
            splits = self.splits(name, per_gpu)
            if not splits:
                continue
            micro = splits[0][0]
            out += [s for s in self.setups(name, per_gpu, coarse=True)
                    if s.activation_checkpointing and s.micro_batch == micro]
            out += [replace(s, micro_batch=micro, grad_accum=per_gpu // micro)
                    for s in self.setups(name, per_gpu, coarse=True)
                    if s.activation_checkpointing and s.micro_batch != micro]
        return list(dict.fromkeys(out))

    def neighbours(self, setup: Setup) -> list[Setup]:
        """Setups one knob away from `setup`, and every micro-batch split with and without
        activation checkpointing (the two trade memory for each other: a larger
        micro-batch may fit only with checkpointing, none only with a smaller one)."""
        out = []
        per_gpu = setup.micro_batch * setup.grad_accum
        for micro, accum in self.splits(setup.strategy, per_gpu):
            for ckpt in self.knob_values(setup.strategy, "activation_checkpointing"):
                out.append(replace(setup, micro_batch=micro, grad_accum=accum,
                                   activation_checkpointing=ckpt))
        for knob in KNOB_ORDER:
            for value in self.knob_values(setup.strategy, knob):
                out.append(replace(setup, **{knob: value}))
        return [s for s in dict.fromkeys(out) if s != setup and valid(s)]


def valid(setup: Setup) -> bool:
    """False for a combination the settings refuse: a select interval shorter than the
    window (ZenFlow's rule, zfbench.core.config_zenflow)."""
    return not (setup.select_interval and isinstance(setup.update_interval, int)
                and 0 < setup.select_interval < setup.update_interval)


def default_zenflow(strategies, per_gpu: int) -> Setup | None:
    """The default ZenFlow setup at this batch: zfbench's ZenFlow scenario
    (SCENARIO_ZENFLOW), DeepSpeed's pt_reserved_cores_perc, pinned buffers, the whole
    per-GPU batch as one micro-batch (None: ZenFlow not searched)."""
    for name in strategies:
        if has_windows(name):
            return Setup(name, per_gpu, 1, **{k: DEFAULTS[k] for k in KNOB_ORDER
                                              if applies(name, k)})
    return None


def settings_of(base: SimSettings, setup: Setup) -> SimSettings:
    """The simulator's settings of `setup` on `base` (node, model, seq, precision ...)."""
    return base.with_(**setup.knobs())


def memory(base: SimSettings, setup: Setup) -> dict:
    """The memory model's verdict (zfbench.sims.costs.CostModel.fits) for `setup`."""
    return CostModel(settings_of(base, setup), setup.strategy).fits(setup.strategy)
