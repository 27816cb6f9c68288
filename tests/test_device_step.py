"""The `device` strategy's optimizer step beside the fused Adam (sims/device_step.py):
DeepSpeed's ZeRO-2 passes over the partition, with numbers."""

import pytest

from zfbench.sims import device_step as ds
from zfbench.sims.costs import ADAM_BYTES_PER_PARAM, CostModel, SimSettings
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate


def test_bytes_per_element_by_hand():
    # norm 2 + flatten 4 + to fp32 6 + clip 8 + copy back 6, Adam reading the fp32
    # gradient (+2 over the 16-bit one it counted) and writing no 16-bit copy (-2)
    assert ds.BESIDE_ADAM_BYTES_PER_ELEM == 2 + 4 + 6 + 8 + 6 + 2 - 2 == 26
    # the whole device step streams 54 B per parameter: nearly twice the fused Adam alone
    assert ADAM_BYTES_PER_PARAM + ds.BESIDE_ADAM_BYTES_PER_ELEM == 54


def test_fp32_weights_have_no_conversion_passes():
    assert ds.beside_adam_s(1e9, 1e12, "fp32") == 0.0
    assert ds.beside_adam_s(1e9, 1e12, "fp16") == ds.beside_adam_s(1e9, 1e12, "bf16") == 0.026


@pytest.mark.parametrize("precision,extra", [("bf16", 26.0)])
def test_device_step_from_presets(precision, extra):
    s = SimSettings.from_knobs(**node_knobs("a100-4x-gen4", 4), model="tiny", precision=precision)
    c = CostModel(s)
    hbm = c.node.gpu.hbm_bytes_per_s * 0.8  # at DEVICE_OPTIM_HBM_EFFICIENCY
    n = c.share(c.params)
    assert c.device_step_s(n) == pytest.approx(n * (ADAM_BYTES_PER_PARAM + extra) / hbm)
    assert c.device_step_s(n) - c.device_optim_s(n) == pytest.approx(
        ds.beside_adam_s(n, hbm, precision))


def test_a_measured_profile_keeps_its_own_device_costs():
    """With a profile the device step is its measured Adam rate and master copies only."""
    class Fake:  # only what device_step_s reads
        calibration = {"device_optim_elems_per_s": 1e9, "master_copy_s_per_elem": 2e-9}
        device_optim_s = CostModel.device_optim_s
        master_copy_s = CostModel.master_copy_s
    assert CostModel.device_step_s(Fake(), 1e9) == pytest.approx(1.0 + 2.0)


def test_the_device_step_op_takes_the_passes():
    """One GPU: the simulated `device_optim` span is the fused Adam plus the passes."""
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 1), model="tiny", precision="fp16", steps=3)
    result = simulate(s, "device")
    spans = result.timeline.spans_frame()
    optim = spans[(spans.op == "device_optim") & (spans.step == 2)].duration_s.sum()
    c = result.costs
    assert optim == pytest.approx(c.device_optim_s(c.params) + ds.beside_adam_s(
        c.params, 900e9 * 0.8, "fp16"), rel=1e-9)
