"""The CPU lanes' d2h with the non-finite check in its pass (real/engine.py `_down_checked`,
issue 45): the same parameters and host state, bit for bit, as with the check as a pass of
its own, a NaN step skipped the same way, the schedule ordered (hazard checker), and the
path taken exactly where it applies (fp32, one rank, no buckets, a strategy that lands its
gradients before its step)."""

from __future__ import annotations

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine
from zfbench.real import host_fused, kernels
from zfbench.real.engine import Engine

CASES = [("zero-offload", {}),
         ("zenflow", dict(topk_ratio=0.25, update_interval=2, full_warm_up_rounds=1)),
         ("zenflow", dict(topk_ratio=0.25, update_interval=2, overlap_step=True))]


def run(strategy, zf, checked: bool, monkeypatch, steps: int = 7, nan_at: int = 4):
    """`steps` steps (a NaN gradient at step `nan_at`, skipped); the parameters, the host
    state, the step log's skips, and the calls of the two checks."""
    # the tiny model through the threaded, non-temporal-store paths of the C++ loops
    monkeypatch.setattr(host_fused, "SERIAL_BELOW", 16)
    monkeypatch.setattr(host_fused, "STREAM_ABOVE", 0)
    monkeypatch.setattr(host_fused, "WORDS_STREAM_ABOVE", 0)
    calls = {"all_finite": 0, "copy_checked_": 0}
    for name in calls:
        fn = getattr(kernels, name)

        def counted(*a, _fn=fn, _name=name, **k):
            calls[_name] += 1
            return _fn(*a, **k)
        monkeypatch.setattr(kernels, name, counted)
    if not checked:
        monkeypatch.setattr(Engine, "_down_checked", lambda self: None)
    cfg = config(strategy, **zf)
    cfg["zfbench"]["nonfinite"] = "skip"
    model = BiasMLP()
    engine = make_engine(model, cfg, hazard_check=True, device_threads=2, host_threads=2)
    data = batches()
    for i in range(steps):
        ids, labels = next(data)
        engine.backward(engine(ids, labels))
        if i == nan_at:
            model.up.weight.grad[1, 2] = float("nan")
        engine.step()
    engine.finish()
    host = engine.strategy.host
    out = {"params": engine.flat_params.clone(), "master": host.master.clone(),
           "m": host.m.clone(), "v": host.v.clone(),
           "skipped": [r["skipped"] for r in engine.step_log],
           "d2h_spans": sum(s.op == "d2h_grad" for s in engine.timeline.spans)}
    engine.close()
    monkeypatch.undo()
    return out, calls


@pytest.mark.slow
@pytest.mark.parametrize("strategy,zf", CASES)
def test_the_checked_d2h_changes_no_bit(strategy, zf, monkeypatch):
    steps = 7
    got, calls = run(strategy, zf, True, monkeypatch, steps)
    want, want_calls = run(strategy, zf, False, monkeypatch, steps)
    for key in ("params", "master", "m", "v"):
        assert torch.equal(got[key], want[key]), key
    assert got["skipped"] == want["skipped"] == [i == 4 for i in range(steps)]
    # the checked d2h ran at every step, the separate check at none; without it, the
    # reverse; one d2h of the gradients a step either way, none at the skipped one in
    # the separate check's schedule
    assert calls == {"all_finite": 0, "copy_checked_": steps}
    assert want_calls == {"all_finite": steps, "copy_checked_": 0}
    assert got["d2h_spans"] == steps and want["d2h_spans"] == steps - 1
    assert host_fused.SERIAL_BELOW != 16  # the thresholds are back


def test_the_checked_d2h_applies_only_where_it_can(monkeypatch):
    """The device strategy lands nothing (the check is its own pass); bf16 gradients and
    the delayed update (no landing before its step) keep the separate check."""
    for strategy, precision in (("device", None), ("zenflow", "bf16"),
                                ("zero-offload-dpu", None), ("zenflow", None)):
        cfg = config(strategy, topk_ratio=0.25, update_interval=2)
        if precision:
            cfg[precision] = {"enabled": True}
        engine = make_engine(BiasMLP(), cfg)
        calls = []
        monkeypatch.setattr(kernels, "copy_checked_",
                            lambda *a, _f=kernels.copy_checked_: calls.append(1) or _f(*a))
        ids, labels = next(batches())
        engine.backward(engine(ids, labels))
        engine.step()
        engine.finish()
        engine.close()
        monkeypatch.undo()
        assert len(calls) == (strategy == "zenflow" and precision is None), strategy
