"""The dgx2-v100 node preset (the ZeRO papers' machine), several of its nodes, fp16 without
bf16, and gradient accumulation in the simulator, each checked against numbers worked out
by hand."""

import pytest

from zfbench.core import hardware as hw
from zfbench.sims.costs import ADAM_BYTES_PER_PARAM, CostModel, SimSettings, SimSettingsError
from zfbench.sims.device_step import BESIDE_ADAM_BYTES_PER_ELEM
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate


def test_dgx2_node_numbers_and_sources():
    node = hw.get_node("dgx2-v100")
    assert (node.gpus, node.host.cores, node.nvme_drives, node.gpus_per_switch) == (16, 48, 8, 4)
    assert node.gpu.fp16_flops_per_s == 125e12 and node.gpu.bf16_flops_per_s is None
    assert node.gpu.memory_bytes == 32e9 and node.host.memory_bytes == 1.5e12
    assert node.link.h2d_bytes_per_s == node.link.d2h_bytes_per_s == 12e9
    # 6 channels of DDR4-2666 per socket, 2 sockets, 75 % of it reached (STREAM triad)
    assert node.host.dram_bytes_per_s == pytest.approx(2 * 6 * 2666e6 * 8 * 0.75)
    # 8 x 100 Gb/s NICs for 16 GPUs: 6.25 GB/s per GPU
    assert node.inter_net.bytes_per_s == 6.25e9
    assert node.nvme.read_bytes_per_s * node.nvme_drives == pytest.approx(25.6e9)
    for part in (node.gpu, node.link, node.host, node.net, node.nvme, node.inter_net):
        assert part.sources and all(src.strip() for src in part.sources.values())
    assert "2101.06840" in node.host.sources["memory_bytes"]
    assert "2104.07857" in node.link.sources["h2d_bytes_per_s"]


def test_v100_refuses_bf16_and_takes_fp16():
    with pytest.raises(SimSettingsError, match="no bf16 tensor cores; use precision fp16"):
        SimSettings.from_knobs(**node_knobs("dgx2-v100", 1), precision="bf16")
    costs = CostModel(SimSettings.from_knobs(**node_knobs("dgx2-v100", 1), precision="fp16"))
    # fp16 tensor-core peak; the model's MFU by shape (zfbench.sims.compute_efficiency)
    assert costs.node.gpu.peak_flops_per_s("fp16") == 125e12
    assert costs.flops_per_s == pytest.approx(125e12 * costs.mfu)


@pytest.mark.parametrize("gpus,nodes,per_node", [(1, 1, 1), (4, 1, 4), (16, 1, 16),
                                                  (32, 2, 16), (64, 4, 16)])
def test_gpu_counts_over_a_node_are_several_nodes(gpus, nodes, per_node):
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", gpus), precision="fp16", model="tiny")
    assert (s.machine.ranks, s.machine.nodes, s.machine.gpus_on_node) == (gpus, nodes, per_node)
    if nodes > 1:
        assert s.machine.inter_net == "ib-edr-dgx2"


def test_gpu_count_that_is_not_whole_nodes():
    with pytest.raises(SimSettingsError, match="multiple of 16"):
        node_knobs("dgx2-v100", 24)


def one_gpu(strategy_accum: int, **extra) -> SimSettings:
    return SimSettings.from_knobs(model="gpt2:layers=2,hidden=256,heads=4", gpus=1, gpus_per_switch=1,
                                  **{k: v for k, v in node_knobs("dgx2-v100", 1).items()
                          if k not in ("gpus", "gpus_per_switch")},
                                  micro_batch=2, seq=256, precision="fp16", grad_accum=strategy_accum,
                                  steps=4, **extra)


def steady_step_s(result) -> float:
    steps = result.timeline.steps_frame()
    return float((steps.t_end_s - steps.t_start_s).iloc[-1])


def test_device_step_with_accumulation_by_hand():
    """One GPU, device: A x (forward + backward with recompute) + one device step (the
    fused Adam and DeepSpeed's passes beside it, zfbench.sims.device_step)."""
    for accum in (1, 3):
        result = simulate(one_gpu(accum), "device")
        c = result.costs
        micro = sum(b.forward_s + b.backward_s for b in c.buckets)
        adam = c.params * (ADAM_BYTES_PER_PARAM + BESIDE_ADAM_BYTES_PER_ELEM) / (900e9 * 0.8)
        assert steady_step_s(result) == pytest.approx(accum * micro + adam, rel=1e-9)
        assert result.flops_per_step() == pytest.approx(
            accum * 3 * c.shape.forward_flops_per_token(256) * 2 * 256)


def test_offload_accumulation_moves_the_share_through_the_host_buffer():
    """Per step: A copies of the gradient down (A - 1 of the 16-bit accumulation buffer,
    2 B per parameter; the last as DeepSpeed's fp32 gradient, 4 B); A - 1 accumulations
    up and the parameters up once (16-bit: 2 B per parameter each)."""
    accum = 4
    result = simulate(one_gpu(accum), "zero-offload")
    spans = result.timeline.spans_frame()
    last = spans[spans.step == 3]
    p2 = result.costs.params * 2
    assert last[last.lane == "d2h"].bytes.sum() == pytest.approx((accum + 1) * p2, abs=64)
    assert last[last.lane == "h2d"].bytes.sum() == pytest.approx(accum * p2, abs=64)
    assert (last.op == "forward").sum() == accum
    host = last[last.op == "host_optim"]
    assert host.bytes.sum() == 0 and len(host) > 0  # one Adam per step, no host accumulation
    assert (last.op == "host_accum").sum() == 0


@pytest.mark.parametrize("strategy", ["zenflow"])
def test_accumulation_is_refused_where_not_simulated(strategy):
    with pytest.raises(SimSettingsError, match="grad_accum 2 is simulated for device"):
        simulate(one_gpu(2), strategy)


def test_simulate_command_takes_grad_accum_and_a_spec(capsys):
    from zfbench.simulate.command import main

    argv = ["--model", "gpt2:layers=2,hidden=256,heads=4", "--gpu", "v100-sxm3-32g",
            "--pcie", "gen3-dgx2", "--host", "xeon-8168", "--gpus", "1", "--precision", "fp16",
            "--grad-accum", "2", "--steps", "3", "--quiet"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "x 2 micro-steps" in out and "zero-offload-dpu" in out
    assert "zenflow left out" in err
    assert main(argv + ["--strategy", "zenflow"]) == 2
    assert "--grad-accum above 1 is simulated for" in capsys.readouterr().err
