"""bench/accum_over_adam.py: the probe's two rates per case, and the ratio of their streams."""

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import accum_over_adam  # noqa: E402
from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, ADAM_BYTES_PER_PARAM  # noqa: E402


def test_each_case_is_a_row_whose_ratio_is_the_two_streams(tmp_path):
    assert accum_over_adam.main(["--threads", "1", "--elems", "65536,131072", "--repeats", "1",
                                 "--out", str(tmp_path)]) == 0
    frame = pd.read_csv(tmp_path / "accum_over_adam.csv")
    assert list(frame["elems"]) == [65536, 131072] and set(frame["threads"]) == {1}
    expected = (frame["host_accum_elems_per_s"] * ACCUM_BYTES_PER_ELEMENT
                / (frame["host_adam_params_per_s"] * ADAM_BYTES_PER_PARAM))
    assert frame["accum_over_adam_stream"].to_numpy() == pytest.approx(expected.to_numpy())
    assert (frame[["host_accum_elems_per_s", "host_adam_params_per_s"]] > 0).all().all()
    payload = json.loads((tmp_path / "accum_over_adam.json").read_text())
    assert len(payload["rows"]) == 2 and payload["machine"]["cpu_model"]


def test_a_bad_list_is_refused_by_the_parser():
    with pytest.raises(SystemExit):
        accum_over_adam.main(["--threads", "one"])
