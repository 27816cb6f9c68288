"""Measured CPU traces: host Adam overlaps compute under zenflow, never under zero-offload."""

import time

import pandas as pd
import pytest

from zfbench.analysis.breakdown import step_breakdown
from engine_helpers import BiasMLP, batches, config, make_engine, train_steps

pytestmark = pytest.mark.slow  # trains the engine for real


def overlapping(a: pd.DataFrame, b: pd.DataFrame) -> float:
    """Total time intervals of `a` overlap intervals of `b` (seconds)."""
    total = 0.0
    for s0, e0 in zip(a["t_start_s"], a["t_end_s"]):
        for s1, e1 in zip(b["t_start_s"], b["t_end_s"]):
            total += max(0.0, min(e0, e1) - max(s0, s1))
    return total


def measured_spans(strategy: str, **zenflow):
    engine = make_engine(BiasMLP(), config(strategy, **zenflow))
    original = engine.strategy.host.adam_chunk

    def slow_chunk(*args, **kwargs):  # a host Adam longer than forward + backward
        time.sleep(0.03)
        return original(*args, **kwargs)
    engine.strategy.host.adam_chunk = slow_chunk
    train_steps(engine, batches(), 12)
    engine.finish()
    engine.close()
    return engine.timeline


def test_host_adam_overlaps_compute_under_zenflow_only():
    zen = measured_spans("zenflow", topk_ratio=0.25, update_interval=3, overlap_step=True)
    off = measured_spans("zero-offload")
    for tl in (zen, off):
        spans = tl.spans_frame()
        assert {"forward", "backward", "d2h_grad", "host_optim", "h2d_param"} <= set(spans["op"])
    z, o = zen.spans_frame(), off.spans_frame()
    comp = ["forward", "backward"]
    off_overlap = overlapping(o[o["op"] == "host_optim"], o[o["op"].isin(comp)])
    assert off_overlap == 0.0

    def gaps(spans):
        """The next step's forward start minus the end of each (>= 30 ms) host update."""
        update = spans[(spans["op"] == "host_optim") &
                       (spans["t_end_s"] - spans["t_start_s"] >= 0.025)]
        forward = spans[spans["op"] == "forward"].set_index("step")["t_start_s"]
        return [forward[t + 1] - end for t, end in zip(update["step"], update["t_end_s"])
                if t + 1 in forward.index]
    # zenflow's next forward starts while the window's host Adam still runs (by the whole
    # 30 ms of it, however late the worker wakes); zero-offload's waits for it to end
    zen_gaps, off_gaps = gaps(z), gaps(o)
    assert len(zen_gaps) >= 3 and all(g < 0 for g in zen_gaps), zen_gaps
    assert len(off_gaps) >= 11 and all(g >= 0 for g in off_gaps), off_gaps
    assert set(z["op"]) >= {"host_accum", "select", "device_optim"}
    # the same breakdown code as the simulator's: zero-offload's stall is host wait
    table = step_breakdown(o, off.steps_frame())
    assert (table["host_wait_s"] > 0.02).all()
    zt = step_breakdown(z, zen.steps_frame())
    assert zt["stall_s"].iloc[3:].mean() < table["stall_s"].iloc[3:].mean()
