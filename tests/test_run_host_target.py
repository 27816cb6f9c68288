"""The run's host-lane ratios (zfbench.run.host_target): from the run's spans and the
profile probed around it, checked against the arithmetic done by hand."""

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from zfbench.run.host_target import (HOST_TARGET_COLUMNS, host_target_columns,
                                     host_target_line, uploads_on_host_worker)

CAL = {"host_adam_params_per_s": 1e9, "h2d_bytes_per_s": 4e9,
       "host_zero_elems_per_s": 4e9,
       "host_lanes": {"zenflow": {"host_threads": 1, "host_adam_params_per_s": 5e8,
                                  "host_zero_elems_per_s": 2e9}}}


def spans(steps=range(4), up_bytes=8e8):
    rows = []
    for s in steps:
        rows.append((0, "host", "host_optim", s, 0.0, 0.5, 0))
        rows.append((0, "h2d", "h2d_param", s, 0.1, 0.2, up_bytes / 2))
        rows.append((0, "h2d", "h2d_param", s, 0.3, 0.4, up_bytes / 2))
        rows.append((0, "d2h", "d2h_grad", s, 0.0, 0.1, 123))
    return pd.DataFrame(rows, columns=["rank", "lane", "op", "step", "t_start_s",
                                       "t_end_s", "bytes"])


def test_zero_offload_ratios_by_hand():
    # 2e8 params a step at 4e8 params per busy s: 0.5 s busy; alone 2e8 / 1e9 = 0.2 s;
    # uploads 8e8 B a step (the steps left out hold other bytes) at 4e9 B/s = 0.2 s
    frame = pd.concat([spans(range(2), up_bytes=1e12), spans(range(2, 6))])
    row = {"strategy": "zero-offload", "host_adam_params_per_s": 4e8}
    out = host_target_columns(row, frame, 2, CAL, True, False, 2e8)
    assert out["host_link_s_per_step"] == pytest.approx(0.2)
    assert out["host_over_adam_alone"] == pytest.approx(0.2 / 0.5)
    assert out["host_over_adam_plus_link"] == pytest.approx(0.4 / 0.5)


def test_a_timeline_of_two_ranks_counts_each_ranks_uploads():
    two = pd.concat([spans(), spans().assign(rank=1)])
    row = {"strategy": "zero-offload", "host_adam_params_per_s": 4e8}
    assert host_target_columns(row, two, 0, CAL, True, False, 2e8) == \
        host_target_columns(row, spans(), 0, CAL, True, False, 2e8)


def test_uploads_on_a_stream_or_link_thread_cost_the_worker_nothing():
    row = {"strategy": "zero-offload", "host_adam_params_per_s": 4e8}
    out = host_target_columns(row, spans(), 0, CAL, False, False, 2e8)
    assert out["host_link_s_per_step"] == 0.0
    assert out["host_over_adam_plus_link"] == out["host_over_adam_alone"]
    cpu = SimpleNamespace(is_cuda=False, links={})
    assert uploads_on_host_worker(cpu)
    assert not uploads_on_host_worker(SimpleNamespace(is_cuda=False, links={"h2d": 1}))
    assert not uploads_on_host_worker(SimpleNamespace(is_cuda=True))


def test_zenflow_takes_its_own_lane_and_the_window_zeroing():
    # the strategy's lane: AdamW 5e8/s and zeroing 2e9/s for 1e8 params = 0.2 + 0.05 s
    row = {"strategy": "zenflow", "host_adam_params_per_s": 2e8}
    out = host_target_columns(row, spans(up_bytes=0.0), 0, CAL, True, True, 1e8)
    assert out["host_over_adam_alone"] == pytest.approx(0.25 / 0.5)
    assert out["host_over_adam_plus_link"] == pytest.approx(0.25 / 0.5)


@pytest.mark.parametrize("cal, rate, params", [(None, 4e8, 2e8), (CAL, 0.0, 2e8),
                                               (CAL, math.nan, 2e8), (CAL, 4e8, 0.0)])
def test_nan_without_a_profile_or_host_updates(cal, rate, params):
    row = {"strategy": "device", "host_adam_params_per_s": rate}
    out = host_target_columns(row, spans(), 0, cal, True, False, params)
    assert set(out) == set(HOST_TARGET_COLUMNS)
    assert all(math.isnan(v) for v in out.values())


def test_line_states_the_ratios_and_the_target():
    row = {"strategy": "zero-offload", "host_adam_params_per_s": 4e8}
    row.update(host_target_columns(row, spans(), 0, CAL, True, False, 2e8))
    line = host_target_line([{"strategy": "device", **dict.fromkeys(HOST_TARGET_COLUMNS,
                                                                  math.nan)}, row])
    assert "0.85x" in line and "zero-offload 400 M params per busy s = 0.40x" in line
    assert "0.80x with the 0.200 s a step" in line
    assert host_target_line([{"strategy": "device"}]) is None
