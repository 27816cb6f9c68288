"""The costs of ZeRO-Offload's scale on DGX-2 nodes (issue 44 item 3), each against a
reference computation from the presets' sourced numbers: a rank's share of the node's
cores, the node's DRAM bandwidth shared by its ranks' host passes and their PCIe DMA, a
PCIe switch's upstream shared by its GPUs, the node's NICs shared by its GPUs, and the
bench that switches each off (bench/zo_scaling.py)."""

import importlib.util
from pathlib import Path

import pytest

from zfbench.core import hardware
from zfbench.sims.costs import ADAM_BYTES_PER_PARAM, CostModel, SimSettings
from zfbench.sims.fluid import Job, node_rates
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import capacities

MODEL = "gpt2:layers=4,hidden=1024,heads=16"
# 2 x Xeon Platinum 8168: 24 cores and 6 channels of DDR4-2666 each (Intel ARK), STREAM
# triad at 0.75 of theoretical (hardware.json's dram_triad_fraction)
CORES, DRAM = 48, 2 * 6 * 2666e6 * 8 * 0.75


def _costs(gpus: int, **kw) -> CostModel:
    knobs = {**node_knobs("dgx2-v100", gpus), "model": MODEL, "micro_batch": 1,
             "seq": 128, "precision": "fp16", "steps": 4, **kw}
    return CostModel(SimSettings.from_knobs(**knobs), "zero-offload")


@pytest.mark.parametrize("gpus,cores", [(1, 48), (2, 24), (16, 3), (32, 3), (128, 3)])
def test_a_rank_gets_its_share_of_the_node_cores(gpus, cores):
    c = _costs(gpus)
    assert c.node.host.cores == CORES
    assert c.cores_per_rank == cores  # 48 cores / the node's ranks (not the run's)


def test_the_node_dram_is_shared_by_its_ranks_host_passes_and_their_dma():
    c = _costs(16)
    assert c.node.host.dram_bytes_per_s == pytest.approx(DRAM, rel=1e-12)
    rates = node_rates(capacities(c))
    units = c.adam_units_per_core_s
    # 16 ranks' CPU-Adam at once: each its 3 cores, or a sixteenth of DRAM at 28 B/param
    adam = [Job("host", r, 1e9, ADAM_BYTES_PER_PARAM, units) for r in range(16)]
    alone = rates(adam)
    assert alone == pytest.approx([min(3 * units, DRAM / 16 / ADAM_BYTES_PER_PARAM)] * 16)
    # with every GPU's gradient copy down at once, DRAM left to Adam is what the DMA
    # leaves: four switches of four GPUs, each upstream at 12 GB/s (ZeRO-Infinity Fig. 2b)
    copies = [Job("d2h", r, 1e9) for r in range(16)]
    both = rates(adam + copies)
    dma = sum(both[16:])
    assert dma == pytest.approx(4 * 12e9)
    assert both[:16] == pytest.approx([min(3 * units, (DRAM - dma) / 16 / ADAM_BYTES_PER_PARAM)]
                                      * 16)
    # 1000x the DRAM (bench/zo_scaling.py's dram_shared off): the cores bind
    assert min(3 * units, 1000 * DRAM / 16 / ADAM_BYTES_PER_PARAM) == 3 * units


def test_a_pcie_switch_upstream_is_shared_by_its_four_gpus():
    c = _costs(16)
    rates = node_rates(capacities(c))
    same_switch = rates([Job("d2h", r, 1e9) for r in range(4)])
    assert same_switch == pytest.approx([12e9 / 4] * 4)
    apart = rates([Job("d2h", r, 1e9) for r in (0, 4, 8, 12)])
    assert apart == pytest.approx([12e9] * 4)
    one_per_switch = node_rates(capacities(_costs(16, gpus_per_switch=1)))
    assert one_per_switch([Job("d2h", r, 1e9) for r in range(4)]) == pytest.approx([12e9] * 4)


def test_a_dgx2_nic_is_shared_by_two_gpus():
    # NVIDIA DGX-2 datasheet: 8 x 100 Gb/s EDR InfiniBand for 16 GPUs
    ib = hardware.lookup("net_links", "ib-edr-dgx2")
    assert 16 * ib.bytes_per_s == pytest.approx(8 * 100e9 / 8)


def test_the_bench_switches_off_one_mechanism_at_a_time(tmp_path):
    path = Path(__file__).resolve().parents[1] / "bench" / "zo_scaling.py"
    spec = importlib.util.spec_from_file_location("zo_scaling", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    dram = bench.no_dram_limit_file(tmp_path)
    on = bench.variant_knobs("all_on", 32, dram)
    for variant in bench.VARIANTS[1:-1]:
        knobs = bench.variant_knobs(variant, 32, dram)
        assert [k for k in knobs if knobs[k] != on.get(k)] == [{
            "cores_shared": "host_cores", "numa_unbound": "bind_cores",
            "dram_shared": "hardware", "pcie_switch_shared": "gpus_per_switch",
            "inter_node_net": "inter_net", "reduce_per_owner": "zero2_reduce"}[variant]]
    s = SimSettings.from_knobs(**bench.variant_knobs("dram_shared", 32, dram))
    assert CostModel(s).node.host.dram_bytes_per_s == pytest.approx(1000 * DRAM, rel=1e-12)
    assert CostModel(SimSettings.from_knobs(**bench.variant_knobs(
        "cores_shared", 32, dram))).cores_per_rank == CORES
