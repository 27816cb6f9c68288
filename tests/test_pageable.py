"""Copies into pageable host buffers (sims/pageable.py, `SimSettings.pin_memory`): the
staging copy's rate cap and DRAM bytes, and the copies blocking the device lane."""

import pytest

from zfbench.sims import pageable
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.fluid import Job, NodeCapacities, node_rates
from zfbench.sims.host_step import CORE_STREAM_BYTES_PER_S
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from zfbench.validate.published import bundled_path, measure, read_rows

SHAPE = "gpt2:layers=4,hidden=1024,heads=16"


def _caps(**over):
    caps = dict(d2h_bytes_per_s=10e9, h2d_bytes_per_s=10e9, d2h_factor_when_h2d_busy=1.0,
                h2d_factor_when_d2h_busy=1.0, upstream_d2h_bytes_per_s=40e9,
                upstream_h2d_bytes_per_s=40e9, gpus_per_switch=1, cores_per_rank=4,
                dram_bytes_per_s=20e9, dram_floor_fraction=0.1)
    caps.update(over)
    return NodeCapacities(**caps)


def test_staging_rate_by_hand():
    # one core streams CORE_STREAM_BYTES_PER_S, reading and writing each byte: half of it
    assert pageable.staging_copy_bytes_per_s(1.0) == pytest.approx(CORE_STREAM_BYTES_PER_S / 2)
    assert pageable.staging_copy_bytes_per_s(0.75) == pytest.approx(
        0.75 * CORE_STREAM_BYTES_PER_S / 2)
    assert pageable.DRAM_BYTES_PER_BYTE == 3.0


def test_pool_caps_a_pageable_copy_and_counts_its_dram_bytes():
    rates = node_rates(_caps())
    pinned = Job("d2h", 0, 1e9)
    paged = Job("d2h", 0, 1e9, pageable.DRAM_BYTES_PER_BYTE, 4e9)
    host = Job("host", 1, 1e9, 10.0, 1e12)  # DRAM-bound host work
    assert rates([pinned, host]) == pytest.approx([10e9, (20e9 - 10e9) / 10.0])
    # capped at 4 GB/s by its staging copy, 3 DRAM bytes per byte: 12 GB/s of DRAM
    assert rates([paged, host]) == pytest.approx([4e9, (20e9 - 12e9) / 10.0])
    # a cap above the link's share changes nothing but the DRAM bytes
    fast = Job("d2h", 0, 1e9, 1.0, 50e9)
    assert rates([fast])[0] == pytest.approx(10e9)


def test_pin_memory_default_and_where_it_applies():
    s = SimSettings.from_knobs(model=SHAPE, steps=3)
    assert s.runtime.pin_memory is True and not CostModel(s).pageable_copies
    c = CostModel(s.with_(pin_memory=False))
    assert c.pageable_copies
    assert c.pageable_copy_bytes_per_s == pytest.approx(
        pageable.staging_copy_bytes_per_s(c.numa_factor))


def _spans(result, rank=0, step=2):
    return [x for x in result.timeline.spans if x.rank == rank and x.step == step]


def _overlap(a, b) -> float:
    return max(0.0, min(a.t_end_s, b.t_end_s) - max(a.t_start_s, b.t_start_s))


@pytest.mark.parametrize("strategy", ["zero-offload", "zero-infinity"])
def test_pageable_copies_never_overlap_backward_compute(strategy):
    """Pinned, gradient copies run under backward; pageable, each blocks the compute lane,
    so no backward op overlaps a copy of the rank and the backward takes longer."""
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 4), model=SHAPE, micro_batch=4, seq=1024,
                               precision="fp16", steps=4)
    pinned = simulate(s, strategy)
    paged = simulate(s.with_(pin_memory=False), strategy)
    def copies(result, rank=0):
        return [x for x in _spans(result, rank) if x.op in ("d2h_grad", "h2d_param")]
    def backward(result, rank=0):
        return [x for x in _spans(result, rank) if x.op == "backward"]
    def hidden(result):  # every rank's: with ZeRO-2 partitions rank 0 owns the first
        return sum(_overlap(b, x) for r in range(4)  # blocks, whose copies come last
                   for b in backward(result, r) for x in copies(result, r))
    assert hidden(pinned) > 0
    assert hidden(paged) == pytest.approx(0.0, abs=1e-12)
    slow, fast = (measure(r, "backward_time_s", 2) for r in (paged, pinned))
    down = sum(x.t_end_s - x.t_start_s for x in _spans(paged) if x.op == "d2h_grad")
    compute = sum(x.t_end_s - x.t_start_s for x in backward(paged))
    assert slow > fast
    assert slow >= compute + down - 1e-9  # the copies add to the compute


def test_zero_infinity_nvme_copies_stay_pinned():
    """NVMe offload copies through DeepSpeed's swapper's pinned buffers: pin_memory False
    changes nothing there."""
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 4), model=SHAPE, micro_batch=4,
                               precision="fp16", steps=3, offload_params="nvme")
    a = measure(simulate(s, "zero-infinity"), "backward_time_s", 2)
    b = measure(simulate(s.with_(pin_memory=False), "zero-infinity"), "backward_time_s", 2)
    assert a == b


def test_bundled_rows_state_pin_memory():
    """ZeRO-Infinity's 2021 rows run DeepSpeed's default (pageable); every offloaded
    ZeRO-2 row pins (stage2.py pins whenever it offloads; the blog's example config sets
    pin_memory true): docs/published.md."""
    _, rows = read_rows(bundled_path())
    for row in rows:
        want = {"zero-infinity": "false", "device": ""}.get(row["strategy"], "true")
        assert row["pin_memory"] == want, row["id"]


def test_pin_memory_column():
    """`pin_memory` in a row: true/false (empty: pinned), anything else unsupported."""
    import zfbench.validate.published as vp
    _, rows = read_rows(bundled_path())
    row = next(r for r in rows if r["id"] == "zi-fig6c-4gpu-zi")
    assert vp.row_settings(row).runtime.pin_memory is False
    assert vp.row_settings({**row, "pin_memory": ""}).runtime.pin_memory is True
    with pytest.raises(vp.Unsupported, match="pin_memory 'maybe' is not true or false"):
        vp.row_settings({**row, "pin_memory": "maybe"})
