"""DeepSpeed ZeRO-2's `overlap_comm` in the simulator (`SimSettings.overlap_comm`): off,
each gradient bucket's reduction and its copy down run on the compute stream, so backward
waits for both; on, they run beside backward. Also the bundled rows' column."""

import pytest

from zfbench.sims.costs import CostModel, SimSettings
from zfbench.sims.settings import node_knobs
from zfbench.sims.simulator import simulate
from zfbench.validate.published import Unsupported, bundled_path, measure, read_rows, \
    row_settings

SHAPE = "gpt2:layers=4,hidden=1024,heads=16"


def _settings(**over) -> SimSettings:
    knobs = dict(node_knobs("dgx2-v100", 4), model=SHAPE, micro_batch=4, seq=1024,
                 precision="fp16", steps=4)
    knobs.update(over)
    return SimSettings.from_knobs(**knobs)


def _spans(result, ops, rank=0, step=2):
    return [x for x in result.timeline.spans
            if x.rank == rank and x.step == step and x.op in ops]


def _overlap_s(a, b) -> float:
    return max(0.0, min(a.t_end_s, b.t_end_s) - max(a.t_start_s, b.t_start_s))


def _busy_s(spans) -> float:
    return sum(x.t_end_s - x.t_start_s for x in spans)


def test_default_and_where_it_applies():
    s = _settings()
    assert s.runtime.overlap_comm is True and not CostModel(s).serial_grad_reduction
    assert CostModel(s.with_(overlap_comm=False)).serial_grad_reduction


@pytest.mark.parametrize("strategy, side_ops", [
    ("zero-offload", ("d2h_grad", "reduce_scatter")),
    ("zero-offload-dpu", ("d2h_grad", "reduce_scatter")),
    ("device", ("reduce_scatter",)),
])
def test_serial_reduction_never_overlaps_backward(strategy, side_ops):
    """On, the reductions and copies run under backward; off, no backward op overlaps one
    of the rank's, and the backward takes at least its compute plus all of them."""
    on = simulate(_settings(), strategy)
    off = simulate(_settings(overlap_comm=False), strategy)
    for result, overlapping in ((on, True), (off, False)):
        bwd = _spans(result, ("backward",))
        side = _spans(result, side_ops)
        assert side, strategy
        hidden = sum(_overlap_s(b, x) for b in bwd for x in side)
        if overlapping:
            assert hidden > 0
        else:
            assert hidden == pytest.approx(0.0, abs=1e-12)
    slow, fast = (measure(r, "backward_time_s", 2) for r in (off, on))
    assert slow > fast
    # the side ops of one bucket run one after the other (reduce, then copy): their
    # spans, all serialized with the backward's compute, add up
    assert slow >= _busy_s(_spans(off, ("backward",))) + _busy_s(_spans(off, side_ops)) - 1e-9


def test_one_rank_copies_still_serialize():
    """With one GPU there is no reduction, but the copy still runs on the compute stream."""
    s = _settings(**node_knobs("dgx2-v100", 1))
    on = measure(simulate(s, "zero-offload"), "backward_time_s", 2)
    off_result = simulate(s.with_(overlap_comm=False), "zero-offload")
    off = measure(off_result, "backward_time_s", 2)
    down = _busy_s(_spans(off_result, ("d2h_grad",)))
    assert down > 0 and off > on
    assert off >= _busy_s(_spans(off_result, ("backward",))) + down - 1e-9


@pytest.mark.parametrize("strategy", ["zenflow", "zero-infinity"])
def test_other_strategies_keep_their_schedule(strategy):
    """overlap_comm is DeepSpeed ZeRO-2's: ZenFlow's and ZeRO-3's schedules ignore it."""
    s = _settings(steps=6)
    a = simulate(s, strategy).timeline.spans
    b = simulate(s.with_(overlap_comm=False), strategy).timeline.spans
    assert [(x.op, x.t_start_s, x.t_end_s) for x in a] == \
        [(x.op, x.t_start_s, x.t_end_s) for x in b]


def test_bundled_rows_state_overlap_comm():
    """The ZeRO-Offload paper's rows ran the ZeRO-Offload tutorial's config (on); the
    ZeRO-Infinity paper's ZeRO-Offload baseline and the DeepSpeed blogs' rows ran
    DeepSpeed's default for ZeRO-2 (off): docs/published.md."""
    _, rows = read_rows(bundled_path())
    for row in rows:
        if row["id"].startswith("zo-"):
            want = "" if row["strategy"] == "device" else "true"
        elif row["id"].startswith("zi-"):
            want = "false" if row["strategy"] == "zero-offload" else ""
        else:
            want = "false"
        assert row["overlap_comm"] == want, row["id"]


def test_overlap_comm_column():
    _, rows = read_rows(bundled_path())
    row = next(r for r in rows if r["id"] == "zi-fig6c-4gpu-zo")
    assert row_settings(row).runtime.overlap_comm is False
    assert row_settings({**row, "overlap_comm": ""}).runtime.overlap_comm is True
    zi = next(r for r in rows if r["id"] == "zi-fig6c-4gpu-zi")
    with pytest.raises(Unsupported, match="overlap_comm false is simulated for device"):
        row_settings({**zi, "overlap_comm": "false"})
    assert row_settings({**zi, "overlap_comm": "true"}).runtime.overlap_comm is True
