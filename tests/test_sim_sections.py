"""SimSettings in sections (issue 47 item 4): the flat knob names round-trip through the
sections, each section refuses its own bad values naming the knob, and the steps left out
of a measurement have one rule that the engine's report, the simulator and validate share."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zfbench.core.config import load_config
from zfbench.core.schedule import (FIXED_RUN_STEPS, FIXED_SKIP_STEPS, measurement_window)
from zfbench.run.report import measurement_window as engine_window
from zfbench.sims.sections import Machine, Measurement, Runtime, ZeroInfinity
from zfbench.sims.settings import KNOB_SECTIONS, SimSettings, SimSettingsError
from zfbench.sims.simulator import default_skip_steps, steps_needed
from zfbench.validate.rows import skip_of

# summary.json's settings keys, in their order, as they were before the sections
FLAT_KEYS = (
    "model", "layers", "gpus", "nodes", "gpus_per_node", "inter_net", "gpu", "pcie", "host",
    "host_cores", "dispatch_s_per_kernel", "host_accum_per_core", "bind_cores", "pin_memory",
    "overlap_comm", "fused_param_upload", "zero2_reduce", "host_job", "net", "gpus_per_switch",
    "micro_batch", "seq", "grad_accum", "precision", "mfu", "activation_checkpointing", "topk_ratio",
    "update_interval", "auto_windows", "select_interval", "overlap_step",
    "full_warm_up_rounds", "offload", "pt_reserved_cores_perc", "steps", "transfers",
    "bandwidth_scale", "offload_params", "zero_stage", "offload_optimizer",
    "prefetch_buckets", "offload_activations", "tiling", "nvme", "nvme_drives", "profile",
    "hardware")


def test_the_flat_keys_are_unchanged_and_each_lives_in_one_section():
    assert tuple(SimSettings().as_dict()) == FLAT_KEYS
    assert tuple(KNOB_SECTIONS) == FLAT_KEYS


knobs = st.fixed_dictionaries({}, optional={
    "gpus": st.integers(1, 8), "micro_batch": st.integers(1, 4), "seq": st.integers(1, 2048),
    "topk_ratio": st.sampled_from([0.05, 0.1, 0.5, 1.0]), "update_interval": st.integers(1, 8),
    "overlap_step": st.booleans(), "steps": st.integers(1, 50),
    "transfers": st.sampled_from(["design", "shipped", "full"]),
    "offload_params": st.sampled_from(["none", "cpu", "nvme"]),
    "prefetch_buckets": st.integers(0, 3), "pin_memory": st.booleans(),
    "mfu": st.none() | st.floats(0.1, 1.0), "host_cores": st.none() | st.integers(1, 64)})


@settings(max_examples=60, deadline=None)
@given(knobs)
def test_flat_knobs_round_trip_through_the_sections(given_knobs):
    s = SimSettings.from_knobs(**given_knobs)
    flat = s.as_dict()
    assert {k: flat[k] for k in given_knobs} == given_knobs
    assert SimSettings.from_knobs(**flat) == s
    assert SimSettings().with_(**given_knobs) == s
    # each knob is read where KNOB_SECTIONS says
    for name, path in KNOB_SECTIONS.items():
        section = s
        for attr in path.split("."):
            section = getattr(section, attr)
        assert getattr(section, name) == flat[name]


@pytest.mark.parametrize("build, word", [
    (lambda: Machine(gpus=0), "gpus"), (lambda: Machine(mfu=1.5), "mfu"),
    (lambda: Machine(nodes=2), "--gpus-per-node"),
    (lambda: Machine(bandwidth_scale=0), "bandwidth_scale"),
    (lambda: ZeroInfinity(offload_params="disk"), "offload_params"),
    (lambda: ZeroInfinity(tiling=0), "tiling"),
    (lambda: Measurement(steps=0), "steps"), (lambda: Measurement(transfers="x"), "transfers"),
    (lambda: SimSettings.from_knobs(fused_param_upload=True), "fused_param_upload"),
    (lambda: SimSettings.from_knobs(zero_stage=4), "zero_stage"),
    (lambda: SimSettings.from_knobs(topk_ratio=0), "topk_ratio"),
    (lambda: SimSettings.from_knobs(no_such_knob=1), "no_such_knob"),
])
def test_each_section_refuses_its_bad_values_naming_the_knob(build, word):
    with pytest.raises(SimSettingsError, match=word):
        build()
    assert Runtime() == Runtime(activation_checkpointing=True)  # a section with no checks


@given(st.integers(0, 5), st.lists(st.integers(1, 9), min_size=1, max_size=4))
def test_the_windowed_rule_leaves_out_warm_up_and_two_windows_then_measures_one(W, lengths):
    skip, needed = measurement_window(True, W, lengths)
    cycled = [lengths[i % len(lengths)] for i in range(3)]
    assert skip == W + cycled[0] + cycled[1] and needed == skip + cycled[2]
    assert measurement_window(False, W, lengths) == (FIXED_SKIP_STEPS, FIXED_RUN_STEPS)


@pytest.mark.parametrize("W, U", [(0, 4), (2, 3), (1, "auto")])
def test_engine_simulator_and_validate_leave_out_the_same_steps(W, U):
    cfg = load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"},
        "zenflow": {"topk_ratio": 0.1, "update_interval": U, "select_interval": 0,
                    "full_warm_up_rounds": W}}})
    s = SimSettings.from_knobs(model="tiny", full_warm_up_rounds=W, update_interval=U,
                               select_interval=0, steps=40)
    engine_skip, engine_needed = engine_window(cfg)
    assert engine_skip == default_skip_steps(s) == skip_of(s, "zenflow")
    assert engine_needed == steps_needed(s)
    fixed = load_config({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {
        "stage": 2, "offload_optimizer": {"device": "cpu"}}})
    assert engine_window(fixed) == (skip_of(s.with_(steps=FIXED_RUN_STEPS), "zero-offload"),
                                    FIXED_RUN_STEPS)
