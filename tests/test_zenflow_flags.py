"""The ZenFlow knobs spelled the same by every command (zfbench.cli_checks): `--zenflow.<knob>`
with the older `--<knob>` as an alias, read into the config's types, applied to the
zenflow strategy only, over a config's section or zfbench's scenario."""

from __future__ import annotations

import pytest

from zfbench.cli_checks import CliError, read_zenflow_value, zenflow_flags
from zfbench.core.config import SCENARIO_ZENFLOW


@pytest.mark.parametrize("knob, text, value", [
    ("topk_ratio", "0.2", 0.2), ("update_interval", "8", 8),
    ("update_interval", "auto", "auto"), ("select_interval", "AUTO", "auto"),
    ("overlap_step", "off", False), ("overlap_step", "true", True),
    ("full_warm_up_rounds", "3", 3),
])
def test_values_are_read_as_the_configs_types(knob, text, value):
    assert read_zenflow_value(knob, text) == value


@pytest.mark.parametrize("knob, text", [("topk_ratio", "lots"), ("overlap_step", "maybe"),
                                        ("full_warm_up_rounds", "auto")])
def test_an_unreadable_value_names_the_flag(knob, text):
    with pytest.raises(CliError, match=zenflow_flags(knob)[0].replace(".", r"\.")):
        read_zenflow_value(knob, text)


def test_run_applies_the_flags_to_zenflow_only_over_the_scenario():
    from zfbench.run.command import build_parser, spec_from_args

    args = build_parser().parse_args(["--zenflow.topk-ratio", "0.25",
                                      "--update-interval", "2", "--device", "cpu"])
    spec = spec_from_args(args)
    zf = spec.engine_config("zenflow").zenflow
    assert (zf.topk_ratio, zf.update_interval) == (0.25, 2)
    # the knobs not given keep zfbench's scenario
    assert zf.overlap_step == SCENARIO_ZENFLOW["overlap_step"]
    assert zf.select_interval == SCENARIO_ZENFLOW["select_interval"]
    assert spec.engine_config("device").zenflow is None


def test_run_flags_override_a_configs_zenflow_section(tmp_path):
    import json

    from zfbench.core.config_build import build_config
    from zfbench.run.command import build_parser, spec_from_args

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(build_config("zenflow", zenflow={
        "topk_ratio": 0.05, "update_interval": 4, "overlap_step": True})))
    args = build_parser().parse_args(["--config", str(path), "--zenflow.overlap-step",
                                      "false", "--device", "cpu", "--strategy", "zenflow"])
    zf = spec_from_args(args, strategies=("zenflow",)).engine_config("zenflow").zenflow
    assert (zf.topk_ratio, zf.update_interval, zf.overlap_step) == (0.05, 4, False)


def test_run_refuses_an_invalid_knob_naming_the_flag():
    from zfbench.run.command import main

    assert main(["--zenflow.topk-ratio", "1.5", "--device", "cpu", "--steps", "1"]) == 2


def test_simulate_takes_both_spellings():
    from zfbench.simulate.command import build_parser

    p = build_parser()
    for flag in ("--zenflow.topk-ratio", "--topk-ratio"):
        assert p.parse_args([flag, "0.3"]).topk_ratio == "0.3"
    assert p.parse_args(["--zenflow.update-interval", "auto"]).update_interval == "auto"


def test_gradients_takes_both_spellings():
    from zfbench.gradients.command import build_parser

    p = build_parser()
    assert p.parse_args(["--zenflow.topk-ratio", "0.2"]).topk_ratio == 0.2
    assert p.parse_args(["--topk-ratio", "0.3"]).topk_ratio == 0.3
