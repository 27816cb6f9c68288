"""The DeepSpeed config of a setup: `ds_config(setup, precision)`, and its check by
zfbench's own parser.

This module owns the translation of an advised `Setup` into DeepSpeed's keys
(docs/config_keys.md): the batch as `train_micro_batch_size_per_gpu` and
`gradient_accumulation_steps` (DeepSpeed derives `train_batch_size` from the ranks it is
launched on, so the same file holds on any launch that has the advised GPU count), the
precision, `zero_optimization` (stage 2, or 3 for ZeRO-Infinity with `offload_param`),
`offload_optimizer` with `pin_memory`, `overlap_comm`, and ZenFlow's section (select
strategy "step" with the advised interval, `overlap_step` on, no warm-up rounds). The base
comes from zfbench.core.config_build. A strategy the parser cannot tell from the keys
alone (ZeRO-Offload's delayed update) gets zfbench's `zfbench.strategy`, which DeepSpeed
does not read. Activation checkpointing is the model code's call, not a key here; the
learning rate and schedule are the user's.
"""

from __future__ import annotations

from zfbench.advise.space import Setup
from zfbench.core.config import load_config
from zfbench.core.config_build import build_config
from zfbench.core.strategies import STRATEGY, has_windows, offloads_params


def ds_config(setup: Setup, precision: str) -> dict:
    """The DeepSpeed config dict of `setup` trained in `precision`."""
    if offloads_params(setup.strategy):
        return _zero3(setup, precision)
    zenflow = None
    if has_windows(setup.strategy):
        zenflow = {"topk_ratio": setup.topk_ratio, "select_strategy": "step",
                   "select_interval": setup.select_interval,
                   "update_interval": setup.update_interval, "overlap_step": True,
                   "full_warm_up_rounds": 0,
                   "pt_reserved_cores_perc": setup.pt_reserved_cores_perc}
    cfg = build_config(setup.strategy, micro_batch=setup.micro_batch,
                       pin_memory=setup.pin_memory, zenflow=zenflow)
    cfg.pop("zfbench", None)  # put back below only where the keys cannot say it
    _common(cfg, setup, precision)
    if load_config(cfg).strategy != setup.strategy:
        cfg["zfbench"] = {"strategy": setup.strategy}
    return cfg


def _common(cfg: dict, setup: Setup, precision: str) -> None:
    cfg["gradient_accumulation_steps"] = setup.grad_accum
    if precision in ("bf16", "fp16"):
        cfg[precision] = {"enabled": True}
    if setup.overlap_comm is not None:
        cfg["zero_optimization"]["overlap_comm"] = setup.overlap_comm


def _zero3(setup: Setup, precision: str) -> dict:
    """ZeRO-Infinity: stage 3, parameters and optimizer state where advised (an NVMe
    target needs the user's `nvme_path`, which no advice can know)."""
    cfg = {"train_micro_batch_size_per_gpu": setup.micro_batch,
           "optimizer": {"type": "AdamW", "params": {}}}
    zero: dict = {"stage": 3}
    optimizer = setup.offload_optimizer or ("cpu" if setup.offload_params == "none"
                                            else setup.offload_params)
    zero["offload_optimizer"] = {"device": optimizer, "pin_memory": bool(setup.pin_memory)}
    if setup.offload_params != "none":
        zero["offload_param"] = {"device": setup.offload_params,
                                 "pin_memory": bool(setup.pin_memory)}
    for part in ("offload_optimizer", "offload_param"):
        if zero.get(part, {}).get("device") == "nvme":
            zero[part]["nvme_path"] = "/local_nvme"
    cfg["zero_optimization"] = zero
    _common(cfg, setup, precision)
    return cfg


def runs_on_engine(setup: Setup) -> bool:
    """Whether zfbench's engine (`python -m zfbench.run --config`) runs this setup's
    strategy (zero-infinity is simulated only)."""
    return STRATEGY[setup.strategy].engine
