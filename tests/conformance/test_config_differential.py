"""Differential config fuzzing (issue 24): zfbench's config reader against DeepSpeed's own.

Hypothesis writes ZeRO / ZenFlow config dicts, valid and invalid, for 1, 2 and 4 ranks, and
each one goes through both readers:

- zfbench: `zfbench.core.config.load_config(d, world_size=W)` (a refusal is a
  `ConfigError`), then `ZenFlowConfig.select_interval_steps(steps_per_epoch)`, which the
  engine calls with its data's epoch length;
- DeepSpeed 0.19.5 (the `[deepspeed]` extra): `DeepSpeedConfig(d, mpu=...)` with an mpu
  that reports W data-parallel ranks (`dist.get_rank` is patched to 0, so no process
  group is needed), then DeepSpeed's own config-time ZenFlow checks that run when an
  engine is built: `deepspeed.runtime.zenflow.engine.configure_zenflow` on a stand-in
  engine (the data's epoch length as its dataloader) and, at ZeRO stage 1 or 2,
  `ZenFlowZeroOptimizer._configure_zenflow` (where "Zenflow must be used with cpu offload"
  lives), with the `offload` / `overlap_comm` assertion of its `__init__`.

The two must agree on accept / refuse and, where both accept, on the resolved values (the
batch triple, ZeRO stage, offload device, every ZenFlow field, the reselection interval in
steps and the update window) -- or differ exactly as documented: `DIFFERENCES` names each
intended difference and the line of docs/config_keys.md that documents it (a test keeps
those lines present). Where zfbench accepts what DeepSpeed refuses, the difference also
says how to write the config so DeepSpeed reads it as zfbench does (`repair`), and the
repaired config must then be accepted by DeepSpeed with the same values. What this
fuzzing found undocumented at first (issue 24: non-object sections crashing, null, ZeRO
keys without a rule, DeepSpeed's ZenFlow replacing the accumulation) is fixed or
documented now.

Environment: DeepSpeed 0.19.5 imports on a CPU-only machine with no variables set (it
picks its CPU accelerator and logs a warning); DS_ACCELERATOR=cpu is set (if unset) only so
a GPU machine parses configs the same way. Nothing here builds or loads a DeepSpeed op, so
DS_BUILD_OPS is not needed. Run it from a venv with the extra installed, e.g.
`python3 -m venv /work/dsvenv && /work/dsvenv/bin/pip install torch==2.13.0 &&
/work/dsvenv/bin/pip install -e '.[dev,deepspeed]'`; without DeepSpeed the module skips.
"""
from __future__ import annotations

import copy
import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest

if importlib.util.find_spec("deepspeed") is not None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed picks its accelerator
deepspeed = pytest.importorskip("deepspeed")

from deepspeed.runtime import config as ds_config
from deepspeed.runtime.zenflow import engine as ds_zenflow_engine
from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig as DsZenFlowConfig
from deepspeed.runtime.zenflow.zenflow_stage_1_and_2 import ZenFlowZeroOptimizer
from deepspeed.runtime.zenflow.zenflow_utils import _split_affinity
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
from deepspeed.runtime.zero.offload_config import (
    DeepSpeedZeroOffloadOptimizerConfig,
    OffloadDeviceEnum,
)
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from zfbench.real.distributed import default_thread_split

from zfbench.core.config import load_config
from zfbench.core.config_fields import ConfigError
from zfbench.core.config_keys import KEY_RULES
from zfbench.core.config_zenflow import ZenFlowConfig

DS_VERSION = "0.19.5"
DOC = Path(__file__).resolve().parents[2] / "docs" / "config_keys.md"
ZF = "zero_optimization.zenflow"
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu",
              "gradient_accumulation_steps")
# the ZenFlow fields both readers have
ZF_FIELDS = ("topk_ratio", "select_strategy", "select_interval", "update_interval",
             "overlap_step", "full_warm_up_rounds", "auto_ratio", "pt_reserved_cores_perc",
             "offload")
_MISSING = object()


@pytest.fixture(autouse=True, scope="module")
def _quiet_deepspeed():
    """DeepSpeed logs a line per config (and deprecation warnings); keep the output clean."""
    ds_logger = deepspeed.utils.logger
    level = ds_logger.level
    ds_logger.setLevel(logging.ERROR)
    yield
    ds_logger.setLevel(level)


def lookup(d, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


def _delete(d: dict, dotted: str) -> None:
    *path, last = dotted.split(".")
    for part in path:
        d = d[part]
    d.pop(last, None)


# ---------------------------------------------------------------- the two readers
@dataclass
class Read:
    """One reader's outcome: `error` is None when it accepted; `values` are comparable."""
    error: BaseException | None = None
    values: dict = field(default_factory=dict)
    notes: tuple = ()
    cfg: object = None

    @property
    def ok(self) -> bool:
        return self.error is None


def zfbench_read(d: dict, world: int, steps_per_epoch: int | None) -> Read:
    try:
        c = load_config(copy.deepcopy(d), world_size=world)
        steps = (c.zenflow.select_interval_steps(steps_per_epoch)
                 if c.zenflow is not None else None)
    except Exception as e:  # noqa: BLE001 - anything but ConfigError is judged a crash
        return Read(error=e)
    values = {"batch": (c.train_batch_size, c.micro_batch, c.grad_accum),
              "stage": c.zero_stage, "device": c.offload_device,
              "zenflow": c.zenflow is not None}
    if c.zenflow is not None:
        zf = c.zenflow
        values.update({f"zf.{f}": getattr(zf, f) for f in ZF_FIELDS})
        values.update({"zf.S_steps": steps, "zf.auto_update": zf.auto_update,
                       "zf.U": 0 if zf.auto_update else zf.update_interval})
    return Read(values=values, notes=c.notes, cfg=c)


class _DataParallelRanks:
    """The mpu DeepSpeedConfig asks for its data-parallel world size."""

    def __init__(self, world: int):
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


def deepspeed_read(d: dict, world: int, steps_per_epoch: int | None) -> Read:
    try:
        with mock.patch.object(ds_config.dist, "get_rank", return_value=0):
            cfg = ds_config.DeepSpeedConfig(copy.deepcopy(d), mpu=_DataParallelRanks(world))
    except Exception as e:  # noqa: BLE001 - DeepSpeed refuses with many exception types
        return Read(error=e)
    assert cfg.world_size == world, "the mpu did not set DeepSpeed's world size"
    zero = cfg.zero_config
    zf, off = zero.zenflow, zero.offload_optimizer
    values = {"batch": (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                        cfg.gradient_accumulation_steps),
              "stage": int(cfg.zero_optimization_stage),
              "device": "none" if off is None else str(getattr(off.device, "value", off.device)),
              "zenflow": zf is not None}
    if zf is None:
        return Read(values=values, cfg=SimpleNamespace(ds=cfg, engine=None))
    # DeepSpeedEngine.__init__ -> configure_zenflow (deepspeed/runtime/zenflow/engine.py),
    # with the data's epoch length as its dataloader's
    engine = SimpleNamespace(
        zenflow_config=lambda: zf,
        training_dataloader=range(steps_per_epoch) if steps_per_epoch else None,
        _config=SimpleNamespace(gradient_accumulation_steps=cfg.gradient_accumulation_steps))
    try:
        ds_zenflow_engine.configure_zenflow(engine)
        if values["stage"] in (1, 2):
            # engine._configure_zero_optimizer -> ZenFlowZeroOptimizer(...).__init__
            # (deepspeed/runtime/zenflow/zenflow_stage_1_and_2.py); its cpu_offload is
            # DeepSpeedZeroOptimizer's: an offload_optimizer whose device is not "none"
            if zf.offload:
                assert zero.overlap_comm, ("offload selective optimizer should be used with "
                                           "overlap_comm")
            optimizer = SimpleNamespace(
                cpu_offload=off is not None and off.device != OffloadDeviceEnum.none)
            ZenFlowZeroOptimizer._configure_zenflow(optimizer, zf)
    except Exception as e:  # noqa: BLE001 - incl. the `raise Warning(...)` of auto + integer
        return Read(error=e)
    values.update({f"zf.{f}": getattr(zf, f) for f in ZF_FIELDS})
    values.update({"zf.S_steps": engine.select_interval, "zf.auto_update": engine.auto_update,
                   "zf.U": engine.update_interval})
    return Read(values=values, cfg=SimpleNamespace(ds=cfg, engine=engine))


# ---------------------------------------------------------------- intended differences
@dataclass
class Case:
    d: dict
    world: int
    steps_per_epoch: int | None
    zf: Read
    ds: Read

    def zf_key(self) -> str | None:
        return getattr(self.zf.error, "key", None)

    def zf_raw(self):
        key = self.zf_key()
        return _MISSING if key is None else lookup(self.d, key)

    def ds_stage(self):
        return self.ds.values.get("stage")


def _is_int(v) -> bool:
    return type(v) is int


def _is_number(v) -> bool:
    return type(v) in (int, float)


# what zfbench's reader takes at each key the fuzzer writes (JSON types, no coercion)
_KIND_OK: dict[str, Callable[[object], bool]] = {
    **{k: _is_int for k in BATCH_KEYS},
    "zero_optimization.stage": _is_int,
    "zero_optimization.offload_optimizer.device": lambda v: isinstance(v, str),
    "zero_optimization.offload_optimizer.pin_memory": lambda v: type(v) is bool,
    "zero_optimization.overlap_comm": lambda v: type(v) is bool,
    f"{ZF}.topk_ratio": _is_number, f"{ZF}.auto_ratio": _is_number,
    f"{ZF}.pt_reserved_cores_perc": _is_number,
    f"{ZF}.select_strategy": lambda v: isinstance(v, str),
    f"{ZF}.select_interval": lambda v: _is_int(v) or v == "auto",
    f"{ZF}.update_interval": lambda v: _is_int(v) or v == "auto",
    f"{ZF}.overlap_step": lambda v: type(v) is bool,
    f"{ZF}.full_warm_up_rounds": _is_int,
    f"{ZF}.offload": lambda v: type(v) is bool,
}


def _wrong_json_type(c: Case) -> bool:
    key, v = c.zf_key(), c.zf_raw()
    return (key in _KIND_OK and v is not _MISSING and v is not None and v != "auto"
            and not _KIND_OK[key](v))


# zfbench's ranges for ZenFlow's knobs (docs/zenflow.md, "The knobs"), where DeepSpeed's are wider
_ZF_RANGE_OK = {
    f"{ZF}.topk_ratio": lambda v: v > 0, f"{ZF}.auto_ratio": lambda v: v > 0,
    f"{ZF}.full_warm_up_rounds": lambda v: v >= 0,
    f"{ZF}.update_interval": lambda v: v == "auto" or v >= 1,
    f"{ZF}.select_interval": lambda v: v == "auto" or v >= 0,
}


def _outside_zf_range(c: Case) -> bool:
    key, v = c.zf_key(), c.zf_raw()
    return (key in _ZF_RANGE_OK and v is not _MISSING and _KIND_OK[key](v)
            and not _ZF_RANGE_OK[key](v))


def _has_null(d) -> bool:
    return isinstance(d, dict) and any(v is None or _has_null(v) for v in d.values())


def _drop_nulls(d: dict) -> dict:
    return {k: _drop_nulls(v) if isinstance(v, dict) else v for k, v in d.items()
            if v is not None}


def _repair_batch_default(d: dict, c: Case) -> dict:
    d = copy.deepcopy(d)
    d["train_micro_batch_size_per_gpu"] = c.zf.cfg.micro_batch
    return d


def _repair_hf_auto(d: dict, c: Case) -> dict:
    d = copy.deepcopy(d)
    resolved = dict(zip(BATCH_KEYS, c.zf.values["batch"]))
    for k in BATCH_KEYS:
        if d.get(k) == "auto":
            d[k] = resolved[k]
    return d


def _repair_select_auto_int(d: dict, c: Case) -> dict:
    d = copy.deepcopy(d)
    d["zero_optimization"]["zenflow"]["select_strategy"] = "step"
    return d


def _repair_drop_ignored(d: dict, c: Case) -> dict:
    d = copy.deepcopy(d)
    for note in c.zf.notes:
        if ": ignored (" in note:
            _delete(d, note.split(": ignored (")[0])
    return d


@dataclass(frozen=True)
class Difference:
    """An intended difference. side "zfbench refuses": `explains` tells whether zfbench's
    refusal of a config DeepSpeed accepts is this one. side "zfbench accepts": `applies`
    tells whether the config has it and `repair` rewrites it the way DeepSpeed must be
    told what zfbench reads (the repaired config must then agree with zfbench)."""
    name: str
    side: str
    doc: str  # a phrase of docs/config_keys.md that documents it
    explains: Callable[[Case], bool] | None = None
    applies: Callable[[dict, Case], bool] | None = None
    repair: Callable[[dict, Case], dict] | None = None
    touches: tuple = ()  # compared values the repair changes on purpose
    example: tuple = ()  # (config, world[, steps_per_epoch]): a minimal config showing it


_ZF_CPU = {"stage": 2, "offload_optimizer": {"device": "cpu"}}
DIFFERENCES = (
    # ---- zfbench refuses what DeepSpeed accepts
    Difference(
        "stage 3 refused for zero-offload", "zfbench refuses",
        "3 with zero-offload or zero-offload-dpu is refused",
        explains=lambda c: c.zf_key() == "zero_optimization.stage" and c.ds_stage() == 3
        and _is_int(c.zf_raw()),
        example=({"train_batch_size": 1, "zero_optimization": {
            "stage": 3, "offload_optimizer": {"device": "cpu"}}}, 1)),
    Difference(
        "zenflow.offload refused at stage 3", "zfbench refuses",
        "`zero_optimization.stage: 3` runs for the `zenflow` strategy only",
        explains=lambda c: c.zf_key() == "zero_optimization.zenflow.offload"
        and c.ds_stage() == 3 and "stage 3" in str(c.zf.error),
        example=({"train_batch_size": 1, "zero_optimization": {
            "stage": 3, "offload_optimizer": {"device": "cpu"}, "overlap_comm": True,
            "zenflow": {"offload": True}}}, 1)),
    Difference(
        "nvme refused", "zfbench refuses", "'cpu' or 'none'; 'nvme' is refused",
        explains=lambda c: c.zf_key() == "zero_optimization.offload_optimizer.device"
        and c.zf_raw() == "nvme",
        example=({"train_batch_size": 1, "zero_optimization": {
            "stage": 2, "offload_optimizer": {"device": "nvme"}}}, 1)),
    Difference(
        "gradient_allreduce_op other than mean refused", "zfbench refuses",
        "DeepSpeed 0.19.5 has no `gradient_allreduce_op` key",
        explains=lambda c: c.zf_key() == "gradient_allreduce_op",
        example=({"train_batch_size": 1, "gradient_allreduce_op": "sum"}, 1)),
    Difference(
        "unknown top-level key refused", "zfbench refuses",
        "DeepSpeed ignores a top-level key it does not know",
        explains=lambda c: c.zf_key() is not None and "." not in c.zf_key()
        and c.zf_key() not in KEY_RULES and "unknown key" in str(c.zf.error),
        example=({"train_batch_size": 1, "zero_optimisation": {"stage": 2}}, 1)),
    Difference(
        "offload needs ZeRO stage 1 or 2", "zfbench refuses",
        "at ZeRO stage 0 is refused",
        explains=lambda c: c.zf_key() == "zero_optimization.stage" and c.ds_stage() == 0
        and "optimizer offload needs ZeRO stage" in str(c.zf.error),
        example=({"train_batch_size": 1, "zero_optimization": {
            "offload_optimizer": {"device": "cpu"}}}, 1)),
    Difference(
        "zenflow needs cpu offload at every stage", "zfbench refuses",
        "a `zenflow` section without `offload_optimizer.device: \"cpu\"` is refused at "
        "every stage",
        explains=lambda c: c.zf_key() == ZF and c.ds_stage() == 0
        and "ZenFlow needs" in str(c.zf.error),
        example=({"train_batch_size": 1, "zero_optimization": {"zenflow": {}}}, 1)),
    Difference(
        "JSON types, not coerced", "zfbench refuses", "Types are checked, not coerced",
        explains=_wrong_json_type,
        example=({"train_batch_size": 1, "zero_optimization": {"stage": "2"}}, 1)),
    Difference(
        "ZenFlow ranges", "zfbench refuses", "Ranges DeepSpeed leaves open",
        explains=_outside_zf_range,
        example=({"train_batch_size": 1, "zero_optimization": {
            **_ZF_CPU, "zenflow": {"update_interval": 0}}}, 1)),
    Difference(
        "auto outside the HF Trainer's keys refused", "zfbench refuses",
        "DeepSpeed reads \"auto\" in any other key of a section",
        explains=lambda c: c.zf_raw() == "auto"
        and (c.zf_key() or "").startswith("zero_optimization."),
        example=({"train_batch_size": 1, "zero_optimization": {
            **_ZF_CPU, "zenflow": {"topk_ratio": "auto"}}}, 1)),
    Difference(
        "a refused key", "zfbench refuses",
        "it would change training in a way zfbench does not implement",
        explains=lambda c: getattr(KEY_RULES.get(c.zf_key() or ""), "treatment", None)
        == "refused" and "does not implement this" in str(c.zf.error),
        example=({"train_batch_size": 1, "zero_optimization": {"mics_shard_size": 2}}, 1)),
    Difference(
        "pre-0.3 boolean zero_optimization refused", "zfbench refuses",
        "its pre-0.3 form, as stage 1 / 0; zfbench refuses it",
        explains=lambda c: c.zf_key() == "zero_optimization"
        and isinstance(c.d.get("zero_optimization"), bool),
        example=({"train_batch_size": 1, "zero_optimization": True}, 1)),
    # ---- zfbench accepts what DeepSpeed refuses
    Difference(
        "null is not given", "zfbench accepts", "null is \"not given\"",
        applies=lambda d, c: _has_null(d), repair=lambda d, c: _drop_nulls(d),
        example=({"train_batch_size": 1, "zero_optimization": None}, 1)),
    Difference(
        "batch defaults", "zfbench accepts",
        "With neither `train_batch_size` nor `train_micro_batch_size_per_gpu`",
        applies=lambda d, c: d.get("train_batch_size") is None
        and d.get("train_micro_batch_size_per_gpu") is None,
        repair=_repair_batch_default,
        example=({"gradient_accumulation_steps": 2}, 2)),
    Difference(
        "HF Trainer auto", "zfbench accepts",
        "zfbench fills the same keys with the same defaults",
        applies=lambda d, c: any(d.get(k) == "auto" for k in BATCH_KEYS),
        repair=_repair_hf_auto,
        example=({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2}, 2)),
    Difference(
        "select_strategy auto with an integer select_interval", "zfbench accepts",
        "an integer `select_interval` with `select_strategy: \"auto\"`",
        applies=lambda d, c: c.zf.ok and c.zf.cfg.zenflow is not None
        and c.zf.cfg.zenflow.select_strategy == "auto"
        and _is_int(c.zf.cfg.zenflow.select_interval),
        repair=_repair_select_auto_int, touches=("zf.select_strategy",),
        example=({"train_batch_size": 1, "zero_optimization": {
            **_ZF_CPU, "zenflow": {"select_interval": 4}}}, 1)),
    Difference(
        "ignored keys are not validated", "zfbench accepts",
        "An ignored key is dropped without reading its value",
        applies=lambda d, c: c.zf.ok and any(": ignored (" in n for n in c.zf.notes),
        repair=_repair_drop_ignored,
        example=({"train_batch_size": 1, "tensorboard": {"enabled": "yes please"}}, 1)),
)


# ---------------------------------------------------------------- the judge
class Disagreement(AssertionError):
    pass


def _compare(zf: Read, ds: Read, skip=()) -> list[str]:
    keys = (set(zf.values) | set(ds.values)) - set(skip)
    return [f"{k}: zfbench {zf.values.get(k, '-')!r} vs DeepSpeed {ds.values.get(k, '-')!r}"
            for k in sorted(keys) if zf.values.get(k, _MISSING) != ds.values.get(k, _MISSING)]


def judge(d: dict, world: int, steps_per_epoch: int | None = None) -> str:
    """'agree: ...' or a Difference's name; a Disagreement otherwise."""
    c = Case(d, world, steps_per_epoch, zfbench_read(d, world, steps_per_epoch),
             deepspeed_read(d, world, steps_per_epoch))
    where = f"config {d!r}, world {world}, steps_per_epoch {steps_per_epoch}"
    if not c.zf.ok and not isinstance(c.zf.error, ConfigError):
        raise Disagreement(f"zfbench crashed ({type(c.zf.error).__name__}: {c.zf.error}); "
                           f"{where}") from c.zf.error
    if c.zf.ok and c.ds.ok:
        diff = _compare(c.zf, c.ds)
        if diff:
            raise Disagreement(f"values differ: {diff}; {where}")
        return "agree: both accept"
    if not c.zf.ok and not c.ds.ok:
        return f"agree: both refuse (zfbench: {c.zf_key()})"
    if not c.zf.ok:  # DeepSpeed accepts
        for diff in DIFFERENCES:
            if diff.side == "zfbench refuses" and diff.explains(c):
                return diff.name
        raise Disagreement(f"zfbench refuses ({c.zf.error}) what DeepSpeed accepts; {where}")
    # zfbench accepts, DeepSpeed refuses: apply every documented difference the config has,
    # then DeepSpeed must accept it and agree
    repaired, used, touched = d, [], set()
    for diff in DIFFERENCES:
        if diff.side == "zfbench accepts" and diff.applies(repaired, c):
            repaired = diff.repair(repaired, c)
            used.append(diff.name)
            touched.update(diff.touches)
    if not used:
        raise Disagreement(f"DeepSpeed refuses ({type(c.ds.error).__name__}: {c.ds.error}) "
                           f"what zfbench accepts; {where}")
    ds2 = deepspeed_read(repaired, world, steps_per_epoch)
    if not ds2.ok:
        raise Disagreement(f"DeepSpeed refuses ({type(ds2.error).__name__}: {ds2.error}) "
                           f"what zfbench accepts, even written as {repaired!r} "
                           f"(differences {used}); {where}")
    diff = _compare(c.zf, ds2, skip=touched)
    if diff:
        raise Disagreement(f"values differ after {used}: {diff}; {where}")
    return " + ".join(used)


# ---------------------------------------------------------------- the config generator
def _maybe_junk(draw, valid, junk, noise):
    """A valid value, or a junk one about 1 in `noise` draws (never with noise None)."""
    pool = junk if noise and draw(st.integers(0, noise - 1)) == 0 else valid
    return draw(st.sampled_from(pool))


ZENFLOW_VALUES = {  # key: (valid values, junk values)
    "topk_ratio": ([0.05, 0.1, 0.5, 1.0, 1], [0, 0.0, 1.5, -0.1, "auto", "0.5", True, None]),
    "select_strategy": (["auto", "step", "epoch"], ["STEP", "bogus", 1, "auto"]),
    "select_interval": (["auto", 0, 1, 2, 4, 8], [-1, "3", 2.0, True, "never"]),
    "update_interval": (["auto", 1, 2, 4], [0, -1, "x", 2.0, True]),
    "overlap_step": ([True, False], [1, "yes", None]),
    "full_warm_up_rounds": ([0, 1, 3], [-1, 2.0, "3", True]),
    "auto_ratio": ([0.5, 0.99, 1.0], [0, 0.0, 1.5, "auto"]),
    "pt_reserved_cores_perc": ([0, 0.0, 0.25, 0.5, 1.0, 1], [1.5, -0.5, "0.5"]),
    "offload": ([False, True], ["yes", 1, None]),
}


@st.composite
def zenflow_sections(draw, noise):
    zf = {}
    for key, (valid, junk) in ZENFLOW_VALUES.items():
        if draw(st.booleans()):
            zf[key] = _maybe_junk(draw, valid, junk, noise and 2 * noise)
    if noise and draw(st.integers(0, 19)) == 0:
        zf[draw(st.sampled_from(["top_k_ratio", "steps_per_epoch"]))] = 3
    return zf


@st.composite
def zero_sections(draw, noise):
    shape = draw(st.sampled_from(["zenflow"] * 4 + ["offload"] * 2 + ["device"] * 2 +
                                 ["free"] * 2))
    zero = {}
    stage = {"zenflow": [1, 2], "offload": [1, 2], "device": [0, 1, 2],
             "free": [0, 1, 2, 3]}[shape]
    if shape == "free" and draw(st.integers(0, 3)) == 0:
        pass  # stage absent: DeepSpeed's and zfbench's default 0
    else:
        zero["stage"] = _maybe_junk(draw, stage, [3, 4, -1, "2", 2.0, True, "auto"], noise)
    device = {"zenflow": ["cpu"], "offload": ["cpu"], "device": ["none"],
              "free": ["cpu", "none"]}[shape]
    if shape != "device" or draw(st.booleans()):
        off = {"device": _maybe_junk(draw, device, ["nvme", "none", "CPU", "gpu", None],
                                     noise)}
        if draw(st.integers(0, 3)) == 0:
            off["pin_memory"] = _maybe_junk(draw, [True, False], ["yes", 1], noise)
        zero["offload_optimizer"] = off
    elif noise and draw(st.integers(0, 9)) == 0:
        zero["offload_optimizer"] = None
    if draw(st.integers(0, 3)) == 0:
        zero["overlap_comm"] = _maybe_junk(draw, [True, False], [None, "yes"], noise)
    if shape == "zenflow" or (shape == "free" and draw(st.booleans())):
        zero["zenflow"] = (None if noise and draw(st.integers(0, 19)) == 0
                           else draw(zenflow_sections(noise)))
    if noise and draw(st.integers(0, 24)) == 0:
        zero[draw(st.sampled_from(["stag", "mics_shard_size", "log_trace_cache_warnings"]))] \
            = -1 if draw(st.booleans()) else False
    return zero


@st.composite
def configs(draw):
    """(config, world size, steps per epoch or None)."""
    world = draw(st.sampled_from([1, 2, 4]))
    noise = draw(st.sampled_from([None, None, 3, 8]))  # None: every value well-formed
    micro, accum = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    # mostly consistent; sometimes a train_batch_size that does not divide or disagrees
    train = micro * accum * world + draw(st.sampled_from([0] * 5 + [1, -1, world]))
    d = {}
    for key, value in zip(BATCH_KEYS, (train, micro, accum)):
        if draw(st.integers(0, 3)):
            d[key] = value
    if noise and draw(st.integers(0, 3)) == 0:
        d[draw(st.sampled_from(BATCH_KEYS))] = draw(st.sampled_from(
            [0, -2, 8.0, 2.5, True, "8", "auto", None]))
    kind = draw(st.integers(0, 19))
    if kind == 0 and noise:
        d["zero_optimization"] = draw(st.sampled_from([True, False, None, 2]))
    elif kind != 1:  # kind 1: no zero_optimization section (stage 0, no offload)
        d["zero_optimization"] = draw(zero_sections(noise))
    if draw(st.integers(0, 5)) == 0:
        d["gradient_allreduce_op"] = draw(st.sampled_from(["mean", "MEAN", "sum", "avg"]))
    if draw(st.integers(0, 7)) == 0:
        key, values = draw(st.sampled_from([
            ("steps_per_print", [10, "often"]), ("wall_clock_breakdown", [False, "no"]),
            ("tensorboard", [{"enabled": False}, {"enabled": "yes please"}])]))
        d[key] = draw(st.sampled_from(values))
    if noise and draw(st.integers(0, 9)) == 0:
        d[draw(st.sampled_from(["train_batch", "zero_optimisation"]))] = 1
    steps_per_epoch = draw(st.sampled_from([None, None, 1, 3, 10]))
    return d, world, steps_per_epoch


# ---------------------------------------------------------------- tests
@settings(max_examples=2500, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(configs())
def test_zfbench_and_deepspeed_agree_or_differ_as_documented(case):
    d, world, steps_per_epoch = case
    verdict = judge(d, world, steps_per_epoch)  # raises Disagreement otherwise
    event(verdict)


def _doc_line(phrase: str) -> int | None:
    """The line of docs/config_keys.md where `phrase` starts (it may wrap), or None."""
    flat, starts = "", []
    for n, line in enumerate(DOC.read_text(encoding="utf-8").splitlines(), 1):
        starts.append((len(flat), n))
        flat += " ".join(line.split()) + " "
    at = flat.find(" ".join(phrase.split()))
    return None if at < 0 else max(n for pos, n in starts if pos <= at)


@pytest.mark.parametrize("diff", DIFFERENCES, ids=lambda x: x.name)
def test_each_difference_is_documented_and_shows_on_its_example(diff):
    assert _doc_line(diff.doc) is not None, \
        f"{diff.name}: docs/config_keys.md no longer says {diff.doc!r}"
    assert judge(*diff.example) == diff.name


def test_zenflow_accumulation_differs_as_documented():
    """DeepSpeed's configure_zenflow ends with `engine._config.gradient_accumulation_steps
    = engine.update_interval` (0 with update_interval "auto"): its accumulation boundary
    and loss division then use U, whatever gradient_accumulation_steps says. zfbench keeps
    the config's accumulation (docs/zenflow.md, "Gradient accumulation is the config's")."""
    d = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
         "zero_optimization": {**_ZF_CPU, "zenflow": {"update_interval": 4,
                                                      "select_strategy": "step",
                                                      "select_interval": 0}}}
    assert judge(d, 1) == "agree: both accept"  # the config classes agree
    assert deepspeed_read(d, 1, None).cfg.engine._config.gradient_accumulation_steps == 4
    assert zfbench_read(d, 1, None).cfg.grad_accum == 2
    assert _doc_line("overwrites `gradient_accumulation_steps` with `update_interval`")


def test_every_deepspeed_zero_key_has_a_rule():
    missing = []
    for prefix, model in (("zero_optimization", DeepSpeedZeroConfig),
                          ("zero_optimization.offload_optimizer",
                           DeepSpeedZeroOffloadOptimizerConfig),
                          (ZF, DsZenFlowConfig)):
        for name, f in model.model_fields.items():
            spellings = {name, f.alias} - {None}
            missing += [f"{prefix}.{s}" for s in sorted(spellings)
                        if f"{prefix}.{s}" not in KEY_RULES]
    assert not missing, missing


def test_deepspeed_is_the_pinned_version():
    """DIFFERENCES and docs/config_keys.md describe DeepSpeed 0.19.5 (pyproject's extra)."""
    assert deepspeed.__version__ == DS_VERSION


def test_zenflow_defaults_are_deepspeeds():
    ours, theirs = ZenFlowConfig(), DsZenFlowConfig()
    assert {f: getattr(ours, f) for f in ZF_FIELDS} == \
        {f: getattr(theirs, f) for f in ZF_FIELDS}
    assert theirs.offload is False  # zfbench refuses it unless false


@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(cores=st.integers(1, 128), reserved=st.one_of(
    st.floats(0.0, 1.0), st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, 1 / 3])))
def test_thread_split_is_deepspeeds_split_affinity(cores, reserved):
    """deepspeed/runtime/zenflow/zenflow_utils.py `_split_affinity`: (optimizer cores,
    training cores); zfbench's default_thread_split: (device lane, host lane)."""
    zf_cores, pt_cores = _split_affinity(list(range(cores)), reserved)
    assert default_thread_split(cores, reserved) == (len(pt_cores), len(zf_cores))
