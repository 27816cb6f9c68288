"""Tests for zfbench.core.config: defaults, a user's ds_config.json, every error, overrides."""
import copy
import dataclasses
import json

import pytest
from hypothesis import given, strategies as st

from zfbench.core.config import (
    STRATEGIES,
    ConfigError,
    EngineConfig,
    LossScaleConfig,
    OptimizerConfig,
    ZenFlowConfig,
    default_zenflow_config,
    load_config,
    zenflow_from_dict,
)

# What a DeepSpeed ZenFlow user's ds_config.json looks like (with zfbench's own section).
DS_CONFIG_JSON = """\
{
  "train_batch_size": 16,
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 2,
  "steps_per_print": 10,
  "wall_clock_breakdown": false,
  "zero_allow_untested_optimizer": true,
  "optimizer": {
    "type": "adamw",
    "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}
  },
  "bf16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": 2,
    "offload_optimizer": {"device": "cpu", "pin_memory": true},
    "overlap_comm": true,
    "contiguous_gradients": true,
    "reduce_bucket_size": 5e8,
    "allgather_bucket_size": 2e8,
    "zenflow": {
      "topk_ratio": 0.05,
      "select_strategy": "step",
      "select_interval": 300,
      "update_interval": 4,
      "overlap_step": true,
      "full_warm_up_rounds": 2,
      "auto_ratio": 0.9,
      "pt_reserved_cores_perc": 0.25,
      "offload": false
    }
  },
  "zfbench": {"nonfinite": "raise", "importance": "l2sq"}
}
"""


def zf_config(**zenflow):
    """A minimal valid ZenFlow config with the given zenflow keys."""
    return {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                  "zenflow": dict(zenflow)}}


def with_key(dotted, value, base=None):
    d = copy.deepcopy(base) if base is not None else {}
    *path, last = dotted.split(".")
    node = d
    for p in path:
        node = node.setdefault(p, {})
    node[last] = value
    return d


def test_defaults_none_and_empty_dict():
    for src in (None, {}):
        c = load_config(src)
        assert (c.micro_batch, c.grad_accum, c.world_size, c.train_batch_size) == (1, 1, 1, 1)
        assert c.optimizer == OptimizerConfig("AdamW", 1e-3, (0.9, 0.999), 1e-8, 0.01, True)
        assert c.precision == "fp32" and c.gradient_clipping == 0.0
        assert (c.zero_stage, c.offload_device, c.pin_memory) == (0, "none", False)
        assert c.zenflow is None and c.strategy == "device"
        assert (c.nonfinite, c.importance) == ("skip", "l1")
        assert c.loss_scale == LossScaleConfig(0.0, 16, 1000, 2, 1.0)
        assert c.comm_dtype is None and c.notes == ()


def test_default_zenflow_matches_reference_table():
    z = default_zenflow_config()
    assert z == ZenFlowConfig()
    assert (z.topk_ratio, z.select_strategy, z.select_interval, z.update_interval) == (
        0.1, "auto", "auto", "auto")
    assert (z.overlap_step, z.full_warm_up_rounds, z.auto_ratio) == (False, 0, 0.99)
    assert (z.pt_reserved_cores_perc, z.auto_update) == (0.5, True)


def test_full_ds_config_json_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(DS_CONFIG_JSON)
    c = load_config(path, world_size=2)
    expected = EngineConfig(
        micro_batch=4, grad_accum=2,
        optimizer=OptimizerConfig("AdamW", 2e-5, (0.9, 0.95), 1e-8, 0.1, True),
        precision="bf16", gradient_clipping=1.0, zero_stage=2, offload_device="cpu",
        pin_memory=True,
        zenflow=ZenFlowConfig(0.05, "step", 300, 4, True, 2, 0.9, 0.25),
        strategy="zenflow", nonfinite="raise", importance="l2sq", world_size=2,
        overlap_comm=True)
    assert c == expected
    assert c.train_batch_size == 16
    assert c.raw == json.loads(DS_CONFIG_JSON)
    assert c.zenflow.select_interval_steps(steps_per_epoch=1000) == 300
    assert not c.zenflow.auto_update
    # the same file as a str path, and as a dict, give the same config
    assert load_config(str(path), world_size=2) == c
    assert load_config(json.loads(DS_CONFIG_JSON), world_size=2) == c
    # world_size 1 makes train_batch_size inconsistent
    with pytest.raises(ConfigError, match="train_batch_size.*4 \\* 2 \\* 1 = 8"):
        load_config(path)


def test_config_is_frozen_and_raw_untouched():
    src = zf_config(topk_ratio=0.2)
    before = copy.deepcopy(src)
    c = load_config(src, strategy="device", micro_batch=8)
    assert src == before and c.raw == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.micro_batch = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        load_config(src).zenflow.topk_ratio = 0.5


def test_strategy_auto_derivation():
    assert load_config({}).strategy == "device"
    off = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}
    assert load_config(off).strategy == "zero-offload"
    assert load_config(zf_config()).strategy == "zenflow"
    dpu = with_key("zfbench.strategy", "zero-offload-dpu", off)
    assert load_config(dpu).strategy == "zero-offload-dpu"
    assert load_config(dpu).zenflow is None


def test_explicit_zenflow_strategy_without_section_uses_defaults():
    d = {"zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}},
         "zfbench": {"strategy": "zenflow"}}
    c = load_config(d)
    assert c.strategy == "zenflow" and c.zenflow == default_zenflow_config()


def test_derived_micro_batch_from_train_batch_size():
    c = load_config({"train_batch_size": 24, "gradient_accumulation_steps": 3},
                    world_size=2)
    assert (c.micro_batch, c.grad_accum, c.train_batch_size) == (4, 3, 24)
    with pytest.raises(ConfigError, match="^train_batch_size: got 25"):
        load_config({"train_batch_size": 25, "gradient_accumulation_steps": 3},
                    world_size=2)


def test_optimizer_type_case_insensitive_and_adam_w_mode():
    c = load_config({"optimizer": {"type": "ADAM", "params": {"adam_w_mode": False}}})
    assert (c.optimizer.type, c.optimizer.adam_w_mode) == ("Adam", False)
    assert load_config({"optimizer": {"type": "adam"}}).optimizer.adam_w_mode is True
    # weight decay defaults to 0.01 (one value for the device and host sides)
    assert load_config({"optimizer": {"type": "Adam"}}).optimizer.weight_decay == 0.01


def test_fp16_loss_scale_keys_and_ignored_keys():
    c = load_config({"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 12,
                              "loss_scale_window": 500, "hysteresis": 4,
                              "min_loss_scale": 0.5},
                     "steps_per_print": 5, "wall_clock_breakdown": True,
                     "tensorboard": {"enabled": False}})
    assert c.precision == "fp16"
    assert c.loss_scale == LossScaleConfig(0.0, 12, 500, 4, 0.5)


ZF = "zero_optimization.zenflow"
ERROR_CASES = [
    # (config, dotted key that the message must name, another substring it must contain)
    ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu", ">= 1"),
    ({"train_micro_batch_size_per_gpu": 2.0}, "train_micro_batch_size_per_gpu", "float"),
    ({"gradient_accumulation_steps": -1}, "gradient_accumulation_steps", ">= 1"),
    ({"optimizer": {"type": "SGD"}}, "optimizer.type", "'AdamW'"),
    ({"optimizer": {"params": {"lr": 0}}}, "optimizer.params.lr", "(0, inf]"),
    ({"optimizer": {"params": {"lr": float("nan")}}}, "optimizer.params.lr", "nan"),
    ({"optimizer": {"params": {"betas": [0.9]}}}, "optimizer.params.betas", "two"),
    ({"optimizer": {"params": {"betas": [0.9, 1.0]}}}, "optimizer.params.betas", "[0, 1)"),
    ({"optimizer": {"params": {"eps": -1e-8}}}, "optimizer.params.eps", "-1e-08"),
    ({"optimizer": {"params": {"weight_decay": -0.1}}}, "optimizer.params.weight_decay",
     "[0, inf]"),
    ({"optimizer": {"params": {"adam_w_mode": "yes"}}}, "optimizer.params.adam_w_mode",
     "true or false"),
    ({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": False}}},
     "optimizer.params.adam_w_mode", "AdamW"),
    ({"optimizer": {"params": {"momentum": 0.9}}}, "optimizer.params.momentum", "unknown"),
    ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "fp16.enabled", "bf16.enabled"),
    ({"bf16": {"enabled": 1}}, "bf16.enabled", "true or false"),
    ({"fp16": {"loss_scale_window": 0}}, "fp16.loss_scale_window", ">= 1"),
    ({"fp16": {"min_loss_scale": 0}}, "fp16.min_loss_scale", "(0, inf]"),
    ({"gradient_clipping": -1.0}, "gradient_clipping", "[0, inf]"),
    ({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
     "zero_optimization.stage", "stages 1-2 only"),
    ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage", "[0, 3]"),
    ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}},
     "zero_optimization.offload_optimizer.device", "CPU memory only"),
    ({"zero_optimization": {"offload_optimizer": {"device": "disk"}}},
     "zero_optimization.offload_optimizer.device", "['none', 'cpu']"),
    ({"zero_optimization": {"offload_optimizer": {"pin_memory": "true"}}},
     "zero_optimization.offload_optimizer.pin_memory", "true or false"),
    ({"zero_optimization": {"offload_param": {"device": "cpu"}}},
     "zero_optimization.offload_param", "ZeRO-3"),
    ({"zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
     "zero_optimization.stage", "stage 1 or 2"),
    ({"optimizer": {"params": {"amsgrad": True}}}, "optimizer.params.amsgrad", "AMSGrad"),
    ({"prescale_gradients": True}, "prescale_gradients", "set it to false"),
    ({"pipeline": {"stages": 2}}, "pipeline", "not implemented"),
    ({"communication_data_type": "fp8"}, "communication_data_type", "'bf16'"),
    ({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4}, "train_batch_size",
     "multiple of train_micro_batch_size_per_gpu"),
    ({"optimizer": {"params": {"momentum": "auto"}}}, "optimizer.params.momentum",
     "unknown"),
    ({"zfbench": {"nonfinite": "auto"}}, "zfbench.nonfinite", "HF Trainer fills"),
    ({"zero_optimization": {"zenflow": {}}}, ZF,
     "zero_optimization.offload_optimizer.device"),
    ({"zfbench": {"strategy": "fast"}}, "zfbench.strategy", "'zero-offload-dpu'"),
    ({"zfbench": {"nonfinite": "ignore"}}, "zfbench.nonfinite", "['raise', 'skip']"),
    ({"zfbench": {"importance": "l2"}}, "zfbench.importance", "'l2sq'"),
    ({"zfbench": {"strategy": "zenflow"}}, "zfbench.strategy",
     "zero_optimization.offload_optimizer.device"),
    ({"zfbench": {"strategy": "zero-offload"}}, "zfbench.strategy", "'cpu'"),
    ({"zero_optimization": {"offload_optimizer": {"device": "cpu"}},
      "zfbench": {"strategy": "device"}}, "zfbench.strategy", "'none'"),
    (with_key("zfbench.strategy", "zero-offload", zf_config()), "zfbench.strategy", ZF),
    (zf_config(topk_ratio=0), f"{ZF}.topk_ratio", "(0, 1]"),
    (zf_config(topk_ratio=1.5), f"{ZF}.topk_ratio", "1.5"),
    (zf_config(topk_ratio="0.1"), f"{ZF}.topk_ratio", "number"),
    (zf_config(select_strategy="never"), f"{ZF}.select_strategy", "'epoch'"),
    (zf_config(select_interval="sometimes"), f"{ZF}.select_interval", "'auto'"),
    (zf_config(select_interval=-1), f"{ZF}.select_interval", ">= 0"),
    (zf_config(update_interval=0), f"{ZF}.update_interval", ">= 1"),
    (zf_config(update_interval="fixed"), f"{ZF}.update_interval", "'auto'"),
    (zf_config(update_interval=4.0), f"{ZF}.update_interval", "integer"),
    (zf_config(overlap_step="yes"), f"{ZF}.overlap_step", "true or false"),
    (zf_config(full_warm_up_rounds=-1), f"{ZF}.full_warm_up_rounds", ">= 0"),
    (zf_config(auto_ratio=0), f"{ZF}.auto_ratio", "(0, 1]"),
    (zf_config(pt_reserved_cores_perc=1.5), f"{ZF}.pt_reserved_cores_perc", "[0, 1]"),
    (zf_config(offload=0), f"{ZF}.offload", "expected true or false"),
    (zf_config(offload=True), f"{ZF}.offload", "requires overlap_comm"),
    (zf_config(select_strategy="step"), f"{ZF}.select_interval", f"{ZF}.select_strategy"),
    (zf_config(select_strategy="epoch", select_interval="auto"), f"{ZF}.select_interval",
     "'epoch'"),
    (zf_config(select_strategy="step", select_interval=3, update_interval=4),
     f"{ZF}.select_interval", f"{ZF}.update_interval"),
    (zf_config(select_interval=2, update_interval=8), f"{ZF}.select_interval", "= 8"),
    ([1, 2], "config", "list"),
    # issue 24: a string where DeepSpeed wants a section, named as such (AttributeError at
    # 3071cfc)
    ({"zero_optimization": {"stage": 2, "offload_optimizer": "cpu"}},
     "zero_optimization.offload_optimizer", "JSON object"),
    (zf_config() | {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                          "zenflow": "on"}},
     "zero_optimization.zenflow", "JSON object"),
    # DeepSpeed's gradient_allreduce_op: refused by name for 'sum' (unknown key at 3071cfc)
    ({"gradient_allreduce_op": "sum"}, "gradient_allreduce_op", "'mean'"),
]


@pytest.mark.parametrize("cfg,key,extra", ERROR_CASES,
                         ids=[f"{i}-{c[1]}" for i, c in enumerate(ERROR_CASES)])
def test_error_names_dotted_key(cfg, key, extra):
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    msg = str(info.value)
    assert msg.startswith(key + ":"), msg
    assert info.value.key == key
    assert extra in msg, msg


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("cfg,key,suggestion", [
    (zf_config(topk_ration=0.1), f"{ZF}.topk_ration", "did you mean 'topk_ratio'?"),
    (zf_config(update_intervall=4), f"{ZF}.update_intervall",
     "did you mean 'update_interval'?"),
    ({"train_micro_batch_size_per_gpus": 2}, "train_micro_batch_size_per_gpus",
     "did you mean 'train_micro_batch_size_per_gpu'?"),
    ({"zero_optimisation": {}}, "zero_optimisation", "did you mean 'zero_optimization'?"),
    ({"zfbench": {"strategie": "device"}}, "zfbench.strategie", "did you mean 'strategy'?"),
    ({"zero_optimization": {"offload_optimizer": {"devise": "cpu"}}},
     "zero_optimization.offload_optimizer.devise", "did you mean 'device'?"),
])
def test_unknown_key_suggests_closest(cfg, key, suggestion):
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert str(info.value).startswith(f"{key}: unknown key")
    assert suggestion in str(info.value)


def test_unknown_key_without_close_match_lists_valid_keys():
    with pytest.raises(ConfigError) as info:
        load_config(zf_config(xyzzy=1))
    assert "did you mean" not in str(info.value)
    assert "'topk_ratio'" in str(info.value)


@pytest.mark.parametrize("cfg,key", [
    ({"train_micro_batch_size_per_gpu": True}, "train_micro_batch_size_per_gpu"),
    ({"gradient_accumulation_steps": False}, "gradient_accumulation_steps"),
    ({"optimizer": {"params": {"lr": True}}}, "optimizer.params.lr"),
    ({"gradient_clipping": True}, "gradient_clipping"),
    ({"zero_optimization": {"stage": True}}, "zero_optimization.stage"),
    (zf_config(full_warm_up_rounds=True), f"{ZF}.full_warm_up_rounds"),
    (zf_config(update_interval=True), f"{ZF}.update_interval"),
    (zf_config(topk_ratio=True), f"{ZF}.topk_ratio"),
])
def test_bool_rejected_where_number_expected(cfg, key):
    with pytest.raises(ConfigError, match=f"^{key}: got True|^{key}: got False") as info:
        load_config(cfg)
    assert "(bool)" in str(info.value)


def test_missing_path(tmp_path):
    path = tmp_path / "nope" / "ds_config.json"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value) and info.value.key == str(path)


def test_invalid_json_names_path_and_line(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text('{\n  "train_micro_batch_size_per_gpu": 4,\n'
                    '  "gradient_accumulation_steps": 2\n  "bf16": {"enabled": true}\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and "line 4" in msg
    assert '"bf16": {"enabled": true}' in msg


def test_json_top_level_must_be_object(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="top level is list"):
        load_config(path)


def test_overrides_on_top_of_a_file(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(DS_CONFIG_JSON)
    c = load_config(path, world_size=2, micro_batch=2, grad_accum=4, topk_ratio=0.2,
                    importance=None)  # None = not given
    assert (c.micro_batch, c.grad_accum, c.train_batch_size) == (2, 4, 16)
    assert c.zenflow.topk_ratio == 0.2 and c.importance == "l2sq"
    # one config file, run under every strategy
    for s in STRATEGIES:
        c = load_config(path, world_size=2, strategy=s)
        assert c.strategy == s
        assert c.offload_device == ("none" if s == "device" else "cpu")
        assert (c.zenflow is not None) == (s == "zenflow")
    c = load_config(None, strategy="zenflow", micro_batch=4, precision="bf16", lr=3e-4)
    assert (c.strategy, c.offload_device, c.micro_batch) == ("zenflow", "cpu", 4)
    assert c.zenflow == default_zenflow_config()
    assert (c.precision, c.optimizer.lr) == ("bf16", 3e-4)
    assert load_config({"bf16": {"enabled": True}}, precision="fp16").precision == "fp16"


def test_override_errors():
    with pytest.raises(ConfigError, match="override micro_batchs.*did you mean 'micro_batch'"):
        load_config(None, micro_batchs=4)
    with pytest.raises(ConfigError, match="^train_micro_batch_size_per_gpu: got 0"):
        load_config(None, micro_batch=0)
    with pytest.raises(ConfigError, match="^override precision"):
        load_config(None, precision="fp8")
    with pytest.raises(ConfigError, match="^override strategy"):
        load_config(None, strategy="zero")
    # an override that contradicts the strategy override is still an error
    with pytest.raises(ConfigError, match="^zfbench.strategy"):
        load_config(None, strategy="zenflow", offload_device="none")


@pytest.mark.parametrize("zf,spe,expected", [
    (dict(), 250, 250),                                           # auto: once per epoch
    (dict(), None, 0),                                            # unsized: select once
    (dict(select_interval=7), 250, 7),                            # auto + int: steps
    (dict(select_interval=0), 250, 0),
    (dict(select_strategy="step", select_interval=40, update_interval=4), 250, 40),
    (dict(select_strategy="step", select_interval=40), None, 40),
    (dict(select_strategy="epoch", select_interval=2), 250, 500),
    (dict(select_strategy="epoch", select_interval=2), None, 0),
    (dict(select_strategy="epoch", select_interval=0, update_interval=4), 250, 0),
])
def test_select_interval_steps(zf, spe, expected):
    assert zenflow_from_dict(zf).select_interval_steps(spe) == expected


def test_epoch_resolved_interval_obeys_order_rule():
    z = zenflow_from_dict(dict(select_strategy="epoch", select_interval=1,
                               update_interval=8))
    assert z.select_interval_steps(8) == 8
    with pytest.raises(ConfigError, match=f"^{ZF}.select_interval: got 5 steps"):
        z.select_interval_steps(5)
    with pytest.raises(ConfigError, match="^steps_per_epoch"):
        z.select_interval_steps(0)


def test_zenflow_from_dict_custom_prefix_and_direct_construction():
    with pytest.raises(ConfigError, match="^zf.topk_ratio: got 2"):
        zenflow_from_dict({"topk_ratio": 2}, prefix="zf")
    with pytest.raises(ConfigError, match=f"^{ZF}.auto_ratio"):
        ZenFlowConfig(auto_ratio=1.5)
    assert ZenFlowConfig(topk_ratio=1).topk_ratio == 1.0
    assert isinstance(ZenFlowConfig(topk_ratio=1).topk_ratio, float)


@given(si=st.integers(0, 50), ui=st.integers(1, 50))
def test_step_interval_order_rule(si, ui):
    d = zf_config(select_strategy="step", select_interval=si, update_interval=ui)
    if 0 < si < ui:
        with pytest.raises(ConfigError, match=f"^{ZF}.select_interval"):
            load_config(d)
    else:
        z = load_config(d).zenflow
        assert (z.select_interval_steps(100), z.update_interval) == (si, ui)
    # an adaptive U never conflicts with the select interval
    d2 = zf_config(select_strategy="step", select_interval=si)
    assert load_config(d2).zenflow.select_interval_steps(None) == si


@given(r=st.floats(allow_nan=True, allow_infinity=True, width=64))
def test_topk_ratio_range(r):
    if 0.0 < r <= 1.0:
        assert load_config(zf_config(topk_ratio=r)).zenflow.topk_ratio == r
    else:
        with pytest.raises(ConfigError, match=f"^{ZF}.topk_ratio"):
            load_config(zf_config(topk_ratio=r))


def test_deepspeed_zenflow_tutorial_values_written_out_are_accepted():
    """Issue 24: `select_strategy: "auto"` written explicitly (DeepSpeed's tutorial
    config) was refused at 3071cfc; it is ZenFlow's default. `gradient_allreduce_op:
    "mean"` (any case) is DeepSpeed's default and what zfbench does."""
    cfg = load_config(zf_config(select_strategy="auto", select_interval="auto",
                                update_interval="auto"))
    assert cfg.zenflow == load_config(zf_config()).zenflow
    assert cfg.zenflow.select_strategy == "auto"
    assert load_config({"gradient_allreduce_op": "MEAN"}).strategy == "device"
