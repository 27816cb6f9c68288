"""The host's optimizer threads on a GPU node (sims/host_step.py): sockets, core binding,
the calibrated CPU-Adam rates and the accumulation rate, with numbers."""

import pytest

from zfbench.core import hardware as hw
from zfbench.sims import host_step as hs
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.settings import SimSettingsError
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from zfbench.validate.published import bundled_path, measure, read_rows, row_settings


def test_numa_factor_by_hand():
    # unbound on 2 sockets: half the traffic remote at 0.6 -> 1 / (0.5 + 0.5/0.6) = 0.75
    assert hs.numa_factor(2, 64, 64, bound=False) == pytest.approx(0.75)
    # bound within one socket: all local
    assert hs.numa_factor(2, 64, 64, bound=True) == 1.0
    # bound over 80 cores of 64-core sockets: 16/80 remote -> 1 / (0.8 + 0.2/0.6)
    assert hs.numa_factor(2, 64, 80, bound=True) == pytest.approx(1 / (0.8 + 0.2 / 0.6))
    assert hs.numa_factor(1, 64, 64, bound=False) == 1.0


def test_binding_speeds_up_two_ranks_host_adam():
    """2 ranks on the 128-core Milan node: bound, each its own socket (local); unbound,
    4/3 as long in the host Adam (the blog's bound/unbound rows differ by 13-16 %)."""
    base = SimSettings.from_knobs(**node_knobs("a100-4x-gen4", 2), model="qwen2.5-3b", steps=3)
    bound, unbound = CostModel(base.with_(bind_cores=True)), CostModel(base)
    assert unbound.adam_units_per_core_s / bound.adam_units_per_core_s == pytest.approx(0.75)
    def adam_s(s):
        return measure(simulate(s, "zero-offload"), "host_adam_time_s", 1)
    ratio = adam_s(base) / adam_s(base.with_(bind_cores=True))
    assert ratio == pytest.approx(4 / 3, rel=0.02)


def test_profiled_lanes_ignore_binding():
    """A measured profile's rates are the machine's own: no NUMA factor is applied."""
    class Fake:  # only what numa_factor reads
        calibration = {"x": 1}
    assert CostModel.numa_factor.fget(Fake()) == 1.0


def test_presets_hold_the_rates_of_their_calibration_rows():
    """Each calibration row's arithmetic gives exactly the preset's value, and the row's
    own simulation then reproduces the row (so the two cannot drift apart)."""
    _, rows = read_rows(bundled_path())
    by_id = {r["id"]: r for r in rows}
    assert set(hs.CALIBRATION_ROWS) <= set(by_id)
    for rid, (host, field) in hs.CALIBRATION_ROWS.items():
        row = by_id[rid]
        s = row_settings(row)
        c = CostModel(s)
        other = 0.0  # a whole host step holds the clip and conversion passes too
        if row["metric"] == "host_step_time_s":
            other = hs.beside_adam_s(c.share(c.params), c.cores_per_rank, c.numa_factor,
                                     c.node.host.dram_bytes_per_s, c.gpus_per_node)
        rate = hs.calibrated_adam_rate(c.share(c.params), float(row["value"]),
                                       c.cores_per_rank, c.numa_factor, other)
        assert getattr(hw.get_host(host), field) == pytest.approx(rate, rel=1e-9)
        simulated = measure(simulate(s, row["strategy"]), row["metric"], 2)
        # the closed form shares DRAM equally among the node's ranks; with several GPUs
        # their host steps start a bucket's copy apart (ZeRO-2 partitions: each rank's
        # last copy is its own, sims/partitioning.py), so rank 0's is within 1%
        rel = 1e-6 if c.gpus == 1 else 1e-2
        assert simulated == pytest.approx(float(row["value"]), rel=rel)


def test_table4_rate_is_far_from_the_milan_rate():
    """One Adam rate per host: the Xeon 8168 (AVX-512) at 111 M/s per core locally, the
    Milan node 15.3 M/s per core in a full DeepSpeed step."""
    assert hw.get_host("xeon-8168").adam_params_per_s_per_core == pytest.approx(111.1e6, rel=1e-3)
    assert hw.get_host("epyc-7763-milan").adam_params_per_s_per_core == pytest.approx(
        16.35e6, rel=1e-3)


def test_accumulation_rate_does_not_follow_adam_rate():
    """Accumulation streams memory: its per-core rate is the same on hosts whose Adam
    rates differ 7x (up to the NUMA factor both see)."""
    a = CostModel(SimSettings.from_knobs(host="xeon-8168", gpus=1, host_cores=48))
    b = CostModel(SimSettings.from_knobs(gpus=1))
    assert a.adam_units_per_core_s / b.adam_units_per_core_s > 6.5
    assert a.accum_units_per_core_s == pytest.approx(b.accum_units_per_core_s)
    assert b.accum_units_per_core_s == pytest.approx(30 * 29.5e6 * 0.75)


def test_clip_and_conversion_by_hand():
    """The blog row's node: 1.6846e9 parameters per rank, 4 ranks on 307.2 GB/s of DRAM
    (2 x 204.8 x 0.75): 32 cores stream far more than a quarter of DRAM, so each pass
    runs at 76.8 GB/s per rank: clip 8 B and conversion 6 B per parameter."""
    part = 6_738_415_616 / 4
    want = part * 8 / 76.8e9 + part * 6 / 76.8e9
    assert want == pytest.approx(0.30709, rel=1e-4)
    assert hs.beside_adam_s(part, 32, 0.75, 307.2e9, 4) == pytest.approx(want, rel=1e-12)
    # one rank alone on 4 cores: core-bound, 4 x 8.85 GB/s x 0.75 for the clip
    assert hs.streaming_pass_s(1e9, 8, 4, 0.75, 307.2e9, 1) == pytest.approx(
        1e9 * 8 / (4 * 30 * 29.5e6 * 10 * 0.75))


def test_deepspeed_host_step_is_serial_after_adam():
    """From presets, ZeRO-Offload's step runs DeepSpeed's order on the host lane: clip,
    Adam, the blocking conversion over the whole partition, and only then the parameters
    go up (one copy): nothing goes up while Adam runs."""
    s = SimSettings.from_knobs(**node_knobs("a100-4x-gen4", 4), model="llama2-7b", steps=3)
    res = simulate(s, "zero-offload")
    spans = res.timeline.spans_frame()
    one = spans[(spans["rank"] == 0) & (spans["step"] == 2)]
    host = one[one["lane"] == "host"].sort_values("t_start_s")
    assert list(host["op"]) == ["host_clip", "host_optim", "host_convert"]
    assert (host["t_start_s"].values[1:] >= host["t_end_s"].values[:-1] - 1e-12).all()
    up = one[one["op"] == "h2d_param"]
    assert len(up) == 1 and up["t_start_s"].min() >= host["t_end_s"].max() - 1e-12
    part = res.costs.share(res.costs.params)
    # the clip and conversion passes stream 8 and 6 B per element at no less than a
    # quarter of the node's 307.2 GB/s (all 4 ranks streaming at once) and no more than
    # all of it (the ranks' host steps start a bucket's copy apart: sims/partitioning.py)
    for op, nbytes in (("host_clip", 8), ("host_convert", 6)):
        row = host[host["op"] == op]
        took = float((row["t_end_s"] - row["t_start_s"]).iloc[0])
        assert part * nbytes / 307.2e9 - 1e-9 <= took <= part * nbytes / 76.8e9 + 1e-9, op
    # the whole host step is the blog's 4.6 s (the calibration row's own setting; the
    # calibration's closed form assumes the 4 ranks' passes at once: within 1%)
    assert measure(res, "host_step_time_s", 1) == pytest.approx(4.6, rel=1e-2)


def test_zero_offload_gradients_go_down_as_fp32_from_presets():
    """DeepSpeed converts each gradient slice to fp32 on the device before the copy
    (GRAD_WIRE_BYTES = 4); zfbench's engine (a measured profile) sends it as 16-bit."""
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 4), model="tiny", precision="fp16", steps=3)
    c = CostModel(s)
    assert c.grad_wire_bytes == hs.GRAD_WIRE_BYTES == 4
    for strategy in ("zero-offload", "zero-offload-dpu"):
        spans = simulate(s, strategy).timeline.spans_frame()
        down = spans[(spans["rank"] == 0) & (spans.step == 2) & (spans.op == "d2h_grad")]
        assert down.bytes.sum() == pytest.approx(c.params / 4 * 4, abs=len(c.buckets))

    class Fake:  # only what grad_wire_bytes reads
        deepspeed_host_step = False
        elem_bytes = 2
    assert CostModel.grad_wire_bytes.fget(Fake()) == 2


def test_fused_tiles_cover_the_partition():
    assert hs.fused_tiles(2.5 * hs.FUSED_TILE_ELEMS) == [hs.FUSED_TILE_ELEMS] * 2 + [
        0.5 * hs.FUSED_TILE_ELEMS]
    assert hs.fused_tiles(hs.FUSED_TILE_ELEMS) == [hs.FUSED_TILE_ELEMS]
    assert sum(hs.fused_tiles(12345.0)) == 12345.0


@pytest.mark.parametrize("strategy", ["zero-offload", "zero-offload-dpu"])
def test_fused_upload_sends_each_tile_while_the_next_tiles_adam_runs(monkeypatch, strategy):
    """DeepSpeed 0.3-0.8's fp16 CPU-Adam (fused_param_upload): per tile, Adam then its
    fp32 parameters up; no conversion pass; a tile's Adam waits for the upload of the
    tile two before it (two buffers); the gradients and the step otherwise as before."""
    s = SimSettings.from_knobs(**node_knobs("dgx2-v100", 2), model="tinyllama-1.1b", precision="fp16",
                               fused_param_upload=True, steps=3)
    res = simulate(s, strategy)
    part = res.costs.share(res.costs.params)
    monkeypatch.setattr(hs, "FUSED_TILE_ELEMS", int(part // 4) + 1)  # 4 tiles a step
    res = simulate(s, strategy)
    spans = res.timeline.spans_frame()
    one = spans[(spans["rank"] == 0) & (spans["step"] == 2)]
    adam = one[one["op"] == "host_optim"].sort_values("t_start_s")
    up = one[one["op"] == "h2d_param"].sort_values("t_start_s")
    assert "host_convert" not in set(one["op"]) and len(adam) == len(up) == 4
    assert up["bytes"].sum() == pytest.approx(part * hs.FUSED_WIRE_BYTES, abs=8)
    a_end, u_start, u_end = (adam["t_end_s"].values, up["t_start_s"].values,
                             up["t_end_s"].values)
    a_start = adam["t_start_s"].values
    assert (u_start >= a_end - 1e-12).all()  # a tile goes up after its Adam
    assert (a_start[2:] >= u_end[:2] - 1e-12).all()  # its buffer: the tile two before is up
    assert u_start[0] < a_end[1]  # the first tile is on its way while the second's Adam runs


def test_fused_upload_is_an_fp16_setting():
    with pytest.raises(SimSettingsError, match="fused_param_upload.*fp16"):
        SimSettings.from_knobs(**node_knobs("a100-4x-gen4", 4), model="tiny", fused_param_upload=True)


def test_fused_upload_column_of_the_published_rows():
    """The papers' fp16 offload rows (2020-2021) ran DeepSpeed 0.3's fused CPU-Adam; Table
    4's CPU-Adam microbenchmark (no upload), the blogs' bf16 rows and the other strategies
    do not set it, and a row of another strategy that sets it is unsupported."""
    from zfbench.validate.published import Unsupported
    _, rows = read_rows(bundled_path())
    for row in rows:
        fused = row["precision"] == "fp16" and row["strategy"] in (
            "zero-offload", "zero-offload-dpu") and row["metric"] != "host_adam_time_s"
        assert row["fused_param_upload"] == ("true" if fused else ""), row["id"]
        if fused:
            assert row_settings(row).runtime.fused_param_upload and row["precision"] == "fp16"
    pt = next(r for r in rows if r["id"] == "zo-fig14-b1-pt")
    with pytest.raises(Unsupported, match="fused_param_upload.*leave it empty for device"):
        row_settings({**pt, "fused_param_upload": "true"})


def test_deepspeeds_zenflow_pinning_gives_its_host_work_the_unreserved_cores():
    """`pt_reserved_cores_perc` (from presets): ZenFlow's host work on the cores
    DeepSpeed's `_split_affinity` leaves a rank, local to its socket; every other strategy
    and the design (None) keep all the rank's cores."""
    from zfbench.core.config_zenflow import split_cores  # the engine's rule too

    def zenflow_optimizer_cores(cores, reserved):
        return split_cores(cores, reserved)[1]
    assert zenflow_optimizer_cores(32, 0.5) == 16
    assert zenflow_optimizer_cores(32, 0.3) == 22  # training keeps ceil(9.6) = 10
    assert zenflow_optimizer_cores(32, 0.0) == 32  # nothing reserved: both share all
    assert zenflow_optimizer_cores(32, 1.0) == 32
    assert zenflow_optimizer_cores(1, 0.5) == 1
    base = SimSettings.from_knobs(**node_knobs("a100-4x-gen4", 4), model="llama2-7b", steps=12)
    pinned = base.with_(pt_reserved_cores_perc=0.5)
    zf = CostModel(pinned, "zenflow")
    assert zf.cores_per_rank == 16 and zf.numa_factor == 1.0  # 128 cores / 4 ranks / 2
    design = CostModel(base, "zenflow")
    assert design.cores_per_rank == 32 and design.numa_factor == pytest.approx(0.75)
    assert CostModel(pinned, "zero-offload").cores_per_rank == 32
    # the window's host Adam: half the cores at the local rate, 2 x 0.75 = 1.5x as long
    def adam_s(s):  # host AdamW's busy time over the windows after warm-up
        spans = simulate(s, "zenflow").timeline.spans_frame()
        adam = spans[(spans["op"] == "host_optim") & (spans["step"] >= 4)
                     & (spans["rank"] == 0)]
        return adam["duration_s"].sum()
    assert adam_s(pinned) / adam_s(base) == pytest.approx(1.5, rel=0.02)
    with pytest.raises(SimSettingsError, match="pt_reserved_cores_perc"):
        base.with_(pt_reserved_cores_perc=1.5)
