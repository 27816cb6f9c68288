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
    """Bytes of every host tensor the strategy holds: its host state and its wires (0
    without them)."""
    s = engine.strategy
    tensors = list(getattr(s, "_wires", {}).values())
    host = getattr(s, "host", None)
    for value in (vars(host).values() if host is not None else ()):
        tensors += [t for t in (value if isinstance(value, (list, tuple)) else [value])
                    if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("strategy", ENGINE_STRATEGIES)
@pytest.mark.parametrize("precision,overlap_comm", [("fp32", False), ("fp32", True),
                                                    ("bf16", False), ("bf16", True)])
def test_engine_estimate_is_the_host_bytes_the_engine_allocates(strategy, precision,
                                                                overlap_comm):
    shape = get_model("tiny")
    model = build_model(shape, seed=0)
    assert sum(p.numel() for p in model.parameters()) == shape.total_params
    cfg = config(strategy, topk_ratio=0.25, update_interval=2) if strategy == "zenflow" \
        else config(strategy)
    cfg["zero_optimization"]["overlap_comm"] = overlap_comm
    if precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    engine = make_engine(model, cfg)
    try:  # three steps: the wires are allocated when first used
        ids = torch.randint(0, shape.vocab, (1, 8))
        for _ in range(3):
            engine.backward(engine(ids, ids))
            engine.step()
        engine.finish()
        allocated = host_tensor_bytes(engine)
        bucketed = engine.bucketed
    finally:
        engine.close()
    elem = element_bytes(precision)
    assert bucketed == (overlap_comm and strategy != "device")
    assert allocated == host_bytes_per_param(strategy, elem, bucketed) * shape.total_params
    est = estimate(shape, strategy, batch=1, seq=8, elem_bytes=elem, bucketed=bucketed)
    assert est.host_bytes == pytest.approx(allocated * HEADROOM)


def test_host_bytes_per_param():
    # fp32 master, m, v + gradient buffers (ZenFlow: staging and two window buffers)
    assert [host_bytes_per_param(s) for s in ENGINE_STRATEGIES] == [0, 16, 16, 24]
    # bf16: + the d2h and h2d wires; dpu with buckets: + a second landing buffer
    assert [host_bytes_per_param(s, 2) for s in ENGINE_STRATEGIES] == [0, 20, 20, 28]
    assert [host_bytes_per_param(s, 2, True) for s in ENGINE_STRATEGIES] == [0, 20, 22, 28]
    assert [host_bytes_per_param(s, 4, True) for s in ENGINE_STRATEGIES] == [0, 16, 20, 24]
    with pytest.raises(ValueError, match="no host memory model"):
        host_bytes_per_param("zero-infinity")


@pytest.mark.parametrize("strategy", ["zero-offload", "zero-offload-dpu", "zenflow"])
@pytest.mark.parametrize("precision", ["bf16", "fp16"])  # (fp32 needs a measured profile)
def test_simulator_host_memory_is_the_same_model(strategy, precision):
    # the simulated GPU schedule sends gradients in buckets (dpu: two landing buffers)
    costs = CostModel(SimSettings.from_knobs(model="tiny", gpus=1, steps=4, precision=precision))
    host = costs.memory_per_rank(strategy)["host_bytes"]
    bucketed = precision != "fp16"  # fp16: no buckets (its gradients are loss-scaled)
    assert host == host_bytes_per_param(strategy, element_bytes(precision), bucketed) * \
        costs.params


def test_element_bytes_match_the_engines_dtypes():
    assert set(DTYPES) == set(ELEMENT_BYTES) == set(PRECISIONS)
    for precision, dtype in DTYPES.items():
        assert torch.empty(0, dtype=dtype).element_size() == element_bytes(precision)
    with pytest.raises(ValueError, match="fp8"):
        element_bytes("fp8")
