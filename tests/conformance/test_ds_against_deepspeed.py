"""The ports' assumptions about DeepSpeed, checked against DeepSpeed itself (the
`[deepspeed]` extra, pinned to 0.19.5; skipped cleanly without it).

- the pt_reserved_cores_perc split rule (test_ds_zf.py::test_split_affinity) equals
  DeepSpeed's `_split_affinity` on every core count and share, not only the five cases;
- zfbench's device update of the selected columns and 1-D parameters equals DeepSpeed's
  ZenFlowSelectiveAdamW (ZeRO-2) and ZenFlowSelectiveAdamW_stage3 (ZeRO-3, one rank) fed
  the same columns and gradient / U, with and without `offload` (what
  test_ds_zf_torch_adam.py ports);
- each config difference the ports mark expected-different is real: DeepSpeed 0.19.5's
  config classes accept the config zfbench refuses.
"""
import pytest
import torch

deepspeed = pytest.importorskip("deepspeed")

from conformance_support import GradProbe, probe_config  # noqa: E402
from engine_helpers import make_engine  # noqa: E402
from zfbench.core.config import ConfigError, load_config  # noqa: E402
from zfbench.core.config_zenflow import zenflow_from_dict  # noqa: E402
from zfbench.real.distributed import default_thread_split  # noqa: E402

V0195 = pytest.mark.skipif(deepspeed.__version__.split("+")[0] != "0.19.5",
                           reason="the ports follow DeepSpeed 0.19.5")


@pytest.mark.parametrize("cores", range(1, 17))
def test_split_rule_is_deepspeeds(cores):
    """(device lane, host lane) thread counts == (len(pt), len(zf)) of DeepSpeed's
    _split_affinity over the same number of cores, for shares 0 to 1."""
    from deepspeed.runtime.zenflow.zenflow_utils import _split_affinity
    for perc in (0.0, 0.05, 0.1, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.75, 0.9, 0.99, 1.0):
        zf, pt = _split_affinity(list(range(cores)), perc)
        assert default_thread_split(cores, perc) == (len(pt), len(zf)), (cores, perc)


@pytest.mark.parametrize("offload", [False, True])
def test_selected_columns_follow_deepspeeds_selective_adamw(offload):
    """Three steps before the first window closes (update_interval 4): the engine's
    selected columns of a (4, 6) weight and its (6,) bias equal DeepSpeed's
    ZenFlowSelectiveAdamW stepping those columns with the same gradients / U; with
    `offload` both keep the moments in host memory (DeepSpeed's offloaded step, buckets
    of one parameter)."""
    from deepspeed.ops.adam import ZenFlowSelectiveAdamW
    U = 4
    model = GradProbe({"w": (4, 6), "b": (6,)})
    twin_w = torch.nn.Parameter(model.w.detach().clone())
    twin_b = torch.nn.Parameter(model.b.detach().clone())
    engine = make_engine(model, probe_config(topk_ratio=0.5, update_interval=U,
                                             offload=offload))
    ds = ZenFlowSelectiveAdamW([twin_w, twin_b], lr=1e-3, weight_decay=0.01,
                               offload=offload, bucket_size=1)
    if offload:  # DeepSpeed's ZeRO-1/2 optimizer allocates them at the first step
        for twin, numel in ((twin_w, 4 * 3), (twin_b, 6)):
            twin.exp_avg_cpu_data = torch.zeros(numel)
            twin.exp_avg_sq_cpu_data = torch.zeros(numel)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        gw, gb = torch.randn(4, 6, generator=gen), torch.randn(6, generator=gen)
        engine.backward(engine(gw, gb))
        engine.step()
        assert (engine.strategy.moments is not None) == offload
        idx = engine.strategy.selected["w"]
        twin_w.selected_indices = idx
        twin_w.selected_grad = gw[:, idx] / U
        twin_w.temp_selected_param = twin_w.data[:, idx].clone()
        twin_b.selected_grad = gb / U
        twin_b.temp_selected_param = twin_b.data.clone()
        ds.step()
        torch.testing.assert_close(model.w.detach()[:, idx], twin_w.detach()[:, idx],
                                   rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(model.b.detach(), twin_b.detach(), rtol=1e-6, atol=1e-7)
    engine.close()


@V0195
def test_deepspeed_accepts_what_the_ports_mark_expected_different():
    """The configs of the config-level expected-different ports load in DeepSpeed 0.19.5's
    classes, and zfbench refuses each with a ConfigError."""
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.zenflow.zenflow_config import ZenFlowConfig as DsZenFlow
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    whole = [  # (zfbench side, DeepSpeed side)
        {"train_batch_size": 1,  # stage3: ZeRO-3 for zero-offload
         "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}},
        {"train_batch_size": 1,  # offload_at_stage0
         "zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": True}}},
    ]
    for cfg in whole:
        DeepSpeedConfig(cfg)
        with pytest.raises(ConfigError):
            load_config(cfg)
    payload = {"topk_ratio": 0.25, "select_strategy": "auto", "select_interval": 4,
               "update_interval": 8, "full_warm_up_rounds": 1, "overlap_step": True}
    DeepSpeedZeroConfig(zenflow=payload)  # select_below_update
    with pytest.raises(ConfigError):
        zenflow_from_dict(payload)
    assert DsZenFlow(topk_ratio=1.0).topk_ratio == 1.0  # 0.19.5 accepts 1.0 as zfbench does


@pytest.mark.parametrize("offload", [False, True])
def test_zero3_selected_columns_follow_deepspeeds_stage3_selective_adamw(offload):
    """ZeRO-3 (one rank: the partition is the whole model), three steps before the first
    window closes: the engine's selected columns of a (4, 6) weight and its (6,) bias equal
    DeepSpeed's ZenFlowSelectiveAdamW_stage3 stepping the same partition (its `ds_tensor`
    the weight transposed, a selected column a row of it) with the same gradients / U;
    with `offload` both keep the moments in host memory."""
    from deepspeed.ops.adam import ZenFlowSelectiveAdamW_stage3
    U = 4
    model = GradProbe({"w": (4, 6), "b": (6,)})
    w0, b0 = model.w.detach().clone(), model.b.detach().clone()
    engine = make_engine(model, probe_config(stage=3, topk_ratio=0.5, update_interval=U,
                                             offload=offload))
    twin_w = torch.nn.Parameter(w0.clone())
    twin_w.ds_shape, twin_w.ds_tensor = (6, 4), w0.T.contiguous().view(-1)
    twin_b = torch.nn.Parameter(b0.clone())
    twin_b.ds_shape, twin_b.ds_tensor = (6,), b0.clone()
    for twin in (twin_w, twin_b):
        twin.complete_column_offset, twin.complete_numel, twin.group_id = 0, twin.numel(), 0
        if offload:  # DeepSpeed's stage-3 optimizer allocates them at the first step
            numel = 4 * 3 if twin is twin_w else 6
            twin.exp_avg_cpu_data = torch.zeros(numel)
            twin.exp_avg_sq_cpu_data = torch.zeros(numel)
    ds = ZenFlowSelectiveAdamW_stage3([twin_w, twin_b], lr=1e-3, weight_decay=0.01,
                                      offload=offload, bucket_size=1)
    gen = torch.Generator().manual_seed(8)
    for _ in range(3):
        gw, gb = torch.randn(4, 6, generator=gen), torch.randn(6, generator=gen)
        engine.backward(engine(gw, gb))
        engine.step()
        idx = engine.strategy.selected["w"]
        rows = twin_w.ds_tensor.view(6, 4)
        twin_w.selected_indices = idx
        twin_w.selected_grad = (gw[:, idx] / U).T.contiguous()
        twin_w.temp_selected_param = rows[idx, :].clone()
        twin_b.selected_indices = torch.arange(6)
        twin_b.selected_grad = gb / U
        twin_b.temp_selected_param = twin_b.ds_tensor.clone()
        ds.step()
        ours = engine.zero3.owned_view("w")
        torch.testing.assert_close(ours[:, idx], rows[idx, :].T, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(engine.zero3.owned_view("b"), twin_b.ds_tensor,
                                   rtol=1e-6, atol=1e-7)
    assert (engine.zero3.owned_view("w")[:, idx] != w0[:, idx]).all()  # they were stepped
    engine.close()
