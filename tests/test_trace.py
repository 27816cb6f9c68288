"""Spans, timelines, Chrome-trace export and the step breakdown, on hand-made timelines."""

import json

import pytest

from zfbench.analysis.breakdown import step_breakdown, summarize
from zfbench.core.trace import LANES, Span, Timeline, merge_chrome_traces


def small_timeline() -> Timeline:
    tl = Timeline("simulated", meta={"strategy": "zenflow"})
    # rank 0, step 0 is [0, 10]: compute [0,3] and [5,6]; a transfer [2,4.5]; host [4.5,8]
    tl.add(0, "compute", "forward", 0, 0.0, 3.0)
    tl.add(0, "d2h", "d2h_grad", 0, 2.0, 4.5, 1000)
    tl.add(0, "compute", "device_optim", 0, 5.0, 6.0)
    tl.add(0, "host", "host_optim", 0, 4.5, 8.0)
    tl.add(0, "h2d", "h2d_param", 1, 10.0, 11.0, 500)
    tl.add(0, "compute", "forward", 1, 11.0, 12.0)
    tl.mark_step(0, 0, 0.0, 10.0)
    tl.mark_step(0, 1, 10.0, 12.0)
    tl.add(1, "compute", "forward", 0, 0.0, 2.0)
    tl.mark_step(1, 0, 0.0, 2.0)
    return tl


def test_span_refuses_unknown_lane_op_and_backwards_time():
    with pytest.raises(ValueError, match="unknown lane 'gpu'"):
        Span(0, "gpu", "forward", 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="unknown op 'fwd'"):
        Span(0, "compute", "fwd", 0, 0.0, 1.0)
    with pytest.raises(ValueError, match="ends before it starts"):
        Span(0, "compute", "forward", 0, 2.0, 1.0)
    assert Span(0, "compute", "forward", 0, 1.0, 3.5).duration_s == 2.5


def test_breakdown_known_answer():
    tl = small_timeline()
    table = step_breakdown(tl.spans_frame(), tl.steps_frame())
    row = table[(table["rank"] == 0) & (table["step"] == 0)].iloc[0]
    assert row["wall_s"] == 10.0
    assert row["compute_s"] == 4.0  # [0,3] + [5,6]
    assert row["stall_s"] == 6.0
    assert row["exposed_io_s"] == 1.5  # transfer [2,4.5] outside compute: [3,4.5]
    assert row["host_wait_s"] == 4.5  # idle [4.5,5] + [6,10] minus nothing in flight
    assert row["host_busy_s"] == 3.5
    assert row["d2h_bytes"] == 1000 and row["h2d_bytes"] == 0
    step1 = table[(table["rank"] == 0) & (table["step"] == 1)].iloc[0]
    assert step1["exposed_io_s"] == 1.0 and step1["compute_s"] == 1.0
    assert step1["h2d_bytes"] == 500
    assert (table["compute_s"] + table["exposed_io_s"] + table["host_wait_s"]
            == table["wall_s"]).all()


def test_summary_averages_over_kept_steps_and_ranks():
    tl = small_timeline()
    out = summarize(tl.spans_frame(), tl.steps_frame(), skip_steps=1, model_bytes=1000)
    assert out["steps_measured"] == 1 and out["ranks"] == 1
    assert out["step_time_s"] == 2.0
    assert out["stall_fraction"] == 0.5
    assert out["h2d_gb_per_s"] == pytest.approx(500 / 1.0 / 1e9)
    assert out["pcie_bytes_per_step_over_model_bytes"] == 0.5
    with pytest.raises(ValueError, match="no steps left"):
        summarize(tl.spans_frame(), tl.steps_frame(), skip_steps=5)


def test_chrome_trace_has_a_process_per_rank_and_a_thread_per_lane():
    trace = json.loads(json.dumps(small_timeline().to_chrome_trace()))
    events = trace["traceEvents"]
    names = {(e["pid"], e["args"]["name"]) for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {(0, "rank 0 (simulated)"), (1, "rank 1 (simulated)")}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    for pid in (0, 1):
        assert [threads[(pid, i)] for i in range(len(LANES))] == list(LANES)
    d2h = next(e for e in events if e["ph"] == "X" and e["name"] == "d2h_grad")
    assert d2h["ts"] == 2.0e6 and d2h["dur"] == 2.5e6  # microseconds
    assert threads[(d2h["pid"], d2h["tid"])] == "d2h"
    assert d2h["args"] == {"step": 0, "bytes": 1000}


def test_merged_trace_keeps_timelines_apart():
    merged = merge_chrome_traces({"a": small_timeline(), "b": small_timeline()})
    pids = {e["pid"] for e in merged["traceEvents"]}
    assert pids == {0, 1, 2, 3}


def test_csv_round_trip(tmp_path):
    tl = small_timeline()
    tl.write_csv(tmp_path, prefix="x.")
    back = Timeline.read_csv(tmp_path, prefix="x.")
    assert back.spans == tl.spans
    assert back.steps_frame().equals(tl.steps_frame())
    assert not list(tmp_path.glob("*.tmp"))
