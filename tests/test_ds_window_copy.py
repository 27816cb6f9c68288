"""bench/ds_window_copy.py on the CPU: every case timed, its bytes over the link counted,
the files written, and bad input refused."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import ds_window_copy  # noqa: E402


def test_every_case_is_a_row_with_its_link_bytes(tmp_path):
    n = 4096
    assert ds_window_copy.main(["--device", "cpu", "--elems", str(n), "--repeats", "1",
                                "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "ds_window_copy.csv").set_index("case")
    assert list(frame.index) == list(ds_window_copy.cases(8, ds_window_copy.torch.device("cpu")))
    assert (frame["seconds"] > 0).all() and (frame["elems"] == n).all()
    assert frame.loc["deepspeed_copy", "link_bytes"] == 2 * n  # 16-bit lands on the device
    assert frame.loc["upload32_then_convert", "link_bytes"] == 4 * n
    assert frame.loc["convert_on_host_fresh", "link_bytes"] == 0
    assert frame["g_elems_per_s"].to_numpy() == pytest.approx(
        (n / frame["seconds"] / 1e9).to_numpy())
    payload = json.loads((tmp_path / "ds_window_copy.json").read_text())
    assert payload["device"] == "cpu" and len(payload["rows"]) == len(frame)


def test_the_copies_write_what_deepspeed_writes():
    """Every copy case leaves in the 16-bit destination the rounding of the same fp32
    master that DeepSpeed's `copy_` gives."""
    torch = ds_window_copy.torch
    fns = ds_window_copy.cases(1000, torch.device("cpu"))
    expected = fns["convert_on_host_fresh"][0]()
    for name in ("deepspeed_copy", "deepspeed_copy_shared", "deepspeed_copy_pinned", "convert_on_host_into",
                 "upload16_pageable", "upload16_pinned", "upload32_then_convert"):
        out = fns[name][0]()
        assert out.dtype == torch.bfloat16 and torch.equal(out, expected), name


@pytest.mark.parametrize("argv", [["--elems", "0"], ["--repeats", "0"]])
def test_bad_sizes_are_refused(tmp_path, argv):
    with pytest.raises(SystemExit):
        ds_window_copy.main(["--device", "cpu", "--out", str(tmp_path), *argv])
