"""Batch arithmetic and `"auto"` values of a DeepSpeed config, resolved as upstream does.

`derive_batch`: DeepSpeed's batch rule. train_batch_size = micro batch x
gradient_accumulation_steps x ranks; any two given derive the third, all three must
agree, one alone sets accumulation to 1. A train_batch_size that does not divide is an
error that shows the arithmetic.

`resolve_auto`: the HF Trainer's DeepSpeed integration lets a config say `"auto"` for the
keys it fills from its TrainingArguments (transformers.integrations.deepspeed,
`HfTrainerDeepSpeedConfig.trainer_config_process`). zfbench fills the same keys with the
same defaults that TrainingArguments has (lr 5e-5, betas 0.9/0.999, eps 1e-8, weight
decay 0.0, max_grad_norm 1.0), with the run's own micro batch, accumulation and precision
standing in for per_device_train_batch_size, gradient_accumulation_steps and --bf16 /
--fp16 (`AutoValues`). A scheduler's "auto" parameters are filled as the Trainer fills
them: warmup_min_lr 0, warmup_max_lr its learning rate (5e-5), warmup_num_steps its
warmup_steps (0), total_num_steps the run's optimizer steps (`AutoValues.steps`; an error
where the run's length is not known). "auto" anywhere else is an error naming the keys
that take it.
ZenFlow's update_interval / select_interval "auto" are ZenFlow's own and are kept.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

from zfbench.core.config_fields import ConfigError, _int

# TrainingArguments defaults (transformers 4.x; the same since 4.0)
HF_DEFAULT_LR = 5e-5
HF_DEFAULT_BETAS = [0.9, 0.999]
HF_DEFAULT_EPS = 1e-8
HF_DEFAULT_WEIGHT_DECAY = 0.0
HF_DEFAULT_MAX_GRAD_NORM = 1.0


@dataclass(frozen=True)
class AutoValues:
    """What this run puts where the HF Trainer would put its arguments."""
    micro_batch: int = 1
    grad_accum: int = 1
    precision: str = "fp32"
    steps: int | None = None  # optimizer steps of the run (a scheduler's total_num_steps)


def _put(d: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for part in path:
        d = d[part]
    d[last] = value


def _fills(auto: AutoValues) -> dict:
    return {
        "train_micro_batch_size_per_gpu": auto.micro_batch,
        "gradient_accumulation_steps": auto.grad_accum,
        "gradient_clipping": HF_DEFAULT_MAX_GRAD_NORM,
        "optimizer.params.lr": HF_DEFAULT_LR,
        "optimizer.params.betas": list(HF_DEFAULT_BETAS),
        "optimizer.params.eps": HF_DEFAULT_EPS,
        "optimizer.params.weight_decay": HF_DEFAULT_WEIGHT_DECAY,
        "bf16.enabled": auto.precision == "bf16",
        "fp16.enabled": auto.precision == "fp16",
        "scheduler.params.warmup_min_lr": 0.0,
        "scheduler.params.warmup_max_lr": HF_DEFAULT_LR,
        "scheduler.params.warmup_num_steps": 0,
        **({"scheduler.params.total_num_steps": auto.steps} if auto.steps else {}),
    }


_TOTAL = "scheduler.params.total_num_steps"
AUTO_KEYS = tuple(_fills(AutoValues())) + ("train_batch_size", _TOTAL)
_ZENFLOW_AUTO = ("zero_optimization.zenflow.update_interval",
                 "zero_optimization.zenflow.select_interval",
                 "zero_optimization.zenflow.select_strategy",  # ZenFlow's default, 'auto' 
                 # the HF Trainer fills it from the model (hidden^2); config.py reads 'auto'
                 "zero_optimization.reduce_bucket_size")


def _walk(d: dict, prefix: str = ""):
    for key, value in d.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            yield from _walk(value, full)
        else:
            yield full, value


def resolve_auto(d: dict, auto: AutoValues, world: int) -> dict:
    """A copy of d with every HF-style "auto" filled (see the module docstring)."""
    out = copy.deepcopy(d)
    fills = _fills(auto)
    for full, value in list(_walk(out)):
        if value != "auto" or full in _ZENFLOW_AUTO:
            continue
        if full in fills:
            _put(out, full, fills[full])
        elif full == _TOTAL:
            raise ConfigError(full, "got 'auto'; the HF Trainer fills it with the run's "
                              "optimizer steps, which zfbench does not know here: give "
                              "the number")
        elif full != "train_batch_size":
            raise ConfigError(full, f"got 'auto'; 'auto' is filled only for the keys the "
                              f"HF Trainer fills ({', '.join(AUTO_KEYS)}); give a value")
    if out.get("train_batch_size") == "auto":
        micro = out.get("train_micro_batch_size_per_gpu", auto.micro_batch)
        accum = out.get("gradient_accumulation_steps", auto.grad_accum)
        out["train_batch_size"] = (_int(micro, "train_micro_batch_size_per_gpu", lo=1) *
                                   _int(accum, "gradient_accumulation_steps", lo=1) * world)
    return out


def derive_batch(d: dict, world: int) -> tuple[int, int]:
    """(micro batch, accumulation steps) by DeepSpeed's rule (module docstring)."""
    tbs, micro, accum = (d.get(k) for k in ("train_batch_size",
                                            "train_micro_batch_size_per_gpu",
                                            "gradient_accumulation_steps"))
    tbs = None if tbs is None else _int(tbs, "train_batch_size", lo=1)
    micro = None if micro is None else _int(micro, "train_micro_batch_size_per_gpu", lo=1)
    accum = None if accum is None else _int(accum, "gradient_accumulation_steps", lo=1)
    if tbs is None:
        return micro or 1, accum or 1
    if micro is None and accum is None:
        accum = 1
    if micro is None:
        micro = tbs // (accum * world)
        key, what = "train_batch_size", (f"gradient_accumulation_steps * world_size = "
                                         f"{accum} * {world}")
    elif accum is None:
        accum = tbs // (micro * world)
        key, what = "train_batch_size", (f"train_micro_batch_size_per_gpu * world_size = "
                                         f"{micro} * {world}")
    else:
        key, what = "train_batch_size", None
    if micro < 1 or accum < 1 or micro * accum * world != tbs:
        if what is not None:
            raise ConfigError(key, f"got {tbs}; it must be a multiple of {what}")
        raise ConfigError(key, f"got {tbs}; expected train_micro_batch_size_per_gpu * "
                          f"gradient_accumulation_steps * world_size = {micro} * {accum} "
                          f"* {world} = {micro * accum * world}")
    return micro, accum
