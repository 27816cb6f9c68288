"""Leave-one-source-out and the calibration markers (zfbench.validate.calibrated): the
judgments in the presets, the LOSO error against a hand simulation on a hand-written
hardware file, and the `calibrated on this case` marker exactly on the calibrated cases."""

import json

import pytest

from zfbench.core import hardware as hw
from zfbench.core import hardware_file
from zfbench.simulate.command import main as simulate_main
from zfbench.simulation import DEFAULTS
from zfbench.sims.simulator import simulate
from zfbench.validate import calibrated as cal
from zfbench.validate import published as vp
from zfbench.validate.metrics import measure
from zfbench.validate.rows import bundled_path, read_rows, row_settings, skip_of

ROWS = {r["id"]: r for r in read_rows(bundled_path())[1]}
JUDGED = {("hosts", "xeon-8168", "adam_params_per_s_per_core"): 29.5e6,
          ("hosts", "epyc-7763-milan", "adam_params_per_s_per_core"): 29.5e6}


def test_every_calibrated_number_and_only_it_carries_a_sourced_judgment():
    found = {(section, name, f): v[0] for section in ("gpus", "hosts")
             for name in getattr(hw, f"{section[:-1]}_names")()
             for f, v in hw.judgments(section, name).items()}
    assert found == JUDGED
    assert {(c.section, c.preset, c.field) for c in cal.CALIBRATIONS} == set(JUDGED)
    for c in cal.CALIBRATIONS:  # the calibrated source names its row, the judgment is one
        obj = hw.lookup(c.section, c.preset)
        assert obj.sources[c.field].startswith(f"calibration row {c.row_id} ")
        assert hw.judgments(c.section, c.preset)[c.field][1].startswith("judgment:")
        assert c.row_id in ROWS


def _gpu_entry(field: dict) -> dict:
    entry = hw.entry_of("gpus", hw.get_gpu("a100-80g"))
    entry["default_mfu"] = field
    return {"gpus": {"g": entry}}


def test_judgments_are_validated_like_the_rest(tmp_path):
    calibrated = {"value": 0.4, "source": "calibration row x of a file"}
    # the presets (require_all) refuse a calibrated number without a judgment
    with pytest.raises(hw.HardwareProfileError, match="no \"judgment\""):
        hardware_file._judgment(calibrated, "default_mfu", "gpu 'g'", require=True)
    bad = [({**calibrated, "judgment": {"value": 1.5, "source": "judgment: x"}}, "fraction"),
           ({**calibrated, "judgment": {"value": 0.3}}, "no source"),
           ({**calibrated, "judgment": {"value": 0.3, "source": "a paper"}}, "judgment:"),
           ({"value": 0.4, "source": "a paper", "judgment": {"value": 0.3,
                                                             "source": "judgment: x"}},
            "only a number whose source begins")]
    for field, match in bad:
        path = tmp_path / "h.json"
        path.write_text(json.dumps(_gpu_entry(field)))
        with pytest.raises(hw.HardwareProfileError, match=match):
            hw.load_profile(path)
    path.write_text(json.dumps(_gpu_entry({**calibrated, "judgment": {
        "value": 0.3, "source": "judgment: x"}})))
    assert hw.load_profile(path)["gpus"]["g"].default_mfu == 0.4  # the value, not the judgment


def _by_hand(row: dict, section: str, preset: str, field: str, value: float, tmp_path):
    """The row simulated on a hardware file written here: the preset with `field` at
    `value`; its signed error in %."""
    entry = hw.entry_of(section, hw.lookup(section, preset))
    entry[field] = {"value": value, "source": "judgment: test"}
    path = tmp_path / f"{preset}.json"
    path.write_text(json.dumps({section: {preset: entry}}))
    settings = row_settings(row).with_(hardware=str(path))
    got = measure(simulate(settings, row["strategy"]), row["metric"],
                  skip_of(settings, row["strategy"]))
    return 100 * (got - float(row["value"])) / float(row["value"])


def test_loso_error_is_the_hand_simulation_with_the_judged_constant(tmp_path):
    rows = [ROWS["zo-table4-cpuadam-10b"], ROWS["zf-blog-fig3-llama7b-adam"],
            ROWS["cb-qwen1.5b-zero2"]]
    done = {r["id"]: r for r in vp.validate_rows(rows, quiet=True)}
    table4 = done["zo-table4-cpuadam-10b"]
    assert table4["loso_judged"] == "xeon-8168 adam_params_per_s_per_core"
    assert table4["error_pct"] == pytest.approx(0, abs=0.1)  # calibrated: itself
    want = _by_hand(table4, "hosts", "xeon-8168", "adam_params_per_s_per_core", 29.5e6,
                    tmp_path)
    assert table4["error_pct_loso"] == pytest.approx(want, rel=1e-9)
    # and in closed form: 10.279e9 parameters on 48 cores at 29.5e6 x numa 0.75
    assert table4["simulated_loso"] == pytest.approx(10_279_047_168 / (29.5e6 * 48 * 0.75),
                                                     rel=1e-6)
    blog = done["zf-blog-fig3-llama7b-adam"]
    assert blog["error_pct_loso"] == pytest.approx(_by_hand(
        blog, "hosts", "epyc-7763-milan", "adam_params_per_s_per_core", 29.5e6, tmp_path),
        rel=1e-9)
    other = done["cb-qwen1.5b-zero2"]  # its source calibrates nothing: unchanged
    assert (other["loso_judged"], other["error_pct_loso"]) == ("", other["error_pct"])
    head = vp.summary(list(done.values()))
    assert head["ok"] == 1 and head["rows_loso"] == 3  # under LOSO every row counts
    assert head["mae_loso_pct"] == pytest.approx(
        sum(abs(r["error_pct_loso"]) for r in done.values()) / 3)
    assert "leave-one-source-out" in vp.format_table(list(done.values()), head)


def test_the_v100_source_judges_nothing_since_the_census():
    """zo-fig8-10b calibrated the V100's MFU until the census (issue 44); now its source
    calibrates nothing, so its leave-one-source-out error is its error."""
    done = vp.validate_rows([ROWS["zo-fig8-1b"], ROWS["zo-fig8-10b"]], quiet=True)
    for row in done:
        assert row["loso_judged"] == "" and row["calibration"] == ""
        assert row["error_pct_loso"] == row["error_pct"]


def test_same_setting_marks_exactly_the_calibrated_case(tmp_path):
    blog = "zf-blog-fig3-llama7b-adam"
    (tmp_path / "h.json").write_text(json.dumps({"hosts": {"epyc-7763-milan": hw.entry_of(
        "hosts", hw.get_host("epyc-7763-milan"))}}))  # the preset's own numbers, in a file
    assert cal.calibrated_on(DEFAULTS, "zero-offload") == [blog]
    for strategy in ("device", "zero-offload-dpu", "zero-infinity", "zenflow"):
        assert cal.calibrated_on(DEFAULTS, strategy) == []
    for change in ({"micro_batch": 2}, {"seq": 2048}, {"gpus": 2}, {"model": "llama2-13b"},
                   {"host": "xeon-8480-spr"}, {"gpu": "a100-40g"}, {"precision": "fp16"},
                   {"host_cores": 64}, {"hardware": str(tmp_path / "h.json")}):
        assert cal.calibrated_on(DEFAULTS.with_(**change), "zero-offload") == [], change
    # DeepSpeed's switches and the links are not part of the setting, nor --mfu for a host
    for change in ({"bind_cores": True}, {"overlap_comm": False}, {"pcie": "gen5"},
                   {"mfu": 0.4}):
        assert cal.calibrated_on(DEFAULTS.with_(**change), "zero-offload") == [blog], change
    v100 = row_settings(ROWS["zo-fig8-10b"])
    assert cal.calibrated_on(v100, "zero-offload") == []  # a check since the census
    # one micro-step of the same shape is Table 4's setting (CPU-Adam's), not Figure 8's
    assert cal.calibrated_on(v100.with_(grad_accum=1), "zero-offload") == [
        "zo-table4-cpuadam-10b"]
    assert cal.calibrated_on(v100.with_(grad_accum=50), "zero-offload") == []


def test_simulate_prints_and_writes_the_marker_only_where_calibrated(tmp_path, capsys):
    assert simulate_main(["--strategy", "zero-offload", "--steps", "4", "--quiet",
                          "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("zero-offload "))
    assert "calibrated on this case" in out and line.endswith("zf-blog-fig3-llama7b-adam")
    rows = json.loads((tmp_path / "a" / "summary.json").read_text())["rows"]
    assert [r["calibrated_on"] for r in rows] == ["zf-blog-fig3-llama7b-adam"]
    assert simulate_main(["--strategy", "zero-offload", "--steps", "4", "--quiet",
                          "--micro-batch", "2", "--out", str(tmp_path / "b")]) == 0
    assert "calibrated on this case" not in capsys.readouterr().out
    rows = json.loads((tmp_path / "b" / "summary.json").read_text())["rows"]
    assert [r["calibrated_on"] for r in rows] == [""]


def test_predict_says_when_its_baseline_is_a_calibration_rows_setting():
    from zfbench.predict.command import calibration_note

    note = calibration_note(DEFAULTS)
    assert note.startswith("calibrated on this case: zf-blog-fig3-llama7b-adam")
    assert calibration_note(DEFAULTS.with_(micro_batch=4)) is None
