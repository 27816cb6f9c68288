"""One home each for the strategy names, the config builder and the ZenFlow scenario
(zfbench.core.strategies, zfbench.core.config_build, zfbench.core.config_zenflow)."""

from __future__ import annotations

import pytest

from zfbench.core import config as core_config
from zfbench.core.config import SCENARIO_ZENFLOW, ZenFlowConfig, load_config
from zfbench.core.config_build import build_config
from zfbench.core.strategies import (ENGINE_STRATEGIES, OFFLOAD_STRATEGIES, SIM_STRATEGIES,
                                     SIMULATED_ONLY)


def test_strategy_names_have_one_home():
    from zfbench.sims import costs, settings
    assert core_config.STRATEGIES is ENGINE_STRATEGIES
    assert settings.STRATEGIES is SIM_STRATEGIES and costs.STRATEGIES is SIM_STRATEGIES
    assert ENGINE_STRATEGIES == ("device", "zero-offload", "zero-offload-dpu", "zenflow")
    assert set(SIM_STRATEGIES) == set(ENGINE_STRATEGIES) | set(SIMULATED_ONLY)
    assert set(OFFLOAD_STRATEGIES) <= set(ENGINE_STRATEGIES)


@pytest.mark.parametrize("strategy", ENGINE_STRATEGIES)
def test_built_config_loads_as_its_strategy(strategy):
    zf = {"topk_ratio": 0.25, "update_interval": 2} if strategy == "zenflow" else None
    d = build_config(strategy, micro_batch=3, lr=1e-2, weight_decay=0.0, clip=1.0, zenflow=zf)
    cfg = load_config(d)
    assert cfg.strategy == strategy and cfg.micro_batch == 3
    assert cfg.optimizer.lr == 1e-2 and cfg.gradient_clipping == 1.0
    assert cfg.offload_device == ("cpu" if strategy in OFFLOAD_STRATEGIES else "none")
    if strategy == "zenflow":
        assert (cfg.zenflow.topk_ratio, cfg.zenflow.update_interval) == (0.25, 2)


def test_builder_writes_only_what_it_is_given():
    assert build_config(None, lr=1e-4, pin_memory=True) == {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"pin_memory": True}}}
    assert "offload_optimizer" not in build_config("device")["zero_optimization"]
    with pytest.raises(ValueError, match="zero-infinity"):
        build_config("zero-infinity")


def test_one_zenflow_scenario_for_simulator_runner_and_commands():
    from zfbench.real.runner import RunSpec
    from zfbench.sims.settings import SimSettings
    from zfbench.validate.command import zenflow_overrides
    s = SimSettings()
    assert {k: getattr(s.zenflow, k) for k in SCENARIO_ZENFLOW if k != "select_strategy"} == \
        {k: v for k, v in SCENARIO_ZENFLOW.items() if k != "select_strategy"}
    zf = RunSpec().engine_config("zenflow").zenflow
    assert {k: getattr(zf, k) for k in SCENARIO_ZENFLOW} == SCENARIO_ZENFLOW
    assert zenflow_overrides(SCENARIO_ZENFLOW["topk_ratio"],
                             SCENARIO_ZENFLOW["update_interval"]) == SCENARIO_ZENFLOW
    # the config's own defaults stay DeepSpeed's
    assert (ZenFlowConfig().update_interval, ZenFlowConfig().overlap_step) == ("auto", False)
