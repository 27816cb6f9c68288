"""The config's `scheduler` section: DeepSpeed's learning-rate schedules, parsed and checked.

Owns `SchedulerConfig` and `scheduler_from_dict`. zfbench implements two of DeepSpeed
0.19.5's schedulers (deepspeed/runtime/lr_schedules.py), with their documented parameters
and defaults:

- `WarmupLR`: warmup_min_lr (0), warmup_max_lr (0.001), warmup_num_steps (1000, at least
  2), warmup_type ('log' or 'linear'); the lr rises from min to max over the warm-up and
  then stays at max;
- `WarmupDecayLR`: the same plus total_num_steps (required); after the warm-up the lr
  falls linearly to min at total_num_steps.

The others (OneCycle, LRRangeTest, WarmupCosineLR) are refused with the reason: a
config that names one would train with another schedule than the user asked for.
`last_batch_iteration` other than -1 (resuming a schedule by hand) is refused too: a
checkpoint restores the schedule (`engine.load_checkpoint`). The arithmetic itself is
real/lr_schedule.py's; here only the values are checked.
"""
from __future__ import annotations

from dataclasses import dataclass

from zfbench.core.config_fields import ConfigError, _check_keys, _choice, _float, _int

IMPLEMENTED = ("WarmupLR", "WarmupDecayLR")
NOT_IMPLEMENTED = {
    "OneCycle": "it also cycles Adam's beta1 (momentum), which zfbench holds fixed",
    "LRRangeTest": "an lr range test is a search, not a training schedule",
    "WarmupCosineLR": "its cosine decay is not implemented",
}
_COMMON = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
           "last_batch_iteration")
PARAMS = {"WarmupLR": _COMMON, "WarmupDecayLR": _COMMON + ("total_num_steps",)}


@dataclass(frozen=True)
class SchedulerConfig:
    """One of DeepSpeed's schedules (module docstring); `lr(i)` is real/lr_schedule.py's."""
    type: str  # "WarmupLR" | "WarmupDecayLR"
    warmup_min_lr: float = 0.0
    warmup_max_lr: float = 0.001
    warmup_num_steps: int = 1000
    warmup_type: str = "log"  # "log" | "linear"
    total_num_steps: int | None = None  # WarmupDecayLR only


def scheduler_from_dict(d) -> SchedulerConfig | None:
    """The checked `scheduler` section (None: no section)."""
    if d is None:
        return None
    _check_keys(d, "scheduler", ("type", "params"))
    if "type" not in d:
        raise ConfigError("scheduler.type", f"missing; expected one of {list(IMPLEMENTED)}")
    typ = d["type"]
    if typ in NOT_IMPLEMENTED:
        raise ConfigError("scheduler.type", f"got {typ!r}; zfbench does not implement "
                          f"it ({NOT_IMPLEMENTED[typ]}): use one of {list(IMPLEMENTED)} "
                          f"or remove the scheduler section")
    typ = _choice(typ, "scheduler.type", IMPLEMENTED)
    p = d.get("params", {})
    _check_keys(p, "scheduler.params", PARAMS[typ])
    key = "scheduler.params."
    last = p.get("last_batch_iteration", -1)
    if last != -1:
        raise ConfigError(key + "last_batch_iteration", f"got {last!r}; zfbench starts "
                          f"every schedule at -1 and restores a resumed one from the "
                          f"checkpoint (engine.load_checkpoint): remove it")
    lo = _float(p.get("warmup_min_lr", 0.0), key + "warmup_min_lr", 0.0)
    hi = _float(p.get("warmup_max_lr", 0.001), key + "warmup_max_lr", 0.0)
    # DeepSpeed raises a warm-up shorter than 2 to 2 (log(1) would divide by zero)
    n = max(2, _int(p.get("warmup_num_steps", 1000), key + "warmup_num_steps", lo=0))
    kind = _choice(p.get("warmup_type", "log"), key + "warmup_type", ("log", "linear"))
    total = None
    if typ == "WarmupDecayLR":
        if "total_num_steps" not in p:
            raise ConfigError(key + "total_num_steps", "missing; WarmupDecayLR decays to "
                              "warmup_min_lr at this step: give the run's optimizer steps")
        total = _int(p["total_num_steps"], key + "total_num_steps", lo=1)
    return SchedulerConfig(typ, lo, hi, n, kind, total)
