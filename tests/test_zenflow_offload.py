"""`zenflow.offload` in the engine: the device AdamW's moments in host memory.

The moments travel, the numbers do not change: runs with and without offload end with
equal weights bit for bit (fp32 and bf16, overlap on and off, reselections, a checkpoint
resumed mid-window); each device update moves every moment up and back once, in buckets
planned by DeepSpeed's rule; the config needs overlap_comm, as DeepSpeed's does.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings, strategies as st

from engine_helpers import BiasMLP, batches, config, make_engine, train_steps
from zfbench.core.config import ConfigError, load_config
from zfbench.real.zenflow_offload import plan_buckets

ZF = dict(topk_ratio=0.25, update_interval=2, select_strategy="step", select_interval=4)
STEPS = 9  # selections at 0, 4, 8; boundaries every 2 steps


def offload_config(offload: bool, bf16: bool = False, overlap: bool = True,
                   bucket: int = 150) -> dict:
    cfg = config("zenflow", clip=0.5, **dict(ZF, overlap_step=overlap, offload=offload))
    cfg["zero_optimization"].update(overlap_comm=True, reduce_bucket_size=bucket)
    if bf16:
        cfg["bf16"] = {"enabled": True}
    return cfg


def trained(cfg: dict, steps: int = STEPS, data=None, engine=None):
    engine = engine or make_engine(BiasMLP(), cfg, host_chunk_elems=97)
    train_steps(engine, data if data is not None else batches(), steps)
    engine.finish()
    engine.close()
    return engine


def weights(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


@pytest.mark.parametrize("bf16,overlap", list(itertools.product((False, True), repeat=2)))
def test_offloaded_moments_give_the_same_weights_bit_for_bit(bf16, overlap):
    on = weights(trained(offload_config(True, bf16, overlap)))
    off = weights(trained(offload_config(False, bf16, overlap)))
    assert on.keys() == off.keys()
    for name in on:
        assert torch.equal(on[name], off[name]), name
    start = weights(make_engine(BiasMLP(), offload_config(True, bf16, overlap)))
    assert any(not torch.equal(on[n], start[n]) for n in on)  # training moved them


def test_every_moment_goes_up_and_back_once_per_device_update():
    engine = trained(offload_config(True))
    z = engine.strategy
    spans = engine.timeline.spans_frame()
    moment_bytes = 4 * 2 * sum(m.numel() for m in z.dm.values())  # fp32 m and v
    assert moment_bytes == z.moments.host_bytes
    buckets = len(z.moments.buckets)
    assert buckets > 1  # reduce_bucket_size 150 cuts this model's weights into several
    for op, lane in (("h2d_moments", "h2d"), ("d2h_moments", "d2h")):
        moved = spans[spans["op"] == op]
        assert set(moved["lane"]) == {lane}
        per_step = moved.groupby("step")["bytes"].agg(["sum", "count"])
        assert list(per_step.index) == list(range(STEPS))  # no warm-up: every step
        assert (per_step["sum"] == moment_bytes).all()
        assert (per_step["count"] == 2 * buckets).all()  # each bucket's m and its v
    plain = trained(offload_config(False)).timeline.spans_frame()
    assert not plain["op"].isin(["h2d_moments", "d2h_moments"]).any()


def test_the_device_holds_one_buckets_moments_at_a_time():
    z = trained(offload_config(True)).strategy
    largest = max(b.numel for b in z.moments.buckets)
    assert z.moments.staging.numel() == 2 * largest
    assert z.moments.staging.numel() < z.moments.host.numel()
    one = trained(offload_config(True, bucket=500_000_000)).strategy
    assert len(one.moments.buckets) == 1  # DeepSpeed's default bucket: all at once


def test_a_checkpoint_mid_window_resumes_exactly(tmp_path):
    data = list(itertools.islice(batches(), 10))
    whole = trained(offload_config(True, bf16=True), 10, iter(data))
    engine = make_engine(BiasMLP(), offload_config(True, bf16=True))
    train_steps(engine, iter(data[:7]), 7)  # mid-window, a selection at 4
    engine.save_checkpoint(tmp_path)
    engine.close()
    resumed = make_engine(BiasMLP(), offload_config(True, bf16=True))
    resumed.load_checkpoint(tmp_path)
    resumed = trained(None, 3, iter(data[7:]), engine=resumed)
    for name, value in weights(whole).items():
        assert torch.equal(weights(resumed)[name], value), name


def test_offload_without_overlap_comm_is_refused_naming_the_fix():
    cfg = offload_config(True)
    cfg["zero_optimization"]["overlap_comm"] = False
    with pytest.raises(ConfigError, match="overlap_comm") as err:
        load_config(cfg)
    assert "zero_optimization.zenflow.offload" in str(err.value)
    assert load_config(offload_config(True)).zenflow.offload is True


sizes = st.lists(st.integers(1, 50), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(sizes, st.integers(1, 120))
def test_buckets_follow_deepspeeds_rule(numels, bucket):
    """In order, a bucket closes as soon as its parameters reach `bucket` elements; the
    buckets cover the entries' moments end to end."""
    entries = [(f"w{i}", (n,), 3 * n) for i, n in enumerate(numels)]  # params > moments
    planned = plan_buckets(entries, bucket)
    assert [n for b in planned for n in b.names] == [e[0] for e in entries]
    offset = 0
    for i, b in enumerate(planned):
        counted = [3 * numels[int(n[1:])] for n in b.names]
        assert b.offset == offset and b.numel == sum(numels[int(n[1:])] for n in b.names)
        offset += b.numel
        assert sum(counted[:-1]) < bucket  # it did not close earlier
        if i < len(planned) - 1:
            assert sum(counted) >= bucket  # only the last may stay below


# -- the memory model and the simulator ---------------------------------------------------
def test_the_memory_estimate_moves_the_moments_to_the_host():
    from zfbench.core.models import get_model
    from zfbench.core.schedule import selected_elements
    from zfbench.real.memory import HEADROOM, estimate

    shape = get_model("tinyllama-1.1b")
    selected = selected_elements(shape.matrices(), sum(v.numel for v in shape.vectors()), 0.1)
    on_device = estimate(shape, "zenflow", 1, 64, 2, 0.1)
    offloaded = estimate(shape, "zenflow", 1, 64, 2, 0.1, moments_offloaded=True,
                         bucket_elems=shape.total_params)  # one bucket: all on the device
    assert offloaded.device_bytes == pytest.approx(on_device.device_bytes)
    assert offloaded.host_bytes - on_device.host_bytes == pytest.approx(
        8 * selected * HEADROOM)
    bucket = shape.total_params // 10
    small = estimate(shape, "zenflow", 1, 64, 2, 0.1, moments_offloaded=True,
                     bucket_elems=bucket)
    assert on_device.device_bytes - small.device_bytes == pytest.approx(
        8 * selected * 0.9 * HEADROOM)


def test_the_simulator_moves_the_moments_each_way_every_step():
    from zfbench.sims.costs import CostModel, SimSettings
    from zfbench.sims.simulator import simulate

    steps = 12
    runs = {off: simulate(SimSettings.from_knobs(steps=steps, offload=off), "zenflow")
            for off in (False, True)}
    settings = SimSettings.from_knobs(steps=steps, offload=True)
    cost = CostModel(settings, "zenflow")
    per_rank = 2 * 2 * cost.selected_params  # bf16 m and v, as DeepSpeed keeps them
    assert cost.offloaded_moment_bytes == per_rank
    spans = runs[True].timeline.spans_frame()
    for op, lane in (("h2d_moments", "h2d"), ("d2h_moments", "d2h")):
        moved = spans[spans["op"] == op]
        assert set(moved["lane"]) == {lane}
        per_step = moved.groupby(["rank", "step"])["bytes"].sum()
        assert len(per_step) == settings.machine.gpus * steps
        assert (per_step == per_rank).all()
    assert not runs[False].timeline.spans_frame()["op"].isin(["h2d_moments"]).any()
    durations = {off: (lambda f: (f.t_end_s - f.t_start_s).median())(
        r.timeline.steps_frame()) for off, r in runs.items()}
    moved = spans[spans["op"].isin(["h2d_moments", "d2h_moments"]) & (spans["rank"] == 0)]
    one_step = (moved.t_end_s - moved.t_start_s).groupby(moved["step"]).sum().median()
    # in line with the device update: a typical step grows by the two copies
    assert durations[True] - durations[False] == pytest.approx(one_step, rel=0.05)


def test_the_simulated_memory_moves_the_moments_to_the_host():
    from zfbench.sims.costs import CostModel, SimSettings

    plain = CostModel(SimSettings(), "zenflow").memory_per_rank("zenflow")
    cost = CostModel(SimSettings.from_knobs(offload=True), "zenflow")
    offloaded = cost.memory_per_rank("zenflow")
    moments = cost.offloaded_moment_bytes
    assert offloaded["host_bytes"] - plain["host_bytes"] == pytest.approx(
        cost.settings.machine.gpus * moments)  # one node: every rank keeps its own
    assert offloaded["device_bytes_per_rank"] < plain["device_bytes_per_rank"]
    assert plain["device_bytes_per_rank"] - offloaded["device_bytes_per_rank"] < moments


def test_the_runs_memory_check_reads_offload_from_the_config():
    from zfbench.core.config import load_config
    from zfbench.core.models import get_model
    from zfbench.real.memory import HEADROOM, MemoryCheck, offloaded_moment_bytes

    shape = get_model("tinyllama-1.1b").with_layers(1)
    needs = {}
    for off in (False, True):
        cfg = load_config(offload_config(off, bucket=500_000_000), world_size=2)
        check = MemoryCheck.of_configs({"zenflow": cfg}, 16, False, host_bytes=1e12,
                                       baseline=0.0)
        needs[off] = check.need(shape, "zenflow")
    moments = offloaded_moment_bytes(shape, "zenflow", ZF["topk_ratio"])
    assert needs[True].host_bytes - needs[False].host_bytes == pytest.approx(
        2 * moments * HEADROOM)  # each of the two ranks keeps its own
    assert needs[True].device_bytes == pytest.approx(needs[False].device_bytes)  # one bucket


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2000), st.integers(1, 700))
def test_ranged_buckets_cover_the_run_in_aligned_pieces(total, bucket):
    """ZeRO-3's buckets: consecutive, covering [0, total), each bound a multiple of ALIGN
    but the end, none longer than the bucket (or ALIGN)."""
    from zfbench.real.zenflow_offload import ALIGN, ranged_buckets
    pieces = ranged_buckets(total, bucket)
    assert sum(b.numel for b in pieces) == total
    assert [b.offset for b in pieces] == [sum(p.numel for p in pieces[:i])
                                          for i in range(len(pieces))]
    assert all(b.offset % ALIGN == 0 and 0 < b.numel <= max(ALIGN, bucket) for b in pieces)


def test_simulate_takes_the_offload_flag_on_zero2(capsys):
    """`--zenflow.offload true` is simulated on ZeRO-2 (the ZeRO-3 switch leaves it)."""
    from zfbench.simulate.command import main

    main(["--zenflow.offload", "true", "--strategy", "zenflow", "--steps", "12"])
    out = capsys.readouterr().out
    assert "moments offloaded" in out and "zenflow" in out.splitlines()[-1]


def test_on_zero3_the_simulator_moves_each_ranks_share_of_the_moments():
    from zfbench.sims.costs import CostModel, SimSettings
    from zfbench.sims.simulator import simulate

    steps = 12
    settings = SimSettings.from_knobs(steps=steps, offload=True, zero_stage=3)
    cost = CostModel(settings, "zenflow")
    per_rank = 2 * 2 * cost.selected_params / settings.machine.ranks  # bf16 m and v
    assert cost.offloaded_moment_bytes == pytest.approx(per_rank)
    spans = simulate(settings, "zenflow").timeline.spans_frame()
    for op in ("h2d_moments", "d2h_moments"):
        per_step = spans[spans["op"] == op].groupby(["rank", "step"])["bytes"].sum()
        assert len(per_step) == settings.machine.ranks * steps
        assert per_step.to_numpy() == pytest.approx(per_rank)
    plain = CostModel(SimSettings.from_knobs(zero_stage=3), "zenflow").memory_per_rank("zenflow")
    offloaded = cost.memory_per_rank("zenflow")
    assert offloaded["host_bytes"] - plain["host_bytes"] == pytest.approx(
        settings.machine.ranks * per_rank)
    assert offloaded["device_bytes_per_rank"] <= plain["device_bytes_per_rank"]
