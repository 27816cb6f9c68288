"""DeepSpeed ZeRO-2's bucket reduction by release (sims/zero2_reduce.py, issue 44 item 3):
each style's seconds against a hand computation from the DGX-2 presets, the simulated
spans carrying them, and the published rows of DeepSpeed 0.3-0.8 reducing per owner."""

import pytest

from zfbench.core import hardware
from zfbench.sims import partitioning, zero2_reduce
from zfbench.sims.costs import CostModel, SimSettings, SimSettingsError
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from zfbench.validate.rows import bundled_path, read_rows, row_settings

MODEL = "gpt2:layers=6,hidden=1024,heads=16"
NV = hardware.lookup("net_links", "nvswitch-v100")
IB = hardware.lookup("net_links", "ib-edr-dgx2")


def _costs(gpus: int, style: str, model: str = MODEL) -> CostModel:
    knobs = {**node_knobs("dgx2-v100", gpus), "model": model, "micro_batch": 1, "seq": 256,
             "precision": "fp16", "steps": 4, "zero2_reduce": style}
    return CostModel(SimSettings.from_knobs(**knobs), "zero-offload")


def test_ring_reduce_by_hand():
    s = 1e9
    # one DGX-2, 16 GPUs: the whole slice once over NVSwitch at 0.8 of 150 GB/s, 15 hops
    one = zero2_reduce.ring_reduce_s(NV, IB, 16, 1, s)
    assert one == pytest.approx(1e9 / 120e9 + 15 * 5e-6, rel=1e-12)
    # 8 DGX-2s: the node boundary through 8 NICs = 16 x 6.25 GB/s x 0.8 = 80 GB/s, below
    # NVSwitch's 120; 128 - 8 NVSwitch hops and 7 InfiniBand ones
    eight = zero2_reduce.ring_reduce_s(NV, IB, 16, 8, s)
    assert eight == pytest.approx(1e9 / 80e9 + 120 * 5e-6 + 7 * 1e-5, rel=1e-12)
    assert zero2_reduce.ring_reduce_s(NV, IB, 1, 1, s) == 0.0


@pytest.mark.parametrize("gpus", [4, 16, 32])
def test_each_style_is_its_formula(gpus):
    for i in (0, 3):
        runs = partitioning.owned_runs(_costs(gpus, "reduce"), i)
        ar, rs, red = (_costs(gpus, style) for style in ("allreduce", "reduce-scatter",
                                                          "reduce"))
        nbytes = ar.buckets[i].numel * 2  # fp16
        assert zero2_reduce.bucket_reduce_s(ar, i, runs) == ar.allreduce_s(nbytes)
        assert zero2_reduce.bucket_reduce_s(rs, i, runs) == rs.allgather_s(nbytes)
        nodes = max(1, gpus // 16)
        want = sum(zero2_reduce.ring_reduce_s(NV, IB, gpus // nodes, nodes, n * 2)
                   for n in runs)
        assert zero2_reduce.bucket_reduce_s(red, i, runs) == pytest.approx(want, rel=1e-12)
        assert sum(runs) == pytest.approx(ar.buckets[i].numel)  # the runs cover the bucket
        if nodes == 1:  # the whole bucket once over the one link, each owner's hops:
            # never below the ideal reduce-scatter's (n-1)/n and (n-1) hops
            assert zero2_reduce.bucket_reduce_s(red, i, runs) >= rs.allgather_s(nbytes)


@pytest.mark.parametrize("style", zero2_reduce.ZERO2_REDUCES)
def test_simulated_reductions_last_what_the_style_costs(style):
    result = simulate(_costs(4, style).settings, "zero-offload")
    c = result.costs
    spans = result.timeline.spans_frame()
    red = spans[(spans["op"] == zero2_reduce.REDUCE_OP) & (spans["step"] == 2)
                & (spans["rank"] == 0)]
    assert len(red) == len(c.buckets)
    want = sorted(zero2_reduce.bucket_reduce_s(c, i, partitioning.owned_runs(c, i))
                  for i in range(len(c.buckets)))
    assert sorted(red["duration_s"]) == pytest.approx(want, rel=1e-9)


def test_rows_of_deepspeed_0_3_reduce_per_owner():
    rows = {r["id"]: r for r in read_rows(bundled_path())[1]}
    fig6c = row_settings(rows["zi-fig6c-32gpu-zo"])
    assert fig6c.runtime.fused_param_upload and fig6c.runtime.zero2_reduce == "reduce"
    blog = row_settings(rows["cb-qwen3b-zo-bound"])  # DeepSpeed of 2025
    assert blog.runtime.zero2_reduce == "allreduce"


def test_an_unknown_style_is_refused_naming_the_knob():
    with pytest.raises(SimSettingsError, match="zero2_reduce 'ring'.*allreduce, reduce"):
        SimSettings.from_knobs(zero2_reduce="ring")
