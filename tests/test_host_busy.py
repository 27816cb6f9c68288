"""Compute on a GPU slowed by host work beside it, at a GPU profile's measured factor
(zfbench.sims.host_busy): the rate rule by hand, where it applies, and a simulation with a
committed H200 profile against a reference computed from its own spans."""

import json
from pathlib import Path

import numpy as np
import pytest

from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.fluid import Job, NodeCapacities, node_rates
from zfbench.sims.host_busy import compute_factor, host_busy_rates
from zfbench.sims.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]
H200_PROFILE = ROOT / "bench/results/gpu/NVIDIA-H200/2026-11-27/profile/profile.json"


def _node(**over):
    caps = dict(d2h_bytes_per_s=10e9, h2d_bytes_per_s=10e9, d2h_factor_when_h2d_busy=1.0,
                h2d_factor_when_d2h_busy=1.0, upstream_d2h_bytes_per_s=40e9,
                upstream_h2d_bytes_per_s=40e9, gpus_per_switch=1, cores_per_rank=4,
                dram_bytes_per_s=1e15)
    return node_rates(NodeCapacities(**{**caps, **over}))


def test_rates_by_hand():
    """Compute goes at the factor only while its own rank has a host job; every other
    job gets the node's rate for the jobs other than compute, as without compute."""
    base = _node()
    rates = host_busy_rates(base, 0.8)
    compute, host = Job("compute", 0, 0.1), Job("host", 0, 1e9, 28.0, 1e8)
    up, other_host = Job("h2d", 0, 1e9), Job("host", 1, 1e9, 28.0, 1e8)
    assert rates([compute]) == [1.0]
    assert rates([compute, host]) == [0.8] + base([host])
    assert rates([host, compute, up]) == [base([host, up])[0], 0.8, base([host, up])[1]]
    assert rates([compute, up]) == [1.0] + base([up])  # an upload is not host work
    assert rates([compute, other_host]) == [1.0] + base([other_host])
    assert rates.job_key is base.job_key


def _profile(tmp_path, factor=None, transfers=None) -> str:
    profile = json.loads(H200_PROFILE.read_text())
    if factor is not None:
        profile["calibration"]["compute_factor_when_host_busy"] = factor
    if transfers is not None:
        profile["calibration"]["transfers"] = transfers
    path = tmp_path / f"profile-{factor}-{transfers}.json"
    path.write_text(json.dumps(profile))
    return str(path)


def _settings(profile: str | None) -> SimSettings:
    return SimSettings.from_knobs(model="qwen2.5-1.5b", gpus=1, micro_batch=1, seq=1024,
                                  precision="bf16", transfers="full", gpus_per_switch=1,
                                  profile=profile, steps=6)


def test_applies_only_with_a_gpu_profile_that_measured_a_slowdown(tmp_path):
    measured = json.loads(H200_PROFILE.read_text())["calibration"]
    assert compute_factor(CostModel(_settings(str(H200_PROFILE)))) == \
        measured["compute_factor_when_host_busy"]
    assert compute_factor(CostModel(_settings(None))) is None  # presets
    assert compute_factor(CostModel(_settings(_profile(tmp_path, factor=1.0)))) is None
    # the CPU-emulated lanes have their own rate model (zfbench.sims.emulated)
    assert compute_factor(CostModel(_settings(_profile(tmp_path, transfers="emulated")))) \
        is None


def _union(spans) -> np.ndarray:
    out: list[list[float]] = []
    for a, b in sorted(zip(spans["t_start_s"], spans["t_end_s"])):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return np.array(out).reshape(-1, 2)


@pytest.mark.parametrize("strategy", ["zero-offload-dpu", "zenflow"])
def test_each_compute_span_is_its_work_plus_the_slowed_share_of_its_overlap(tmp_path,
                                                                           strategy):
    """Reference: a compute span of W seconds alone (the factor-1 simulation's span)
    that overlaps host work for o seconds lasts W + (1 - f) o (o seconds at rate f, the
    rest at 1); spans that overlap none keep W; some do overlap."""
    f = 0.7
    alone = simulate(_settings(_profile(tmp_path, factor=1.0)), strategy).timeline
    slowed = simulate(_settings(_profile(tmp_path, factor=f)), strategy).timeline
    a = alone.spans_frame().query("lane == 'compute'").reset_index(drop=True)
    spans = slowed.spans_frame()
    s = spans.query("lane == 'compute'").reset_index(drop=True)
    assert list(a["op"]) == list(s["op"]) and list(a["step"]) == list(s["step"])
    host = _union(spans.query("lane == 'host'"))
    overlap = np.array([np.clip(np.minimum(host[:, 1], e) - np.maximum(host[:, 0], b),
                                0, None).sum() for b, e in zip(s["t_start_s"], s["t_end_s"])])
    work = (a["t_end_s"] - a["t_start_s"]).to_numpy()
    assert (s["t_end_s"] - s["t_start_s"]).to_numpy() == pytest.approx(
        work + (1 - f) * overlap, abs=1e-9)
    assert overlap.sum() > 0.1 * work.sum()


def test_device_strategy_without_host_work_is_unchanged(tmp_path):
    """No host work beside compute: the very same spans with the slowdown as without."""
    alone = simulate(_settings(_profile(tmp_path, factor=1.0)), "device").timeline
    slowed = simulate(_settings(_profile(tmp_path, factor=0.5)), "device").timeline
    cols = ["lane", "op", "step", "t_start_s", "t_end_s"]
    a, s = alone.spans_frame()[cols], slowed.spans_frame()[cols]
    assert len(a) == len(s)
    assert np.allclose(a[["t_start_s", "t_end_s"]], s[["t_start_s", "t_end_s"]],
                       rtol=0, atol=1e-12)
    assert list(a["op"]) == list(s["op"])


def _bench():
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    import host_busy_compute
    return host_busy_compute


def test_overlap_per_step_by_hand():
    """bench/host_busy_compute.py: each step's compute seconds under the host lane's
    busy union (two host spans overlapping each other count once; another rank's not)."""
    import pandas as pd

    rows = [(0, "host", "host_optim", 0, 0.0, 1.0), (0, "host", "host_accum", 0, 0.5, 1.5),
            (1, "host", "host_optim", 0, 0.0, 9.0),
            (0, "compute", "forward", 1, 0.8, 2.0),   # 0.7 s under host work
            (0, "compute", "backward", 1, 2.0, 3.0),  # none
            (0, "compute", "forward", 2, 1.4, 1.6)]   # 0.1 s
    spans = pd.DataFrame(rows, columns=["rank", "lane", "op", "step", "t_start_s",
                                        "t_end_s"])
    got = _bench().overlap_per_step(spans)
    assert got.to_dict() == pytest.approx({1: 0.7, 2: 0.1})


def test_committed_runs_rows_against_their_steps(tmp_path):
    """The H200 run's rows: measured medians as steps.csv holds them (step 0 left out),
    zero-offload's excess 0, and the implied factor the overlap over overlap + excess."""
    import pandas as pd

    run = H200_PROFILE.parents[1] / "run_qwen2.5-1.5b"
    rows = {r["strategy"]: r for r in _bench().run_rows(run, "NVIDIA-H200", ROOT, tmp_path)}
    steps = pd.read_csv(run / "steps.csv").query("step >= 1")
    base = rows["zero-offload"]
    scale = base["measured_compute_s"] / base["sim_compute_s"]
    for name, r in rows.items():
        assert r["measured_compute_s"] == float(
            steps.loc[steps["strategy"] == name, "compute_s"].median())
        want = (r["measured_compute_s"] - r["sim_compute_s"]) - (
            base["measured_compute_s"] - base["sim_compute_s"])
        assert r["excess_s"] == pytest.approx(want, abs=1e-15)
    assert base["excess_s"] == 0.0 and base["overlap_s"] == 0.0
    dpu = rows["zero-offload-dpu"]
    o = dpu["overlap_s"] * scale
    assert dpu["implied_factor"] == pytest.approx(o / (o + dpu["excess_s"]))
    assert dpu["sim_compute_slowed_s"] > dpu["sim_compute_s"]


def test_gpu_validate_replay_reads_the_older_summary_and_slows_only_overlapped_compute():
    """bench/validate_replay.py on the committed H100 validate run (its summary spells
    the micro-batch `batch`): a row per cell with validate.csv's measured steps; with the
    profile's factor the ZeRO-Offload cells (no host work beside compute) keep their step
    of the factor set to 1, and ZenFlow's cells take longer."""
    import sys

    import pandas as pd

    sys.path.insert(0, str(ROOT / "bench"))
    import validate_replay

    run = ROOT / "bench/results/gpu/NVIDIA-H100-80GB-HBM3/validate"
    slowed = validate_replay.replay(run, {}).set_index("cell")
    alone = validate_replay.replay(run, {"compute_factor_when_host_busy": 1.0}).set_index(
        "cell")
    measured = pd.read_csv(run / "validate.csv")["measured_step_time_s"]
    assert sorted(slowed["measured_step_time_s"]) == sorted(measured.drop_duplicates())
    now = "simulated_now_step_time_s"
    for cell in ("ratio2.device", "ratio2.zero-offload"):
        assert slowed.loc[cell, now] == pytest.approx(alone.loc[cell, now], rel=1e-9)
    zenflow = [c for c in slowed.index if ".zenflow." in c]
    assert zenflow and all(slowed.loc[c, now] > alone.loc[c, now] for c in zenflow)
