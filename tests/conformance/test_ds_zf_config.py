"""Ports of DeepSpeed's tests/unit/runtime/zenflow/test_zf_config.py (0.19.5) to zfbench.

DeepSpeed builds its pydantic classes directly (DeepSpeedZeroConfig, ZenFlowConfig).
zfbench reads the `zero_optimization` section as part of the whole config
(`zfbench.core.config.load_config`); its `zenflow` subsection has its own reader,
`zfbench.core.config_zenflow.zenflow_from_dict` (and the `ZenFlowConfig` dataclass),
which is where the zenflow-only cases go. DeepSpeed's ValidationError is zfbench's
ConfigError, whose message names the dotted key.
"""
import pytest

from conformance_support import expected_different
from zfbench.core.config import ConfigError, load_config
from zfbench.core.config_zenflow import ZenFlowConfig, zenflow_from_dict


@pytest.mark.parametrize("stage", [
    pytest.param(2, id="int-gradients"),
    pytest.param(3, id="enum-weights"),
])
def test_stage_enum_accepts_int_and_enum(stage):
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_stage_enum_accepts_int_and_enum:
    `stage` 2 (ZeroStageEnum.gradients) and 3 (ZeroStageEnum.weights) are read as those
    stages. zfbench has no enum: the integers are the stages (stage 3 without ZenFlow runs
    the device strategy, which keeps stage 0's layout, as it does at stages 1 and 2)."""
    assert load_config({"zero_optimization": {"stage": stage}}).zero_stage == stage


@pytest.mark.parametrize("stage", [
    pytest.param(None, id="as-in-deepspeed", marks=expected_different("offload_at_stage0")),
    pytest.param(2, id="with-stage-2"),
])
def test_offload_optimizer_config_from_dict(stage):
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_offload_optimizer_config_from_dict:
    an offload_optimizer dict {"device": "cpu", "pin_memory": true} is read into the offload
    settings. DeepSpeed's case gives no stage (0), which zfbench refuses for CPU offload;
    the with-stage-2 case checks the reading itself."""
    zero = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
    if stage is not None:
        zero["stage"] = stage
    cfg = load_config({"zero_optimization": zero})
    assert cfg.offload_device == "cpu"
    assert cfg.pin_memory is True


def test_invalid_offload_optimizer_type_raises():
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_invalid_offload_optimizer_type_raises:
    a non-dict offload_optimizer is an error naming the key (not an AttributeError)."""
    with pytest.raises(ConfigError, match="zero_optimization.offload_optimizer"):
        load_config({"zero_optimization": {"offload_optimizer": "not a dict"}})


@expected_different("select_below_update")
def test_zenflow_config_from_dict():
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_zenflow_config_from_dict:
    the zenflow dict (topk 0.25, select_strategy auto, select_interval 4, update_interval 8,
    warm-up 1, overlap_step) is read field for field."""
    payload = {"topk_ratio": 0.25, "select_strategy": "auto", "select_interval": 4,
               "update_interval": 8, "full_warm_up_rounds": 1, "overlap_step": True}
    zf = zenflow_from_dict(payload)
    assert isinstance(zf, ZenFlowConfig)
    assert (zf.topk_ratio, zf.select_strategy, zf.select_interval, zf.update_interval,
            zf.full_warm_up_rounds, zf.overlap_step) == (0.25, "auto", 4, 8, 1, True)


def test_invalid_zenflow_type_raises():
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_invalid_zenflow_type_raises:
    a non-dict zenflow section is an error naming the key."""
    with pytest.raises(ConfigError, match="zero_optimization.zenflow"):
        load_config({"zero_optimization": {"zenflow": 123}})


def test_offload_and_zenflow_combined():
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_offload_and_zenflow_combined:
    stage 2 with CPU optimizer offload and a zenflow section (epoch strategy) is accepted,
    both read."""
    cfg = load_config({"zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "zenflow": {"topk_ratio": 0.3, "select_strategy": "epoch", "select_interval": 3,
                    "update_interval": 6, "full_warm_up_rounds": 0, "overlap_step": False},
    }})
    assert cfg.offload_device == "cpu"
    assert isinstance(cfg.zenflow, ZenFlowConfig)
    assert cfg.zenflow.select_strategy == "epoch"
    assert cfg.strategy == "zenflow"


# ---------------------------------------------------------------- after 0.19.5
@pytest.mark.parametrize("topk_ratio", [
    0.0, pytest.param(1.0, marks=expected_different("topk_one"))])
def test_topk_ratio_excludes_endpoints(topk_ratio):
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_topk_ratio_excludes_endpoints
    (DeepSpeed after 0.19.5; 0.19.5 accepts both): topk_ratio 0 and 1 are refused."""
    with pytest.raises(ConfigError, match="topk_ratio"):
        ZenFlowConfig(topk_ratio=topk_ratio)


@pytest.mark.parametrize("update_interval", [0, -5])
def test_update_interval_rejects_non_positive_values(update_interval):
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_update_interval_rejects_non_positive_values
    (DeepSpeed after 0.19.5)."""
    with pytest.raises(ConfigError, match="update_interval"):
        ZenFlowConfig(update_interval=update_interval)


@pytest.mark.parametrize("update_interval", [1, "auto"])
def test_update_interval_accepts_valid_boundary_values(update_interval):
    """Ports tests/unit/runtime/zenflow/test_zf_config.py::test_update_interval_accepts_valid_boundary_values
    (DeepSpeed after 0.19.5)."""
    assert ZenFlowConfig(update_interval=update_interval).update_interval == update_interval
