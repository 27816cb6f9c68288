"""CUDA paths of the engine; these run only where torch sees a GPU (skipped elsewhere)."""

import pytest
import torch

from engine_helpers import BiasMLP, batches, config, make_engine, params_of, train_steps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ZF = dict(topk_ratio=0.25, update_interval=3, overlap_step=True, select_strategy="step",
          select_interval=6)


@pytest.mark.parametrize("strategy", ["device", "zero-offload", "zero-offload-dpu", "zenflow"])
def test_cuda_engine_matches_cpu_engine(strategy):
    zf = ZF if strategy == "zenflow" else {}
    results = {}
    for device in ("cpu", "cuda"):
        model = BiasMLP()
        engine = make_engine(model, config(strategy, **zf), device=device)
        train_steps(engine, ((i.to(device), l.to(device)) for i, l in batches()), 10)
        engine.finish()
        engine.close()
        results[device] = {n: p.cpu() for n, p in params_of(model).items()}
        if device == "cuda":
            spans = engine.timeline.spans_frame()
            assert {"forward", "backward"} <= set(spans["op"])
            assert (spans["t_end_s"] >= spans["t_start_s"]).all()
    for name, p in results["cpu"].items():
        assert torch.allclose(p, results["cuda"][name], rtol=1e-4, atol=1e-5), name


def test_host_buffers_are_pinned_on_cuda():
    engine = make_engine(BiasMLP(), config("zenflow", **ZF), device="cuda")
    assert engine.strategy.host.master.is_pinned()
    assert engine.flat_params.is_cuda and engine.strategy.upload.is_cuda
    engine.close()
