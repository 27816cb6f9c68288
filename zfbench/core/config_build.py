"""Building a DeepSpeed-style config dict for one strategy (the inverse of parsing it).

This module owns `build_config`: the one way zfbench's runner, commands, benchmarks and
tests write the config a strategy runs under (ZeRO stage 2, AdamW, the optimizer offloaded
to the CPU for every offloading strategy, the zenflow section for zenflow). It writes only
what it is given: a knob left at None is left out of the dict, so its default stays the
parser's (`zfbench.core.config.load_config`), which also does every validation.
"""
from __future__ import annotations

from zfbench.core.strategies import ENGINE_STRATEGIES, OFFLOAD_STRATEGIES


def build_config(strategy: str | None, *, micro_batch: int | None = None,
                 lr: float | None = None, weight_decay: float | None = None,
                 clip: float | None = None, stage: int = 2, pin_memory: bool | None = None,
                 zenflow: dict | None = None, optimizer: str = "AdamW") -> dict:
    """The config dict of `strategy` (None: no zfbench.strategy and no offload device,
    for a caller that sets the strategy later as a `load_config` override).

    An offloading strategy gets offload_optimizer.device "cpu"; `pin_memory` (when given)
    goes beside it. `zenflow` (when given, even empty) is the zero_optimization.zenflow
    section as is; the parser refuses it with a strategy other than zenflow.
    """
    if strategy is not None and strategy not in ENGINE_STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is not one the engine runs; choose one "
                         f"of: {', '.join(ENGINE_STRATEGIES)}")
    cfg: dict = {}
    if micro_batch is not None:
        cfg["train_micro_batch_size_per_gpu"] = micro_batch
    params = {k: v for k, v in (("lr", lr), ("weight_decay", weight_decay)) if v is not None}
    cfg["optimizer"] = {"type": optimizer, "params": params}
    if clip is not None:
        cfg["gradient_clipping"] = clip
    zero: dict = {"stage": stage}
    offload: dict = {}
    if strategy in OFFLOAD_STRATEGIES:
        offload["device"] = "cpu"
    if pin_memory is not None:
        offload["pin_memory"] = pin_memory
    if offload:
        zero["offload_optimizer"] = offload
    if zenflow is not None:
        zero["zenflow"] = dict(zenflow)
    cfg["zero_optimization"] = zero
    if strategy is not None:
        cfg["zfbench"] = {"strategy": strategy}
    return cfg
