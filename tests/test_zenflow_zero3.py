"""ZenFlow on ZeRO-3 (`zero_stage` 3, zfbench.sims.zenflow_zero3): its bytes per step
against the analytic count, its device memory against DeepSpeed's allocation and
documented ZeRO-3 estimate, its identity with ZeRO-2 on one GPU, and the simulate
command's choice of ZeRO-3 where ZeRO-2 does not fit (issue 48)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from zfbench.core.schedule import is_selection_step, is_warmup
from zfbench.sims import device_memory, zero3
from zfbench.sims.costs import CostModel, SimSettings, SimSettingsError
from zfbench.sims.settings import on_node
from zfbench.sims.simulator import simulate
from zfbench.simulate.command import main

SMALL = dict(model="qwen2.5-1.5b", layers=2, steps=12, zero_stage=3)


def per_step_bytes(result, rank: int = 0) -> dict[int, dict[str, float]]:
    spans = result.timeline.spans_frame()
    spans = spans[spans["rank"] == rank]
    return {t: g.groupby("op")["bytes"].sum().to_dict() for t, g in spans.groupby("step")}


@pytest.mark.parametrize("gpus,warm_up,select_interval", [(4, 0, 0), (4, 2, 4), (2, 1, 0),
                                                          (1, 0, 0)])
def test_bytes_per_step_are_the_analytic_count(gpus, warm_up, select_interval):
    """Every block all-gathered twice (forward, backward) and its gradient reduce-scattered
    once a step; the unselected 16-bit share down every step and up at a boundary; warm-up
    steps the whole share, down in fp32 and up in 16 bits; at a selection the column
    scores all-gathered (16-bit)."""
    s = SimSettings.from_knobs(**SMALL, gpus=gpus, full_warm_up_rounds=warm_up,
                               select_interval=select_interval)
    result = simulate(s, "zenflow")
    c = result.costs
    P, b, N = c.params, c.elem_bytes, gpus
    unselected = sum(round((bk.numel - bk.selected_numel) / N * b) for bk in c.buckets)
    whole_share_up = sum(round(bk.numel / N * b) for bk in c.buckets)
    whole_share_down = sum(round(bk.numel / N * 4) for bk in c.buckets)  # fp32 wire
    scores = sum(m.cols for m in c.shape.matrices()) * b
    seen_boundary = seen_plain = 0
    for t, moved in per_step_bytes(result).items():
        warm = is_warmup(t, warm_up)
        boundary = c.is_boundary(t)
        want = {"d2h_grad": whole_share_down if warm else unselected,
                "h2d_param": whole_share_up if warm else (unselected if boundary else 0)}
        if N > 1:
            want["allgather"] = 2 * P * b + (
                scores if not warm and is_selection_step(t, warm_up, select_interval) else 0)
            want["reduce_scatter"] = P * b
        got = {op: moved.get(op, 0) for op in want}
        assert got == want, t
        assert set(moved) - set(want) <= {"forward", "backward", "select", "device_optim",
                                          "host_accum", "host_optim", "host_clip",
                                          "host_convert"}
        seen_boundary += boundary and not warm
        seen_plain += not boundary
        # the cost model's own count (the figure and docs read it) agrees
        ops = {"d2h": "d2h_grad", "h2d": "h2d_param", "allgather": "allgather",
               "reduce_scatter": "reduce_scatter"}
        counted = zero3.zenflow_bytes_per_step(
            c, boundary, is_selection_step(t, warm_up, select_interval) and not warm, warm)
        assert {ops[k]: v for k, v in counted.items() if ops[k] in want} == got
    assert seen_boundary and seen_plain


@hsettings(max_examples=6, deadline=None)
@given(model=st.sampled_from(["tiny", "opt-350m", "qwen2.5-0.5b"]),
       layers=st.integers(1, 2), topk=st.sampled_from([0.05, 0.1, 0.3]),
       interval=st.integers(1, 4), overlap=st.booleans())
def test_on_one_gpu_zero3_is_zero2(model, layers, topk, interval, overlap):
    """On one GPU a partition is the whole model and nothing is gathered: ZeRO-3's
    ZenFlow steps take exactly ZeRO-2's times."""
    base = SimSettings.from_knobs(model=model, layers=layers, gpus=1, steps=3 * interval + 4,
                                  topk_ratio=topk, update_interval=interval, overlap_step=overlap)
    two = simulate(base, "zenflow").timeline.steps_frame()["wall_s"]
    three = simulate(base.with_(zero_stage=3), "zenflow").timeline.steps_frame()["wall_s"]
    assert list(three) == pytest.approx(list(two), rel=1e-12, abs=1e-15)


def test_zero3_moves_more_over_the_network_than_zero2():
    """Per step ZeRO-3 moves two all-gathers and a reduce-scatter of the model (3 model
    sizes through each rank's ring); ZeRO-2's ZenFlow all-reduces it (2) and all-gathers
    it once a window (1/U): with U = 4, 3 against 2.25 model sizes a step."""
    s = SimSettings.from_knobs(**{**SMALL, "zero_stage": 2}, gpus=4)

    def ring_model_sizes(strategy_settings) -> float:
        spans = simulate(strategy_settings, "zenflow").timeline.spans_frame()
        net = spans[(spans["lane"] == "net") & (spans["rank"] == 0)]
        weight = net["op"].map({"allreduce": 2.0}).fillna(1.0)  # a ring all-reduce: RS + AG
        return float((net["bytes"] * weight).sum()) / CostModel(s, "zenflow").model_bytes

    two, three = ring_model_sizes(s), ring_model_sizes(s.with_(zero_stage=3))
    assert three == pytest.approx(3 * s.measurement.steps, rel=1e-3)  # the scores are a few kB
    assert two == pytest.approx(2 * s.measurement.steps + s.measurement.steps / 4, rel=1e-3)


def test_device_memory_is_deepspeeds_allocation():
    """The rank's 16-bit partition, ZeRO-3's working set (DeepSpeed's defaults: the
    largest module's parameters and gradient, `prefetch_buckets` blocks up to
    stage3_max_live_parameters, one reduce bucket), the activations, and 4 16-bit copies
    of each selected element of the partition; ZeRO-2's ZenFlow holds the whole model
    and gradient and the selected state for every selected element."""
    for gpus, prefetch in ((8, 1), (4, 2), (1, 1)):
        s = SimSettings.from_knobs(**on_node("h100-8x-gen5", {"model": "llama2-13b", "gpus": gpus,
                                                   "prefetch_buckets": prefetch}))
        c3 = CostModel(s.with_(zero_stage=3), "zenflow")
        c2 = CostModel(s, "zenflow")
        P, b, sel, act = c3.params, 2, c3.selected_params, c3.activation_bytes()
        M = device_memory.largest_module_numel(c3.shape)
        layer = max(bk.numel for bk in c3.buckets)
        working = (M + min(prefetch * layer, 1_000_000_000)) * b \
            + (min(500_000_000, P) + M) * b
        want3 = P / gpus * b + working + act + sel / gpus * 4 * b
        got3 = c3.memory_per_rank("zenflow")["device_bytes_per_rank"]
        assert got3 == pytest.approx(want3, rel=1e-12)
        got2 = c2.memory_per_rank("zenflow")["device_bytes_per_rank"]
        assert got2 == pytest.approx(2 * P * b + 12 * sel + act, rel=1e-12)
        # stage 3 saves the partitioned parameters, the whole gradient (less the working
        # set) and the selected state of the other ranks' partitions
        saved = (P - P / gpus) * b + (P * b - working) + (12 * sel - sel / gpus * 4 * b)
        assert got2 - got3 == pytest.approx(saved, rel=1e-9)
        assert got3 < got2
        # the host holds the same optimizer state either way
        assert c3.memory_per_rank("zenflow")["host_bytes"] == \
            c2.memory_per_rank("zenflow")["host_bytes"]


def deepspeed_case3_bytes(shape, gpus: int) -> int:
    """DeepSpeed's documented ZeRO-3 model-state estimate per GPU with offload_param none
    and offload_optimizer cpu (ZenFlow's placement): largest_layer_memory + 2 x params /
    total GPUs, largest_layer_memory = 4 x the largest module's own parameters
    (https://deepspeed.readthedocs.io/en/latest/memory.html, "ZeRO-3", case 3;
    deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_live)."""
    biases = {v.name: v.numel for v in shape.vectors()}
    largest = max(m.numel + biases.get(f"{m.name}.bias", 0) for m in shape.matrices())
    return 4 * largest + int(2 * shape.total_params / gpus)


def largest_depth(fits, most: int) -> int:
    """The largest depth in 0..most that `fits` (monotone), by bisection."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


# llama2-70b's width (Llama-2-70b-hf's config.json), deep enough to fill 8 x 80 GB.
WIDE = "llama:layers=800,hidden=8192,heads=64,kv_heads=8,ffn=28672,vocab=32000"


def test_largest_model_per_gpu_against_deepspeeds_zero3_estimate():
    """On one 80 GB H100 (and on 8), the deepest model of llama2-70b's width the memory
    model fits on ZeRO-3 against DeepSpeed's documented estimate plus what it leaves out
    (activations, ZenFlow's selected state): DeepSpeed's model states are exactly part of
    ours, and ours fits at most as deep, short by no more than the layers DeepSpeed's
    default buffers beside them take (prefetched blocks up to stage3_max_live_parameters,
    one reduce bucket: both at most 1.5e9 16-bit elements)."""
    depths = {}
    for gpus in (1, 8):
        base = on_node("h100-8x-gen5", {"model": WIDE, "gpus": gpus, "zero_stage": 3,
                                        "layers": 1})
        cap = CostModel(SimSettings.from_knobs(**base), "zenflow").node.gpu.memory_bytes

        def ours(layers: int) -> float:
            return CostModel(SimSettings.from_knobs(**{**base, "layers": layers}), "zenflow") \
                .memory_per_rank("zenflow")["device_bytes_per_rank"]

        def theirs(layers: int) -> float:
            c = CostModel(SimSettings.from_knobs(**{**base, "layers": layers}), "zenflow")
            return (deepspeed_case3_bytes(c.shape, gpus) + c.activation_bytes()
                    + c.share(c.selected_params) * zero3.ZENFLOW_SELECTED_COPIES * 2)

        for layers in (1, 10, 40):
            c = CostModel(SimSettings.from_knobs(**{**base, "layers": layers}), "zenflow")
            buffers = (min(max(bk.numel for bk in c.buckets), 1_000_000_000)
                       + min(500_000_000, c.params)) * 2
            assert ours(layers) - theirs(layers) == pytest.approx(buffers, rel=1e-9)
        deepest = largest_depth(lambda n: n == 0 or ours(n) <= cap, 800)
        deepest_ds = largest_depth(lambda n: n == 0 or theirs(n) <= cap, 800)
        per_layer = (theirs(20) - theirs(10)) / 10
        assert deepest <= deepest_ds <= deepest + 1.5e9 * 2 / per_layer + 1
        depths[gpus] = deepest
    # a layer is 0.86 G parameters, 2 B each in the partition and 8 B a selected element
    # (a tenth): one 80 GB GPU holds under 40 of them, not llama2-70b's 80; eight GPUs
    # all 80 and, the working set not partitioned, up to 8 times one GPU's depth
    assert 20 <= depths[1] < 40 and 80 < depths[8] <= 8 * depths[1]


def test_llama2_70b_on_eight_h100_needs_zero3():
    knobs = on_node("h100-8x-gen5", {"model": "llama2-70b"})
    two = CostModel(SimSettings.from_knobs(**knobs), "zenflow").fits("zenflow")
    three = CostModel(SimSettings.from_knobs(**knobs, zero_stage=3), "zenflow").fits("zenflow")
    assert not two["fits"] and three["fits"]
    assert two["device_bytes_per_rank"] > 2 * 68.9e9 * 2  # the whole model and gradient
    assert three["device_bytes_per_rank"] < 40 * 2 ** 30


def test_simulate_answers_llama2_70b_with_zenflow_on_zero3_and_says_so(tmp_path, capsys):
    # four of its layers fit ZeRO-2: no note, stage 2
    assert main(["--model", "llama2-70b", "--node", "h100-8x-gen5", "--strategy", "zenflow",
                 "--layers", "4", "--steps", "12", "--quiet"]) == 0
    assert "ZeRO-3" not in capsys.readouterr().out
    assert main(["--model", "llama2-70b", "--node", "h100-8x-gen5", "--strategy", "zenflow",
                 "--steps", "12", "--quiet", "--out", str(tmp_path / "whole")]) == 0
    printed = capsys.readouterr().out
    notes = [line for line in printed.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "on ZeRO-2 does not fit" in notes[0] \
        and "simulated on ZeRO-3" in notes[0]
    head = json.loads((tmp_path / "whole" / "summary.json").read_text())
    assert head["settings"]["zero_stage"] == 3 and head["notes"] == notes
    # --zero-stage 2 asked for: no switch, and one named strategy that cannot fit fails
    assert main(["--model", "llama2-70b", "--node", "h100-8x-gen5", "--strategy", "zenflow",
                 "--zero-stage", "2", "--steps", "12", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "zenflow does not fit" in err and "--zero-stage 3" in err
    # without a node preset the summary's settings still record the stage simulated
    assert main(["--model", "llama2-70b", "--gpu", "h100-sxm", "--gpus", "8", "--strategy",
                 "zenflow", "--host", "xeon-8480-spr", "--steps", "12", "--quiet", "--out",
                 str(tmp_path / "bare")]) == 0
    head = json.loads((tmp_path / "bare" / "summary.json").read_text())
    assert head["settings"]["zero_stage"] == 3 and len(head["notes"]) == 1


@pytest.mark.parametrize("argv,needle", [
    (["--zero-stage", "4"], "zero_stage must be one of 2, 3"),
    (["--zero-stage", "3", "--strategy", "zero-offload"], "--zero-stage 3 applies to zenflow"),
    (["--zero-stage", "3", "--transfers", "shipped"], "zero_stage 3 simulates"),
])
def test_bad_zero_stage_is_one_clear_error(argv, needle, capsys):
    assert main(["--model", "tiny", "--steps", "12", "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_the_schedule_gathers_each_block_twice_before_its_ops():
    """Each forward and backward op of a block runs after that block's all-gather of its
    step (prefetch 1: issued one op ahead), and the step's first gather before it starts
    computing."""
    s = SimSettings.from_knobs(**SMALL, gpus=4)
    spans = simulate(s, "zenflow").timeline.spans_frame()
    spans = spans[(spans["rank"] == 0) & (spans["step"] == 5)]
    gathers = spans[spans["op"] == "allgather"].sort_values("t_start_s")
    compute = spans[spans["op"].isin(["forward", "backward"])].sort_values("t_start_s")
    nb = len(CostModel(s, "zenflow").buckets)
    assert len(gathers) == len(compute) == 2 * nb
    assert (gathers["t_end_s"].to_numpy() <= compute["t_start_s"].to_numpy() + 1e-12).all()


@hsettings(max_examples=5, deadline=None)
@given(model=st.sampled_from(["opt-350m", "qwen2.5-0.5b", "tinyllama-1.1b"]),
       layers=st.integers(1, 3), gpus=st.sampled_from([2, 4, 8]),
       prefetch=st.integers(0, 2))
def test_a_step_is_never_shorter_than_its_compute_and_first_gather(model, layers, gpus,
                                                                   prefetch):
    """Nothing computes before a step's first all-gather (the first block's, for its
    forward: nothing is left to hide it behind), so every step lasts at least that
    gather plus the step's compute, whatever the prefetch."""
    s = SimSettings.from_knobs(model=model, layers=layers, gpus=gpus, steps=12, zero_stage=3,
                               prefetch_buckets=prefetch)
    result = simulate(s, "zenflow")
    c = result.costs
    spans, steps = result.timeline.spans_frame(), result.timeline.steps_frame()
    busy = spans[spans["lane"] == "compute"].assign(s=lambda f: f["t_end_s"] - f["t_start_s"])
    busy = busy.groupby(["rank", "step"])["s"].sum()
    first = c.allgather_s(zero3.bucket_bytes(c, 0))
    for _, row in steps.iterrows():
        assert row["wall_s"] >= busy[(row["rank"], row["step"])] + first - 1e-12
