"""ZeRO-2 gradient partitions (sims/partitioning.py) in the device and zero-offload
schedules: reduce-scatter to the owners, owners-only copies, reductions waiting for them."""

import pytest

from zfbench.sims import partitioning
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from zfbench.validate.published import measure

MODEL = "gpt2:layers=6,hidden=1024,heads=16"
DEEP = "gpt2:layers=24,hidden=1024,heads=16"  # blocks smaller than a 16-GPU partition


def _settings(gpus: int, **kw) -> SimSettings:
    knobs = {**node_knobs("dgx2-v100", gpus), "model": MODEL, "micro_batch": 1, "seq": 256,
             "precision": "fp16", "steps": 4, **kw}
    return SimSettings.from_knobs(**knobs)


def test_partitions_cover_every_bucket_once():
    c = CostModel(_settings(16))
    per_rank = [sum(partitioning.owned_numel(c, r, i) for i in range(len(c.buckets)))
                for r in range(c.gpus)]
    assert per_rank == pytest.approx([c.params / 16] * 16)
    for i, b in enumerate(c.buckets):
        assert sum(partitioning.owned_numel(c, r, i) for r in range(16)) == \
            pytest.approx(b.numel)
    # a bucket belongs to the few ranks its span overlaps, not to all of them
    assert all(1 <= len(partitioning.owners(c, i)) < 16 for i in range(len(c.buckets)))
    assert partitioning.owners(c, 0)[0] == 0  # the first block is rank 0's
    assert partitioning.owners(c, len(c.buckets) - 1)[-1] == 15
    for r in range(16):  # the cached per-rank list is owned_numel's
        assert partitioning.owned_numels(c, r) == pytest.approx(
            [partitioning.owned_numel(c, r, i) for i in range(len(c.buckets))])
    for i in range(len(c.buckets)):  # owners() is the ranks with a positive share
        assert partitioning.owners(c, i) == [
            r for r in range(16) if partitioning.owned_numel(c, r, i) > 0]


def test_only_presets_partition():
    c = CostModel(_settings(4))
    assert partitioning.owns_partitions(c, "zero-offload")
    assert partitioning.owns_partitions(c, "zero-offload-dpu")
    assert not partitioning.owns_partitions(c, "device")  # it reduce-scatters, copies nothing
    assert partitioning.reduce_scatters(c, "device")
    for strategy in ("zero-infinity", "zenflow"):
        assert not partitioning.owns_partitions(c, strategy)
        assert not partitioning.reduce_scatters(c, strategy)
    c.calibration = {"transfers": "emulated"}  # a measured profile keeps the engine's way
    assert not partitioning.owns_partitions(c, "zero-offload")
    assert not partitioning.reduce_scatters(c, "device")


def test_owners_copy_their_partition_after_a_reduce_scatter():
    s = _settings(4, zero2_reduce="reduce-scatter")  # the ideal one (sims/zero2_reduce.py)
    result = simulate(s, "zero-offload")
    c = result.costs
    spans = result.timeline.spans_frame()
    step = spans[spans["step"] == 2]
    for rank in range(4):
        mine = step[step["rank"] == rank]
        d2h = mine[mine["op"] == "d2h_grad"]
        # the rank copies down exactly its partition (fp32), bucket by bucket it owns
        assert d2h["bytes"].sum() == pytest.approx(c.params / 4 * c.grad_wire_bytes,
                                                   rel=1e-6)
        assert len(d2h) == sum(1 for i in range(len(c.buckets))
                               if partitioning.owned_numel(c, rank, i) > 0)
        red = mine[mine["op"] == "reduce_scatter"]
        assert len(red) == len(c.buckets) and "allreduce" not in set(mine["op"])
        whole = c.buckets[0].numel * c.elem_bytes
        row = red[red["bytes"] == int(round(whole))].iloc[0]
        # half the all-reduce's ring time, bar latency: (n-1)/n of the bucket per rank
        assert row["duration_s"] == pytest.approx(c.allgather_s(whole))
        assert row["duration_s"] < 0.6 * c.allreduce_s(whole)
        gathers = mine[mine["op"] == "allgather"]  # one all-gather of the whole model
        assert len(gathers) == 1 and gathers["bytes"].iloc[0] == c.model_bytes


def test_next_reduction_waits_for_the_owners_copy():
    # a slow link: each bucket's copy through its owner's link outlasts its backward
    result = simulate(_settings(4, bandwidth_scale=0.02), "zero-offload")
    c = result.costs
    spans = result.timeline.spans_frame()
    step = spans[(spans["step"] == 2)]
    order = list(reversed(range(len(c.buckets))))  # backward order
    copy_end = {}  # (bucket, owner): the owner's copies run in order, one per owned bucket
    for r in range(c.gpus):
        d2h = step[(step["rank"] == r) & (step["op"] == "d2h_grad")].sort_values("t_start_s")
        owned = [i for i in order if partitioning.owned_numel(c, r, i) > 0]
        assert len(owned) == len(d2h)
        copy_end.update({(i, r): end for i, end in zip(owned, d2h["t_end_s"])})
    red = step[(step["rank"] == 1) & (step["op"] == "reduce_scatter")].sort_values("t_start_s")
    waited = 0
    for k in range(1, len(order)):
        prev = order[k - 1]
        last_copy = max(copy_end[(prev, r)] for r in partitioning.owners(c, prev))
        assert red.iloc[k]["t_start_s"] >= last_copy - 1e-12
        waited += red.iloc[k]["t_start_s"] - last_copy < 1e-9  # started by that copy
    assert waited >= len(order) // 2


def test_zero_offload_backward_flat_with_gpus_where_zero_infinity_falls():
    """ZeRO-Infinity Figure 6c's relation: with the gradient copies dominating, ZeRO-Offload's
    backward barely shrinks from 4 to 16 GPUs (one owner's link per bucket), while
    ZeRO-Infinity's falls with each GPU's share (every link per bucket)."""
    def backward(strategy, gpus):
        kw = {"offload_params": "cpu"} if strategy == "zero-infinity" else {}
        settings = _settings(gpus, bandwidth_scale=0.02, model=DEEP, **kw)
        return measure(simulate(settings, strategy),
                       "backward_time_s", 2)
    zo = backward("zero-offload", 16) / backward("zero-offload", 4)
    zi = backward("zero-infinity", 16) / backward("zero-infinity", 4)
    assert zo > 0.85
    assert zi < 0.4


def test_serial_reductions_gate_every_rank_on_the_owners_copies():
    """Without overlap_comm (DeepSpeed's ZeRO-2 default) a bucket's reduction is a
    rendezvous: it starts on every rank at the same moment, and the owners' copy of the
    bucket before it comes first. So every rank's backward holds every bucket's copy:
    at least its compute plus, per bucket, its owners' copy."""
    result = simulate(_settings(4, overlap_comm=False, model=DEEP), "zero-offload")
    spans = result.timeline.spans_frame()
    step = spans[spans["step"] == 2]
    starts = [step[(step["rank"] == r) & (step["op"] == "reduce_scatter")]
              .sort_values("t_start_s")["t_start_s"].to_numpy() for r in range(4)]
    for r in range(1, 4):
        assert starts[r] == pytest.approx(starts[0], abs=1e-12)
    down = step[step["op"] == "d2h_grad"]
    assert set(down["rank"]) == set(range(4))  # every rank owns a part of this model
    # a bucket's owners copy at once (same start); buckets' copies one after another
    copies_in_series = down.groupby("t_start_s")["duration_s"].max().sum()
    compute = step[(step["rank"] == 0) & (step["op"] == "backward")]["duration_s"].sum()
    assert measure(result, "backward_time_s", 2) >= compute + copies_in_series - 1e-9
