"""The upload link and the host's work slowing each other, as a GPU profile measures it
(zfbench.real.rate_probe `_link_host_contention`; sims/fluid.py `node_rates`)."""

import json
from dataclasses import replace

import pytest

from zfbench.analysis.breakdown import summarize
from zfbench.real.profile import with_rates
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.fluid import Job, NodeCapacities, node_rates
from zfbench.sims.simulator import simulate


def _caps(**over):
    caps = dict(d2h_bytes_per_s=10e9, h2d_bytes_per_s=10e9, d2h_factor_when_h2d_busy=1.0,
                h2d_factor_when_d2h_busy=1.0, upstream_d2h_bytes_per_s=40e9,
                upstream_h2d_bytes_per_s=40e9, gpus_per_switch=1, cores_per_rank=4,
                dram_bytes_per_s=1e15)
    caps.update(over)
    return NodeCapacities(**caps)


def test_factors_by_hand():
    """An upload beside host work goes at its factor, the host work at its own; a
    download, or either alone, is untouched; factors of 1 are the old rates exactly."""
    up, down = Job("h2d", 0, 1e9), Job("d2h", 0, 1e9)
    host = Job("host", 0, 1e9, 28.0, 1e8)  # 4 cores x 1e8 elements/s, DRAM no limit
    rates = node_rates(_caps(h2d_factor_when_host_busy=0.8, host_factor_when_h2d_busy=0.25))
    assert rates([up, host]) == pytest.approx([8e9, 0.25 * 4e8])
    assert rates([down, host]) == pytest.approx([10e9, 4e8])
    assert rates([up]) == pytest.approx([10e9])
    assert rates([host]) == pytest.approx([4e8])
    plain = node_rates(_caps())
    ones = node_rates(_caps(h2d_factor_when_host_busy=1.0, host_factor_when_h2d_busy=1.0))
    for jobs in ([up, host], [down, up, host], [host], [up]):
        assert ones(jobs) == plain(jobs)


@pytest.fixture(scope="module")
def cpu_profile(tiny_profile_path):
    return json.loads(tiny_profile_path.read_text())


@pytest.mark.slow
def test_only_a_profile_that_measured_them_applies_them(cpu_profile, tmp_path):
    """The CPU lanes measure no such factors (their uploads are the host worker's own
    copies): none applies; presets apply none; a profile carrying them passes them on."""
    assert "h2d_factor_when_host_busy" not in cpu_profile["calibration"]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu_profile))
    s = SimSettings(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                    profile=str(path), steps=10)
    assert CostModel(s).link_host_factors == {}
    assert CostModel(SimSettings(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16,
                                 steps=10)).link_host_factors == {}
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(with_rates(cpu_profile, {
        "h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.5})))
    assert CostModel(replace(s, profile=str(measured))).link_host_factors == {
        "h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.5}


@pytest.mark.slow
def test_contention_lengthens_only_steps_where_uploads_and_host_work_overlap(cpu_profile,
                                                                            tmp_path):
    """A CUDA-like profile (copy engines) of the tiny model: with the factors, ZeRO-Offload
    (each chunk's upload beside the next chunk's AdamW) takes longer; the device strategy
    (no host work, no uploads) is unchanged to the last bit."""
    cal = {**cpu_profile["calibration"], "transfers": "cuda"}
    base = {**cpu_profile, "calibration": cal}
    paths = {}
    for name, rates in (("apart", {}), ("contended", {
            "h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.25})):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(with_rates(base, rates)))
    s = SimSettings(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                    profile=str(paths["apart"]), steps=10)

    def step_s(strategy: str, which: str) -> float:
        r = simulate(replace(s, profile=str(paths[which])), strategy)
        return summarize(r.timeline.spans_frame(), r.timeline.steps_frame(),
                         r.skip_steps)["step_time_s"]
    assert step_s("zero-offload", "contended") > step_s("zero-offload", "apart")
    assert step_s("device", "contended") == step_s("device", "apart")
