"""The simulator with a profile of zfbench's engine measured on a GPU: the upload link
and the host's work slowing each other as the profile measures it (zfbench.real.rate_probe
`_link_host_contention`; sims/fluid.py `node_rates`), the host updates in the engine's
chunks, and ZenFlow's backward waiting for the last accumulation as the engine's does."""

import json

import pytest

from zfbench.analysis.breakdown import summarize
from zfbench.real.profile_record import with_rates
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
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                               profile=str(path), steps=10)
    assert CostModel(s).link_host_factors == {}
    assert CostModel(SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16,
                                            steps=10)).link_host_factors == {}
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(with_rates(cpu_profile, {
        "h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.5})))
    assert CostModel(s.with_(profile=str(measured))).link_host_factors == {
        "h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.5}


@pytest.mark.slow
def test_contention_lengthens_only_steps_where_uploads_and_host_work_overlap(cpu_profile,
                                                                            tmp_path):
    """A CUDA-like profile (copy engines) of the tiny model: with the factors, ZeRO-Offload
    (each chunk's upload beside the next chunk's AdamW) takes longer; the device strategy
    (no host work, no uploads) is unchanged to the last bit."""
    paths = {"apart": _cuda_like(cpu_profile, tmp_path)}
    paths["contended"] = tmp_path / "contended.json"
    paths["contended"].write_text(json.dumps(with_rates(
        json.loads(paths["apart"].read_text()),
        {"h2d_factor_when_host_busy": 0.5, "host_factor_when_h2d_busy": 0.25})))
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                               profile=str(paths["apart"]), steps=10)

    def step_s(strategy: str, which: str) -> float:
        r = simulate(s.with_(profile=str(paths[which])), strategy)
        return summarize(r.timeline.spans_frame(), r.timeline.steps_frame(),
                         r.skip_steps)["step_time_s"]
    assert step_s("zero-offload", "contended") > step_s("zero-offload", "apart")
    assert step_s("device", "contended") == step_s("device", "apart")


def _cuda_like(cpu_profile, tmp_path, name="cuda_like.json"):
    """The tiny CPU profile as if measured on a GPU (copy engines, the engine's schedule),
    with the lanes not slowing each other."""
    cal = {**cpu_profile["calibration"], "transfers": "cuda"}
    path = tmp_path / name
    path.write_text(json.dumps(with_rates({**cpu_profile, "calibration": cal}, {
        "compute_factor_when_host_busy": 1.0, "host_factor_when_compute_busy": 1.0})))
    return path


@pytest.mark.slow
def test_engine_host_updates_run_in_the_engines_chunks(cpu_profile, tmp_path, monkeypatch):
    """With a profile of zfbench's engine each bucket's host update is cut into the
    engine's host chunks (each followed by its upload); from presets one job a bucket."""
    import math

    import zfbench.sims.host_costs as host_costs_module
    monkeypatch.setattr(host_costs_module, "engine_host_chunk_elems", lambda threads: 5000)
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                               profile=str(_cuda_like(cpu_profile, tmp_path)), steps=8)
    r = simulate(s, "zero-offload")
    spans = r.timeline.spans_frame()
    want = sum(math.ceil(b.numel / 5000) for b in r.costs.buckets)
    assert want > len(r.costs.buckets)  # the test cuts buckets
    assert (spans.query("step == 5 and op == 'host_optim'").shape[0] == want)
    assert (spans.query("step == 5 and op == 'h2d_param'").shape[0] == want)
    preset = CostModel(s.with_(profile=None, precision="bf16"))
    assert preset.host_chunk_elems is None


@pytest.mark.slow
def test_zenflow_backward_waits_for_the_last_accumulation_on_the_engines_gpu_schedule(
        cpu_profile, tmp_path):
    """zfbench's engine on a GPU sends gradients down during backward into the one
    staging buffer the previous accumulation reads, and its main thread waits for that
    accumulation before launching backward: the simulated backward of step t+1 starts no
    earlier than step t's host accumulation ends (made slow here so that it matters)."""
    path = _cuda_like(cpu_profile, tmp_path)
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                               profile=str(path), steps=10)
    c = CostModel(s)
    # an accumulation of every parameter lasting four forwards, whatever this machine's
    # profile measured: it outlasts the next step's forward
    slow = path.with_name("slow_accum.json")
    slow.write_text(json.dumps(with_rates(json.loads(path.read_text()), {
        "host_accum_elems_per_s": c.params / (4 * c.forward_s)})))
    s = s.with_(profile=str(slow))
    spans = simulate(s, "zenflow").timeline.spans_frame()
    accum_end = spans.query("op == 'host_accum'").groupby("step")["t_end_s"].max()
    bwd_start = spans.query("op == 'backward'").groupby("step")["t_start_s"].min()
    fwd_end = spans.query("op == 'forward'").groupby("step")["t_end_s"].max()
    waited = [t for t in accum_end.index if t + 1 in bwd_start.index]
    assert waited and all(bwd_start[t + 1] >= accum_end[t] - 1e-12 for t in waited)
    # the accumulation is the later of the two: backward waited, not forward's end
    assert any(accum_end[t] > fwd_end[t + 1] + 1e-9 for t in waited)
