"""`predict --from-run`'s link rates: the run's own copies (bytes / busy seconds per
direction) where it measured them, the fit to the exposed transfer where it did not."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from zfbench.predict import inputs as predict_inputs
from zfbench.predict.command import main
from zfbench.predict.fit import MEASURED_LINK, Breakdown

RECORDED_RUN = Path(__file__).parent / "golden" / "run_tiny_amd_epyc_zen4"


def _span(op, lane, step, start, seconds, nbytes):
    return {"rank": 0, "lane": lane, "op": op, "step": step, "t_start_s": start,
            "t_end_s": start + seconds, "bytes": nbytes}


def test_the_rates_are_each_directions_bytes_over_its_copies_busy_seconds():
    """By hand: step 0 is warm-up (left out), and only `d2h_grad` / `h2d_param` count."""
    spans = pd.DataFrame([
        _span("d2h_grad", "d2h", 0, 0.0, 1.0, 10**6),  # warm-up: left out
        _span("d2h_grad", "d2h", 1, 2.0, 0.001, 4 * 10**6),
        _span("d2h_grad", "d2h", 2, 3.0, 0.0005, 2 * 10**6),
        _span("d2h_other", "d2h", 2, 3.1, 0.5, 10**6),  # not a gradient copy
        _span("h2d_param", "h2d", 1, 2.5, 0.002, 3 * 10**6),
        _span("h2d_param", "h2d", 2, 3.5, 0.004, 3 * 10**6),
        _span("forward", "compute", 1, 2.0, 0.1, 0)])
    rates = predict_inputs.measured_link(spans, 1, {"d2h_gb_per_s": 99.0}, "r")
    assert rates["d2h"]["bytes_per_s"] == pytest.approx(6e6 / 0.0015)  # 4e9
    assert rates["h2d"]["bytes_per_s"] == pytest.approx(6e6 / 0.006)  # 1e9
    assert "d2h_grad bytes / busy seconds over 2 copies of steps >= 1" in \
        rates["d2h"]["source"]


def test_without_spans_the_rows_recorded_rates_are_taken_and_without_them_none():
    row = {"d2h_gb_per_s": 55.0, "h2d_gb_per_s": 28.0}
    rates = predict_inputs.measured_link(None, 6, row, "r")
    assert rates["d2h"]["bytes_per_s"] == 55e9 and rates["h2d"]["bytes_per_s"] == 28e9
    assert "summary.json zero-offload row h2d_gb_per_s" in rates["h2d"]["source"]
    # one direction alone, zero or missing: no measured link, the fit finds both
    assert predict_inputs.measured_link(None, 6, {"d2h_gb_per_s": 55.0}, "r") == {}
    assert predict_inputs.measured_link(None, 6, {"d2h_gb_per_s": 55.0,
                                                  "h2d_gb_per_s": 0.0}, "r") == {}


def test_a_measured_rate_must_be_positive_and_given_for_both_directions():
    good = {"bytes_per_s": 1e9, "source": "s"}
    with pytest.raises(ValueError, match="both d2h and h2d"):
        Breakdown(0.1, 0.1, 0.1, link_Bps={"d2h": good})
    with pytest.raises(ValueError, match="finite bytes_per_s > 0"):
        Breakdown(0.1, 0.1, 0.1, link_Bps={"d2h": good, "h2d": {"bytes_per_s": 0.0}})


def _run_copy(tmp_path, spans: bool, rates: bool) -> Path:
    """The recorded run, with or without its timeline files and its rows' GB/s."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED_RUN, run)
    if not spans:
        for f in run.glob("*.spans.csv"):
            f.unlink()
    if not rates:
        summary = json.loads((run / "summary.json").read_text())
        for r in summary["rows"]:
            r.pop("d2h_gb_per_s", None), r.pop("h2d_gb_per_s", None)
        (run / "summary.json").write_text(json.dumps(summary))
    return run


@pytest.mark.parametrize("spans,rates", [(True, True), (False, True), (False, False)])
def test_predict_takes_the_link_from_the_runs_copies_and_says_where_from(
        tmp_path, capsys, spans, rates):
    run = _run_copy(tmp_path, spans, rates)
    out = tmp_path / "pred"
    assert main(["--from-run", str(run), "--steps", "16", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    inferred = json.loads((out / "inferred.json").read_text())
    link = json.loads((out / "inferred_hardware.json").read_text())[
        "host_links"]["inferred-link"]
    row = next(r for r in json.loads((run / "summary.json").read_text())["rows"]
               if r["strategy"] == "zero-offload")
    if not rates:  # the fallback: fitted to the exposed transfer
        assert inferred["fits"][0]["case"] != MEASURED_LINK
        assert "link rates from: fitted to the measured exposed transfer" in printed
        assert all("inferred from" in s for s in inferred["link_rates_from"].values())
        return
    copies = pd.read_csv(RECORDED_RUN / "zero-offload.spans.csv")
    copies = copies[copies["step"] >= row["steps_left_out"]]
    for lane, op in (("d2h", "d2h_grad"), ("h2d", "h2d_param")):
        mine = copies[copies["op"] == op]
        by_hand = mine["bytes"].sum() / (mine["t_end_s"] - mine["t_start_s"]).sum()
        if not spans:  # the run's own figure for the same copies
            by_hand = row[f"{lane}_gb_per_s"] * 1e9
        assert link[f"{lane}_bytes_per_s"]["value"] == pytest.approx(by_hand, rel=1e-9)
        source = inferred["link_rates_from"][lane]
        assert source.startswith("measured: run ") and \
            ("zero-offload.spans.csv" if spans else "summary.json") in source
    assert link["setup_latency_s"]["value"] == 0  # the rates hold each copy's fixed cost
    [only] = inferred["fits"]
    assert only["case"] == MEASURED_LINK and only["reached"]
    assert "link rates from: the run's own copies" in printed
    assert "exposed transfer, a check (the link is not fitted to it)" in printed
    # the simulated ZeRO-Offload copies are busy as long as the measured ones, per direction
    for lane in ("d2h", "h2d"):
        measured_busy = row[f"{lane}_bytes_per_step"] / link[f"{lane}_bytes_per_s"]["value"]
        assert only["simulated_zero_offload"][f"{lane}_busy_s"] == pytest.approx(
            measured_busy, rel=1e-6)


def test_link_rates_without_a_run_is_refused_in_one_line(capsys):
    assert main(["--from-breakdown", "compute=0.66,io=0.53,stall=5.61",
                 "--link-rates", "fit"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--link-rates: only --from-run" in err[0]
