"""Port of the ZenFlow case of DeepSpeed's tests/unit/runtime/test_ds_config_dict.py.

The case comes from DeepSpeed after 0.19.5 (0.19.5 has no `gradient_allreduce_op` key;
its test_ds_config_dict.py has no ZenFlow case): summing instead of averaging the
gradients over ranks is refused together with ZenFlow.
"""
import pytest

from zfbench.core.config import ConfigError, load_config


def test_sum_gradient_allreduce_rejects_zenflow():
    """Ports tests/unit/runtime/test_ds_config_dict.py::test_sum_gradient_allreduce_rejects_zenflow:
    gradient_allreduce_op "sum" with a ZeRO-2 zenflow section is an error that names the key
    (zfbench averages the gradients, as DeepSpeed's default "mean" does). The same config
    with "mean", and the CPU offload ZenFlow needs, is accepted."""
    with pytest.raises(ConfigError, match="gradient_allreduce_op"):
        load_config({"train_batch_size": 1, "gradient_allreduce_op": "sum",
                     "zero_optimization": {"stage": 2, "zenflow": {}}})
    cfg = load_config({"train_batch_size": 1, "gradient_allreduce_op": "mean",
                       "zero_optimization": {"stage": 2, "zenflow": {},
                                             "offload_optimizer": {"device": "cpu"}}})
    assert cfg.strategy == "zenflow"
