"""The profile describes the device it was measured on (zfbench.real.profile): the
calibration's `device` and `transfers` come from the device the measurement used, never
from whether torch happens to see a GPU, and every timing waits for the device
(zfbench.real.rate_probe.median_time, Clock). CUDA's side is in tests/test_cuda.py."""

import time

import pytest
import torch

from zfbench.core.models import get_model
from zfbench.real.profile import measure_profile
from zfbench.real.profile_record import build_profile, mean_profile, with_rates
from zfbench.real.rate_probe import Clock, RateProbe, device_sync, median_time
from zfbench.real.runner import RunSpec

TINY = dict(model="tiny", layers=None, micro_batch=2, seq=16, device_threads=1, host_threads=1,
            precision="fp32")


@pytest.fixture(scope="module")
def cpu_profile():
    return measure_profile(RunSpec(device="cpu", **TINY), repeats=2)


def test_a_cpu_profile_says_emulated_even_where_torch_sees_a_gpu(monkeypatch):
    """The old lie: `transfers` was "cuda" whenever torch.cuda.is_available()."""
    import zfbench.real.profile_record as profile
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profile, "machine", lambda: {"cuda_device": "a GPU not used"})
    prof = measure_profile(RunSpec(device="cpu", **TINY), repeats=2)
    cal = prof["calibration"]
    assert cal["transfers"] == "emulated" and cal["device"] == "cpu"
    assert "device_memory_bytes" not in cal
    # the CPU lanes' device section as before: a nominal memory, the d2h memory copy
    gpu = prof["gpus"]["measured-device"]
    assert gpu["memory_bytes"]["value"] == 64e9
    assert gpu["hbm_bytes_per_s"]["value"] == cal["d2h_bytes_per_s"]


def test_cpu_profile_measures_every_block_and_rate(cpu_profile):
    cal = cpu_profile["calibration"]
    assert (cal["device"], cal["transfers"]) == ("cpu", "emulated")
    for kind in ("embedding", "decoder", "head"):
        assert cal["blocks"][kind]["forward_s"] > 0 and cal["blocks"][kind]["backward_s"] > 0
    for key in ("d2h_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s_both",
                "h2d_bytes_per_s_both", "host_adam_params_per_s", "device_copy_s_per_elem"):
        assert cal[key] > 0, key


def test_median_time_waits_for_the_device_before_and_after():
    """Each repeat: sync, then the clock, fn, sync, then the clock is read; so work `fn`
    only queues (here: 20 ms that the sync waits out) is inside the time."""
    calls, queued = [], []

    def fn():
        calls.append("fn")
        queued.append(0.02)

    def sync():
        calls.append("sync")
        while queued:
            time.sleep(queued.pop())
    seconds = median_time(fn, 3, sync=sync)
    assert calls == ["sync", "fn", "sync"] * 3
    assert seconds >= 0.02
    # without the wait the queued work is outside the time
    queued.clear()
    assert median_time(fn, 3) < 0.02


def test_cpu_timing_has_nothing_to_wait_for():
    assert device_sync("cpu") is None and device_sync(None) is None
    clock = Clock("cpu")
    marks = [clock.mark(), clock.mark()]
    assert clock.seconds(marks) == marks and marks[1] >= marks[0]


def test_cpu_rate_probe_is_as_before_and_closes():
    probe = RateProbe(1 << 12, torch.bfloat16, 1)
    assert probe.device == torch.device("cpu") and not probe.streams
    assert probe.dev.dtype == torch.bfloat16 and probe.grad.dtype == torch.float32
    rates = probe.measure(2)
    assert all(v > 0 for v in rates.values())
    probe.close()
    probe.close()  # idempotent


def test_link_host_contention_factors_from_the_probes_own_copies():
    """The GPU-only measurement, run with the CPU lanes' copies and a stand-in for the
    stream wait (the CPU has none): factors alone / together, in (0, 1]; the CPU lanes'
    own measure() leaves them out (nothing applies them there)."""
    probe = RateProbe(1 << 16, torch.bfloat16, 1)
    _, h2d, _, _ = probe._links()
    waits = []
    factors = probe._link_host_contention(h2d, lambda: waits.append(1), 1e-3, 1e-3, 2)
    assert set(factors) == {"h2d_factor_when_host_busy", "host_factor_when_h2d_busy"}
    assert all(0 < v <= 1 for v in factors.values()) and waits
    assert "h2d_factor_when_host_busy" not in probe.measure(2)
    probe.close()


def _fake_profile(device_info):
    blocks = {k: {"forward_s": 1e-3, "backward_s": 2e-3, "forward_flops": 1e6, "tokens": 32}
              for k in ("embedding", "decoder", "head")}
    rates = {"d2h_bytes_per_s": 2e10, "h2d_bytes_per_s": 2.5e10, "d2h_bytes_per_s_both": 1.5e10,
             "h2d_bytes_per_s_both": 2e10, "host_adam_params_per_s": 1e9,
             "host_accum_elems_per_s": 5e9, "device_copy_s_per_elem": 2e-12,
             "precision": "bf16", "device_optim_elems_per_s": 1e11,
             "select_s_per_elem": 1e-12}
    spec = RunSpec(**{**TINY, "device": "cpu"})
    return build_profile(spec, get_model("tiny"), blocks, 1, 1, rates, device_info)


GPU = {"device": "Some GPU 80GB", "transfers": "cuda", "device_memory_bytes": 80 * 2**30}


def test_a_cuda_profile_reports_the_gpus_memory_and_copy_rate():
    prof = _fake_profile(GPU)
    gpu = prof["gpus"]["measured-device"]
    assert gpu["memory_bytes"]["value"] == 80 * 2**30
    assert "total_memory" in gpu["memory_bytes"]["source"]
    # bf16: 2 bytes read + 2 written per element in 2 ps -> 2e12 B/s
    assert gpu["hbm_bytes_per_s"]["value"] == pytest.approx(2e12)
    assert "device-to-device copy" in gpu["hbm_bytes_per_s"]["source"]
    cal = prof["calibration"]
    assert {k: cal[k] for k in GPU} == GPU


@pytest.mark.parametrize("info", [GPU, {"device": "cpu", "transfers": "emulated"}])
def test_with_rates_and_mean_profile_keep_the_device(info):
    prof = _fake_profile(info)
    cell = with_rates(prof, {"d2h_bytes_per_s": 4e10})
    mean = mean_profile([prof, cell])
    for out in (cell, mean):
        cal = out["calibration"]
        assert {k: cal[k] for k in info} == info
        assert set(cal) == set(prof["calibration"])
        assert out["gpus"]["measured-device"]["memory_bytes"]["value"] == \
            prof["gpus"]["measured-device"]["memory_bytes"]["value"]
    assert cell["calibration"]["d2h_bytes_per_s"] == 4e10
    assert mean["calibration"]["d2h_bytes_per_s"] == pytest.approx(3e10)


def test_with_rates_round_trips_a_measured_cpu_profile(cpu_profile):
    cal = cpu_profile["calibration"]
    cell = with_rates(cpu_profile, {"host_adam_params_per_s": cal["host_adam_params_per_s"] / 2})
    again = mean_profile([cpu_profile, cell])
    for out in (cell, again):
        assert (out["calibration"]["device"], out["calibration"]["transfers"]) == \
            ("cpu", "emulated")
        assert out["calibration"]["blocks"] == cal["blocks"]


def test_an_old_profile_without_a_device_keeps_what_it_had():
    """Profiles written before `device` existed: with_rates neither adds nor loses keys."""
    prof = _fake_profile({"transfers": "cuda"})  # the old lie, no memory: the CPU numbers
    assert "device" not in prof["calibration"]
    assert prof["gpus"]["measured-device"]["memory_bytes"]["value"] == 64e9
    cell = with_rates(prof, {})
    assert cell["calibration"]["transfers"] == "cuda" and "device" not in cell["calibration"]


def test_the_probe_measures_each_strategys_own_host_lane():
    """`strategy_threads`: the host-lane rates again on each other thread count (on a GPU
    every strategy but ZenFlow runs its host step on all the cores), as `host_lanes`;
    none where every strategy runs on the probe's own count. `strategy_threads_of` reads
    the counts back from a profile's calibration, to measure them again."""
    from zfbench.real.rate_probe import HOST_LANE_KEYS, strategy_threads_of
    probe = RateProbe(1 << 12, torch.bfloat16, 1,
                      strategy_threads={"zero-offload": 2, "zenflow": 1})
    rates = probe.measure(2)
    probe.close()
    lanes = rates["host_lanes"]
    assert set(lanes) == {"zero-offload"}  # zenflow's count is the probe's own
    lane = lanes["zero-offload"]
    assert lane["host_threads"] == 2
    assert set(lane) == {"host_threads", *HOST_LANE_KEYS, "host_convert_elems_per_s"}
    assert all(v > 0 for v in lane.values())
    assert strategy_threads_of({"host_lanes": lanes}) == {"zero-offload": 2}
    assert strategy_threads_of({}) == {}
    plain = RateProbe(1 << 12, torch.float32, 1, strategy_threads={"zenflow": 1})
    assert "host_lanes" not in plain.measure(2)
    plain.close()


def test_the_simulator_takes_a_strategys_own_host_lane(tmp_path):
    """sims/settings.py `strategy_host_lane` (CostModel with a strategy): with a profile whose `host_lanes` hold a
    strategy's rates on another thread count, that strategy's simulation runs its host
    work on that many cores at those rates; other strategies, `--host-cores`, and
    profiles without lanes keep the profile's own."""
    import json

    from zfbench.sims.costs import CostModel, SimSettings
    from zfbench.sims.simulator import simulate
    prof = _fake_profile(GPU)
    cal = prof["calibration"]
    lane = {"host_threads": 4, "host_adam_params_per_s": 3e9,
            "host_accum_elems_per_s": 8e9}
    cal["host_lanes"] = {"zero-offload": lane}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    settings = SimSettings.from_knobs(model="tiny", profile=str(path), micro_batch=1, seq=32, steps=4)
    own = CostModel(settings, "zero-offload")
    assert own.node.host.cores == 4
    assert own.node.host.adam_params_per_s(4) == pytest.approx(3e9)
    assert own.accum_units_per_core_s == pytest.approx(8e9 / 4)
    for other in (CostModel(settings, "zenflow"), CostModel(settings),
                  CostModel(settings.with_(host_cores=1), "zero-offload")):
        assert other.node.host.cores == 1
        assert other.node.host.adam_params_per_s(1) == pytest.approx(1e9)
    # the step: zero-offload's host Adam is 3x faster with its lane than without it
    adam = {}
    for lanes in ({"zero-offload": lane}, {}):
        cal["host_lanes"] = lanes
        path.write_text(json.dumps(prof))
        spans = simulate(settings, "zero-offload").timeline.spans_frame()
        optim = spans[(spans["op"] == "host_optim") & (spans["step"] == 2)]
        adam[bool(lanes)] = optim["duration_s"].sum()
    assert adam[True] == pytest.approx(adam[False] / 3, rel=0.05)
