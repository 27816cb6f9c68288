"""A DeepSpeed run's `overlap_comm` and activation recomputation carried from its saved
config into the simulated settings of bench/predict_deepspeed.py (DeepSpeed's defaults
where the keys are absent), and the fit recovering a known node's compute from a log
written as DeepSpeed would time that node's step."""

import copy
import json

import pytest

from bench_helpers import ROOT, bench_module
from zfbench.predict import inputs as predict_inputs
from zfbench.predict.fit import Scales, baseline_parts, infer, on_hardware_file, write_hardware
from zfbench.sims.costs import CostModel, SimSettings

pdd = bench_module("predict_deepspeed")
H200_RUNS = ROOT / "bench/results/gpu/NVIDIA-H200/2026-11-28/call2/deepspeed_side/deepspeed"
SMALL = dict(model="gpt2:layers=2,hidden=512,heads=8", micro_batch=1, seq=256,
             precision="bf16", gpus=1, gpus_per_switch=1, transfers="shipped")


def _zero_offload_run() -> dict:
    runs = json.loads((H200_RUNS / "summary.json").read_text())["runs"]
    return copy.deepcopy(next(r for r in runs if r["engine"] == "zero_offload"))


def test_absent_keys_take_deepspeeds_defaults():
    """The committed H200 config (stage 2, no overlap_comm, a model that recomputes
    nothing) simulates with both off; a stage-3 config without the key has it on."""
    run = _zero_offload_run()
    zero = run["deepspeed_config"]["zero_optimization"]
    assert "overlap_comm" not in zero and zero["stage"] == 2
    assert "activation_checkpointing" not in run
    knobs = pdd.shape_knobs(run)
    assert knobs["overlap_comm"] is False and knobs["activation_checkpointing"] is False
    runtime = SimSettings.from_knobs(**knobs).runtime
    assert (runtime.overlap_comm, runtime.activation_checkpointing) == (False, False)
    zero["stage"] = 3
    assert pdd.overlap_comm(run) is True
    assert pdd.overlap_comm({}) is False  # DeepSpeed's stage default is 0


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("recompute", [True, False])
def test_the_saved_values_reach_the_settings(tmp_path, overlap, recompute):
    """A saved config's `overlap_comm` and the run's `activation_checkpointing` are the
    settings' (both the fit's and the prediction's come from these knobs), and a
    ZeRO-Offload run that differs from its ZenFlow run is refused."""
    run = _zero_offload_run()
    run["deepspeed_config"]["zero_optimization"]["overlap_comm"] = overlap
    run["activation_checkpointing"] = recompute
    knobs = on_hardware_file(pdd.shape_knobs(run), tmp_path / "presets.json")
    runtime = SimSettings.from_knobs(**knobs).runtime
    assert (runtime.overlap_comm, runtime.activation_checkpointing) == (overlap, recompute)
    other = copy.deepcopy(run)
    other["deepspeed_config"]["zero_optimization"]["overlap_comm"] = not overlap
    with pytest.raises(ValueError, match="overlap_comm"):
        pdd.predict_one(run, {"zenflow_overlap": other}, H200_RUNS, 4, 1.0, tmp_path)


def test_recompute_sets_the_compute_over_forward():
    """Pageable, the log's compute is its forward times the simulated compute over forward:
    larger with recomputation (backward redoes the forward) than without."""
    plain = SimSettings.from_knobs(**SMALL, pin_memory=False, activation_checkpointing=False)
    ckpt = plain.with_(activation_checkpointing=True)
    c = CostModel(ckpt)
    assert pdd.compute_over_forward(plain) < pdd.compute_over_forward(ckpt)
    assert pdd.compute_over_forward(ckpt) - pdd.compute_over_forward(plain) == \
        pytest.approx(sum(b.backward_s for b in c.buckets) / c.forward_s
                      - sum(b.backward_s for b in CostModel(plain).buckets)
                      / CostModel(plain).forward_s)


LOG_STEP = ("[Rank 0] time (ms) | optimizer_allgather: 0.05 | optimizer_gradients: 0.00 | "
            "optimizer_step: {opt}\n"
            "[Rank 0] time (ms) | fwd: {fwd} | bwd: {bwd} | bwd_inner: {inner} | "
            "bwd_allreduce: {red} | step: {step}\n")


@pytest.mark.parametrize("overlap", [True, False])
def test_the_fit_recovers_a_known_nodes_compute_from_a_log(tmp_path, overlap):
    """A pinned ZeRO-Offload step simulated without recomputation on a node of known MFU,
    written as DeepSpeed's timer lines (forward + bwd_inner the compute) and read back,
    is fitted to that MFU and its compute."""
    knobs = on_hardware_file(dict(SMALL, activation_checkpointing=False,
                                  overlap_comm=overlap), tmp_path / "presets.json")
    base = SimSettings.from_knobs(**knobs, steps=8)
    truth = Scales(mfu=0.25, d2h=1.5, host=1.3)
    node, _ = write_hardware(tmp_path / "truth.json", base, truth,
                             dict.fromkeys(("mfu", "d2h", "h2d", "host"), "test truth"))
    parts = baseline_parts(node)
    fwd = CostModel(node).forward_s
    ms = {k: 1e3 * v for k, v in parts.items()}
    step = LOG_STEP.format(opt=ms["stall_s"], fwd=1e3 * fwd, bwd=ms["compute_s"] - 1e3 * fwd,
                           inner=ms["compute_s"] - 1e3 * fwd, red=ms["d2h_s"],
                           step=ms["stall_s"] + ms["h2d_s"])
    log = tmp_path / "zero_offload.log"
    log.write_text(step * 3)
    measured = predict_inputs.read_deepspeed_log(log, skip=1)
    assert measured.compute_s == pytest.approx(parts["compute_s"])
    fits = [f for f in infer(base, measured, tmp_path) if f.reached]
    assert fits
    share = 0.005 * max(1.0, measured.step_s / measured.compute_s)
    assert fits[0].scales.mfu == pytest.approx(truth.mfu, rel=2 * share)
    assert fits[0].simulated["compute_s"] == pytest.approx(parts["compute_s"], rel=2 * share)
