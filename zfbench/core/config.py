"""The DeepSpeed-style training config: parsed, validated and defaulted in one place.

Owns the translation of a DeepSpeed user's JSON (dict or path to a .json file) into the
frozen dataclasses every other part of zfbench reads (`EngineConfig` and its parts).
Every error is a `ConfigError` naming the full dotted key, the bad value and what is
allowed; an unknown key also gets a "did you mean" suggestion. Every key DeepSpeed
accepts is applied, ignored with a warning (in `EngineConfig.notes`), or refused with a
reason: the one table is `zfbench.core.config_keys.KEY_RULES` (docs/config_keys.md).

Interpretations:
- Batch: any two of train_batch_size, train_micro_batch_size_per_gpu and
  gradient_accumulation_steps derive the third (train = micro x accum x ranks), as
  DeepSpeed does; all three must agree. With none, micro 1 and accum 1.
- `"auto"` values are filled as the HF Trainer's DeepSpeed integration fills them
  (`AutoValues`, the run's batch, accumulation and precision standing in for its
  arguments); ZenFlow's own "auto" (update_interval, select_interval) is ZenFlow's.
- `optimizer.params.adam_w_mode` defaults to True for "Adam" too, as DeepSpeed does;
  "AdamW" with adam_w_mode false is an error.
- The file must be self-consistent (an offload strategy needs offload_optimizer.device
  "cpu", "device" must not offload, a zenflow section only with strategy zenflow/auto,
  offload needs ZeRO stage >= 1). A `strategy=` override instead re-derives the offload
  device and drops the zenflow section, so one ds_config.json runs under every strategy;
  `zenflow` is None exactly when the resolved strategy is not "zenflow".
"""
from __future__ import annotations

import copy
import json
import os
import pathlib
from dataclasses import asdict, dataclass, field, fields

from zfbench.core.config_auto import AutoValues, derive_batch, resolve_auto  # noqa: F401
from zfbench.core.config_fields import (ConfigError, _bool,  # noqa: F401
                                   _choice, _float, _int, _unknown)
from zfbench.core.config_keys import triage
from zfbench.core.config_scheduler import SchedulerConfig, scheduler_from_dict
from zfbench.core.config_zenflow import (SCENARIO_ZENFLOW, ZENFLOW_PREFIX,  # noqa: F401
                                    ZenFlowConfig, default_zenflow_config,
                                    zenflow_from_dict)
# The engine's strategies (zfbench.core.strategies: the simulator also has zero-infinity,
# which the engine does not implement, so it is not a valid zfbench.strategy).
from zfbench.core.strategies import ENGINE_STRATEGIES as STRATEGIES
from zfbench.core.strategies import OFFLOAD_STRATEGIES as _OFFLOAD_STRATEGIES
from zfbench.core.strategies import device_adamw, has_windows, offloads


# DeepSpeed's default stage3_prefetch_bucket_size (zero/config.py, 5e7 elements)
DEFAULT_PREFETCH_ELEMS = 50_000_000


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
    consecutive_hysteresis: bool = False


def _optimizer(d) -> OptimizerConfig:
    if d is None:
        return OptimizerConfig()
    typ = _choice(d.get("type", "AdamW"), "optimizer.type", ("Adam", "AdamW"), True)
    p = d.get("params", {})
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
    fp = d.get("fp16", {})
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
                              0.0, lo_open=True),
        consecutive_hysteresis=_bool(fp.get("consecutive_hysteresis", False),
                                     "fp16.consecutive_hysteresis"))
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
    comm_dtype: str | None = None  # communication_data_type; None: the gradients' dtype
    select_comm: str = "scores"  # "scores" | "allgather": ZenFlow's cross-rank selection
    # weight gradients accumulated into the flat buffer; None: the engine's choice by
    # device (zfbench.real.inplace_grads.wanted: on for the CPU lanes, off on CUDA)
    inplace_grads: bool | None = None
    column_major: bool = True  # 2-D weights stored column by column in the flat buffers
    # zero_optimization.overlap_comm: gradient buckets reduced and sent during backward
    overlap_comm: bool = False
    bucket_elems: int = 500_000_000  # zero_optimization.reduce_bucket_size (DeepSpeed's)
    # the lr schedule (zfbench.core.config_scheduler); None: the lr stays optimizer.params.lr
    scheduler: SchedulerConfig | None = None
    dataloader_drop_last: bool = False  # of the loader `initialize` builds (training_data)
    # ZeRO-3: elements gathered ahead of the module in use (stage3_prefetch_bucket_size)
    prefetch_elems: int = DEFAULT_PREFETCH_ELEMS
    # one line per ignored key (zfbench.core.config_keys), printed by the commands
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def train_batch_size(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    def as_dict(self) -> dict:
        """The effective config, every field resolved (what summary.json records)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "raw"}
        for name in ("optimizer", "loss_scale", "zenflow", "scheduler"):
            out[name] = asdict(out[name]) if out[name] is not None else None
        out["optimizer"]["betas"] = list(out["optimizer"]["betas"])
        out["notes"] = list(self.notes)
        out["train_batch_size"] = self.train_batch_size
        return out

    @classmethod
    def from_dict(cls, d: dict, raw: dict | None = None) -> "EngineConfig":
        """The config `as_dict` wrote (a resolved config, not a DeepSpeed file: nothing is
        defaulted); `raw` the DeepSpeed dict it was parsed from. `from_dict(c.as_dict(),
        c.raw) == c`."""
        d = {k: v for k, v in d.items() if k != "train_batch_size"}
        opt = d["optimizer"]
        d["optimizer"] = OptimizerConfig(**{**opt, "betas": tuple(opt["betas"])})
        d["loss_scale"] = LossScaleConfig(**d["loss_scale"])
        d["zenflow"] = None if d["zenflow"] is None else ZenFlowConfig(**d["zenflow"])
        d["scheduler"] = None if d["scheduler"] is None else SchedulerConfig(**d["scheduler"])
        d["notes"] = tuple(d["notes"])
        return cls(**d, raw=dict(raw or {}))


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
    column_major="zfbench.column_major", overlap_comm="zero_optimization.overlap_comm",
    reduce_bucket_size="zero_optimization.reduce_bucket_size",
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
            if isinstance(zero, dict) and not has_windows(strat):
                zero.pop("zenflow", None)
            _set(d, "zero_optimization.offload_optimizer.device",
                 "cpu" if offloads(strat) else "none")
            if offloads(strat) and isinstance(zero, dict) and \
                    zero.get("stage", 0) in (0, None):
                zero["stage"] = 2  # offload needs a ZeRO stage; the strategy asks for it
    for name, value in given.items():
        if name == "precision":
            p = _choice(value, "override precision", ("fp32", "bf16", "fp16"))
            _set(d, "bf16.enabled", p == "bf16")
            _set(d, "fp16.enabled", p == "fp16")
        else:
            _set(d, _OVERRIDES[name], value)


def read_config(source) -> dict:
    """The config as a dict: a dict as given, a JSON file read, None as {}."""
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
                world_size: int = 1, auto: AutoValues | None = None,
                **overrides) -> EngineConfig:
    """Parse and validate a DeepSpeed-style config; overrides are applied first.

    world_size enters the batch rule train = micro x accum x world; `auto` fills the
    keys set to "auto" (default: the HF Trainer's defaults, batch 1, fp32).
    """
    raw = copy.deepcopy(read_config(source))  # the input as given, detached from the caller
    d = copy.deepcopy(raw)
    if "bfloat16" in d and "bf16" not in d:  # DeepSpeed's alternative spelling
        d["bf16"] = d.pop("bfloat16")
    _apply_overrides(d, overrides)
    world = _int(world_size, "world_size", lo=1)
    d, notes = triage(d)
    d = resolve_auto(d, auto or AutoValues(), world)
    micro, accum = derive_batch(d, world)

    optimizer = _optimizer(d.get("optimizer"))
    scheduler = scheduler_from_dict(d.get("scheduler"))
    drop_last = _bool(d.get("dataloader_drop_last", False), "dataloader_drop_last")
    precision, loss_scale = _precision(d)
    clip = _float(d.get("gradient_clipping", 0.0), "gradient_clipping", 0.0)
    comm_dtype = d.get("communication_data_type")
    if comm_dtype is not None:
        comm_dtype = _choice(comm_dtype, "communication_data_type",
                             ("fp32", "fp16", "bf16"))

    zero = d.get("zero_optimization", {})
    stage = _int(zero.get("stage", 0), "zero_optimization.stage", 0, 3)
    prefetch = _prefetch_elems(zero)
    off = zero.get("offload_optimizer", {})
    dev_key = "zero_optimization.offload_optimizer.device"
    if off.get("device") == "nvme":
        raise ConfigError(dev_key, "got 'nvme'; zfbench offloads to CPU memory only "
                          "(set it to 'cpu')")
    device = _choice(off.get("device", "none"), dev_key, ("none", "cpu"))
    pin = _bool(off.get("pin_memory", False),
                "zero_optimization.offload_optimizer.pin_memory")
    overlap_comm = _bool(zero.get("overlap_comm", False), "zero_optimization.overlap_comm")
    bucket = zero.get("reduce_bucket_size", "auto")
    if bucket == "auto":  # DeepSpeed's default (the HF Trainer would use hidden^2)
        bucket = 500_000_000
    elif isinstance(bucket, float) and bucket.is_integer():  # configs write 5e8
        bucket = int(bucket)
    bucket_elems = _int(bucket, "zero_optimization.reduce_bucket_size", lo=1)

    zf_section = zero.get("zenflow")
    own = d.get("zfbench", {})
    strategy = _choice(own.get("strategy", "auto"), "zfbench.strategy",
                       STRATEGIES + ("auto",))
    nonfinite = _choice(own.get("nonfinite", "skip"), "zfbench.nonfinite",
                        ("raise", "skip"))
    importance = _choice(own.get("importance", "l1"), "zfbench.importance",
                         ("l1", "l2sq"))
    select_comm = _choice(own.get("select_comm", "scores"), "zfbench.select_comm",
                          ("scores", "allgather"))
    inplace_grads = (None if own.get("inplace_grads") is None
                     else _bool(own["inplace_grads"], "zfbench.inplace_grads"))
    column_major = _bool(own.get("column_major", True), "zfbench.column_major")

    zenflow = None
    if zf_section is not None:
        zenflow = zenflow_from_dict(zf_section)
        if device != "cpu":
            raise ConfigError(ZENFLOW_PREFIX, f"ZenFlow needs {dev_key} = 'cpu'; got "
                              f"{device!r}")
    if strategy == "auto":
        strategy = ("zenflow" if zenflow is not None
                    else "zero-offload" if device == "cpu" else "device")
    if zenflow is not None and not has_windows(strategy):
        raise ConfigError("zfbench.strategy", f"got {strategy!r} while "
                          f"{ZENFLOW_PREFIX} is present; expected 'zenflow' or 'auto'")
    if has_windows(strategy) and zenflow is None:
        zenflow = default_zenflow_config()
    if (strategy in _OFFLOAD_STRATEGIES) != (device == "cpu"):
        want = "'cpu'" if strategy in _OFFLOAD_STRATEGIES else "'none'"
        raise ConfigError("zfbench.strategy", f"got {strategy!r} with {dev_key} = "
                          f"{device!r}; that strategy needs {dev_key} = {want}")
    if stage == 3:
        _check_stage3(strategy, zenflow)
    if device == "cpu" and stage == 0:
        raise ConfigError("zero_optimization.stage", f"got 0 with {dev_key} = 'cpu'; "
                          "optimizer offload needs ZeRO stage 1 or 2 (as in DeepSpeed)")
    if zenflow is not None and zenflow.offload and not overlap_comm:
        # DeepSpeed asserts the same when it builds its ZeRO-1/2 ZenFlow optimizer
        raise ConfigError(f"{ZENFLOW_PREFIX}.offload", "got true with "
                          "zero_optimization.overlap_comm false; it requires overlap_comm "
                          "(as DeepSpeed asserts): set zero_optimization.overlap_comm "
                          "to true")

    if world > 1 and (stage in (1, 2) or device_adamw(strategy)):  # what zfbench's ranks do differently from DeepSpeed's
        notes.append(
            f"zero_optimization.stage {stage}: the device strategy keeps the whole "
            f"parameters and optimizer state on every rank (stage 0's layout)" if device_adamw(strategy) else
            f"zero_optimization.stage {stage}: gradients are all-reduced whole, then each "
            f"rank's host updates its shard (stage 2 would reduce-scatter: half the bytes)")
    return EngineConfig(micro_batch=micro, grad_accum=accum, optimizer=optimizer,
                        precision=precision, gradient_clipping=clip, zero_stage=stage,
                        offload_device=device, pin_memory=pin, zenflow=zenflow,
                        strategy=strategy, nonfinite=nonfinite, importance=importance,
                        raw=raw, world_size=world, loss_scale=loss_scale,
                        comm_dtype=comm_dtype, select_comm=select_comm,
                        inplace_grads=inplace_grads, column_major=column_major,
                        overlap_comm=overlap_comm, bucket_elems=bucket_elems,
                        scheduler=scheduler, dataloader_drop_last=drop_last,
                        prefetch_elems=prefetch, notes=tuple(notes))


def _prefetch_elems(zero: dict) -> int:
    """stage3_prefetch_bucket_size (or its unprefixed spelling): elements of the modules
    gathered ahead of the one in use (ZeRO-3); "auto" and absent are DeepSpeed's 5e7."""
    key = ("stage3_prefetch_bucket_size" if "stage3_prefetch_bucket_size" in zero
           else "prefetch_bucket_size")
    value = zero.get(key, "auto")
    if value == "auto":
        return DEFAULT_PREFETCH_ELEMS
    if isinstance(value, float) and value.is_integer():  # configs write 5e7
        value = int(value)
    return _int(value, f"zero_optimization.{key}", lo=0)


def _check_stage3(strategy: str, zenflow: ZenFlowConfig | None) -> None:
    """ZeRO-3 runs in the engine for zenflow (real/zero3.py), without its offload; the
    device strategy takes the stage and keeps stage 0's layout, as it does at 1 and 2."""
    if device_adamw(strategy):  # no partitioning: the note below says so
        return
    if not has_windows(strategy):
        raise ConfigError("zero_optimization.stage", f"got 3 with strategy {strategy!r}, "
                          "which the engine runs on ZeRO stages 1-2 only (ZeRO-3 is "
                          "zenflow's): set stage 2, or simulate ZeRO-3 offload with "
                          "python -m zfbench.simulate --strategy zero-infinity")
    if zenflow is not None and zenflow.offload:
        raise ConfigError(f"{ZENFLOW_PREFIX}.offload", "got true with "
                          "zero_optimization.stage 3; the engine runs zenflow.offload on "
                          "ZeRO stages 1-2 only: set stage 2 or offload false")
