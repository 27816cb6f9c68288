"""The simulator's expectation for the machine that ran `zfbench.run`, beside the
measured rows (zfbench/run/expect.py)."""
from __future__ import annotations

import json
import math

import pytest

from zfbench.run.expect import format_expectation, side_by_side, verdict


def row(strategy: str, step: float, stall: float, io: float, wait: float) -> dict:
    return {"strategy": strategy, "step_time_s": step, "stall_fraction": stall,
            "exposed_io_s": io, "host_wait_s": wait}


MEASURED = [row("zero-offload", 0.70, 0.70, 0.10, 0.39), row("zenflow", 0.40, 0.12, 0.05, 0.0)]


def test_side_by_side_pairs_each_part_and_the_ratios_to_zero_offload():
    simulated = [row("zenflow", 0.32, 0.12, 0.04, 0.0), row("zero-offload", 0.64, 0.6, 0.08, 0.11)]
    pairs = {p["strategy"]: p for p in side_by_side(MEASURED, simulated)}
    zf = pairs["zenflow"]
    assert zf["measured_step_time_s"] == 0.40 and zf["simulated_step_time_s"] == 0.32
    assert zf["step_error_pct"] == pytest.approx(-20.0)
    assert zf["measured_over_zero_offload"] == pytest.approx(0.40 / 0.70)
    assert zf["simulated_over_zero_offload"] == pytest.approx(0.5)
    assert pairs["zero-offload"]["simulated_host_wait_s"] == 0.11
    text = format_expectation(list(pairs.values()))
    assert "0.400|0.320" in text and "-20.0" in text


def test_the_verdict_tells_reached_from_out_of_reach_from_slower_than_modelled():
    def pairs(measured_zf: float, simulated_zf: float):
        return side_by_side([row("zero-offload", 1.0, 0.5, 0.1, 0.4),
                             row("zenflow", measured_zf, 0.1, 0.05, 0.0)],
                            [row("zero-offload", 1.0, 0.5, 0.1, 0.4),
                             row("zenflow", simulated_zf, 0.1, 0.05, 0.0)])
    assert "within the 0.8x target" in verdict(pairs(0.6, 0.9))
    assert "out of reach on this machine" in verdict(pairs(0.9, 0.85))
    assert "slower than its model says" in verdict(pairs(0.9, 0.6))
    alone = side_by_side([row("zenflow", 1.0, 0.1, 0.0, 0.0)],
                         [row("zenflow", 1.0, 0.1, 0.0, 0.0)])
    assert math.isnan(alone[0]["measured_over_zero_offload"]) and verdict(alone) is None


@pytest.mark.slow
def test_a_one_rank_profile_run_prints_and_keeps_the_simulated_expectation(tmp_path, capsys):
    from zfbench.run.command import main

    out = tmp_path / "run"
    assert main(["--model", "tiny", "--layers", "1", "--steps", "14", "--device", "cpu",
                 "--precision", "fp32", "--profile", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED FOR THIS MACHINE" in printed and "lanes here: device" in printed
    summary = json.loads((out / "summary.json").read_text())
    here = {p["strategy"]: p for p in summary["simulated_here"]}
    assert set(here) == {"device", "zero-offload", "zero-offload-dpu", "zenflow"}
    measured = {r["strategy"]: r for r in summary["rows"]}
    for strategy, pair in here.items():
        assert pair["measured_step_time_s"] == measured[strategy]["step_time_s"]
        assert pair["simulated_step_time_s"] > 0
    assert (out / "profile.json").exists()
    for strategy in here:  # each simulated with the rates measured around its own run
        own = json.loads((out / "profiles" / f"{strategy}.json").read_text())
        assert own["calibration"]["blocks"] == \
            json.loads((out / "profile.json").read_text())["calibration"]["blocks"]
    # the host lane against the rates probed around it (issue 45), printed and kept:
    # zero-offload's ratios recomputed from its own spans and profile
    import pandas as pd

    from zfbench.run.host_target import host_target_columns

    assert "host lane against the rates probed around it" in printed
    assert measured["device"]["host_over_adam_plus_link"] is None  # NaN, as JSON null
    row = measured["zero-offload"]
    cal = json.loads((out / "profiles" / "zero-offload.json").read_text())["calibration"]
    spans = pd.read_csv(out / "zero-offload.spans.csv")
    want = host_target_columns(row, spans, row["steps_left_out"], cal, True, False,
                               summary["settings"]["params"])
    assert want["host_link_s_per_step"] > 0
    for key, value in want.items():
        assert row[key] == pytest.approx(value, rel=1e-9)
    assert row["host_over_adam_plus_link"] > row["host_over_adam_alone"] > 0


def test_several_ranks_measure_each_strategys_host_lane_on_their_share(monkeypatch):
    """A launched run's profile (rank 0 measures): on a GPU each strategy's host lane on
    the rank's share of the cores as the engine gives it (real/distributed.py
    `lane_threads`); one rank leaves the profile its own default; --host-threads fixes one
    count for all, so no lanes."""
    from types import SimpleNamespace

    import zfbench.real.distributed as dist
    from zfbench.real.runner import RunSpec
    from zfbench.run.expect import Calibration
    monkeypatch.setattr(dist, "available_cores", lambda: 32)
    ctx = SimpleNamespace(active=True, rank=0, world=4)
    assert Calibration(RunSpec(), ctx)._rank_lanes() == {
        "zero-offload": 8, "zero-offload-dpu": 8, "zenflow": 4}
    assert Calibration(RunSpec())._rank_lanes() is None
    assert Calibration(RunSpec(host_threads=2), ctx)._rank_lanes() == {}
