"""A DeepSpeed run's `pin_memory` carried into the simulated settings
(bench/predict_deepspeed.py), the log's in-backward copies moved out of its compute, the
fit's pageable case (zfbench.predict.fit `PAGEABLE`) and the link's staging-copy rate."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from bench_helpers import ROOT, bench_module
from zfbench.core import hardware
from zfbench.predict import inputs as predict_inputs
from zfbench.predict.fit import PAGEABLE, Breakdown, Scales, baseline_parts, infer, \
    on_hardware_file, write_hardware
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.simulator import simulate

pdd = bench_module("predict_deepspeed")
H200_RUNS = ROOT / "bench/results/gpu/NVIDIA-H200/2026-11-28/call2/deepspeed_side/deepspeed"
CPU_RUNS = ROOT / "bench/results/predict_deepspeed"
SMALL = dict(model="gpt2:layers=2,hidden=512,heads=8", micro_batch=1, seq=256,
             precision="bf16", gpus=1, gpus_per_switch=1, transfers="shipped")


def _runs(folder: Path) -> list[dict]:
    return json.loads((folder / "summary.json").read_text())["runs"]


def test_the_saved_h200_config_reaches_the_settings_as_pageable():
    """The H200 runs' configs say `offload_optimizer.pin_memory: false` on cuda: the knobs
    and the settings built from them carry it, for the ZeRO-Offload and the ZenFlow runs."""
    for run in _runs(H200_RUNS):
        zero = run["deepspeed_config"]["zero_optimization"]
        assert run["device"] == "cuda" and zero["offload_optimizer"]["pin_memory"] is False
        knobs = pdd.shape_knobs(run)
        assert knobs["pin_memory"] is False
        base = SimSettings.from_knobs(**knobs)
        assert base.runtime.pin_memory is False and CostModel(base).pageable_copies


def test_cuda_default_and_cpu_accelerator():
    """On cuda a config without the key takes DeepSpeed 0.19.5's default (true); the CPU
    accelerator's runs are pinned whatever their config says (no link)."""
    run = {"device": "cuda", "deepspeed_config": {"zero_optimization": {
        "offload_optimizer": {"device": "cpu"}}}}
    assert pdd.pin_memory(run) is True
    run["deepspeed_config"]["zero_optimization"]["offload_optimizer"]["pin_memory"] = False
    assert pdd.pin_memory(run) is False
    assert pdd.pin_memory({**run, "device": "cpu"}) is True
    assert pdd.pin_memory({k: v for k, v in run.items() if k != "device"}) is True


def test_cpu_accelerator_runs_simulate_as_before(tmp_path):
    """The committed CPU-accelerator runs (configs with pin_memory false, no device) give
    the settings they gave without the knob, and their log is read as before."""
    for run in _runs(CPU_RUNS):
        assert run["deepspeed_config"]["zero_optimization"]["offload_optimizer"][
            "pin_memory"] is False
        knobs = on_hardware_file(pdd.shape_knobs(run), tmp_path / "presets.json")
        assert knobs["pin_memory"] is True
        plain = {k: v for k, v in knobs.items() if k != "pin_memory"}
        assert SimSettings.from_knobs(**knobs) == SimSettings.from_knobs(**plain)
        assert pdd.compute_over_forward(SimSettings.from_knobs(**knobs)) is None


@hsettings(max_examples=40, deadline=None)
@given(fwd=st.floats(1.0, 100.0), bwd=st.floats(0.0, 900.0), allreduce=st.floats(0.0, 90.0),
       ratio=st.floats(1.0, 6.0))
def test_pageable_split_moves_only_backward_copies(fwd, bwd, allreduce, ratio):
    """The compute is the forward times the ratio (at most forward + `bwd_inner`), what it
    gives up joins d2h, h2d and the stall stay, and the step's sum is unchanged."""
    timers = {"fwd": fwd, "bwd_inner": bwd, "bwd_allreduce": allreduce,
              "step": 500.0, "optimizer_step": 400.0}
    plain = predict_inputs._deepspeed_parts(timers)
    paged = predict_inputs._deepspeed_parts(timers, ratio)
    assert paged["compute_s"] == pytest.approx(min(fwd * ratio, fwd + bwd) / 1e3)
    assert paged["compute_s"] + paged["d2h_s"] == pytest.approx(
        plain["compute_s"] + plain["d2h_s"])
    assert (paged["h2d_s"], paged["stall_s"]) == (plain["h2d_s"], plain["stall_s"])
    assert paged["d2h_s"] >= plain["d2h_s"]


def test_compute_over_forward_is_the_cost_models():
    base = SimSettings.from_knobs(**SMALL, pin_memory=False)
    c = CostModel(base)
    want = (c.forward_s + sum(b.backward_s for b in c.buckets)) / c.forward_s
    assert pdd.compute_over_forward(base) == pytest.approx(want)
    assert want > 1


def _with_staging(tmp_path: Path, rate: float | None, **over) -> SimSettings:
    knobs = on_hardware_file(dict(SMALL, **over), tmp_path / "presets.json")
    if rate is not None:
        data = json.loads(Path(knobs["hardware"]).read_text())
        (link,) = data["host_links"].values()
        link["staging_copy_bytes_per_s"] = {"value": rate, "source": "test"}
        Path(knobs["hardware"]).write_text(json.dumps(data))
    return SimSettings.from_knobs(**knobs, steps=8)


def test_a_links_staging_rate_caps_pageable_copies(tmp_path):
    """The link's `staging_copy_bytes_per_s` replaces the judgment; absent, the judgment."""
    judged = CostModel(_with_staging(tmp_path, None, pin_memory=False))
    assert judged.node.link.staging_copy_bytes_per_s is None
    given_rate = CostModel(_with_staging(tmp_path, 7.5e9, pin_memory=False))
    assert given_rate.pageable_copy_bytes_per_s == 7.5e9
    entry = hardware.entry_of("host_links", given_rate.node.link)
    assert entry["staging_copy_bytes_per_s"]["value"] == 7.5e9
    assert "staging_copy_bytes_per_s" not in hardware.entry_of("host_links",
                                                               judged.node.link)


def _end_s(settings: SimSettings, strategy: str) -> float:
    return float(simulate(settings, strategy).timeline.steps_frame()["t_end_s"].max())


@hsettings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(overlap=st.booleans(), interval=st.sampled_from([1, 2, 4]),
       rate=st.sampled_from([None, 2e9, 40e9]), strategy=st.sampled_from(["zenflow",
                                                                          "zero-offload"]))
def test_pageable_never_makes_a_step_faster(tmp_path, overlap, interval, rate, strategy):
    """At a fixed node, the same run with pageable buffers takes at least as long as
    pinned: its copies are capped by the staging copy and hold the lanes that issue them."""
    s = _with_staging(tmp_path, rate, overlap_step=overlap, update_interval=interval)
    pinned = _end_s(s, strategy)
    paged = _end_s(s.with_(pin_memory=False), strategy)
    assert paged >= pinned * (1 - 1e-9)


def test_shipped_round_trip_holds_backward_when_pageable(tmp_path):
    """Pageable, DeepSpeed's hook copies the accumulator up and the sum down in turn: no
    backward op overlaps a copy, and a mid-window step takes compute + both copies."""
    s = _with_staging(tmp_path, None, update_interval=4, pin_memory=False)
    result = simulate(s, "zenflow")
    spans = [x for x in result.timeline.spans if x.step == 2]
    back = [x for x in spans if x.op == "backward"]
    copies = [x for x in spans if x.op in ("d2h_grad", "h2d_param")]
    assert copies and back
    assert all(max(0.0, min(b.t_end_s, x.t_end_s) - max(b.t_start_s, x.t_start_s)) < 1e-12
               for b in back for x in copies)
    busy = sum(x.t_end_s - x.t_start_s for x in copies + back)
    step = result.timeline.steps_frame().set_index("step").loc[2, "wall_s"]
    assert step >= busy - 1e-9


def test_the_pageable_fit_recovers_a_known_node(tmp_path):
    """A pageable ZeRO-Offload step simulated on a node of known MFU, d2h (with its staging
    copy) and host rates, read as a DeepSpeed log would split it, is fitted back to them."""
    base = _with_staging(tmp_path, None, pin_memory=False)
    how = dict.fromkeys(("mfu", "d2h", "h2d", "host", "staging", "latency"), "test")
    truth = Scales(mfu=0.2, d2h=2.5, host=1.7)
    node, _ = write_hardware(tmp_path / "truth.json", base, truth, how)
    parts = baseline_parts(node)
    measured = Breakdown(parts["compute_s"], parts["d2h_s"] + parts["h2d_s"],
                         parts["stall_s"], parts["d2h_s"], parts["h2d_s"])
    (fitted,) = infer(base, measured, tmp_path)
    assert fitted.case == PAGEABLE and fitted.reached
    # the fit stops once each part is within 0.5% of the larger of it and the step
    # (`fit`'s tol): each scale is as close as its part's share of the step allows
    step = measured.step_s
    for name, part in (("mfu", "compute_s"), ("d2h", "d2h_s"), ("host", "stall_s")):
        share = 0.005 * max(1.0, step / getattr(measured, part))
        assert getattr(fitted.scales, name) == pytest.approx(getattr(truth, name),
                                                             rel=2 * share), name
    assert fitted.scales.h2d == 1.0
    staging = fitted.entries["host_links"]["inferred-link"]["staging_copy_bytes_per_s"]
    assert staging["value"] == pytest.approx(
        CostModel(base).pageable_copy_bytes_per_s * fitted.scales.d2h)


def test_the_h200_prediction_fits_pageable_copies(tmp_path):
    """bench/predict_deepspeed.py on the committed H200 runs: the row says pageable, its
    fit inferred a staging rate, and the log's compute + d2h is the pinned reading's,
    only moved between the two."""
    assert pdd.main(["--runs", str(H200_RUNS), "--overlap-compute-scale", "1",
                     "--steps", "16", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "predict_deepspeed.json").read_text())["rows"]
    assert row["pin_memory"] is False and row["inferred_staging_copy_bytes_per_s"] > 0
    zo = next(r for r in _runs(H200_RUNS) if r["engine"] == "zero_offload")
    pinned = predict_inputs.read_deepspeed_log(H200_RUNS / zo["log"],
                                               skip=int(zo["warmup_steps"]))
    assert row["baseline_compute_s"] < pinned.compute_s
    assert row["baseline_compute_s"] + row["baseline_d2h_s"] == pytest.approx(
        pinned.compute_s + pinned.d2h_s)
    assert (row["baseline_h2d_s"], row["baseline_stall_s"]) == pytest.approx(
        (pinned.h2d_s, pinned.stall_s))
