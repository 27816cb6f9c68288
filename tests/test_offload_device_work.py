"""bench/offload_device_work.py: the offloading step's own device work, read off committed
GPU runs, checked against hand computations (issue 44 item 1)."""

import csv
import json
import statistics
from pathlib import Path

import pytest

from bench_helpers import bench_module

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    return bench_module("offload_device_work")


def _write_run(results: Path) -> None:
    run = results / "GPU-X" / "run_a"
    run.mkdir(parents=True)
    lines = ["strategy,rank,step,wall_s,compute_s"]
    for name, values in (("device", [9.0, 0.20, 0.30, 0.25]),
                         ("zero-offload", [9.0, 0.10, 0.22, 0.15])):
        lines += [f"{name},0,{i},1.0,{v}" for i, v in enumerate(values)]
    (run / "steps.csv").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text(json.dumps({"settings": {
        "model": "m", "micro_batch": 2, "seq": 64, "params": 1e9}}))
    (results / "GPU-X" / "profile").mkdir()
    (results / "GPU-X" / "profile" / "profile.json").write_text(json.dumps({"calibration": {
        "device_optim_elems_per_s": 2e10, "master_copy_s_per_elem": 1e-11}}))


def test_excess_is_each_offloading_step_over_the_device_forward_backward(tmp_path):
    bench = _bench()
    _write_run(tmp_path)
    frame = bench.runs(tmp_path, tmp_path)
    assert len(frame) == 1
    row = frame.iloc[0]
    update = 1e9 / 2e10 + 1e9 * 1e-11  # 0.06 s: Adam at the profile's rate + master copy
    fwd_bwd = 0.25 - update  # the device steps' median (step 0 left out) less its update
    excess = sorted(v - fwd_bwd for v in (0.10, 0.22, 0.15))
    assert row["device_update_s"] == pytest.approx(update, rel=1e-12)
    assert row["device_fwd_bwd_s"] == pytest.approx(fwd_bwd, rel=1e-12)
    assert (row["excess_min_s"], row["excess_median_s"], row["excess_max_s"]) == \
        pytest.approx(excess, rel=1e-12)
    assert row["lane_minus_device_median_s"] == pytest.approx(0.15 - 0.25, rel=1e-12)
    assert row["steps"] == 3 and row["micro_batch"] == 2


def test_crossing_interpolates_and_says_none_outside():
    bench = _bench()
    assert bench.crossing([0, 10, 20], [1.0, 2.0, 4.0], 3.0) == pytest.approx(15.0)
    assert bench.crossing([0, 10, 20], [1.0, 2.0, 4.0], 1.0) == pytest.approx(0.0)
    assert bench.crossing([0, 10, 20], [1.0, 2.0, 4.0], 0.5) is None
    assert bench.crossing([0, 10, 20], [1.0, 2.0, 4.0], 4.5) is None


def test_committed_runs_read_as_the_files_say():
    """Both lent GPUs' runs are found, and a median is what the CSV itself gives."""
    bench = _bench()
    results = ROOT / "bench" / "results" / "gpu"
    frame = bench.runs(results, ROOT)
    assert {"NVIDIA-H200", "NVIDIA-H100-80GB-HBM3"} <= set(frame["gpu"])
    run = "bench/results/gpu/NVIDIA-H100-80GB-HBM3/run_qwen2.5-1.5b"
    with open(ROOT / run / "steps.csv") as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) >= 1]
    for name in ("zero-offload", "zenflow"):
        want = statistics.median(float(r["compute_s"]) for r in rows if r["strategy"] == name)
        got = frame[(frame["run"] == run) & (frame["strategy"] == name)]["compute_median_s"]
        assert float(got.iloc[0]) == pytest.approx(want, rel=1e-12)
    ops = bench.ops_vs_device(results, ROOT)
    with open(results / "NVIDIA-H100-80GB-HBM3" / "validate" / "ops.csv") as f:
        measured = {(r["cell"], r["op"]): float(r["measured_s_per_step"])
                    for r in csv.DictReader(f)}
    for row in ops.itertuples():
        assert row.over_device == pytest.approx(
            measured[(row.cell, row.op)] / measured[("ratio2.device", row.op)], rel=1e-12)
