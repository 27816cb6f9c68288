"""The simulator prices the engine's end-of-step gradient zeroing as the engine does it
(sims/emulated.py `grad_zero_s`): where the engine leaves the slots backward writes over
(real/engine.py `defer_zero`: no gradient buckets, not ZeRO-3) at the profile's
`grad_zero_deferred_s_per_elem`, elsewhere the whole zeroing; a profile written before
that key (bench/results/noflag_run_expect/profile.json) prices the whole zeroing, as it
did. The stored profiles get distinct made-up rates, so each price names its key."""

import json
from pathlib import Path

import pytest

from zfbench.real.profile_record import with_rates
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.emulated import grad_zero_s
from zfbench.sims.simulator import simulate

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
CPU_PROFILE = RESULTS / "noflag_run_expect" / "profile.json"  # CPU lanes, before the key
GPU_PROFILE = RESULTS / "gpu" / "NVIDIA-H200" / "profile" / "profile.json"
WHOLE, DEFERRED = 1.0e-9, 0.375e-9  # s per gradient element (made up, distinct)


def _profile(tmp_path, source: Path, deferred: float | None, name: str) -> Path:
    raw = json.loads(source.read_text())
    assert "grad_zero_deferred_s_per_elem" not in raw["calibration"]  # written before it
    rates = {"grad_zero_s_per_elem": WHOLE, "compute_factor_when_host_busy": 1.0,
             "host_factor_when_compute_busy": 1.0}
    if deferred is not None:
        rates["grad_zero_deferred_s_per_elem"] = deferred
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(with_rates(raw, rates)))
    return path


def _settings(profile: Path, **over) -> SimSettings:
    cal = json.loads(profile.read_text())["calibration"]
    model, _, layers = cal["model"].partition("[")
    knobs = dict(model=model, gpus=1, micro_batch=cal["batch"], seq=cal["seq"],
                 precision=cal["precision"], transfers="full", profile=str(profile), steps=6)
    if layers:
        knobs["layers"] = int(layers.rstrip("L]"))
    knobs.update(over)
    return SimSettings.from_knobs(**knobs)


def test_each_strategy_is_priced_at_what_its_engine_zeroes(tmp_path):
    cpu = CostModel(_settings(_profile(tmp_path, CPU_PROFILE, DEFERRED, "cpu")))
    gpu = CostModel(_settings(_profile(tmp_path, GPU_PROFILE, DEFERRED, "gpu")))
    assert cpu.emulated and not gpu.emulated
    # the CPU lanes: no buckets, so every ZeRO-2 strategy defers; ZeRO-3 never does
    for strategy in ("zero-offload", "zero-offload-dpu", "zenflow", "device"):
        assert grad_zero_s(cpu, strategy) == pytest.approx(cpu.params * DEFERRED, rel=1e-12)
    assert grad_zero_s(cpu, "zero-infinity") == pytest.approx(cpu.params * WHOLE, rel=1e-12)
    zero3 = CostModel(_settings(_profile(tmp_path, CPU_PROFILE, DEFERRED, "cpu3"),
                                zero_stage=3))
    assert grad_zero_s(zero3, "zenflow") == pytest.approx(zero3.params * WHOLE, rel=1e-12)
    # a GPU: the offloading strategies send their gradients in buckets; device does not
    for strategy in ("zero-offload", "zero-offload-dpu", "zenflow"):
        assert grad_zero_s(gpu, strategy) == pytest.approx(gpu.params * WHOLE, rel=1e-12)
    assert grad_zero_s(gpu, "device") == pytest.approx(gpu.params * DEFERRED, rel=1e-12)


def test_a_profile_without_the_key_prices_the_whole_zeroing(tmp_path):
    old = CostModel(_settings(_profile(tmp_path, CPU_PROFILE, None, "old")))
    for strategy in ("zero-offload", "zenflow", "device", "zero-infinity"):
        assert grad_zero_s(old, strategy) == pytest.approx(old.params * WHOLE, rel=1e-12)


@pytest.mark.parametrize("deferred", [DEFERRED, None])
def test_the_simulated_step_ends_with_that_zeroing(tmp_path, deferred):
    """ZeRO-Offload's last compute span of every step is the zeroing: its seconds are the
    priced ones (the lanes here do not slow each other)."""
    settings = _settings(_profile(tmp_path, CPU_PROFILE, deferred, "run"))
    spans = simulate(settings, "zero-offload").timeline.spans_frame()
    compute = spans[spans["lane"] == "compute"].sort_values("t_start_s")
    want = CostModel(settings).params * (WHOLE if deferred is None else deferred)
    for step, group in compute.groupby("step"):
        last = group.iloc[-1]
        assert last["op"] == "device_optim", step
        assert last["duration_s"] == pytest.approx(want, rel=1e-9), step
