"""Ports of DeepSpeed's tests/unit/ops/adam/test_zf_torch_adam.py (0.19.5) to zfbench.

DeepSpeed tests its device-side selective optimizer (ZenFlowSelectiveAdamW, and
ZenFlowSelectiveAdamW_stage3 for ZeRO-3) on hand-made parameters whose
`selected_indices` and `selected_grad` are set by the test. zfbench's device update is
part of its ZenFlow strategy (real/zenflow.py), so each port drives the engine with a
GradProbe (the gradient of each parameter is the tensor fed to it) and steers the first
selection onto DeepSpeed's indices by giving those columns the largest L1 norm.
`opt` names the DeepSpeed class: the stage-3 one maps to ZeRO stage 3, whose weights are
read from the rank's partition (`engine.zero3.owned_view`, as DeepSpeed's tests read
`param.ds_tensor`); `offload=True` maps to `zenflow.offload` (the moments in host memory),
which ZeRO-3 refuses (expected-different).
"""
import pytest
import torch

from conformance_support import GradProbe, expected_different, probe_config
from engine_helpers import make_engine
from zfbench.real.flat import take_columns

STAGE = {"ZenFlowSelectiveAdamW": 2, "ZenFlowSelectiveAdamW_stage3": 3}
OPTS = [pytest.param("ZenFlowSelectiveAdamW", id="ZenFlowSelectiveAdamW"),
        pytest.param("ZenFlowSelectiveAdamW_stage3", id="ZenFlowSelectiveAdamW_stage3")]
OPTS_OFFLOAD = [OPTS[0],
                pytest.param("ZenFlowSelectiveAdamW_stage3", id="ZenFlowSelectiveAdamW_stage3",
                             marks=expected_different("stage3_offload"))]
LR, WD, BETAS, EPS = 1e-3, 0.01, (0.9, 0.999), 1e-8


def steering_grad(shape, chosen, gen):
    """A random gradient whose `chosen` columns carry the largest L1 norms."""
    g = torch.randn(shape, generator=gen)
    if len(shape) == 2 and chosen is not None:
        g[:, chosen] = g[:, chosen].sign() * (g[:, chosen].abs() + 10.0)
    return g


def probe(opt, shapes, *, offload=False, **cfg):
    model = GradProbe(shapes)
    engine = make_engine(model, probe_config(stage=STAGE[opt], offload=offload, **cfg))
    return model, engine


def step(engine, grads):
    engine.backward(engine(*grads))
    engine.step()


def values(engine, model):
    """The weights as the rank holds them: the model's, or on ZeRO-3 the rank's partition
    (between steps the model's parameters are released)."""
    z3 = engine.zero3
    return {n: (p.detach() if z3 is None else z3.owned_view(n)).clone()
            for n, p in model.named_parameters()}


@pytest.mark.parametrize("opt", OPTS)
def test_init_methods_without_offload(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_init_methods, its offload=False
    half: without zenflow.offload the selected columns' moments live where the weights do
    (the engine's device) from the first step on, shaped as the selection."""
    model, engine = probe(opt, {"w": (2, 4)}, topk_ratio=0.5)
    assert engine.config.zenflow is not None and engine.strategy.name == "zenflow"
    step(engine, [steering_grad((2, 4), [1, 2], torch.Generator().manual_seed(0))])
    s = engine.strategy
    for moments in (s.dm, s.dv):
        assert moments["w"].device == model.w.device
        assert moments["w"].numel() == 2 * s.selected["w"].numel()
    engine.close()


@pytest.mark.parametrize("opt", OPTS_OFFLOAD)
def test_init_methods_with_offload(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_init_methods, its offload=True
    half (the optimizer switches to its offloading step): with zenflow.offload the
    selected columns' moments live in host memory, shaped as the selection, and the
    device holds only a staging buffer for them."""
    model, engine = probe(opt, {"w": (2, 4)}, offload=True, topk_ratio=0.5)
    step(engine, [steering_grad((2, 4), [1, 2], torch.Generator().manual_seed(0))])
    s = engine.strategy
    assert s.moments is not None
    for moments in (s.dm, s.dv):
        assert engine.backend.is_host(moments["w"])
        assert moments["w"].numel() == 2 * s.selected["w"].numel()
        assert moments["w"].abs().sum() > 0  # the step's moments came back
    assert s.moments.staging.device == model.w.device
    engine.close()


@pytest.mark.parametrize("opt", OPTS)
def test_step_without_offload(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_step_without_offload: a (4, 6)
    weight with columns [1, 3, 4] selected; one step moves those columns (summed change >
    1e-5) and consumes the gradient (DeepSpeed clears selected_grad / temp_selected_param;
    the engine's gradient buffer is zero after the step). Unselected columns do not move (no
    window closed yet, update_interval 4)."""
    chosen = [1, 3, 4]
    model, engine = probe(opt, {"w": (4, 6)}, topk_ratio=0.5)
    before = values(engine, model)["w"]
    step(engine, [steering_grad((4, 6), chosen, torch.Generator().manual_seed(1))])
    assert engine.strategy.selected["w"].tolist() == chosen
    after = values(engine, model)["w"]
    assert (after[:, chosen] - before[:, chosen]).abs().sum() > 1e-5
    rest = [j for j in range(6) if j not in chosen]
    assert torch.equal(after[:, rest], before[:, rest])
    assert not model.w.grad.any()
    engine.close()


@pytest.mark.parametrize("opt", OPTS_OFFLOAD)
def test_step_with_offload_bucket_flush(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_step_with_offload_bucket_flush
    (offload=True, bucket_size 1, two (2, 4) weights with columns [1, 2] and [0, 3]): each
    weight is a bucket of its own, both are stepped (their selected columns move, the rest
    do not) and each bucket's moments went up and came back once."""
    shapes = {"w1": (2, 4), "w2": (2, 4)}
    chosen = {"w1": [1, 2], "w2": [0, 3]}
    model, engine = probe(opt, shapes, offload=True, topk_ratio=0.5, reduce_bucket_size=1)
    before = values(engine, model)
    gen = torch.Generator().manual_seed(5)
    step(engine, [steering_grad(shapes[n], chosen[n], gen) for n in shapes])
    s = engine.strategy
    assert [b.names for b in s.moments.buckets] == [("w1",), ("w2",)]
    after = values(engine, model)
    for name, cols in chosen.items():
        assert s.selected[name].tolist() == cols
        rest = [j for j in range(4) if j not in cols]
        assert (after[name][:, cols] != before[name][:, cols]).all(), name
        assert torch.equal(after[name][:, rest], before[name][:, rest]), name
    spans = engine.timeline.spans_frame()
    assert (spans["op"] == "h2d_moments").sum() == (spans["op"] == "d2h_moments").sum() == 2
    engine.close()


@pytest.mark.parametrize("opt", OPTS)
def test_clear_selected_mv(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_clear_selected_mv: after a step
    the selected columns have moments; clearing zeroes them. zfbench clears them at each
    reselection (select_interval 2 here), so after the reselecting step they hold only that
    step's gradient: exp_avg = (1 - beta1) g / U, exp_avg_sq = (1 - beta2) (g / U)^2."""
    U = 2
    gen = torch.Generator().manual_seed(2)
    model, engine = probe(opt, {"w": (2, 4)}, topk_ratio=0.5, update_interval=U,
                          select_interval=2)
    s = engine.strategy
    for t in range(3):
        g = steering_grad((2, 4), [0, 2], gen)
        step(engine, [g])
        assert s.dm["w"].abs().sum() > 0
    assert s.selected["w"].tolist() == [0, 2]
    laid_out = torch.empty_like(values(engine, model)["w"])  # the engine's layout
    laid_out.copy_(g / U)
    g_sel = take_columns(laid_out, s.selected["w"])
    torch.testing.assert_close(s.dm["w"], (1 - BETAS[0]) * g_sel, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(s.dv["w"], (1 - BETAS[1]) * g_sel ** 2, rtol=1e-6,
                               atol=1e-10)
    engine.close()


@pytest.mark.parametrize("opt", OPTS)
def test_group_step_without_offload(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_group_step_without_offload (one
    group of parameters stepped together, columns [0, 1, 3] selected): one device step
    updates the whole group (two weights' selected columns and a 1-D parameter) and consumes
    every gradient."""
    chosen = [0, 1, 3]
    shapes = {"w1": (2, 6), "w2": (3, 6), "b": (6,)}
    model, engine = probe(opt, shapes, topk_ratio=0.5)
    before = values(engine, model)
    gen = torch.Generator().manual_seed(3)
    step(engine, [steering_grad(shape, chosen, gen) for shape in shapes.values()])
    s = engine.strategy
    assert s.device_count == 1
    after = values(engine, model)
    for name in ("w1", "w2"):
        assert s.selected[name].tolist() == chosen
        assert (after[name][:, chosen] != before[name][:, chosen]).all(), name
    assert (after["b"] != before["b"]).all()
    assert all(not p.grad.any() for p in model.parameters())
    engine.close()


@pytest.mark.parametrize("opt", OPTS_OFFLOAD)
def test_group_step_with_offload(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_group_step_with_offload (one
    (2, 6) weight, columns [0, 1, 3] selected, moments offloaded): the step consumes the
    gradient, and weights and moments equal those of the same step without offload."""
    grads = [steering_grad((2, 6), [0, 1, 3], torch.Generator().manual_seed(6))]
    runs = []
    for offload in (True, False):
        model, engine = probe(opt, {"w": (2, 6)}, offload=offload, topk_ratio=0.5,
                              overlap_comm=True)
        step(engine, [g.clone() for g in grads])
        assert engine.strategy.selected["w"].tolist() == [0, 1, 3]
        assert not model.w.grad.any()
        runs.append((values(engine, model)["w"], engine.strategy.dm["w"].clone(),
                     engine.strategy.dv["w"].clone()))
        engine.close()
    for with_offload, without in zip(*runs):
        assert torch.equal(with_offload, without)


@pytest.mark.parametrize("opt", OPTS)
def test_1d_param_support(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_1d_param_support: a 1-D
    parameter (10,) is updated on the device every step (not only when a window closes):
    after one step it equals torch.optim.AdamW's step on grad / U, and the gradient is
    consumed."""
    U = 4
    model, engine = probe(opt, {"b": (10,)}, update_interval=U)
    twin = torch.nn.Parameter(values(engine, model)["b"])
    g = torch.randn(10, generator=torch.Generator().manual_seed(4))
    step(engine, [g])
    twin.grad = g / U
    torch.optim.AdamW([twin], lr=LR, betas=BETAS, eps=EPS, weight_decay=WD).step()
    torch.testing.assert_close(values(engine, model)["b"], twin.detach(), rtol=1e-6,
                               atol=1e-7)
    assert not model.b.grad.any()
    engine.close()


@pytest.mark.parametrize("opt", OPTS)
def test_state_increment(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_state_increment: every step
    advances the device optimizer's step count by one (all 4 columns selected)."""
    _, engine = probe(opt, {"w": (2, 4)}, topk_ratio=1.0)
    gen = torch.Generator().manual_seed(5)
    step(engine, [torch.randn(2, 4, generator=gen)])
    first = engine.strategy.device_count
    step(engine, [torch.randn(2, 4, generator=gen)])
    assert engine.strategy.device_count == first + 1 == 2
    engine.close()


@pytest.mark.parametrize("opt", OPTS)
def test_against_torch_adamw(opt):
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_against_torch_adamw: with every
    column selected (topk_ratio 1.0, U 1), 10 steps of random gradients give
    torch.optim.AdamW(lr=1e-3)'s parameters (DeepSpeed allows atol 1e-4; zfbench meets
    1e-6)."""
    model, engine = probe(opt, {"w": (2, 4)}, topk_ratio=1.0, update_interval=1)
    twin = torch.nn.Parameter(values(engine, model)["w"])
    reference = torch.optim.AdamW([twin], lr=LR)
    gen = torch.Generator().manual_seed(6)
    for _ in range(10):
        g = torch.randn(2, 4, generator=gen)
        step(engine, [g])
        twin.grad = g.clone()
        reference.step()
    torch.testing.assert_close(values(engine, model)["w"], twin.detach(), rtol=0, atol=1e-6)
    engine.close()


NVME = {"offload_param": {"device": "nvme", "nvme_path": "/tmp"}}
STAGE3_NVME = expected_different("nvme")  # offload_param to NVMe (ZeRO-Infinity)


@STAGE3_NVME
def test_group_step_nvme_offloaded_partition():
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_group_step_nvme_offloaded_partition
    (ZenFlowSelectiveAdamW_stage3 on a ZeRO-3 partition swapped out to NVMe): zfbench
    refuses NVMe offload."""
    _, engine = probe("ZenFlowSelectiveAdamW_stage3", {"w": (4, 6)}, **NVME)
    engine.close()


@STAGE3_NVME
def test_step_nvme_offloaded_partition():
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_step_nvme_offloaded_partition:
    as above, through step()."""
    _, engine = probe("ZenFlowSelectiveAdamW_stage3", {"w": (4, 6)}, **NVME)
    engine.close()


@STAGE3_NVME
def test_temp_copy_param_nvme_offloaded_partition():
    """Ports tests/unit/ops/adam/test_zf_torch_adam.py::test_temp_copy_param_nvme_offloaded_partition:
    as above, for the read-only snapshot of the selected columns."""
    _, engine = probe("ZenFlowSelectiveAdamW_stage3", {"w": (4, 6)}, **NVME)
    engine.close()
