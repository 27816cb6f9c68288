"""`zfbench.real.initialize` resolves a DeepSpeed config for the ranks it runs on
(issue 24); tests/test_torchrun.py runs the same under torchrun with real ranks."""

import pytest

import zfbench.real.engine as engine_module
from zfbench.core.config import ConfigError, load_config
from zfbench.real.distributed import DistContext
from engine_helpers import BiasMLP


@pytest.mark.parametrize("given, want", [
    ({"train_batch_size": 4}, (4, 2, 1)),
    ({"train_batch_size": 8, "gradient_accumulation_steps": 2}, (8, 2, 2)),
    ({"train_micro_batch_size_per_gpu": 3}, (6, 3, 1)),
])
def test_the_batch_triple_is_resolved_for_the_ranks_given(monkeypatch, given, want):
    """train = micro x accumulation x ranks with the context's 2 ranks (at 3071cfc
    train_batch_size 4 resolved to micro 4 per rank: 8 rows a step on 2 ranks)."""
    monkeypatch.setattr(engine_module, "Engine", lambda model, config, **kw: config)
    cfg = engine_module.initialize(BiasMLP(), given, dist=DistContext(0, 2, 0, "gloo"))
    assert (cfg.train_batch_size, cfg.micro_batch, cfg.grad_accum) == want
    assert cfg.world_size == 2


def test_a_config_resolved_for_other_ranks_is_refused():
    with pytest.raises(ConfigError, match="resolved for 1 rank.*runs on 2"):
        engine_module.Engine(BiasMLP(), load_config({}), device="cpu",
                             dist=DistContext(0, 2, 0, "gloo"))
