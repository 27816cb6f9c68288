"""The census's curve of GEMM and attention seconds by size (zfbench.sims.op_curve): its
knots rebuilt from the committed H200 sweep, the sweep's rows reproduced within a stated
tolerance, the invariants (seconds never fall with size, efficiency in (0, 1] on every
preset GPU), and the cost model's blocks computed from it by hand."""

import csv
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from zfbench.core import hardware as hw
from zfbench.core.models import get_model
from zfbench.sims import compute_efficiency as ce
from zfbench.sims import op_curve as oc
from zfbench.sims.costs import CostModel, SimSettings

SWEEP = (Path(__file__).resolve().parents[1] / "bench" / "results" / "gpu" / "NVIDIA-H200" /
         "2026-11-27" / "op_efficiency")
PEAK = hw.get_gpu("h200").bf16_flops_per_s
# A row is bounded by the GPU, not by issuing it, at three of the sweep's launch floors
# (its stream of tiny kernels) or more; the spread of such rows around their size's median
# (forward against the two gradients, one model against another) stays within 25 %.
GPU_BOUND_FLOORS = 3.0
ROW_TOLERANCE = 0.25


def sweep_rows() -> list[dict]:
    with open(SWEEP / "op_efficiency.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def kind_of(row: dict) -> str:
    if row["kind"] == "attention":
        return ("attention_forward_backward" if row["op"].endswith("forward_backward")
                else "attention_forward")
    return row["kind"]


def test_bundled_knots_are_the_sweep_rebuilt():
    """zfbench/data/op_curve.json holds exactly what knots_from_rows makes of the
    committed sweep: per size the median seconds, non-decreasing."""
    rebuilt = oc.knots_from_rows(sweep_rows(), PEAK)
    bundled = oc.curve().knots
    assert set(rebuilt) == set(bundled) == set(oc.KINDS)
    for kind in oc.KINDS:
        assert len(rebuilt[kind]) == len(bundled[kind])
        for (x0, t0), (x1, t1) in zip(rebuilt[kind], bundled[kind]):
            assert x0 == pytest.approx(x1, rel=1e-12) and t0 == pytest.approx(t1, rel=1e-12)
    assert oc.curve().gpu == "h200"


def test_knots_by_hand():
    """Three rows of one size and one of a larger, faster one: the median, then the
    larger size held at the smaller's seconds (a bigger op never takes less)."""
    rows = [{"kind": "gemm", "op": "a", "flops": 1e9, "seconds": s} for s in (3e-5, 1e-5, 2e-5)]
    rows += [{"kind": "gemm", "op": "b", "flops": 4e9, "seconds": 1.5e-5},
             {"kind": "attention", "op": "sdpa.forward", "flops": 2e9, "seconds": 5e-5},
             {"kind": "attention", "op": "sdpa.forward_backward", "flops": 7e9, "seconds": 9e-5},
             {"kind": "elementwise", "op": "add", "flops": 0.0, "seconds": 1e-6}]
    knots = oc.knots_from_rows(rows, 1e15)
    assert knots["gemm"] == ((1e-6, 2e-5), (4e-6, 2e-5))
    assert knots["attention_forward"] == ((2e-6, 5e-5),)
    assert knots["attention_forward_backward"] == ((7e-6, 9e-5),)


def test_curve_reproduces_the_sweeps_gpu_bound_rows():
    """Every GEMM and attention row the GPU bounds (module constants: 193 of the sweep's
    rows, the widest miss 24 %, a llama2-7b weight gradient at 512 tokens) is within
    ROW_TOLERANCE of the curve at its size."""
    floor = json.loads((SWEEP / "op_efficiency.json").read_text())["references"][
        "launch_floor_s_per_op"]
    curve = oc.curve()
    checked = 0
    for row in sweep_rows():
        if row["kind"] == "elementwise" or float(row["seconds"]) < GPU_BOUND_FLOORS * floor:
            continue
        got = curve.seconds(kind_of(row), float(row["flops"]) / PEAK)
        assert got == pytest.approx(float(row["seconds"]), rel=ROW_TOLERANCE), row
        checked += 1
    assert checked == 193


def test_curve_between_and_beyond_its_knots():
    """Log-linear between knots (the geometric mean at the geometric middle), the first
    knot's seconds below the sweep, the last knot's efficiency above it."""
    curve = oc.curve()
    (x0, t0), (x1, t1) = curve.knots["gemm"][-2:]
    assert curve.seconds("gemm", math.sqrt(x0 * x1)) == pytest.approx(math.sqrt(t0 * t1))
    first = curve.knots["gemm"][0]
    assert curve.seconds("gemm", first[0] / 10) == first[1]
    assert curve.seconds("gemm", 10 * x1) == pytest.approx(10 * t1)
    assert curve.seconds("gemm", 0.0) == 0.0


@hsettings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(oc.KINDS), a=st.floats(1e-9, 1.0), b=st.floats(1e-9, 1.0),
       gpu=st.sampled_from(sorted(hw.gpu_names())))
def test_seconds_never_fall_with_size_and_efficiency_is_at_most_one(kind, a, b, gpu):
    small, large = sorted((a, b))
    curve = oc.curve()
    assert 0 < curve.seconds(kind, small) <= curve.seconds(kind, large)
    g = hw.get_gpu(gpu)
    peak = g.peak_flops_per_s("fp16")
    flops = large * peak
    seconds = oc.op_s(kind, flops, peak, oc.share_scale(g))
    assert 0 < flops / (peak * seconds) <= g.matmul_achievable_share <= 1


def test_share_scale_carries_the_curve_by_sourced_matmul_shares():
    """The H200 and the H100 SXM (the same Hopper die) run the curve as measured; an A100
    at the same seconds at peak takes 0.803 / 0.869 of it, a V100 0.803 / 0.664."""
    assert oc.share_scale(hw.get_gpu("h200")) == 1.0
    assert oc.share_scale(hw.get_gpu("h100-sxm")) == 1.0
    assert oc.share_scale(hw.get_gpu("a100-80g")) == pytest.approx(0.803 / 0.869)
    assert oc.share_scale(hw.get_gpu("v100-sxm3-32g")) == pytest.approx(0.803 / 0.664)


@hsettings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["qwen2.5-1.5b", "llama2-7b", "opt-1.3b"]),
       seq=st.sampled_from([256, 1024, 2048]), micro_batch=st.integers(1, 8),
       checkpointing=st.booleans())
def test_block_seconds_grow_with_the_batch_and_backward_outweighs_forward(
        model, seq, micro_batch, checkpointing):
    shape = get_model(model)
    scale = oc.share_scale(hw.get_gpu("a100-80g"))
    for block in shape.blocks()[:2] + shape.blocks()[-1:]:
        one = oc.block_matrix_s(shape, block, seq, micro_batch, checkpointing, 312e12, scale)
        more = oc.block_matrix_s(shape, block, seq, micro_batch + 1, checkpointing, 312e12,
                                 scale)
        assert one[0] <= more[0] and one[1] <= more[1]
        assert one[1] >= one[0] >= 0


def test_a_llama_layer_by_hand():
    """llama2-7b's layer at 2 x 1024 tokens on an H200: seven GEMMs (q, k, v, o of 4096^2,
    gate, up, down of 4096 x 11008), each once forward and twice backward, and causal SDPA
    (forward 2 x 32 heads x 1024^2 x 128 x 2 sequences; forward + backward 3.5 x that)."""
    shape = get_model("llama2-7b")
    layer = shape.blocks()[1]
    curve = oc.curve()
    gemm = 4 * curve.seconds("gemm", 2 * 2048 * 4096 * 4096 / PEAK) + 3 * curve.seconds(
        "gemm", 2 * 2048 * 4096 * 11008 / PEAK)
    attn = 2 * 32 * 1024 ** 2 * 128 * 2
    fwd_attn = curve.seconds("attention_forward", attn / PEAK)
    both = curve.seconds("attention_forward_backward", 3.5 * attn / PEAK)
    fwd, bwd = oc.block_matrix_s(shape, layer, 1024, 2, False, PEAK, 1.0)
    assert fwd == pytest.approx(gemm + fwd_attn)
    assert bwd == pytest.approx(2 * gemm + both - fwd_attn)
    assert oc.block_matrix_s(shape, layer, 1024, 2, True, PEAK, 1.0)[1] == pytest.approx(
        bwd + fwd)  # checkpointing recomputes the forward
    # a GPT-2 (Megatron-LM v1) layer's scores are batched matmuls on the GEMM curve
    gpt2 = get_model("gpt2:layers=2,hidden=1024,heads=16")
    f, b = oc.attention_s(gpt2, gpt2.blocks()[1], 512, 3, PEAK, 1.0)
    one = curve.seconds("gemm", 2 * 3 * 16 * 512 * 512 * 64 / PEAK)
    assert (f, b) == (pytest.approx(2 * one), pytest.approx(4 * one))


def test_a_tied_head_still_costs_its_vocabulary_projection():
    """qwen2.5-1.5b ties its LM head to the embedding: the head block has no lm_head
    matrix, its projection's FLOPs are one GEMM all the same; the embedding has none."""
    shape = get_model("qwen2.5-1.5b")
    head, embed = shape.blocks()[-1], shape.blocks()[0]
    assert oc.gemm_flops(head, 1024) == [pytest.approx(2 * 1024 * shape.vocab * shape.hidden)]
    assert oc.gemm_flops(embed, 1024) == []


def test_preset_cost_model_blocks_are_the_census():
    """From presets (no --mfu, no measured MFU, no profile) a block's compute is its curve
    seconds plus its elementwise bytes at HBM bandwidth, where the launch floor does not
    bind; the cost model's MFU is FLOPs over peak times those seconds."""
    s = SimSettings.from_knobs(gpu="a100-80g", model="llama2-7b", micro_batch=2, seq=1024,
                               steps=2, dispatch_s_per_kernel=0.0)
    c = CostModel(s)
    gpu = hw.get_gpu("a100-80g")
    scale = oc.share_scale(gpu)
    for bucket, block in zip(c.buckets, c.shape.blocks()):
        fwd, bwd = oc.block_matrix_s(c.shape, block, 1024, 2, True, 312e12, scale)
        moved = ce.block_traffic(c.shape, block, 1024, 2, True)
        assert bucket.forward_s == pytest.approx(fwd + moved.forward_bytes / gpu.hbm_bytes_per_s)
        assert bucket.backward_s == pytest.approx(bwd + moved.backward_bytes / gpu.hbm_bytes_per_s)
    flops = 4 * sum(b.forward_flops(1024, 2) for b in c.shape.blocks())
    assert c.mfu == pytest.approx(flops / (312e12 * sum(b.forward_s + b.backward_s
                                                        for b in c.buckets)))
    assert 0 < c.mfu < c.gemm_efficiency < gpu.matmul_achievable_share
