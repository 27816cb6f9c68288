"""The `device` strategy zeroes its gradients inside its AdamW pass on the CPU lanes with fp32
weights (real/strategies.py `DeviceStrategy.zeroes_grads`, real/adamw.py `zero_grads`):
the same bits as AdamW then the engine's zeroing, one pass fewer, and the simulator leaves
that pass out where the engine does (sims/costs.py `zero_rides_device_adam`)."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine
from zfbench.real.adamw import adamw_foreach_
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.simulator import simulate


@pytest.mark.parametrize("shape", [(1000,), (37,), (6, 7)])
def test_zero_grads_has_the_bits_of_adamw_then_zero(shape):
    """1-D fp32 takes real/host_fused.py's one pass, 2-D the fused kernel then the zeros."""
    gen = torch.Generator().manual_seed(3)
    p, g, m, v = (torch.randn(shape, generator=gen) for _ in range(4))
    v.abs_()
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.99, eps=1e-8, weight_decay=0.1)
    ref = [t.clone() for t in (p, g, m, v)]
    adamw_foreach_([ref[0]], [ref[1]], [ref[2]], [ref[3]], [3], **hyper)
    ref[1].zero_()
    adamw_foreach_([p], [g], [m], [v], [3], zero_grads=True, **hyper)
    for name, a, b in zip("pgmv", (p, g, m, v), ref):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), name


def _train(zeroes_grads: bool, steps: int = 5, nan_at: int | None = None):
    cfg = config("device")
    cfg["zfbench"]["nonfinite"] = "skip"
    engine = make_engine(BiasMLP(seed=5), cfg)
    assert engine.strategy.zeroes_grads  # fp32 on the CPU lanes
    engine.strategy.zeroes_grads = zeroes_grads
    for i, (ids, labels) in enumerate(itertools.islice(batches(), steps)):
        loss = engine(ids, labels)
        engine.backward(loss)
        if i == nan_at:
            engine.flat_grads[3] = float("nan")
        engine.step()
        # zeroed after every step, skipped or not, but for the slots left for backward
        # to write (apart), which no p.grad shows
        stale = engine.inplace_grads.stale
        for name, p in engine.named_params:
            assert p.grad is None or not p.grad.any()
            assert id(p) in stale or not engine.layout.view(engine.flat_grads, name).any()
    spans = engine.timeline.spans_frame()
    zero_spans = len(spans[(spans["lane"] == "compute") & (spans["op"] == "device_optim")])
    params = engine.flat_params.clone()
    log = list(engine.step_log)
    engine.close()
    return params, zero_spans, log


@pytest.mark.slow
def test_the_engine_trains_the_same_bits_with_one_pass_fewer():
    fused, fused_spans, log = _train(True, nan_at=2)
    apart, apart_spans, _ = _train(False, nan_at=2)
    assert [r["skipped"] for r in log] == [False, False, True, False, False]
    assert torch.equal(fused.view(torch.int32), apart.view(torch.int32))
    # per applied step: the check and the AdamW spans, and the zeroing's only apart;
    # the skipped step is zeroed by the engine in both
    assert apart_spans - fused_spans == 4


def _settings(profile, **over):
    knobs = dict(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                 transfers="full", profile=str(profile), steps=6)
    knobs.update(over)
    return SimSettings.from_knobs(**knobs)


def _device_optim_spans(settings, strategy) -> int:
    spans = simulate(settings, strategy).timeline.spans_frame()
    return len(spans[(spans["lane"] == "compute") & (spans["op"] == "device_optim")])


@pytest.mark.slow
def test_the_simulator_leaves_the_zeroing_out_of_the_device_step(tiny_profile_path):
    fp32 = _settings(tiny_profile_path)
    assert CostModel(fp32).zero_rides_device_adam
    assert not CostModel(_settings(tiny_profile_path, precision="bf16")).zero_rides_device_adam
    # the device step's spans: the check and AdamW (fp32), the zeroing too (bf16)
    assert _device_optim_spans(fp32, "device") == 2 * 6
    assert _device_optim_spans(_settings(tiny_profile_path, precision="bf16"),
                               "device") == 3 * 6
