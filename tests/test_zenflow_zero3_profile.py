"""ZenFlow on ZeRO-3 simulated from a measured profile (zfbench.sims.zenflow_zero3_engine):
the engine's spans in the engine's order, step for step, against an actual small engine
run at `zero_optimization.stage` 3 on the CPU lanes; the knobs that still refuse it
(issue 48)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from zfbench.analysis.validation import schedule_signature, signature_diff
from zfbench.real.runner import RunSpec, train
from zfbench.sims.costs import SimSettings, SimSettingsError
from zfbench.sims.settings import for_engine_run
from zfbench.sims.simulator import simulate
from zfbench.validate.command import zenflow_overrides

STEPS = 10


def engine_and_simulated(profile_path, stage: int, pair=(0.1, 4), warm_up: int = 0):
    """The spans of the engine's zenflow run at ZeRO `stage` (tiny, 2 layers, the
    profile's batch, seq and precision) and of its simulation from the profile."""
    cal = json.loads(profile_path.read_text())["calibration"]
    spec = RunSpec(model="tiny", layers=2, micro_batch=cal["batch"], seq=cal["seq"],
                   steps=STEPS, device="cpu", device_threads=1, host_threads=1,
                   precision=cal["precision"])
    over = {**zenflow_overrides(*pair), "zero_stage": stage, "full_warm_up_rounds": warm_up}
    spec = replace(spec, overrides=over)
    config = spec.engine_config("zenflow")
    assert config.zero_stage == stage
    measured = train(spec, "zenflow", progress=False).timeline.spans_frame()
    settings = for_engine_run(config, model="tiny", layers=2, gpus=1,
                              micro_batch=spec.micro_batch, seq=spec.seq,
                              profile=str(profile_path), steps=STEPS)
    assert settings.zenflow.zero_stage == stage
    return measured, simulate(settings, "zenflow").timeline.spans_frame()


@pytest.mark.slow
@pytest.mark.parametrize("warm_up", [0, 2])
def test_the_simulated_stage3_step_has_the_engines_spans_in_its_order(tiny_profile_path,
                                                                      warm_up):
    """Every step, from the first: the compute lane's ops in the engine's order and each
    other lane's ops (the h2d `select` that ZeRO-3 adds at a selection included)."""
    measured, simulated = engine_and_simulated(tiny_profile_path, 3, warm_up=warm_up)
    diffs = signature_diff(schedule_signature(measured, 0, STEPS - 1),
                           schedule_signature(simulated, 0, STEPS - 1))
    assert diffs == []
    first = warm_up  # the selection step
    for frame in (measured, simulated):
        h2d = frame[(frame["step"] == first) & (frame["lane"] == "h2d")]
        assert "select" in set(h2d["op"])
    # the selection's h2d carries the selected elements' fp32 values, on both sides
    def selection_up(f):
        return f[(f["step"] == first) & (f["lane"] == "h2d") & (f["op"] == "select")]
    assert selection_up(simulated)["bytes"].sum() == pytest.approx(
        selection_up(measured)["bytes"].sum(), rel=0.05)
    # the engine's whole gradient shard down every step (transfers full), both sides
    def grads(f):
        return f[f["op"] == "d2h_grad"].groupby("step")["bytes"].sum().to_dict()
    assert grads(simulated) == grads(measured)


@pytest.mark.slow
def test_on_one_rank_the_stage3_simulation_differs_from_stage2_by_the_selection_copy(
        tiny_profile_path):
    """One rank: nothing is all-gathered or reduce-scattered, on either side; the engine's
    ZeRO-3 adds the selected values' h2d, which its ZeRO-2 does not have with fp32
    weights, and the simulator follows."""
    measured3, simulated3 = engine_and_simulated(tiny_profile_path, 3)
    for frame in (measured3, simulated3):
        assert not set(frame["op"]) & {"allgather", "reduce_scatter", "allreduce"}
    measured2, simulated2 = engine_and_simulated(tiny_profile_path, 2)
    def ops(f):
        return set(zip(f["lane"], f["op"]))
    assert ops(simulated3) - ops(simulated2) == ops(measured3) - ops(measured2)
    assert ops(measured3) - ops(measured2) == {("h2d", "select")}


@pytest.mark.slow
def test_stage3_takes_a_profile_but_not_the_shipped_path(tiny_profile_path):
    settings = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, zero_stage=3,
                                      precision="fp32",
                                      transfers="full", profile=str(tiny_profile_path))
    assert settings.zenflow.zero_stage == 3 and settings.machine.profile
    with pytest.raises(SimSettingsError, match="shipped path is ZeRO-2's"):
        SimSettings.from_knobs(zero_stage=3, transfers="shipped")


@pytest.mark.slow
def test_the_measured_gather_overhead_lengthens_each_blocks_passes(tiny_profile_path,
                                                                   tmp_path):
    """The profile's `zero3_hooks` (seconds a block's forward and backward gain under
    ZeRO-3's gathers) go into each block's compute as measured, not scaled by tokens;
    ZeRO-2's steps do not take them."""
    from zfbench.real.profile_record import with_rates

    profile = json.loads(tiny_profile_path.read_text())
    apart = {"compute_factor_when_host_busy": 1.0, "host_factor_when_compute_busy": 1.0}
    paths = {}
    for name, extra in (("none", 0.0), ("some", 1e-3)):
        hooks = {k: {"forward_s": extra, "backward_s": 2 * extra}
                 for k in ("embedding", "decoder", "head")}
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(with_rates(profile, {**apart,
                                                               "zero3_hooks": hooks})))

    def busy(path, stage):
        s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=4, seq=32,
                                   precision=profile["calibration"]["precision"],
                                   transfers="full", profile=str(path), steps=6,
                                   zero_stage=stage)
        f = simulate(s, "zenflow").timeline.spans_frame()
        f = f[f["step"] == 3]
        return {op: f[f["op"] == op]["duration_s"].sum() for op in ("forward", "backward")}
    blocks = 2 + 2  # the embedding, two decoder layers, the head
    none, some = busy(paths["none"], 3), busy(paths["some"], 3)
    assert some["forward"] - none["forward"] == pytest.approx(blocks * 1e-3, rel=1e-6)
    assert some["backward"] - none["backward"] == pytest.approx(blocks * 2e-3, rel=1e-6)
    assert busy(paths["some"], 2) == busy(paths["none"], 2)


@pytest.mark.slow
def test_two_gloo_ranks_simulated_as_the_engine_ran_them(tiny_profile_path, tmp_path):
    """`python -m zfbench.run --gpus 2` with a stage-3 config: rank 0's spans, every
    step, match the simulation's from the profile (gathers, the reduce-scatter and the
    score all-reduce on `net` included), and each step moves the same bytes over `net`
    and down (the simulator gathers a block where the engine gathers a module: the
    same bytes in fewer spans)."""
    import pandas as pd

    from zfbench.core.config import load_config
    from zfbench.run.command import main as run_main

    cal = json.loads(tiny_profile_path.read_text())["calibration"]
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                    "zenflow": zenflow_overrides(0.1, 4)},
              "train_micro_batch_size_per_gpu": cal["batch"],
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(config))
    assert run_main(["--model", "tiny", "--layers", "2", "--steps", str(STEPS), "--seq",
                     str(cal["seq"]), "--gpus", "2", "--strategy", "zenflow", "--config",
                     str(path), "--precision", cal["precision"], "--device-threads", "1",
                     "--host-threads", "1", "--quiet", "--out", str(tmp_path / "run")]) == 0
    measured = pd.read_csv(tmp_path / "run" / "zenflow.spans.csv")
    measured = measured[measured["rank"] == 0]
    engine_config = load_config(str(path), world_size=2, precision=cal["precision"],
                                strategy="zenflow")
    settings = for_engine_run(engine_config, model="tiny", layers=2, gpus=2,
                              micro_batch=cal["batch"], seq=cal["seq"],
                              profile=str(tiny_profile_path), steps=STEPS)
    simulated = simulate(settings, "zenflow").timeline.spans_frame()
    simulated = simulated[simulated["rank"] == 0]
    assert signature_diff(schedule_signature(measured, 0, STEPS - 1),
                          schedule_signature(simulated, 0, STEPS - 1)) == []
    # (the engine's `finish` gathers the trained model once more after the last step)
    def moved(f):
        f = f[f["lane"].isin(["net", "d2h"]) & (f["step"] < STEPS)]
        return f.groupby(["step", "op"])["bytes"].sum().to_dict()
    assert moved(simulated) == moved(measured)
