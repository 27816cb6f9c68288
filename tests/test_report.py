"""zfbench.report: `run` and `simulate` write the same summary columns and steps.csv, and
print the same table; the mfu peak and the memory columns of a measured run."""

import math

import pandas as pd
import pytest

from zfbench.report import (MEASURED_ONLY, SUMMARY_COLUMNS, TABLE_HEAD, fits_cell,
                            format_table, render)
from zfbench.run.command import main as run_main
from zfbench.run.report import gpu_preset, peak_flops
from zfbench.simulate.command import main as simulate_main

RUN = ["--model", "tiny", "--steps", "12", "--batch", "2", "--seq", "16",
       "--device-threads", "1", "--host-threads", "1", "--quiet"]
SIM = ["--model", "qwen2.5-1.5b", "--layers", "2", "--steps", "12", "--quiet"]


def _header(printed: str) -> list[str]:
    return next(line for line in printed.splitlines()
                if line.split()[:1] == ["strategy"]).split()


@pytest.mark.slow
def test_run_and_simulate_share_columns_table_and_steps_csv(tmp_path, capsys):
    assert run_main(RUN + ["--out", str(tmp_path / "run")]) == 0
    run_head = _header(capsys.readouterr().out)
    assert simulate_main(SIM + ["--out", str(tmp_path / "sim")]) == 0
    sim_head = _header(capsys.readouterr().out)

    run = pd.read_csv(tmp_path / "run" / "summary.csv")
    sim = pd.read_csv(tmp_path / "sim" / "summary.csv")
    n = len(SUMMARY_COLUMNS)
    assert list(run.columns[:n]) == list(SUMMARY_COLUMNS)
    # no sweep: nothing else but the published row each number was calibrated on, if any
    # (zfbench.validate.calibrated; empty here)
    assert list(sim.columns) == list(SUMMARY_COLUMNS) + ["calibrated_on"]
    assert sim["calibrated_on"].isna().all()
    assert set(run.columns) - set(sim.columns) == set(MEASURED_ONLY)
    # the printed tables: the same columns, a measured run adds its loss at the end
    assert sim_head == list(TABLE_HEAD) and run_head == list(TABLE_HEAD) + ["loss"]

    # what run now writes as simulate does: mfu (empty on the CPU lane), memory, fits
    assert run["mfu"].isna().all() and run["fits"].all()
    assert (run["device_bytes_per_rank"] > 0).all() and (run["host_capacity_bytes"] > 0).all()
    assert run.set_index("strategy").loc["device", "host_bytes"] == 0
    assert (run.set_index("strategy").drop("device")["host_bytes"] > 0).all()
    assert (sim["mfu"] > 0).all()

    # steps.csv: the same columns, one row per strategy, rank and step
    run_steps = pd.read_csv(tmp_path / "run" / "steps.csv")
    sim_steps = pd.read_csv(tmp_path / "sim" / "steps.csv")
    assert list(run_steps.columns) == list(sim_steps.columns)
    assert run_steps.groupby("strategy").size().to_dict() == {
        s: 12 for s in ("device", "zero-offload", "zero-offload-dpu", "zenflow")}
    assert sorted(run_steps[run_steps["strategy"] == "zenflow"]["step"]) == list(range(12))
    parts = run_steps[["compute_s", "exposed_io_s", "host_wait_s"]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(run_steps["wall_s"].to_numpy(), abs=1e-9)


@pytest.mark.parametrize("name, preset", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-40GB", "a100-40g"),
    ("NVIDIA A100 80GB PCIe", "a100-80g"), ("NVIDIA H100 NVL", None),
    ("NVIDIA GH200 480GB", None), ("NVIDIA GeForce RTX 4090", None)])
def test_gpu_name_matches_a_preset_or_none(name, preset):
    assert gpu_preset(name) == preset


def test_peak_is_the_presets_datasheet_number_or_empty_with_the_reason():
    peak, note = peak_flops(True, "bf16", "NVIDIA H100 80GB HBM3")
    assert peak == pytest.approx(989e12) and "h100-sxm" in note
    for args, word in (((False, "bf16"), "no datasheet peak"),
                       ((True, "bf16", "NVIDIA GeForce RTX 4090"), "no hardware preset"),
                       ((True, "fp32", "NVIDIA H100 PCIe"), "fp32")):
        peak, note = peak_flops(*args)
        assert peak is None and word in note


def test_table_cells_units_and_empty_values():
    row = {"strategy": "zenflow", "step_time_s": 0.5, "speedup_vs_zero_offload": math.nan,
           "stall_fraction": 0.25, "exposed_io_s": 0.1, "host_wait_s": 0.025,
           "d2h_gb_per_s": 12.0, "h2d_gb_per_s": 13.0, "host_adam_params_per_s": 2.5e9,
           "pcie_bytes_per_step_over_model_bytes": 1.25, "achieved_flops_per_s": 4e14,
           "mfu": math.nan, "fits": True, "too_short": True}
    head, line = format_table([row]).splitlines()
    cells = dict(zip(head.split(), line.replace(" (too short)", "_short").split()))
    assert cells["strategy"] == "zenflow_short"
    assert (cells["speedup"], cells["stall%"], cells["hostAdam_Gparam/s"], cells["TFLOP/s"],
            cells["mfu%"], cells["fits"]) == ("-", "25.0", "2.5", "400", "-", "yes")
    gib = 2 ** 30
    assert fits_cell({"fits": False, "device_bytes_per_rank": 90 * gib,
                      "device_capacity_bytes": 80 * gib}) == "NO (dev 90/80 GiB)"
    assert fits_cell({"fits": False, "device_bytes_per_rank": 1.0,
                      "device_capacity_bytes": math.nan, "host_bytes": 3 * gib,
                      "host_capacity_bytes": 2 * gib}) == "NO (host 3/2 GiB)"
    assert fits_cell({"fits": math.nan}) == "-"
    assert render(["a", "bb"], [["xxx", "y"]]).splitlines() == ["  a  bb", "xxx   y"]


def test_a_gpu_run_says_when_zero_offload_had_part_of_the_cores():
    from zfbench.run.report import host_share_note
    rows = [{"strategy": "zero-offload", "host_threads": 8},
            {"strategy": "zero-offload-dpu", "host_threads": 8},
            {"strategy": "zenflow", "host_threads": 8}, {"strategy": "device", "host_threads": 8}]
    note = host_share_note(rows, True, 16)
    assert "zero-offload and zero-offload-dpu ran the host AdamW on 8 of the rank's 16" in note
    assert "zenflow" not in note.split(" ran ")[0]
    assert host_share_note(rows, False, 16) is None  # the CPU lanes: the split is the point
    assert host_share_note(rows, True, 8) is None  # already every core
    assert host_share_note(rows[2:], True, 16) is None  # no ZeRO-Offload row
