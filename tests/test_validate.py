"""Calibration and validation: profile -> simulator, the quick validate matrix, projection."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

from zfbench.analysis.validation import (compare_ops, compare_rows, error_summary,
                                         schedule_signature, signature_diff, spearman)
from zfbench.sims.costs import SimSettings, SimSettingsError
from zfbench.sims.simulator import simulate
from zfbench.core.hardware import load_profile
from zfbench.run.command import main as run_main
from zfbench.simulate.command import main as simulate_main
from zfbench.validate.command import main as validate_main

TINY = ["--model", "tiny", "--steps", "10", "--batch", "2", "--seq", "16",
        "--device-threads", "1", "--host-threads", "1", "--quiet"]  # conftest's TINY_RUN


@pytest.fixture(scope="module")
def profile_path(tiny_profile_path):
    return tiny_profile_path


@pytest.mark.slow
def test_profile_is_a_hardware_profile_with_calibration(profile_path):
    parsed = load_profile(profile_path)
    node = parsed["nodes"]["measured"]
    assert node.gpus == 1 and node.link.d2h_bytes_per_s > 0
    cal = json.loads(profile_path.read_text())["calibration"]
    for kind in ("embedding", "decoder", "head"):
        assert cal["blocks"][kind]["forward_s"] > 0 and cal["blocks"][kind]["backward_s"] > 0
    for key in ("device_optim_elems_per_s", "select_s_per_elem", "d2h_bytes_per_s",
                "h2d_bytes_per_s", "d2h_bytes_per_s_both", "h2d_bytes_per_s_both",
                "host_adam_params_per_s", "host_accum_elems_per_s", "device_threads",
                "host_threads", "device_copy_s_per_elem"):
        assert cal[key] > 0, key
    # the step's zeroing where the engine defers it (the CPU lanes): the slots of the
    # weights backward writes over are left out, the rest (embedding, norms) is timed
    assert 0 < cal["grad_zero_deferred_share"] < 1
    for key in ("compute_factor_when_host_busy", "host_factor_when_compute_busy"):
        assert 0 < cal[key] <= 1, key
    # what ZeRO-3's gathers and releases add to each block's passes (at least 0)
    assert set(cal["zero3_hooks"]) == {"embedding", "decoder", "head"}
    assert all(v >= 0 for b in cal["zero3_hooks"].values() for v in b.values())
    raw = json.loads(profile_path.read_text())
    assert all(v["source"] for v in raw["host_links"]["measured-link"].values()
               if isinstance(v, dict))


@pytest.mark.slow
def test_simulate_with_profile_uses_measured_costs(profile_path, capsys):
    assert simulate_main(["--profile", str(profile_path), "--steps", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "tiny on the machine measured in" in out
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16, precision="fp32",
                               transfers="full", profile=str(profile_path), steps=8)
    result = simulate(s, "zero-offload")
    cal = json.loads(profile_path.read_text())["calibration"]
    fwd = result.timeline.spans_frame().query("op == 'forward'")["duration_s"].iloc[0]
    blocks = cal["blocks"]
    want = blocks["embedding"]["forward_s"] + 2 * blocks["decoder"]["forward_s"] + \
        blocks["head"]["forward_s"]
    assert fwd == pytest.approx(want, rel=1e-9)
    d2h = result.timeline.spans_frame().query("lane == 'd2h'")
    assert (d2h["bytes"] == result.costs.params * 4).all()
    # applying a one-step-late update is the measured device copy (plus the engine's
    # per-step gradient check and zeroing, which every offload step has: on the CPU lanes
    # the zeroing of what backward does not write over), when the lanes do not slow each
    # other

    from zfbench.real.profile_record import with_rates
    apart = profile_path.with_name("apart.json")
    apart.write_text(json.dumps(with_rates(json.loads(profile_path.read_text()), {
        "compute_factor_when_host_busy": 1.0, "host_factor_when_compute_busy": 1.0})))
    c = result.costs
    dpu = simulate(s.with_(profile=str(apart)), "zero-offload-dpu").timeline.spans_frame(
    ).query("op == 'device_optim' and step == 4")["duration_s"].sum()
    assert dpu == pytest.approx(c.params * (cal["device_copy_s_per_elem"] +
                                            cal["grad_check_s_per_elem"] +
                                            cal["grad_zero_deferred_s_per_elem"]), rel=1e-9)


@pytest.mark.slow
def test_zenflow_window_is_priced_as_the_engine_runs_it(profile_path):
    """Since issue 45 the engine zeroes no window: a window's first accumulation writes
    it. A profile that measured that accumulation (`host_accum_first_elems_per_s` F,
    which the probe now measures) prices each window's first accumulation at F and every
    other at the accumulation's rate, and no zeroing even where a stale
    `host_zero_elems_per_s` Z is beside it; an older profile (Z, no F) prices the zeroing
    as before, a window's host update params / Z longer, and every accumulation alike.
    ZeRO-Offload's host step, which has neither, is unchanged."""
    from zfbench.real.profile_record import with_rates
    raw = json.loads(profile_path.read_text())
    assert raw["calibration"]["host_accum_first_elems_per_s"] > 0  # the probe measures it
    assert "host_zero_elems_per_s" not in raw["calibration"]
    apart = {"compute_factor_when_host_busy": 1.0, "host_factor_when_compute_busy": 1.0}
    base = {k: v for k, v in raw["calibration"].items()
            if k not in ("host_zero_elems_per_s", "host_accum_first_elems_per_s")}
    accum = base["host_accum_elems_per_s"]
    variants = {"old": {}, "old_zero": {"host_zero_elems_per_s": 2e6},
                "new": {"host_accum_first_elems_per_s": accum},
                "new_slow": {"host_accum_first_elems_per_s": 2e6,
                             "host_zero_elems_per_s": 2e6}}
    paths = {}
    for name, rates in variants.items():
        profile = with_rates({**raw, "calibration": base}, {**apart, **rates})
        paths[name] = profile_path.with_name(f"window_{name}.json")
        paths[name].write_text(json.dumps(profile))
    s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16,
                               precision="fp32", profile=str(paths["old"]), steps=12)

    def op_s(strategy: str, which: str, op: str):
        result = simulate(s.with_(profile=str(paths[which])), strategy)
        spans = result.timeline.spans_frame().query(f"op == '{op}'")
        return spans.groupby("step")["duration_s"].sum(), result.costs

    old, costs = op_s("zenflow", "old", "host_optim")
    windows = sum(costs.is_boundary(t) and t >= costs.settings.zenflow.full_warm_up_rounds
                  for t in range(12))
    assert windows >= 2
    zeroed, _ = op_s("zenflow", "old_zero", "host_optim")
    assert zeroed.sum() - old.sum() == pytest.approx(windows * costs.params / 2e6, rel=1e-6)
    for which in ("new", "new_slow"):  # no zeroing priced, whatever Z says
        assert op_s("zenflow", which, "host_optim")[0].sum() == pytest.approx(old.sum(),
                                                                              rel=1e-9)
    # the accumulation: at F where F equals the accumulation's rate, as before; a slow F
    # lengthens exactly the first accumulation of each window
    acc_old, _ = op_s("zenflow", "old", "host_accum")
    acc_same, _ = op_s("zenflow", "new", "host_accum")
    acc_slow, _ = op_s("zenflow", "new_slow", "host_accum")
    assert acc_same.to_list() == pytest.approx(acc_old.to_list(), rel=1e-9)
    longer = acc_slow - acc_old
    first = [t for t in acc_old.index if t >= costs.settings.zenflow.full_warm_up_rounds
             and (t == costs.settings.zenflow.full_warm_up_rounds or costs.is_boundary(t - 1))]
    assert len(first) == windows or len(first) == windows + 1
    assert set(longer[longer > 1e-12].index) == set(first)
    elems = acc_old[first[0]] * accum  # the accumulated elements (one rank)
    assert longer[first[0]] == pytest.approx(elems / 2e6 - acc_old[first[0]], rel=1e-6)
    for which in ("old_zero", "new_slow"):
        assert op_s("zero-offload", which, "host_optim")[0].sum() == pytest.approx(
            op_s("zero-offload", "old", "host_optim")[0].sum(), rel=1e-12)


@pytest.fixture(scope="module")
def bf16_profile_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile_bf16")
    assert run_main(TINY + ["--precision", "bf16", "--strategy", "zero-offload", "--profile",
                            "--out", str(out)]) == 0
    return out / "profile.json"


@pytest.mark.slow
def test_simulate_takes_the_profiles_precision(bf16_profile_path, tmp_path, capsys):
    """A bf16 run's profile simulates bf16 transfers: the d2h bytes per step the run
    measured (was fp32: twice as many), unless --precision says otherwise."""
    profile_path = bf16_profile_path
    cal = json.loads(profile_path.read_text())["calibration"]
    assert cal["precision"] == "bf16"
    measured = pd.read_csv(profile_path.parent / "summary.csv").set_index("strategy")
    want = measured.loc["zero-offload", "d2h_bytes_per_step"]
    argv = ["--profile", str(profile_path), "--strategy", "zero-offload", "--steps", "10",
            "--quiet"]
    assert simulate_main(argv + ["--out", str(tmp_path / "own")]) == 0
    assert "bf16 (the profile's)" in capsys.readouterr().out
    sim = pd.read_csv(tmp_path / "own" / "summary.csv")
    assert sim["d2h_bytes_per_step"].iloc[0] == want > 0
    summary = json.loads((tmp_path / "own" / "summary.json").read_text())
    assert summary["settings"]["precision"] == "bf16"
    assert simulate_main(argv + ["--precision", "fp32", "--out", str(tmp_path / "fp32")]) == 0
    sim32 = pd.read_csv(tmp_path / "fp32" / "summary.csv")
    assert sim32["d2h_bytes_per_step"].iloc[0] == 2 * want


@pytest.mark.slow
def test_with_rates_rebuilds_the_hardware_the_simulator_reads(profile_path):
    """A cell's profile: the shape's, with the host and link rates measured around the
    cell; the simulator's node must see the new rates, the blocks must not change."""
    from zfbench.real.profile_record import with_rates
    base = json.loads(profile_path.read_text())
    cal = base["calibration"]
    rates = {"host_adam_params_per_s": cal["host_adam_params_per_s"] / 2,
             "d2h_bytes_per_s": cal["d2h_bytes_per_s"] * 3}
    cell = with_rates(base, rates)
    assert cell["calibration"]["blocks"] == cal["blocks"]
    assert cell["calibration"]["transfers"] == cal["transfers"]
    assert cell["calibration"]["host_adam_params_per_s"] == rates["host_adam_params_per_s"]
    path = profile_path.with_name("cell.json")
    path.write_text(json.dumps(cell))
    node, old = load_profile(path)["nodes"]["measured"], load_profile(profile_path)[
        "nodes"]["measured"]
    assert node.link.d2h_bytes_per_s == pytest.approx(3 * old.link.d2h_bytes_per_s)
    assert node.link.h2d_bytes_per_s == pytest.approx(old.link.h2d_bytes_per_s)
    assert node.host.adam_params_per_s_per_core == pytest.approx(
        old.host.adam_params_per_s_per_core / 2)


def test_emulated_lanes_slow_each_other_only_when_they_overlap():
    """Compute and host-side work of one rank sharing DRAM: each at its factor while both
    run; other ranks' work and transfers down are not affected."""
    from zfbench.sims.emulated import emulated_rates
    from zfbench.sims.fluid import Job

    def base(active):
        return [10.0 * (i + 1) for i in range(len(active))]
    base.job_key = lambda job: (job.kind, job.rank)
    rates = emulated_rates(base, 0.5, 0.25)
    compute, host, up, down = (Job("compute", 0, 1.0), Job("host", 0, 1.0),
                               Job("h2d", 0, 1.0), Job("d2h", 0, 1.0))
    assert rates([compute]) == [1.0]
    assert rates([host, down]) == [10.0, 20.0]
    assert rates([compute, host, down, up]) == [0.5, 2.5, 20.0, 7.5]
    assert rates([Job("compute", 1, 1.0), host]) == [1.0, 10.0]
    assert rates.job_key is base.job_key


@pytest.mark.slow
def test_lane_contention_lengthens_overlapped_strategies_only(profile_path):
    """Measured factors below 1 make dpu and zenflow (host work beside compute) slower
    and leave zero-offload and device (never both at once) as they were."""
    from zfbench.real.profile_record import with_rates
    raw = json.loads(profile_path.read_text())
    paths = {}
    for label, f in (("apart", 1.0), ("shared", 0.5)):
        paths[label] = profile_path.with_name(f"{label}.json")
        paths[label].write_text(json.dumps(with_rates(raw, {
            "compute_factor_when_host_busy": f, "host_factor_when_compute_busy": f})))

    def step_s(label, strategy):
        s = SimSettings.from_knobs(model="tiny", layers=2, gpus=1, micro_batch=2, seq=16,
                                   precision="fp32", transfers="full", profile=str(paths[label]),
                                   steps=12)
        steps = simulate(s, strategy).timeline.steps_frame().iloc[4:]
        return (steps["t_end_s"] - steps["t_start_s"]).mean()
    for strategy in ("zero-offload", "device"):
        assert step_s("shared", strategy) == pytest.approx(step_s("apart", strategy))
    for strategy in ("zero-offload-dpu", "zenflow"):
        assert step_s("shared", strategy) > step_s("apart", strategy)


@pytest.mark.slow
def test_profile_of_another_model_is_refused(profile_path):
    with pytest.raises(SimSettingsError, match="measured on tiny"):
        SimSettings.from_knobs(model="opt-350m", precision="fp32", profile=str(profile_path))


@pytest.mark.slow
def test_quick_validate_matches_schedules_within_loose_bounds(tmp_path):
    assert validate_main(["--quick", "--quiet", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "validate.csv")
    assert set(table["strategy"]) == {"device", "zero-offload", "zero-offload-dpu", "zenflow"}
    assert (table["schedule_diffs"] == 0).all()
    # every shape has its ZenFlow-on-ZeRO-3 cell, at the pair, with its own summary
    zero3 = table[table["zero_stage"] == 3]
    assert list(zero3["strategy"]) == ["zenflow"] * 3 and zero3["shape"].nunique() == 3
    assert (zero3["topk_ratio"] == 0.1).all() and (zero3["update_interval"] == 4).all()
    summary = json.loads((tmp_path / "validate_summary.json").read_text())
    assert summary["schedule_mismatches"] == 0 and summary["complete"] is True
    assert list(table["regime"].unique()) == ["longer", "equal", "shorter"]
    # how close the simulation comes is a measurement (docs/results.md holds the full
    # validate's); here, what holds on any machine: the summary is the table's
    assert summary["step_time_mape"] == pytest.approx(
        table["rel_error_step_time_s"].abs().mean())
    assert summary["zero3_cells"] == 3 and summary["zero3_step_time_mape"] == pytest.approx(
        zero3["rel_error_step_time_s"].abs().mean())
    assert (table["simulated_step_time_s"] > 0).all()
    assert (table["measured_step_time_s"] > 0).all()
    assert len(list((tmp_path / "traces").glob("*.json"))) >= 15
    assert len(list((tmp_path / "traces").glob("*.zenflow.zero3.topk0.1-U4.json"))) == 3
    # a profile per shape and one per cell (host and link rates measured around it)
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 3 + 3 * 5
    # every cell's busy seconds per op, both sides: the compute ops of every cell, and
    # the host optimizer of each offloading cell, measured and simulated
    ops = pd.read_csv(tmp_path / "ops.csv")
    assert ops.groupby("shape")["cell"].nunique().tolist() == [5, 5, 5]
    fwd = ops[ops["op"] == "forward"]
    assert len(fwd) == 15 and (fwd["measured_s_per_step"] > 0).all() \
        and (fwd["simulated_s_per_step"] > 0).all()
    host = ops[(ops["op"] == "host_optim") & ~ops["cell"].str.endswith(".device")]
    assert len(host) == 12 and (host["simulated_s_per_step"] > 0).all()
    # bench/trace_ops.py reads the same table back from the traces (older runs' only
    # record), and bench/validate_replay.py simulates the kept profiles to the same steps
    bench = Path(__file__).resolve().parents[1] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import trace_ops
        import validate_replay
    finally:
        sys.path.remove(str(bench))
    assert trace_ops.main([str(tmp_path / "traces"), "--skip", "6", "--out",
                           str(tmp_path / "ops_from_traces.csv")]) == 0
    again = pd.read_csv(tmp_path / "ops_from_traces.csv")
    keys = ["cell", "lane", "op"]
    ours = ops.set_index(keys).sort_index()
    theirs = again.set_index(keys).sort_index()
    assert list(ours.index) == list(theirs.index)
    for col in ("measured_s_per_step", "simulated_s_per_step"):
        assert theirs[col].to_numpy() == pytest.approx(ours[col].to_numpy(), rel=1e-4,
                                                       abs=1e-6)
    replayed = validate_replay.replay(tmp_path, {})
    assert len(replayed) == len(table.drop_duplicates(
        ["shape", "strategy", "zero_stage", "measured_step_time_s"]))
    assert replayed["simulated_now_step_time_s"].to_numpy() == pytest.approx(
        replayed["simulated_then_step_time_s"].to_numpy(), rel=1e-9)
    assert (table["cell_host_adam_params_per_s"] > 0).all()
    # the settings used and where the numbers came from
    settings = summary["settings"]
    assert (settings["model"], settings["layers"], settings["steps"], settings["skip"]) == \
        ("tiny", 2, 14, 6)
    assert settings["zenflow_pairs"] == [{"topk_ratio": 0.1, "update_interval_steps": 4}]
    assert settings["zero3_cells"] == [{"strategy": "zenflow", "topk_ratio": 0.1,
                                        "update_interval_steps": 4}]
    assert settings["shapes"] == ["longer", "equal", "shorter"]
    assert summary["provenance"]["command_line"] == \
        f"python -m zfbench.validate --quick --quiet --out {tmp_path}"
    assert summary["provenance"]["torch_version"] and summary["provenance"]["machine"]


@pytest.mark.slow
def test_validate_runs_a_subset_of_shapes_and_keeps_finished_shapes_when_stopped(
        tmp_path, monkeypatch, capsys):
    """--shapes picks regimes; each finished shape is on disk before the next starts, so a
    run that dies in its second shape leaves the first shape's rows, marked incomplete."""
    import zfbench.validate.command as v
    assert validate_main(["--quick", "--quiet", "--shapes", "nope", "--out",
                          str(tmp_path / "bad")]) == 2
    assert "choose among longer, equal, shorter" in capsys.readouterr().err
    real_shape, calls = v.validate_shape, []

    def dies_in_second_shape(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 2:
            raise RuntimeError("worker died")
        return real_shape(*args, **kwargs)
    monkeypatch.setattr(v, "validate_shape", dies_in_second_shape)
    with pytest.raises(RuntimeError, match="worker died"):
        validate_main(["--quick", "--quiet", "--shapes", "equal,shorter", "--out",
                       str(tmp_path)])
    table = pd.read_csv(tmp_path / "validate.csv")
    assert set(table["shape"]) == {calls[0]} and set(table["regime"]) == {"equal"}
    assert len(table) == 5  # one pair in --quick: one row per strategy, and ZeRO-3's
    summary = json.loads((tmp_path / "validate_summary.json").read_text())
    assert summary["shapes_done"] == [calls[0]] and summary["complete"] is False
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.slow
def test_validate_leaves_out_a_shape_that_would_overrun_its_budget(tmp_path, capsys):
    """A budget already spent after the first shape: the second is left out, and the
    summary and the output say which and how to run it; what finished is kept."""
    assert validate_main(["--quick", "--quiet", "--shapes", "equal,shorter",
                          "--budget-min", "0.0001", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "validate_summary.json").read_text())
    assert summary["complete"] is False and len(summary["shapes_done"]) == 1
    assert summary["left_out"]["shapes"] == ["shorter"]
    assert summary["left_out"]["run_them_with"].endswith("--shapes shorter")
    assert "left out to stay within the time budget" in capsys.readouterr().err
    assert set(pd.read_csv(tmp_path / "validate.csv")["regime"]) == {"equal"}
    assert validate_main(["--quick", "--budget-min", "-1", "--out", str(tmp_path)]) == 2


def test_signature_catches_a_different_schedule():
    frame = pd.DataFrame([
        (0, "compute", "forward", 3, 0.0, 1.0, 0), (0, "compute", "backward", 3, 1.0, 2.0, 0),
        (0, "d2h", "d2h_grad", 3, 2.0, 3.0, 8), (0, "host", "host_optim", 3, 3.0, 4.0, 0)],
        columns=["rank", "lane", "op", "step", "t_start_s", "t_end_s", "bytes"])
    other = frame.copy()
    other.loc[3, "op"] = "host_accum"
    same = frame.copy()
    same.loc[:, "t_start_s"] *= 2
    same.loc[:, "t_end_s"] *= 2
    a, b = schedule_signature(frame, 3, 3), schedule_signature(other, 3, 3)
    assert signature_diff(a, schedule_signature(same, 3, 3)) == []
    assert signature_diff(a, b) == ["step 3 host: measured ('host_optim',) vs simulated "
                                    "('host_accum',)"]


def _summary_of(cells, simulated_stall: float) -> dict:
    """error_summary of one group of (strategy, measured s, simulated s) cells whose
    measured stall is 0.5."""
    rows = []
    for strategy, m, s in cells:
        row = compare_rows({"step_time_s": m, "stall_fraction": 0.5, "d2h_bytes_per_step": 1,
                            "h2d_bytes_per_step": 1},
                           {"step_time_s": s, "stall_fraction": simulated_stall,
                            "d2h_bytes_per_step": 1, "h2d_bytes_per_step": 1})
        rows.append({"shape": "x", "strategy": strategy, **row})
    return error_summary(pd.DataFrame(rows), ["shape"])


def test_compare_ops_gives_busy_seconds_per_step_of_each_side():
    """Steps 1-2 of two made-up timelines: a (lane, op) on one side only is 0 on the
    other (ratio inf, or NaN where neither spent time); step 0 is outside the window."""
    cols = ["lane", "op", "step", "t_start_s", "t_end_s"]
    measured = pd.DataFrame([("host", "host_optim", 1, 0.0, 0.5),
                             ("host", "host_optim", 2, 1.0, 1.5),
                             ("host", "host_optim", 0, 9.0, 19.0),
                             ("h2d", "h2d_param", 2, 2.0, 2.1),
                             ("compute", "forward", 1, 3.0, 3.2)], columns=cols)
    simulated = pd.DataFrame([("host", "host_optim", 1, 0.0, 0.25),
                              ("compute", "forward", 1, 3.0, 3.1),
                              ("d2h", "d2h_grad", 1, 4.0, 4.0)], columns=cols)
    table = compare_ops(measured, simulated, 1, 2).set_index(["lane", "op"])
    assert table.loc[("host", "host_optim")].tolist() == pytest.approx([0.5, 0.125, 4.0])
    assert table.loc[("compute", "forward")].tolist() == pytest.approx([0.1, 0.05, 2.0])
    assert table.loc[("h2d", "h2d_param"), "measured_s_per_step"] == pytest.approx(0.05)
    assert table.loc[("h2d", "h2d_param"), "measured_over_simulated"] == float("inf")
    assert pd.isna(table.loc[("d2h", "d2h_grad"), "measured_over_simulated"])
    # the CPU lanes' uploads inside the host chunks: out of the host's time, not the
    # upload's own; an upload outside every host span takes nothing out
    nested = pd.concat([measured, pd.DataFrame(
        [("h2d", "h2d_param", 1, 0.1, 0.3), ("h2d", "h2d_param", 2, 1.2, 1.7)],
        columns=cols)], ignore_index=True)
    table = compare_ops(nested, simulated, 1, 2, ("host", "h2d")).set_index(["lane", "op"])
    assert table.loc[("host", "host_optim"), "measured_s_per_step"] == pytest.approx(
        (0.5 - 0.2 + 0.5) / 2)
    assert table.loc[("h2d", "h2d_param"), "measured_s_per_step"] == pytest.approx(
        (0.2 + 0.5 + 0.1) / 2)


def test_error_summary_numbers():
    summary = _summary_of((("a", 1.0, 1.1), ("b", 2.0, 1.8), ("c", 3.0, 3.3)), 0.45)
    assert summary["step_time_mape"] == pytest.approx(0.1)
    assert summary["step_time_max_abs_rel_error"] == pytest.approx(0.1)
    assert summary["stall_max_abs_error_points"] == pytest.approx(5.0)
    assert summary["rank_correlation_min"] == 1.0 and summary["groups_same_order"] == 1
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


@pytest.mark.slow
def test_project_reports_full_depth_as_projected(tmp_path, capsys):
    argv = ["--model", "tiny", "--layers", "1", "--steps", "8", "--batch", "2", "--seq",
            "16", "--device-threads", "1", "--host-threads", "1", "--quiet", "--project",
            "--strategy", "zenflow", "--out", str(tmp_path)]
    assert run_main(argv) == 0
    out = capsys.readouterr().out
    assert "PROJECTED" in out and "tiny at full depth" in out
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["projected"].fillna(False).astype(bool).sum() == 1


def _sizing_profile(tokens: int, seconds_per_step: float, host_params_per_s: float) -> dict:
    """A profile whose forward+backward over the 2-layer tiny shape totals the given time."""
    per_block = seconds_per_step / 4  # embedding, 2 decoder layers, head
    blocks = {k: {"forward_s": per_block / 2, "backward_s": per_block / 2}
              for k in ("embedding", "decoder", "head")}
    return {"calibration": {"batch": 1, "seq": tokens, "blocks": blocks,
                            "host_adam_params_per_s": host_params_per_s}}


@pytest.mark.parametrize("intercept_s, want", [
    (0.0, {"ratio2": 10, "ratio1": 20, "ratio0.5": 40}),  # every target reachable
    (0.4, {"ratio1.67": 4, "ratio1": 12, "ratio0.5": 32}),  # r_max = 5/3: host longer at 4
    (0.8, {"ratio1": 4, "ratio0.667": 14, "ratio0.333": 44}),  # r_max = 1: 1, 1/1.5, 1/3
    (1.8, {"ratio0.5": 4, "ratio0.333": 24, "ratio0.167": 84}),  # r_max = 0.5: none longer
])
def test_sized_shapes_fit_a_line_and_scale_unreachable_targets(intercept_s, want):
    """forward+backward = intercept + 0.05 s/token; host Adam = 1 s. Ratio r needs
    (1/r - intercept) / 0.05 tokens; r_max = 1/(intercept + 0.2); the targets are
    min(2, r_max), min(1, r_max / 1.5), min(0.5, r_max / 3)."""
    from zfbench.real.runner import RunSpec
    from zfbench.core.models import get_model
    from zfbench.validate.shapes import sized_shapes
    params = get_model("tiny").total_params
    low = _sizing_profile(4, intercept_s + 0.05 * 4, params / 1.0)
    high = _sizing_profile(64, intercept_s + 0.05 * 64, params / 1.0)
    shapes = sized_shapes(RunSpec(model="tiny", layers=2), low, high, max_seq=512)
    assert {name: spec.seq for name, spec in shapes.items()} == want
    assert all(spec.micro_batch == 1 for spec in shapes.values())


def test_order_check_counts_only_pairs_beyond_noise():
    """a/b are 2% apart (a tie: their swapped simulated order is not held against the
    model); a-c and b-c differ by 50%+ and c is simulated in the wrong place for one."""
    summary = _summary_of((("a", 1.00, 1.10), ("b", 1.02, 1.05), ("c", 1.60, 1.08)), 0.5)
    assert summary["pairs_beyond_noise"] == 2
    assert summary["pairs_beyond_noise_same_order"] == 1  # b < c kept, a < c reversed
    assert summary["groups_same_order"] == 0


def test_sized_shapes_grow_the_batch_beyond_the_models_positions():
    """A GPU-like profile: forward+backward 1 ms + 1 us/token against 1 s of host Adam.
    Ratio r needs (1/r - 0.001) / 1e-6 tokens: far beyond 512 positions, so the batch
    grows (rows of at most 512 tokens), up to MAX_BATCH rows."""
    from zfbench.real.runner import RunSpec
    from zfbench.core.models import get_model
    from zfbench.validate.shapes import MAX_BATCH, sized_shapes
    params = get_model("tiny").total_params
    low = _sizing_profile(4, 0.001 + 1e-6 * 4, params / 1.0)
    high = _sizing_profile(64, 0.001 + 1e-6 * 64, params / 1.0)
    shapes = sized_shapes(RunSpec(model="tiny", layers=2), low, high, max_seq=512)
    # ratio 2 needs 499000 tokens, 1: 999000, 0.5: 1999000; at most 64 x 512 = 32768
    for spec in shapes.values():
        assert spec.seq <= 512 and spec.micro_batch == MAX_BATCH
        assert spec.micro_batch * spec.seq == MAX_BATCH * 512
    low = _sizing_profile(4, 0.5 + 1e-4 * 4, params / 1.0)
    high = _sizing_profile(64, 0.5 + 1e-4 * 64, params / 1.0)
    sized = sized_shapes(RunSpec(model="tiny", layers=2), low, high, max_seq=512)
    # r_max = 1 / 0.5004 = 1.998: targets 1.998, 1, 0.5 need 4, 5000 and 15000 tokens:
    # one row; 10 rows of 500; 30 rows of 500
    got = {name: (spec.micro_batch, spec.seq) for name, spec in sized.items()}
    assert got == {"ratio2": (1, 4), "ratio1": (10, 500), "ratio0.5": (30, 500)}


def test_a_noisy_sizing_pair_is_capped_for_quick(capsys):
    """Profiles where the many-token one came out faster (the machine busier during the
    first): the slope is clamped, every target would ask for the largest shape, and
    `max_tokens` (--quick's 256) keeps the shapes seconds long; the output says why."""
    from zfbench.real.runner import RunSpec
    from zfbench.core.models import get_model
    from zfbench.validate.command import QUICK_MAX_TOKENS
    from zfbench.validate.shapes import MAX_BATCH, sized_shapes
    params = get_model("tiny").total_params
    low = _sizing_profile(4, 0.004, params / 0.01)
    high = _sizing_profile(64, 0.003, params / 0.01)
    base = RunSpec(model="tiny", layers=2)
    uncapped = sized_shapes(base, low, high, max_seq=4096)
    assert all(s.micro_batch * s.seq == MAX_BATCH * 4096 for s in uncapped.values())
    assert "no slower at 64 tokens" in capsys.readouterr().err
    capped = sized_shapes(base, low, high, max_seq=4096, max_tokens=QUICK_MAX_TOKENS)
    assert all(s.micro_batch * s.seq <= QUICK_MAX_TOKENS for s in capped.values())


def test_a_noisy_sizing_pair_is_measured_again_then_refused(capsys):
    """The many-token profile no faster than the few-token one is measured again; a pair
    that is fine on the second attempt is used as it is, and three inverted pairs stop a
    full validate with an error naming the fixes (--quick keeps the last pair: its
    shapes are capped). Session 19: an inverted 4/64-token pair sized validate's
    `shorter` shape at 2 x 4096 tokens, a 70-minute shape at host/compute 0.014."""
    from zfbench.real.runner import RunSpec
    from zfbench.core.models import get_model
    from zfbench.validate.shapes import (SIZING_ATTEMPTS, SIZING_SEQ, NoisySizingError,
                                         compute_s, sizing_profiles)
    params = get_model("tiny").total_params
    base = RunSpec(model="tiny", layers=2)
    lo_n, hi_n = SIZING_SEQ
    inverted = [_sizing_profile(lo_n, 0.004, params / 0.01),
                _sizing_profile(hi_n, 0.003, params / 0.01)]
    fine = [_sizing_profile(lo_n, 0.004, params / 0.01),
            _sizing_profile(hi_n, 0.009, params / 0.01)]
    asked = []

    def measuring(pairs):
        queue = [p for pair in pairs for p in pair]

        def measure(spec):
            asked.append((spec.micro_batch, spec.seq))
            return queue.pop(0)
        return measure

    low, high = sizing_profiles(base, measuring([inverted, fine]))
    assert compute_s(high, base.shape()) == pytest.approx(0.009)
    assert asked == [(1, lo_n), (1, hi_n)] * 2
    assert "attempt 1 of 3" in capsys.readouterr().err
    with pytest.raises(NoisySizingError, match="too busy.*--quick"):
        sizing_profiles(base, measuring([inverted] * SIZING_ATTEMPTS))
    low, high = sizing_profiles(base, measuring([inverted] * SIZING_ATTEMPTS),
                                cap_tokens=True)
    assert compute_s(high, base.shape()) == pytest.approx(0.003)


def test_validate_reports_a_machine_too_busy_to_size_its_shapes(tmp_path, monkeypatch,
                                                                  capsys):
    import zfbench.validate.command as v
    from zfbench.core.models import get_model
    params = get_model("tiny").total_params

    def inverted(spec):
        return _sizing_profile(spec.seq, 0.004 if spec.seq < 100 else 0.003, params / 0.01)
    monkeypatch.setattr(v, "measure_profile", inverted)
    assert validate_main(["--model", "tiny", "--layers", "2", "--quiet", "--out",
                          str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "error: forward+backward of tiny" in err and "too busy" in err
    assert not (tmp_path / "validate.csv").exists()


def test_fitting_halves_the_batch_until_every_strategy_fits(monkeypatch):
    """A sized shape beyond a small machine's memory (64 rows of 2048 tokens through a
    tinyllama layer: ~50 GB of activations) comes back with the largest halved batch
    that fits: it fits, twice its batch does not (unchanged where 64 rows fit)."""
    from zfbench.real.memory import InsufficientMemoryError, check_fits
    from zfbench.real.runner import RunSpec
    from zfbench.validate.shapes import fitting
    # one memory size for every check (MemAvailable moves with whatever else runs)
    monkeypatch.setattr("zfbench.real.memory.available_host_bytes", lambda: 20e9)
    spec = RunSpec(model="tinyllama-1.1b", layers=1, micro_batch=64, seq=2048, device="cpu",
                   precision="bf16")

    def fits(batch: int) -> bool:
        try:
            check_fits(spec.shape(), ["device", "zero-offload", "zero-offload-dpu",
                                      "zenflow"], batch, 2048, 2, False)
            return True
        except InsufficientMemoryError:
            return False
    got = fitting(spec)
    assert got.seq == 2048 and 64 % got.micro_batch == 0 and fits(got.micro_batch)
    assert got.micro_batch == 64 or not fits(got.micro_batch * 2)
    assert fits(64) or got.micro_batch < 64


def test_every_shape_runs_zenflow_on_zero3_too():
    """validate's cells: each strategy on ZeRO-2 (zenflow at every pair), then zenflow on
    ZeRO-3 at the first pair, in --quick (one pair) and in the full run (two); the
    ZeRO-3 cell's name, files and engine config say stage 3."""
    from dataclasses import replace

    from zfbench.real.runner import RunSpec
    from zfbench.validate.command import PAIRS, cell_name, cell_plan, zenflow_overrides

    for pairs in (PAIRS[:1], PAIRS):
        plan = cell_plan(pairs)
        assert [c for c in plan if c[2] == 3] == [("zenflow", pairs[0], 3)]
        assert len(plan) == 3 + len(pairs) + 1
    assert cell_name("s", "zenflow", (0.1, 4), 3) == "s.zenflow.zero3.topk0.1-U4"
    assert cell_name("s", "zenflow", (0.1, 4)) == "s.zenflow.topk0.1-U4"
    spec = RunSpec(model="tiny", layers=2, micro_batch=1, seq=8, device="cpu",
                   precision="fp32")
    for stage in (2, 3):
        config = replace(spec, overrides=zenflow_overrides(0.1, 4, stage)).engine_config(
            "zenflow")
        assert config.zero_stage == stage
