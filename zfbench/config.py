"""The DeepSpeed-style training config: parsed, validated and defaulted in one place.

Owns the translation of a DeepSpeed user's JSON (dict or path to a .json file) into the
frozen dataclasses every other part of zfbench reads (`EngineConfig` and its parts).
Every error is a `ConfigError` naming the full dotted key, the bad value and what is
allowed; an unknown key also gets a "did you mean" suggestion.

Ignored top-level keys (logging/monitoring only, they cannot change the numbers): see
IGNORED_TOP_LEVEL. Keys that would change training but are not implemented (`scheduler`,
`zero_optimization.offload_param`) are errors, never silently dropped.

Interpretations:
- `optimizer.params.adam_w_mode` defaults to True for "Adam" too, as DeepSpeed does;
  "AdamW" with adam_w_mode false is a contradiction and an error.
- The file must be self-consistent (an offload strategy needs offload_optimizer.device
  "cpu", "device" must not offload, a zenflow section only with strategy zenflow/auto).
  A `strategy=` override instead re-derives the offload device and drops the zenflow
  section for other strategies, so one ds_config.json runs under every strategy.
- `zenflow` is None exactly when the resolved strategy is not "zenflow".
- ZeRO stage is recorded as given (DeepSpeed's "offload needs stage >= 1" is not checked).
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
from dataclasses import dataclass, field, fields

STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zenflow")
_OFFLOAD_STRATEGIES = ("zero-offload", "zero-offload-dpu", "zenflow")
IGNORED_TOP_LEVEL = ("steps_per_print", "wall_clock_breakdown", "dump_state",
                     "memory_breakdown", "zero_allow_untested_optimizer", "tensorboard",
                     "wandb", "csv_monitor", "comms_logger", "flops_profiler")

from zfbench.config_fields import (ConfigError, _bool,  # noqa: F401
                                   _check_keys, _choice, _count, _float, _int, _unknown)
from zfbench.config_zenflow import (ZENFLOW_PREFIX, ZenFlowConfig,  # noqa: F401
                                    default_zenflow_config, zenflow_from_dict)


# ---------------------------------------------------------------- the other sections
@dataclass(frozen=True)
class OptimizerConfig:
    type: str = "AdamW"  # "Adam" or "AdamW"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01  # the same on the device and the host side
    adam_w_mode: bool = True


@dataclass(frozen=True)
class LossScaleConfig:
    """fp16 loss scaling (DeepSpeed's keys and defaults); loss_scale 0 = dynamic."""
    loss_scale: float = 0.0
    initial_scale_power: int = 16
    loss_scale_window: int = 1000
    hysteresis: int = 2
    min_loss_scale: float = 1.0


@dataclass(frozen=True)
class ZeroCommConfig:
    """ZeRO communication knobs, accepted and recorded (bucket sizes in elements)."""
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    allgather_partitions: bool = True
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000


def _optimizer(d) -> OptimizerConfig:
    if d is None:
        return OptimizerConfig()
    _check_keys(d, "optimizer", ("type", "params"))
    typ = _choice(d.get("type", "AdamW"), "optimizer.type", ("Adam", "AdamW"), True)
    p = d.get("params", {})
    _check_keys(p, "optimizer.params",
                ("lr", "betas", "eps", "weight_decay", "adam_w_mode"))
    betas = p.get("betas", (0.9, 0.999))
    if not isinstance(betas, (list, tuple)) or len(betas) != 2:
        raise ConfigError("optimizer.params.betas",
                          f"got {betas!r}; expected two numbers in [0, 1)")
    betas = tuple(_float(b, "optimizer.params.betas", 0.0, 1.0, hi_open=True)
                  for b in betas)
    wmode = _bool(p.get("adam_w_mode", True), "optimizer.params.adam_w_mode")
    if typ == "AdamW" and not wmode:
        raise ConfigError("optimizer.params.adam_w_mode", "got False with optimizer.type"
                          " = 'AdamW'; expected true (or use type 'Adam')")
    return OptimizerConfig(
        type=typ, betas=betas, adam_w_mode=wmode,
        lr=_float(p.get("lr", 1e-3), "optimizer.params.lr", 0.0, lo_open=True),
        eps=_float(p.get("eps", 1e-8), "optimizer.params.eps", 0.0, lo_open=True),
        weight_decay=_float(p.get("weight_decay", 0.01),
                            "optimizer.params.weight_decay", 0.0))


def _precision(d: dict) -> tuple[str, LossScaleConfig]:
    bf = d.get("bf16", {})
    _check_keys(bf, "bf16", ("enabled",))
    fp = d.get("fp16", {})
    ls_names = [f.name for f in fields(LossScaleConfig)]
    _check_keys(fp, "fp16", ["enabled"] + ls_names)
    bf_on = _bool(bf.get("enabled", False), "bf16.enabled")
    fp_on = _bool(fp.get("enabled", False), "fp16.enabled")
    if bf_on and fp_on:
        raise ConfigError("fp16.enabled", "true together with bf16.enabled = true; "
                          "expected at most one of bf16 / fp16 enabled")
    ls = LossScaleConfig(
        loss_scale=_float(fp.get("loss_scale", 0.0), "fp16.loss_scale", 0.0),
        initial_scale_power=_int(fp.get("initial_scale_power", 16),
                                 "fp16.initial_scale_power", 0, 64),
        loss_scale_window=_int(fp.get("loss_scale_window", 1000),
                               "fp16.loss_scale_window", lo=1),
        hysteresis=_int(fp.get("hysteresis", 2), "fp16.hysteresis", lo=1),
        min_loss_scale=_float(fp.get("min_loss_scale", 1.0), "fp16.min_loss_scale",
                              0.0, lo_open=True))
    return ("bf16" if bf_on else "fp16" if fp_on else "fp32"), ls


@dataclass(frozen=True)
class EngineConfig:
    micro_batch: int
    grad_accum: int
    optimizer: OptimizerConfig
    precision: str  # "fp32" | "bf16" | "fp16"
    gradient_clipping: float  # 0 = off
    zero_stage: int
    offload_device: str  # "none" | "cpu"
    pin_memory: bool
    zenflow: ZenFlowConfig | None  # set iff strategy == "zenflow"
    strategy: str  # one of STRATEGIES, never "auto"
    nonfinite: str  # "raise" | "skip"
    importance: str  # "l1" | "l2sq"
    raw: dict = field(default_factory=dict, compare=False, hash=False, repr=False)
    world_size: int = 1
    loss_scale: LossScaleConfig = LossScaleConfig()
    comm: ZeroCommConfig = ZeroCommConfig()
    select_comm: str = "scores"  # "scores" | "allgather": ZenFlow's cross-rank selection
    inplace_grads: bool = True  # weight gradients accumulated into the flat buffer

    @property
    def train_batch_size(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size


_TOP = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
        "train_batch_size", "optimizer", "bf16", "fp16", "gradient_clipping",
        "zero_optimization", "zfbench") + IGNORED_TOP_LEVEL
_ZERO = ("stage", "offload_optimizer", "zenflow") + tuple(
    f.name for f in fields(ZeroCommConfig))

# override name -> dotted key in the DeepSpeed dict it sets (plus "precision")
_OVERRIDES = dict(
    micro_batch="train_micro_batch_size_per_gpu", grad_accum="gradient_accumulation_steps",
    gradient_clipping="gradient_clipping", zero_stage="zero_optimization.stage",
    offload_device="zero_optimization.offload_optimizer.device",
    pin_memory="zero_optimization.offload_optimizer.pin_memory",
    optimizer="optimizer.type", lr="optimizer.params.lr",
    weight_decay="optimizer.params.weight_decay", strategy="zfbench.strategy",
    nonfinite="zfbench.nonfinite", importance="zfbench.importance",
    select_comm="zfbench.select_comm", inplace_grads="zfbench.inplace_grads",
    **{f.name: f"{ZENFLOW_PREFIX}.{f.name}" for f in fields(ZenFlowConfig)})
OVERRIDE_NAMES = tuple(sorted(_OVERRIDES)) + ("precision",)


def _set(d: dict, dotted: str, value) -> None:
    *path, last = dotted.split(".")
    for part in path:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    d[last] = value


def _apply_overrides(d: dict, overrides: dict) -> None:
    """CLI overrides; None means "not given". `strategy` re-derives offload/zenflow."""
    for name in overrides:
        if name not in OVERRIDE_NAMES:
            raise _unknown(f"override {name}", name, OVERRIDE_NAMES)
    given = {k: v for k, v in overrides.items() if v is not None}
    strat = given.get("strategy")
    if strat is not None:
        _choice(strat, "override strategy", STRATEGIES + ("auto",))
        if strat in STRATEGIES:
            zero = d.setdefault("zero_optimization", {})
            if isinstance(zero, dict) and strat != "zenflow":
                zero.pop("zenflow", None)
            _set(d, "zero_optimization.offload_optimizer.device",
                 "none" if strat == "device" else "cpu")
    for name, value in given.items():
        if name == "precision":
            p = _choice(value, "override precision", ("fp32", "bf16", "fp16"))
            _set(d, "bf16.enabled", p == "bf16")
            _set(d, "fp16.enabled", p == "fp16")
        else:
            _set(d, _OVERRIDES[name], value)


def _read(source) -> dict:
    if source is None:
        return {}
    if isinstance(source, dict):
        return source
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError("config", f"got {type(source).__name__}; expected a dict, "
                          "a path to a .json file, or None")
    path = os.fspath(source)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(path, f"cannot read config file: {e.strerror or e}") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        lines = text.splitlines()
        line = lines[e.lineno - 1].strip() if 0 < e.lineno <= len(lines) else ""
        raise ConfigError(path, f"invalid JSON at line {e.lineno}, column {e.colno}: "
                          f"{e.msg}: {line!r}") from None
    if not isinstance(d, dict):
        raise ConfigError(path, f"top level is {type(d).__name__}; expected an object")
    return d


def load_config(source: dict | str | os.PathLike | None = None, *,
                world_size: int = 1, **overrides) -> EngineConfig:
    """Parse and validate a DeepSpeed-style config; overrides are applied first.

    world_size is only used to check train_batch_size = micro * accum * world (and to
    derive the micro batch when only train_batch_size is given).
    """
    raw = copy.deepcopy(_read(source))  # the input as given, detached from the caller
    d = copy.deepcopy(raw)
    _apply_overrides(d, overrides)
    world = _int(world_size, "world_size", lo=1)
    _check_keys(d, "", _TOP)

    accum = _int(d.get("gradient_accumulation_steps", 1),
                 "gradient_accumulation_steps", lo=1)
    tbs = d.get("train_batch_size")
    tbs = None if tbs is None else _int(tbs, "train_batch_size", lo=1)
    micro = _int(d.get("train_micro_batch_size_per_gpu",  # derived from tbs if absent
                       1 if tbs is None else max(1, tbs // (accum * world))),
                 "train_micro_batch_size_per_gpu", lo=1)
    if tbs is not None and tbs != micro * accum * world:
        raise ConfigError("train_batch_size", f"got {tbs}; expected "
                          f"train_micro_batch_size_per_gpu * gradient_accumulation_steps"
                          f" * world_size = {micro} * {accum} * {world} = "
                          f"{micro * accum * world}")

    optimizer = _optimizer(d.get("optimizer"))
    precision, loss_scale = _precision(d)
    clip = _float(d.get("gradient_clipping", 0.0), "gradient_clipping", 0.0)

    zero = d.get("zero_optimization", {})
    _check_keys(zero, "zero_optimization", _ZERO)
    stage = zero.get("stage", 0)
    if stage == 3 and not isinstance(stage, bool):
        raise ConfigError("zero_optimization.stage", "got 3; zfbench implements ZeRO "
                          "stages up to 2 (expected 0, 1 or 2)")
    stage = _int(stage, "zero_optimization.stage", 0, 2)
    off = zero.get("offload_optimizer", {})
    _check_keys(off, "zero_optimization.offload_optimizer", ("device", "pin_memory"))
    dev_key = "zero_optimization.offload_optimizer.device"
    device = _choice(off.get("device", "none"), dev_key, ("none", "cpu"))
    pin = _bool(off.get("pin_memory", False),
                "zero_optimization.offload_optimizer.pin_memory")
    comm = ZeroCommConfig(**{
        f.name: (_count if isinstance(f.default, int) and not isinstance(f.default, bool)
                 else _bool)(zero.get(f.name, f.default), f"zero_optimization.{f.name}")
        for f in fields(ZeroCommConfig)})

    zf_section = zero.get("zenflow")
    own = d.get("zfbench", {})
    _check_keys(own, "zfbench", ("strategy", "nonfinite", "importance", "select_comm",
                                  "inplace_grads"))
    strategy = _choice(own.get("strategy", "auto"), "zfbench.strategy",
                       STRATEGIES + ("auto",))
    nonfinite = _choice(own.get("nonfinite", "skip"), "zfbench.nonfinite",
                        ("raise", "skip"))
    importance = _choice(own.get("importance", "l1"), "zfbench.importance",
                         ("l1", "l2sq"))
    select_comm = _choice(own.get("select_comm", "scores"), "zfbench.select_comm",
                          ("scores", "allgather"))
    inplace_grads = _bool(own.get("inplace_grads", True), "zfbench.inplace_grads")

    zenflow = None
    if zf_section is not None:
        zenflow = zenflow_from_dict(zf_section)
        if device != "cpu":
            raise ConfigError(ZENFLOW_PREFIX, f"ZenFlow needs {dev_key} = 'cpu'; got "
                              f"{device!r}")
    if strategy == "auto":
        strategy = ("zenflow" if zenflow is not None
                    else "zero-offload" if device == "cpu" else "device")
    if zenflow is not None and strategy != "zenflow":
        raise ConfigError("zfbench.strategy", f"got {strategy!r} while "
                          f"{ZENFLOW_PREFIX} is present; expected 'zenflow' or 'auto'")
    if strategy == "zenflow" and zenflow is None:
        zenflow = default_zenflow_config()
    if (strategy in _OFFLOAD_STRATEGIES) != (device == "cpu"):
        want = "'cpu'" if strategy in _OFFLOAD_STRATEGIES else "'none'"
        raise ConfigError("zfbench.strategy", f"got {strategy!r} with {dev_key} = "
                          f"{device!r}; that strategy needs {dev_key} = {want}")

    return EngineConfig(micro_batch=micro, grad_accum=accum, optimizer=optimizer,
                        precision=precision, gradient_clipping=clip, zero_stage=stage,
                        offload_device=device, pin_memory=pin, zenflow=zenflow,
                        strategy=strategy, nonfinite=nonfinite, importance=importance,
                        raw=raw, world_size=world, loss_scale=loss_scale, comm=comm,
                        select_comm=select_comm, inplace_grads=inplace_grads)
