"""The one Scenario (zfbench/core/scenario.py): each default lives once, and SimSettings
and RunSpec carry a scenario through unchanged."""
from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from zfbench.core.config import load_config
from zfbench.core.scenario import (CPU_LANES, GPU_NODE, NAMED, SCENARIO_FIELDS,
                                   ZENFLOW_FIELDS, Scenario, ZenFlowScenario)
from zfbench.real.runner import RunSpec
from zfbench.sims.settings import SimSettings, SimSettingsError, for_engine_run


def test_the_simulators_defaults_are_the_gpu_nodes_scenario_field_by_field():
    d = SimSettings()
    for name in SCENARIO_FIELDS:
        assert getattr(d.scenario, name) == getattr(GPU_NODE, name), name
    for name in ZENFLOW_FIELDS:
        assert getattr(d.zenflow, name) == getattr(GPU_NODE.zenflow, name), name
    assert d.scenario == GPU_NODE
    # the class default itself, not only an instance's: the scenario section is GPU_NODE
    assert {f.name: f.default for f in fields(SimSettings)}["scenario"] is GPU_NODE


def test_the_runs_defaults_are_the_cpu_lanes_scenario_field_by_field():
    d = RunSpec()
    assert (d.model, d.layers, d.seq, d.precision) == (
        CPU_LANES.model, CPU_LANES.layers, CPU_LANES.seq, CPU_LANES.precision)
    # batch and accumulation: the built config's, which are the scenario's
    assert (d.micro_batch, d.grad_accum) == (CPU_LANES.micro_batch, CPU_LANES.grad_accum)
    assert d.scenario == CPU_LANES
    assert RunSpec.model == CPU_LANES.model and RunSpec.seq == CPU_LANES.seq


def test_the_run_commands_defaults_come_from_the_cpu_lanes_scenario():
    from zfbench.run.command import build_parser
    from zfbench.run.defaults import DEFAULT_PRECISION, DEFAULT_SEQ, GPU_SEQ

    assert DEFAULT_SEQ == CPU_LANES.seq == 4
    assert (DEFAULT_PRECISION, GPU_SEQ) == (GPU_NODE.precision, GPU_NODE.seq)
    from zfbench.run.plan import spec_from_args
    spec = spec_from_args(build_parser().parse_args([]))  # the flags not given, resolved
    assert (spec.model, spec.layers, spec.seq) == (CPU_LANES.model, CPU_LANES.layers,
                                                   CPU_LANES.seq)


def test_the_named_scenarios():
    assert NAMED == {"gpu-node": GPU_NODE, "cpu-lanes": CPU_LANES}
    assert (GPU_NODE.model, GPU_NODE.layers, GPU_NODE.micro_batch, GPU_NODE.seq,
            GPU_NODE.precision) == ("llama2-7b", None, 1, 1024, "bf16")
    assert (CPU_LANES.model, CPU_LANES.layers, CPU_LANES.micro_batch, CPU_LANES.seq,
            CPU_LANES.precision) == ("tinyllama-1.1b", 1, 1, 4, None)
    assert GPU_NODE.zenflow == CPU_LANES.zenflow == ZenFlowScenario()


def test_from_scenario_refuses_a_scenario_field_among_the_rest():
    try:
        SimSettings.from_scenario(GPU_NODE, seq=8)
    except SimSettingsError as err:
        assert "seq" in str(err)
    else:
        raise AssertionError("seq given twice was accepted")


def test_for_engine_run_builds_through_the_scenario():
    """An engine config's precision and ZenFlow knobs, the fields given, the GPU node's
    scenario for the rest: the same settings the flat construction gives."""
    from zfbench.core.config_build import build_config

    raw = build_config(None, lr=1e-4, weight_decay=0.0, pin_memory=True)
    cfg = load_config(raw, strategy="zenflow", precision="fp32", topk_ratio=0.25,
                      update_interval=2, select_strategy="step", select_interval=0,
                      overlap_step=True)
    got = for_engine_run(cfg, model="tiny", layers=1, micro_batch=2, seq=16,
                         hardware=None, profile=None, steps=12, precision="bf16")
    assert got.scenario == Scenario(model="tiny", layers=1, micro_batch=2, seq=16,
                                    grad_accum=1, precision="bf16",
                                    zenflow=ZenFlowScenario(topk_ratio=0.25,
                                                            update_interval=2))
    assert (got.measurement.transfers, got.measurement.steps) == ("full", 12)


zenflows = st.builds(
    ZenFlowScenario,
    topk_ratio=st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0]),
    update_interval=st.integers(1, 8),
    select_interval=st.sampled_from([0, 8, 16]),
    overlap_step=st.booleans(),
    full_warm_up_rounds=st.integers(0, 3))
scenarios = st.builds(
    Scenario,
    model=st.sampled_from(["tiny", "tinyllama-1.1b", "llama2-7b", "opt-350m"]),
    layers=st.one_of(st.none(), st.integers(1, 2)),
    micro_batch=st.integers(1, 8),
    seq=st.sampled_from([1, 4, 16, 128, 1024]),
    grad_accum=st.integers(1, 4),
    precision=st.sampled_from(["bf16", "fp16"]),
    zenflow=zenflows)


@settings(max_examples=40, deadline=None)
@given(scenarios)
def test_scenario_to_sim_settings_and_back_is_identity(sc):
    built = SimSettings.from_scenario(sc, gpus=2, steps=24)
    assert built.scenario == sc
    assert (built.machine.gpus, built.measurement.steps) == (2, 24)
    assert Scenario.from_flat(sc.flat(), GPU_NODE) == sc


@settings(max_examples=25, deadline=None)
@given(scenarios | st.builds(
    lambda sc: Scenario(**{**{f: getattr(sc, f) for f in SCENARIO_FIELDS},
                           "precision": None, "zenflow": sc.zenflow}), scenarios))
def test_scenario_to_run_spec_and_back_is_identity(sc):
    spec = RunSpec.from_scenario(sc, steps=3, device="cpu")
    assert spec.scenario == sc
    assert spec.steps == 3
    zf = spec.engine_config("zenflow").zenflow  # what the engine runs
    assert (zf.topk_ratio, zf.update_interval, zf.overlap_step) == (
        sc.zenflow.topk_ratio, sc.zenflow.update_interval, sc.zenflow.overlap_step)
