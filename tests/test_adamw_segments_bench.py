"""bench/adamw_segments.py: one row per thread count and call, the list's size as asked,
and bad input refused with the fix named."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import adamw_segments  # noqa: E402


def test_each_thread_count_and_call_is_a_row(tmp_path):
    assert adamw_segments.main(["--shapes", "64x30,1040x2,33x3", "--threads", "1,2",
                                "--repeats", "1", "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "adamw_segments.csv")
    assert len(frame) == 8 and set(frame["threads"]) == {1, 2}
    lists = frame[frame["call"].str.endswith("_list")]
    assert set(lists["tensors"]) == {35} and set(frame["elements"]) == {64 * 30 + 2080 + 99}
    assert (frame["median_ms"] > 0).all()
    payload = json.loads((tmp_path / "adamw_segments.json").read_text())
    assert len(payload["rows"]) == 8 and payload["machine"]["cpu_model"]


def test_a_bad_shape_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit):
        adamw_segments.main(["--shapes", "1024"])
    assert "ROWSxCOUNT" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--grad-divisor", "0"],
                                  ["--repeats", "0"]])
def test_bad_numbers_are_refused(argv):
    with pytest.raises(SystemExit):
        adamw_segments.main(argv)
