"""One memory model (zfbench.core.memory_model) for the engine's estimate and the
simulator's fit check, held to what the engine really allocates."""

from __future__ import annotations

import pytest
import torch

from engine_helpers import config, make_engine
from zfbench.core.memory_model import (ELEMENT_BYTES, PRECISIONS, element_bytes,
                                       host_bytes_per_param)
from zfbench.core.models import get_model
from zfbench.core.strategies import ENGINE_STRATEGIES
from zfbench.real.flat import DTYPES
from zfbench.real.memory import HEADROOM, estimate
from zfbench.real.model import build_model
from zfbench.sims.costs import CostModel, SimSettings


def host_tensor_bytes(engine) -> int:
    """Bytes of every tensor the strategy's host state holds (0 without one)."""
    host = getattr(engine.strategy, "host", None)
    if host is None:
        return 0
    total = 0
    for value in vars(host).values():
        for t in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("strategy", ENGINE_STRATEGIES)
def test_engine_estimate_is_the_host_bytes_the_engine_allocates(strategy):
    shape = get_model("tiny")
    model = build_model(shape, seed=0)
    assert sum(p.numel() for p in model.parameters()) == shape.total_params
    engine = make_engine(model, config(strategy))
    try:
        allocated = host_tensor_bytes(engine)
    finally:
        engine.close()
    assert allocated == host_bytes_per_param(strategy) * shape.total_params
    est = estimate(shape, strategy, batch=1, seq=8, elem_bytes=4)
    assert est.host_bytes == pytest.approx(allocated * HEADROOM)


def test_host_bytes_per_param():
    # fp32 master, m, v + gradient buffers (ZenFlow: staging and two window buffers)
    assert [host_bytes_per_param(s) for s in ENGINE_STRATEGIES] == [0, 16, 16, 24]
    with pytest.raises(ValueError, match="no host memory model"):
        host_bytes_per_param("zero-infinity")


@pytest.mark.parametrize("strategy", ["zero-offload", "zero-offload-dpu", "zenflow"])
def test_simulator_host_memory_is_the_same_model(strategy):
    costs = CostModel(SimSettings(model="tiny", gpus=1, steps=4))
    host = costs.memory_per_rank(strategy)["host_bytes"]
    assert host == host_bytes_per_param(strategy) * costs.params


def test_element_bytes_match_the_engines_dtypes():
    assert set(DTYPES) == set(ELEMENT_BYTES) == set(PRECISIONS)
    for precision, dtype in DTYPES.items():
        assert torch.empty(0, dtype=dtype).element_size() == element_bytes(precision)
    with pytest.raises(ValueError, match="fp8"):
        element_bytes("fp8")
