"""Several ranks sharing one CPU in the simulator (zfbench.sims.emulated.cpu_share) and the
collectives measured among them (zfbench.real.collective_probe): busy lanes' threads share
the machine's cores, a gloo collective takes what the probe measured when nothing else
runs and longer beside other work, and a profile without the machine's cores simulates
every rank on lanes of its own, as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zfbench.real.collective_probe import line_through
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.emulated import collective_share, cpu_share, emulated_rates
from zfbench.sims.fluid import Job
from zfbench.sims.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "bench" / "results" / "noflag_run_expect" / "profile.json"
# a measured collective: a fixed part and a part per byte (the probe's keys)
COLLECTIVES = {"allreduce_s_fixed": 0.004, "allreduce_s_per_byte": 5e-9,
               "allgather_s_fixed": 0.006, "allgather_s_per_byte": 7e-9}


def profile_with(tmp_path: Path, **calibration) -> str:
    profile = json.loads(PROFILE.read_text())
    profile["calibration"].update(calibration)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    return str(path)


def settings(profile: str, gpus: int) -> SimSettings:
    cal = json.loads(Path(profile).read_text())["calibration"]
    return SimSettings.from_knobs(model=cal["model"], gpus=gpus, micro_batch=cal["batch"],
                                  seq=cal["seq"], precision=cal["precision"], transfers="full",
                                  profile=profile, steps=6)


def spans(result, lane: str, op: str, rank: int = 0):
    frame = result.timeline.spans_frame()
    frame = frame[(frame["rank"] == rank) & (frame["lane"] == lane) & (frame["op"] == op)]
    return (frame["t_end_s"] - frame["t_start_s"]).tolist()


@pytest.mark.parametrize("busy, threads, cores, share", [
    ([("compute", 0), ("compute", 1), ("compute", 2), ("compute", 3)], (1, 1), 2, 0.5),
    ([("compute", 0), ("host", 0)], (1, 1), 2, 1.0),  # one rank's two lanes on 2 cores
    ([("compute", 0), ("host", 0), ("h2d", 1)], (2, 2), 2, 2 / 6),  # h2d: a host lane's
    ([("compute", 0), ("d2h", 0), ("host", 1)], (1, 3), 2, 0.5),  # d2h: the device lane's
    ([("compute", 0), ("compute", 1)], (1, 1), None, 1.0),  # cores unknown: no sharing
    ([], (1, 1), 2, 1.0),
])
def test_busy_lanes_threads_share_the_cores(busy, threads, cores, share):
    active = [Job(kind, rank, 1.0) for kind, rank in busy]
    assert cpu_share(active, *threads, cores) == pytest.approx(share)


def test_a_collective_was_measured_with_every_rank_in_it():
    assert collective_share(4, 1, 2) == 0.5
    assert collective_share(2, 1, 8) == 1.0
    assert collective_share(4, 2, None) == 1.0


def test_the_line_through_two_timings():
    fixed, per_byte = line_through((1000, 0.002), (1_001_000, 0.012))
    assert per_byte == pytest.approx(1e-8) and fixed == pytest.approx(0.00199)
    # a small point above the line's intercept never gives a negative part
    fixed, per_byte = line_through((1000, 0.02), (1_001_000, 0.012))
    assert per_byte == 0.0 and fixed == pytest.approx(0.012)


def test_four_ranks_on_two_cores_compute_at_half_their_rate(tmp_path):
    shared = profile_with(tmp_path, cpu_cores=2, collective_ranks=4, **COLLECTIVES)
    s = settings(shared, 4)
    costs = CostModel(s)
    assert costs.shared_cores == ((1, 1), 2)
    result = simulate(s, "device")
    # step 0's forward: every rank computes and nothing else runs, so 4 threads share 2
    assert spans(result, "compute", "forward")[0] == pytest.approx(2 * costs.forward_s)
    # the gradient all-reduce, every rank in it and nothing else running: as measured
    reduce = spans(result, "net", "allreduce")
    assert reduce[0] == pytest.approx(COLLECTIVES["allreduce_s_fixed"] +
                                      COLLECTIVES["allreduce_s_per_byte"] * costs.model_bytes)
    # the engine's device strategy updates every parameter and gathers nothing
    assert spans(result, "net", "allgather") == []


def test_without_the_machines_cores_every_rank_has_lanes_of_its_own(tmp_path):
    alone = profile_with(tmp_path)  # a profile from before the multi-rank expectation
    s = settings(alone, 4)
    costs = CostModel(s)
    assert costs.shared_cores[1] is None
    assert costs.measured_collective_s("allreduce", 1e6) is None  # not measured: a preset
    result = simulate(s, "device")
    assert spans(result, "compute", "forward")[0] == pytest.approx(costs.forward_s)


def test_a_collective_beside_host_work_goes_slower_than_measured():
    """Every rank in a collective (as the probe measured it): rate 1; one rank's host lane
    busy beside them: 5 threads on 2 cores where the probe had 4, so 4/5 of it."""
    def base(jobs):
        return [1.0] * len(jobs)
    base.job_key = lambda job: (job.kind, job.rank)
    rates = emulated_rates(base, 1.0, 1.0, threads=(1, 1), cores=2, ranks=4)
    nets = [Job("net", rank, 1.0) for rank in range(4)]
    assert rates(nets) == pytest.approx([1.0] * 4)
    assert rates(nets + [Job("host", 0, 1.0)]) == pytest.approx([0.8] * 4 + [0.4])
    # one rank alone in it: no faster than measured (it cannot end before its peers)
    assert rates([Job("net", 0, 1.0)]) == pytest.approx([1.0])


def test_measured_collectives_hold_for_their_world_size_only(tmp_path):
    shared = profile_with(tmp_path, cpu_cores=2, collective_ranks=4, **COLLECTIVES)
    assert CostModel(settings(shared, 4)).measured_collective_s("allgather", 1e6) == \
        pytest.approx(0.006 + 7e-3)
    assert CostModel(settings(shared, 2)).measured_collective_s("allgather", 1e6) is None


@pytest.mark.parametrize("zenflow", [
    dict(select_strategy="auto", select_interval="auto", update_interval=4),
    dict(select_strategy="step", select_interval=8, update_interval=2),
    dict(select_strategy="epoch", select_interval=1, update_interval="auto"),
    dict(topk_ratio=0.2, overlap_step=False, full_warm_up_rounds=2, update_interval=3),
])
def test_the_simulator_reads_a_zenflow_config_as_the_engine_runs_it(zenflow):
    """One rule from an engine config to simulator settings (sims/settings.for_engine_run):
    the engine's own resolution of the select interval, every knob it reads."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from engine_helpers import BiasMLP, config, make_engine
    from zfbench.core.config import load_config
    from zfbench.sims.settings import for_engine_run

    raw = config("zenflow", **zenflow)
    engine = make_engine(BiasMLP(), raw)
    try:
        zf_engine = engine.strategy
        settings = for_engine_run(load_config(raw), model="tinyllama-1.1b", layers=1,
                                  profile=str(PROFILE))
        assert settings.zenflow.select_interval == zf_engine.S
        assert settings.zenflow.update_interval == engine.config.zenflow.update_interval
        assert settings.zenflow.topk_ratio == engine.config.zenflow.topk_ratio
        assert settings.zenflow.overlap_step == engine.config.zenflow.overlap_step
        assert settings.zenflow.full_warm_up_rounds == engine.config.zenflow.full_warm_up_rounds
        assert settings.scenario.precision == engine.config.precision
        assert settings.measurement.transfers == "full"
    finally:
        engine.close()
