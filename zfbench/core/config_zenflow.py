"""The `zero_optimization.zenflow` section: the `ZenFlowConfig` dataclass and its rules.

Keys, defaults and validation follow docs/zenflow.md ("The knobs"); `zfbench.core.config`
parses the rest of the DeepSpeed config and re-exports everything here. Also owns
`SCENARIO_ZENFLOW`, zfbench's own ZenFlow scenario (why it differs from these defaults:
its comment), and `DEFAULT_TOPK_RATIO`, the one home of the default top-k ratio: the
config's, the scenario's and every other default top-k ratio (commands, probes, gradient
statistics) import it.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, fields

from zfbench.core.config_fields import (ConfigError, _bool, _check_keys, _choice, _float, _int,
                                   _join)

# ---------------------------------------------------------------- ZenFlow section
ZENFLOW_PREFIX = "zero_optimization.zenflow"
# The share of each matrix's columns ZenFlow updates on the device at once, by default:
# DeepSpeed's default `topk_ratio` and the ZenFlow paper's setting. Written here only.
DEFAULT_TOPK_RATIO = 0.1


def _check_zenflow_values(v: dict, prefix: str) -> None:
    """Type, range and cross-field rules of zenflow.md "Config" (v has every field)."""
    k = lambda name: _join(prefix, name)  # noqa: E731
    _float(v["topk_ratio"], k("topk_ratio"), 0.0, 1.0, lo_open=True)
    _choice(v["select_strategy"], k("select_strategy"), ("auto", "step", "epoch"))
    for name, lo in (("select_interval", 0), ("update_interval", 1)):
        if isinstance(v[name], str):
            if v[name] != "auto":
                raise ConfigError(k(name), f"got {v[name]!r}; the only string allowed "
                                  f"is 'auto', otherwise an integer >= {lo}")
        else:
            _int(v[name], k(name), lo=lo)
    _bool(v["overlap_step"], k("overlap_step"))
    _int(v["full_warm_up_rounds"], k("full_warm_up_rounds"), lo=0)
    _float(v["auto_ratio"], k("auto_ratio"), 0.0, 1.0, lo_open=True)
    _float(v["pt_reserved_cores_perc"], k("pt_reserved_cores_perc"), 0.0, 1.0)
    _bool(v["offload"], k("offload"))
    sel, si, ui = v["select_strategy"], v["select_interval"], v["update_interval"]
    if sel != "auto" and si == "auto":
        raise ConfigError(k("select_interval"), f"got 'auto' with {k('select_strategy')}"
                          f" = {sel!r}; a non-auto strategy needs an integer >= 0")
    if sel != "epoch" and isinstance(si, int):  # counted in steps: compare with U now
        _check_interval_order(si, ui, prefix)


def _check_interval_order(s_steps: int, ui, prefix: str) -> None:
    if isinstance(ui, int) and 0 < s_steps < ui:
        raise ConfigError(_join(prefix, "select_interval"),
                          f"got {s_steps} steps with {_join(prefix, 'update_interval')}"
                          f" = {ui}; expected 0 (select once) or >= update_interval")


def split_cores(cores: int, reserved: float) -> tuple[int, int]:
    """(training, optimizer) cores of a rank's `cores` by DeepSpeed's rule for
    `pt_reserved_cores_perc` (deepspeed/runtime/zenflow/zenflow_utils.py `_split_affinity`,
    0.19.5): training keeps ceil(reserved x cores), the optimizer the rest; where that
    leaves either side none (reserved 0 or 1, one core) both share them all."""
    cores = max(1, int(cores))
    training = math.ceil(reserved * cores)
    if 0 < training < cores:
        return training, cores - training
    return cores, cores


@dataclass(frozen=True)
class ZenFlowConfig:
    """`zero_optimization.zenflow`; constructing one validates it."""
    topk_ratio: float = DEFAULT_TOPK_RATIO
    select_strategy: str = "auto"
    select_interval: int | str = "auto"
    update_interval: int | str = "auto"
    overlap_step: bool = False
    full_warm_up_rounds: int = 0
    auto_ratio: float = 0.99
    pt_reserved_cores_perc: float = 0.5
    # the selected columns' Adam moments kept in host memory, brought to the device around
    # each device update (needs zero_optimization.overlap_comm, as in DeepSpeed)
    offload: bool = False

    def __post_init__(self):
        _check_zenflow_values({f.name: getattr(self, f.name) for f in fields(self)},
                              ZENFLOW_PREFIX)
        for name in ("topk_ratio", "auto_ratio", "pt_reserved_cores_perc"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def auto_update(self) -> bool:
        return self.update_interval == "auto"

    def select_interval_steps(self, steps_per_epoch: int | None) -> int:
        """S, the reselection interval in steps (0 = select once, at the first step).

        "step": the integer. "epoch": steps_per_epoch * n. "auto": with
        select_interval "auto", once per epoch (steps_per_epoch); with an integer, that
        integer as steps (the shipped code rejects this combination). When an
        epoch-based rule meets steps_per_epoch=None (an unsized data stream) the result
        is 0: select once. An epoch-resolved S obeys the same rule as a step-counted
        one: 0 < S < a fixed update_interval is a ConfigError.
        """
        if steps_per_epoch is not None:
            _int(steps_per_epoch, "steps_per_epoch", lo=1)
        si = self.select_interval
        if self.select_strategy == "step" or (self.select_strategy == "auto"
                                              and isinstance(si, int)):
            return si
        epochs = 1 if si == "auto" else si
        if steps_per_epoch is None:
            return 0
        s = steps_per_epoch * epochs
        _check_interval_order(s, self.update_interval, ZENFLOW_PREFIX)
        return s


def default_zenflow_config() -> ZenFlowConfig:
    return ZenFlowConfig()


# zfbench's ZenFlow *scenario*: what the simulator's settings default to, what the engine
# runs for the zenflow strategy when a run's config has no zero_optimization.zenflow
# section (zfbench.real.runner, which says so in the config's notes), and what the
# validation and accuracy commands start from. It differs from the config defaults above
# on purpose: those are DeepSpeed's (a config file must mean what it means to DeepSpeed),
# whose update_interval "auto" and overlap_step off make the windows depend on the
# gradients and put the host update in the critical path; the scenario pins one known
# schedule instead - a fixed window of 4 steps, the host update overlapped with the next
# window, columns selected once (select_strategy "step", select_interval 0) - so that
# simulated and measured runs follow the same steps whatever the gradients. Every knob not named here
# (full_warm_up_rounds, auto_ratio, ...) keeps its ZenFlowConfig default.
SCENARIO_ZENFLOW = {"topk_ratio": DEFAULT_TOPK_RATIO, "update_interval": 4, "overlap_step": True,
                    "select_strategy": "step", "select_interval": 0}


def zenflow_from_dict(d: dict, prefix: str = ZENFLOW_PREFIX) -> ZenFlowConfig:
    names = [f.name for f in fields(ZenFlowConfig)]
    _check_keys(d, prefix, names)
    values = {f.name: d.get(f.name, f.default) for f in fields(ZenFlowConfig)}
    _check_zenflow_values(values, prefix)
    return ZenFlowConfig(**values)
