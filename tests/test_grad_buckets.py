"""Gradient buckets sent down during backward (`zero_optimization.overlap_comm`,
real/grad_buckets.py): the same training as one d2h after backward, bit for bit, with
the buckets' d2h spans inside backward and the schedule free of hazards."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps

ZF = dict(topk_ratio=0.25, update_interval=2, select_strategy="step", select_interval=4,
          overlap_step=True)


class TiedMLP(BiasMLP):
    """The embedding table is also the output layer: two contributions to one gradient
    (routed by InplaceGrads in both uses), the case where a bucket sent at the first one
    would carry half a gradient."""

    def forward(self, ids, labels):
        h = self.emb(ids)
        h = h + self.down(torch.relu(self.up(h)))
        logits = nn.functional.linear(self.norm(h), self.emb.weight)
        return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def bucketed(cfg: dict, on: bool, elems: int = 150) -> dict:
    cfg["zero_optimization"]["overlap_comm"] = on
    cfg["zero_optimization"]["reduce_bucket_size"] = elems
    return cfg


def run(strategy, on, model_cls=BiasMLP, bf16=False, inplace=True, steps=7, **kw):
    cfg = bucketed(config(strategy, clip=0.5, **(ZF if strategy == "zenflow" else {})), on)
    if bf16:
        cfg["bf16"] = {"enabled": True}
    cfg["zfbench"]["inplace_grads"] = inplace
    model = model_cls()
    engine = make_engine(model, cfg, **kw)
    train_steps(engine, batches(), steps)
    engine.finish()
    engine.close()
    return engine, params_of(model)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero-offload", "zero-offload-dpu", "zenflow"])
@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("model_cls,inplace", [(BiasMLP, True), (TiedMLP, True),
                                               (TiedMLP, False)])
def test_bucketed_d2h_trains_exactly_as_one_copy_after_backward(strategy, bf16, model_cls,
                                                               inplace):
    engine, got = run(strategy, True, model_cls, bf16, inplace)
    assert engine.buckets is not None and len(engine.buckets.buckets) > 2
    _, want = run(strategy, False, model_cls, bf16, inplace)
    for name, p in want.items():
        assert torch.equal(got[name], p), name


@pytest.mark.slow
def test_buckets_go_down_during_backward():
    engine, _ = run("zenflow", True, steps=3)
    spans = engine.timeline.spans_frame()
    n = len(engine.buckets.buckets)
    for step in range(3):
        mine = spans[spans["step"] == step]
        back = mine[mine["op"] == "backward"].iloc[0]
        d2h = mine[mine["op"] == "d2h_grad"]
        assert len(d2h) == n
        assert int(d2h["bytes"].sum()) == engine.shard_grad_bytes
        # every bucket but what waited for the end of backward went down inside it
        inside = d2h[(d2h["t_start_s"] >= back["t_start_s"]) &
                     (d2h["t_end_s"] <= back["t_end_s"])]
        assert len(inside) >= n - 1


def test_buckets_are_off_where_they_cannot_apply():
    # device: nothing goes down; fp16: the gradients are still loss-scaled in backward;
    # dpu without buckets keeps one landing buffer, read by the pending host step
    cases = [("device", {}), ("zero-offload", {"fp16": {"enabled": True}}),
             ("zero-offload-dpu", {"fp16": {"enabled": True}})]
    for strategy, extra in cases:
        engine = make_engine(BiasMLP(), {**bucketed(config(strategy), True), **extra})
        assert engine.buckets is None
        if strategy != "zero-offload":
            assert engine.strategy.grads_landing(0) is None
        engine.close()


@pytest.mark.parametrize("bf16", [False, True])
def test_dpu_buckets_land_in_two_alternating_buffers(bf16):
    """dpu with buckets: step t's gradients land while the host step of t-1 still reads
    its own, so the landings of consecutive steps are two distinct host buffers (the
    fp32 gradient buffers, or two d2h wires with bf16 weights), and steps two apart share
    one; without buckets there is one landing."""
    cfg = bucketed(config("zero-offload-dpu"), True)
    if bf16:
        cfg["bf16"] = {"enabled": True}
    engine = make_engine(BiasMLP(), cfg)
    s = engine.strategy
    landings = [s.grads_landing(t) for t in range(3)]
    assert landings[0].data_ptr() != landings[1].data_ptr()
    assert landings[0].data_ptr() == landings[2].data_ptr()
    assert len(s.host.grads) == (1 if bf16 else 2)
    engine.close()
    cfg["zero_optimization"]["overlap_comm"] = False
    engine = make_engine(BiasMLP(), cfg)
    assert engine.strategy.landings == 1 and len(engine.strategy.host.grads) == 1
    engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero-offload", "zero-offload-dpu", "zenflow"])
def test_bucketed_schedule_is_free_of_hazards_and_needs_its_waits(strategy):
    engine, _ = run(strategy, True, TiedMLP, hazard_check=True)
    report = engine.backend.hazards.report()
    assert report["hazards"] == 0, report["distinct"]
    assert "a bucket's d2h waits for its gradients" in engine.backend.waits_used
    dropped, _ = run(strategy, True, TiedMLP, hazard_check=True,
                     waits_dropped={"a bucket's d2h waits for its gradients"})
    assert dropped.backend.hazards.report()["hazards"] > 0
