"""DeepSpeed's ZenFlow on its CPU accelerator (issue 44): the training thread's memory-pass
rate read from a ZeRO-Offload log's `optimizer_gradients`, written into the node's link by
bench/predict_deepspeed.py, and ZenFlow's per-step gradient round trip simulated as that
thread's passes at that rate (zfbench.sims.cpu_accelerator) in place of link copies."""

import json

import pytest

from bench_helpers import bench_module
from zfbench.core import hardware
from zfbench.predict.fit import on_hardware_file
from zfbench.predict.inputs import PASS_BYTES_PER_ELEM, deepspeed_pass_rate
from zfbench.sims import cpu_accelerator
from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.simulator import simulate

pdd = bench_module("predict_deepspeed")
SMALL = dict(model="gpt2:layers=2,hidden=512,heads=8", micro_batch=1, seq=128,
             precision="fp32", gpus=1, gpus_per_switch=1, transfers="shipped",
             update_interval=4, full_warm_up_rounds=0, overlap_comm=False)
RATE = 2.5e10  # bytes/s of the training thread's pass in the tests' hardware files


def _log(path, grads_ms: list[float]) -> None:
    """A ZeRO-Offload log with `wall_clock_breakdown`'s lines, one step per value."""
    lines = []
    for ms in grads_ms:
        lines += [f"[Rank 0] time (ms) | optimizer_allgather: 0.05 | optimizer_gradients: "
                  f"{ms} | optimizer_step: 60.0",
                  "[Rank 0] time (ms) | fwd: 60.0 | bwd: 500.0 | bwd_inner: 230.0 | "
                  "bwd_allreduce: 270.0 | step: 80.0"]
    path.write_text("\n".join(lines) + "\n")


def test_pass_rate_is_the_partition_over_the_timer(tmp_path):
    """Bytes of one in-place pass (8 an fp32 element) over the mean steady timer; the
    warm-up steps left out; a log without the timer is refused."""
    log = tmp_path / "zo.log"
    _log(log, [500.0, 10.0, 12.0, 14.0])
    rate = deepspeed_pass_rate(log, 5e7, skip=1)
    assert PASS_BYTES_PER_ELEM == 8
    assert rate["bytes_per_s"] == pytest.approx(5e7 * 8 / 0.012)
    assert "optimizer_gradients" in rate["source"]
    assert deepspeed_pass_rate(log, 5e7, skip=0)["bytes_per_s"] < rate["bytes_per_s"]
    log.write_text("[Rank 0] time (ms) | fwd: 60.0 | bwd: 500.0 | step: 80.0\n")
    with pytest.raises(ValueError, match="optimizer_gradients"):
        deepspeed_pass_rate(log, 5e7, skip=0)


def test_round_trip_bytes_follow_deepspeeds_passes():
    """The window's first step copies the gradient into the accumulator (8 B an element);
    every later step also copies the accumulator up and adds it (8 + 12 B)."""
    assert cpu_accelerator.round_trip_bytes_per_elem(True) == 8
    assert cpu_accelerator.round_trip_bytes_per_elem(False) == 28


def _settings(tmp_path, rate: float | None, **knobs) -> SimSettings:
    path = tmp_path / f"hw_{rate}.json"
    k = on_hardware_file({**SMALL, **knobs}, path)
    if rate is not None:
        node = json.loads(path.read_text())
        for link in node["host_links"].values():
            link["training_thread_bytes_per_s"] = {"value": rate, "source": "test"}
        path.write_text(json.dumps(node))
    return SimSettings.from_knobs(**k, steps=12)


def _per_lane_op(result) -> dict:
    spans = result.timeline.spans_frame()
    spans = spans.assign(d=spans.t_end_s - spans.t_start_s)
    return spans.groupby(["lane", "op", "step"]).d.sum().to_dict()


def test_link_field_reads_back_and_scales(tmp_path):
    """The hardware file's rate is the link's; `bandwidth_scale` (the overlap's halved
    thread budget) scales it with the link; a real link has none."""
    costs = CostModel(_settings(tmp_path, RATE))
    assert cpu_accelerator.thread_rate(costs) == RATE
    halved = CostModel(_settings(tmp_path, RATE).with_(bandwidth_scale=0.5))
    assert cpu_accelerator.thread_rate(halved) == pytest.approx(RATE / 2)
    plain = CostModel(_settings(tmp_path, None))
    assert cpu_accelerator.thread_rate(plain) is None
    assert cpu_accelerator.round_trip_s(plain, False) == 0.0
    assert hardware.get_link(SimSettings().machine.pcie).training_thread_bytes_per_s is None


def test_zenflow_round_trip_is_the_threads_passes(tmp_path):
    """On a CPU accelerator each ZenFlow step's compute lane holds the round trip at the
    thread's rate (8 B an element on a window's first step, 28 on the others) and no
    accumulator goes up the link; without the field (negative control) the round trip is
    link copies and the compute lane holds no such pass."""
    on_cpu = _settings(tmp_path, RATE)
    c = CostModel(on_cpu)
    ops = _per_lane_op(simulate(on_cpu, "zenflow"))
    for t in range(4, 12):
        first = t % 4 == 0
        want = c.share(c.params) * (8 if first else 28) / RATE
        assert ops[("compute", "host_accum", t)] == pytest.approx(want, rel=1e-6)
        assert ("h2d", "h2d_param", t) not in ops or t % 4 == 3  # only the update goes up
    plain = _per_lane_op(simulate(_settings(tmp_path, None), "zenflow"))
    assert not any(k[:2] == ("compute", "host_accum") for k in plain)
    assert any(k[:2] == ("h2d", "h2d_param") and k[2] % 4 != 3 for k in plain)


def test_zero_offload_does_not_see_the_field(tmp_path):
    """The fitted baseline (ZeRO-Offload) simulates alike with and without the field: the
    field only changes what ZenFlow does beyond it."""
    with_field = simulate(_settings(tmp_path, RATE), "zero-offload")
    without = simulate(_settings(tmp_path, None), "zero-offload")
    assert _per_lane_op(with_field) == _per_lane_op(without)


def test_predict_writes_the_rate_only_on_a_cpu_accelerator(tmp_path):
    """bench/predict_deepspeed.py writes the log's pass rate into the node's link for a
    run without CUDA and leaves a GPU run's node alone."""
    log = tmp_path / "zo.log"
    _log(log, [10.0, 10.0, 10.0])
    run = {"log": "zo.log", "n_params": 4e7, "warmup_steps": 1}
    presets = tmp_path / "presets.json"
    on_hardware_file(dict(SMALL), presets)
    before = presets.read_text()
    assert pdd.cpu_accelerator_link({**run, "device": "cuda"}, tmp_path, presets) is None
    assert presets.read_text() == before
    rate = pdd.cpu_accelerator_link(run, tmp_path, presets)
    assert rate == pytest.approx(4e7 * 8 / 0.010)
    link = next(iter(json.loads(presets.read_text())["host_links"].values()))
    assert link["training_thread_bytes_per_s"]["value"] == pytest.approx(rate)
