"""Bad command lines of `simulate` and `validate` (hypothesis): each flag with a bad value
(negative, zero, non-numeric, unknown names, unknown sweep knobs, bad paths) ends with exit
code 2, exactly one stderr line starting with "error:", no traceback, nothing on stdout and
nothing created under `--out`, before any work starts."""

import json
import string
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from zfbench.simulate.command import main as simulate_main
from zfbench.validate.command import main as validate_main

FAST = dict(max_examples=30, deadline=None,
            suppress_health_check=[HealthCheck.function_scoped_fixture,
                                   HealthCheck.too_slow])
BASE = ["--model", "tiny", "--layers", "1", "--steps", "6", "--quiet"]

words = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=8).map(
    lambda w: "zz" + w)  # never a known name, nor "none", "auto", "true"
non_numeric = st.one_of(words, st.sampled_from(["", "1.5.2", "ten", "0x", "1e"]))
negative = st.integers(-10**6, -1).map(str)
not_positive = st.one_of(negative, st.just("0"))
fractional = st.sampled_from(["1.5", "2.25", "-0.5"])


def bad_int(minimum: int):
    return st.one_of(negative if minimum == 0 else not_positive, non_numeric, fractional)


BAD_SIMULATE = {
    "--steps": bad_int(1), "--gpus": bad_int(1), "--gpus-per-switch": bad_int(1),
    "--micro-batch": bad_int(1), "--batch": bad_int(1), "--seq": bad_int(1),
    "--layers": bad_int(1), "--host-cores": bad_int(1), "--update-interval": bad_int(1),
    "--select-interval": st.one_of(negative, non_numeric),
    "--full-warm-up-rounds": bad_int(0),
    "--topk-ratio": st.one_of(st.sampled_from(["0", "-0.1", "1.5", "nan", "inf"]), words),
    "--mfu": st.one_of(st.sampled_from(["0", "-1", "1.01", "nan"]), words),
    "--bandwidth-scale": st.one_of(st.sampled_from(["0", "-2", "inf", "nan"]), words),
    "--model": words, "--gpu": words, "--pcie": words, "--host": words, "--net": words,
    "--precision": words, "--transfers": words, "--strategy": words,
    "--activation-checkpointing": words, "--overlap-step": words,
    "--sweep": st.one_of(
        words.map(lambda w: f"{w}=1,2"),  # unknown knob
        words,  # no "="
        st.sampled_from(["pcie=", "steps=0,4", "gpus=2,x", "topk_ratio=0.1,2",
                         "model=tiny,zzmodel"])),
    "--auto-windows": st.one_of(not_positive, fractional, st.just("1,0,2"),
                                words.map(lambda w: f"/nonexistent/{w}.csv")),
}
BAD_PATHS = ("out is a file", "out under a file", "profile missing", "profile not json",
             "profile without calibration", "profile is a directory",
             "windows file without lengths")


def assert_refused(capsys, rc: int, out: Path) -> None:
    captured = capsys.readouterr()
    assert rc == 2, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert not out.exists() or (out.is_file() and out.read_text() == "keep") or \
        (out.is_dir() and not any(out.iterdir()))


@hsettings(**FAST)
@given(flag=st.sampled_from(sorted(BAD_SIMULATE)), data=st.data())
def test_simulate_refuses_a_bad_value_in_one_line(capsys, flag, data):
    value = data.draw(BAD_SIMULATE[flag], label="value")
    capsys.readouterr()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        extra = ["--update-interval", "auto"] if flag == "--auto-windows" else []
        rc = simulate_main(BASE + extra + [flag, value, "--out", str(out)])
        assert_refused(capsys, rc, out)


def make_path(tmp: Path, case: str) -> tuple[list[str], Path]:
    """The flags of one bad-path case and the --out it names."""
    out = tmp / "out"
    if case == "out is a file":
        out.write_text("keep")
        return [], out
    if case == "out under a file":
        (tmp / "f").write_text("keep")
        return [], tmp / "f" / "out"
    profile = tmp / "profile.json"
    if case == "profile not json":
        profile.write_text("not json {")
    elif case == "profile without calibration":
        profile.write_text(json.dumps({"gpus": {}}))
    elif case == "profile is a directory":
        profile.mkdir()
    elif case == "windows file without lengths":
        (tmp / "w.csv").write_text("window,steps\n0,3\n")
        return ["--update-interval", "auto", "--auto-windows", str(tmp / "w.csv")], out
    return ["--profile", str(profile)], out


@hsettings(**FAST)
@given(case=st.sampled_from(BAD_PATHS))
def test_simulate_checks_paths_before_any_work(capsys, case):
    capsys.readouterr()
    with tempfile.TemporaryDirectory() as tmp:
        flags, out = make_path(Path(tmp), case)
        before = sorted(p.name for p in Path(tmp).rglob("*"))
        rc = simulate_main(["--steps", "6", "--quiet", *flags, "--out", str(out)])
        assert_refused(capsys, rc, out)
        assert sorted(p.name for p in Path(tmp).rglob("*")) == before


BAD_VALIDATE = {
    "--steps": bad_int(2), "--skip": st.one_of(negative, non_numeric),
    "--layers": bad_int(1), "--device-threads": bad_int(1), "--host-threads": bad_int(1),
    "--shapes": words, "--precision": words, "--model": words,
}


@hsettings(**FAST)
@given(flag=st.sampled_from(sorted(BAD_VALIDATE) + ["--out"]), data=st.data())
def test_validate_refuses_a_bad_value_in_one_line(capsys, monkeypatch, flag, data):
    import zfbench.validate.command as v
    # a value that slipped through would start minutes of measuring: return 0 at once
    monkeypatch.setattr(v, "validate", lambda *args, **kwargs: 0)
    capsys.readouterr()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        if flag == "--out":
            flags, out = make_path(Path(tmp), data.draw(
                st.sampled_from(BAD_PATHS[:2]), label="case"))
        else:
            flags = [flag, data.draw(BAD_VALIDATE[flag], label="value")]
        rc = validate_main(["--quick", "--quiet", *flags, "--out", str(out)])
        assert_refused(capsys, rc, out)


def test_an_abbreviated_flag_is_refused_not_taken_for_the_whole_one(capsys):
    """`--lay 2` once set `--layers 2` while the run's argv scan treated the layers as not
    given; every command now asks for flags spelled whole."""
    import argparse

    import pytest

    from zfbench.accuracy.command import build_parser as accuracy_parser
    from zfbench.figures.command import build_parser as figures_parser
    from zfbench.gradients.command import build_parser as gradients_parser
    from zfbench.predict.command import main as predict_main
    from zfbench.run.command import main as run_main

    for main, argv in ((run_main, ["--lay", "2"]), (simulate_main, ["--pci", "gen4"]),
                       (predict_main, ["--paper", "--quie"])):
        assert main(argv) == 2
        assert "unrecognized arguments" in capsys.readouterr().err
    for build in (accuracy_parser, figures_parser, gradients_parser):
        parser = build()
        assert isinstance(parser, argparse.ArgumentParser) and not parser.allow_abbrev
        with pytest.raises(SystemExit):
            parser.parse_args(["--ou", "x"])
    capsys.readouterr()
