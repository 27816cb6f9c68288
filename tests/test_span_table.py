"""The fast ways to a timeline's table and files give the very results of the plain ones
(issue 45, item 5: the simulator fast again, every file byte for byte the same):
`rows_frame` is `pd.DataFrame(rows, columns=...)`, `span_lines` is each field's str(),
a trace.json part rendered in a worker is the text the merged trace writes, and
steps.csv from the runs' own texts is the concatenated table written whole."""

import json

import pandas as pd
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from zfbench.core.span_table import rows_frame, span_lines
from zfbench.core.trace import (LANES, OPS, SPAN_COLUMNS, STEP_COLUMNS, Timeline, TraceSteps,
                                chrome_events_text, write_chrome_trace)
from zfbench.report import steps_text, write_steps
from zfbench.sims.costs import STRATEGIES, SimSettings
from zfbench.simulation import FilePlan, TraceRule, run

numbers = st.one_of(st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.booleans(), st.none(), st.sampled_from([0, 0.0, -0.0, 1, 1.0]))
plain = st.one_of(st.integers(0, 2**62), st.floats(0, 1e6, allow_nan=False))


def assert_same_frame(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns)
    assert list(a.dtypes) == list(b.dtypes)
    pd.testing.assert_frame_equal(a, b, check_exact=True)


@hsettings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(plain, st.sampled_from(LANES), st.sampled_from(OPS), plain,
                               plain, plain, plain), max_size=20),
       odd=st.lists(numbers, max_size=3))
def test_rows_frame_is_pandas_own_frame(rows, odd):
    """Any mix of ints and floats (and, in the last column, ints past 64 bits, bools,
    None, which take pandas' way) gives pandas' own frame, dtypes and all."""
    assert_same_frame(rows_frame(rows, SPAN_COLUMNS), pd.DataFrame(rows, columns=SPAN_COLUMNS))
    if rows:
        mixed = [row[:-1] + (value,) for row, value in zip(rows, odd)] + rows[len(odd):]
        assert_same_frame(rows_frame(mixed, SPAN_COLUMNS),
                          pd.DataFrame(mixed, columns=SPAN_COLUMNS))
    steps = [(r[0], r[3], r[4], r[5]) for r in rows]
    assert_same_frame(rows_frame(steps, STEP_COLUMNS), pd.DataFrame(steps, columns=STEP_COLUMNS))


def test_a_simulations_frames_are_pandas_own(tmp_path):
    from zfbench.sims.simulator import simulate

    tl = simulate(SimSettings.from_knobs(model="qwen2.5-1.5b", layers=2, steps=6),
                  "zero-infinity").timeline
    spans = tl.spans_frame()
    assert_same_frame(spans.drop(columns="duration_s"),
                      pd.DataFrame(tl._spans, columns=SPAN_COLUMNS))
    assert_same_frame(tl.steps_frame().drop(columns="wall_s"),
                      pd.DataFrame(tl._steps, columns=STEP_COLUMNS))


@hsettings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 9), st.sampled_from(LANES), st.sampled_from(OPS),
                               numbers, numbers, numbers, numbers), max_size=25),
       copies=st.lists(st.integers(0, 3), max_size=25))
def test_span_lines_are_each_fields_text(rows, copies):
    """Rows of any values (other types and signs of equal numbers: 1 and 1.0, 0.0 and
    -0.0), some followed by another rank's copy (the same objects), are each field's
    str(), however the memo of times is shared."""
    batch = []
    for row, n in zip(rows, copies + [0] * len(rows)):
        batch.append(row)
        batch.extend((row[0] + k + 1, *row[1:]) for k in range(n))
    want = "".join(",".join(map(str, row)) + "\n" for row in batch)
    assert span_lines(batch, {}) == want
    memo: dict = {}
    assert span_lines(batch, memo) + span_lines(batch, memo) == want + want


def two_timelines() -> dict[str, Timeline]:
    named = {}
    for label, ranks in (("a", 2), ("b", 3)):
        tl = Timeline("simulated")
        for rank in range(ranks):
            for step in range(6):
                tl.add(rank, "compute", "forward", step, step + 0.1 * rank, step + 0.5)
                tl.mark_step(rank, step, float(step), step + 1.0)
        named[label] = tl
    return named


@pytest.mark.parametrize("steps", [None, TraceSteps(2, 2)])
def test_a_trace_rendered_in_parts_is_the_same_file(tmp_path, steps):
    """A part made beforehand at the offset the merged trace gives it is used as it is;
    at another offset (a run before it with more ranks) it is rendered again."""
    named = two_timelines()
    whole = write_chrome_trace(tmp_path / "whole.json", named, steps).read_bytes()
    right = {"a": (0, chrome_events_text(named["a"], "a", 0, steps)),
             "b": (2, chrome_events_text(named["b"], "b", 2, steps))}
    wrong = {"b": (3, "not json")}  # 3 x b's ranks: not where it lands
    for name, rendered in (("right", right), ("wrong", wrong)):
        path = write_chrome_trace(tmp_path / f"{name}.json", named, steps, rendered)
        assert path.read_bytes() == whole, name
    json.loads(whole)


def test_steps_csv_from_the_runs_texts_is_the_table_written_whole(tmp_path):
    tables = [pd.DataFrame({"strategy": s, "rank": [0, 1], "wall_s": [0.1 * k, 1e-7],
                            "d2h_bytes": [k, 2**40]}) for k, s in enumerate(("x", "y"))]
    (tmp_path / "whole").mkdir()
    (tmp_path / "texts").mkdir()
    write_steps(tmp_path / "whole", tables)
    write_steps(tmp_path / "texts", tables, [steps_text(t) for t in tables])
    assert (tmp_path / "texts" / "steps.csv").read_bytes() == \
        (tmp_path / "whole" / "steps.csv").read_bytes()
    # another dtype in one table: the texts alone would differ, so the table is written whole
    tables[1]["d2h_bytes"] = tables[1]["d2h_bytes"].astype(float)
    write_steps(tmp_path / "texts", tables, ["wrong\n", "texts\n"])
    assert (tmp_path / "texts" / "steps.csv").read_text() == \
        pd.concat(tables, ignore_index=True).to_csv(index=False)


def test_workers_render_their_trace_parts_where_they_land(tmp_path):
    """`run` with worker processes: each run's part of trace.json was rendered at the
    process ids it gets there (every strategy 4 ranks: 0, 4, 8, ...)."""
    case = SimSettings.from_knobs(model="qwen2.5-1.5b", layers=2, steps=14)
    plan = FilePlan(tmp_path, TraceRule(), "csv")
    _, results = run([({}, case)], list(STRATEGIES), quiet=True, jobs=2, plan=plan)
    offsets = [results[((), s)].trace_text[0] for s in STRATEGIES]
    assert offsets == [4 * k for k in range(len(STRATEGIES))]
    assert all(results[((), s)].steps_text for s in STRATEGIES)
