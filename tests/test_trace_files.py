"""Files at scale (issue 15, item 2): trace.json draws a window of steps by its stated rule,
`--trace-steps all` draws every step, every span goes to CSV (always tested) or Parquet
(with pyarrow) and reads back equal, the streamed trace is the merged one, worker
processes write the same files, and the README and the command's docstring describe them."""

import json
import re
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings as hsettings, strategies as st

import zfbench.simulate.command as simulate_cmd
import zfbench.core.trace as trace_module
from zfbench.sims.costs import STRATEGIES, SimSettings
from zfbench.sims.simulator import default_skip_steps, simulate
from zfbench.simulate.command import main
from zfbench.simulation import TraceRule
from zfbench.core.trace import (LANES, OPS, Timeline, TraceSteps, columnar_format,
                                merge_chrome_traces, write_chrome_trace)

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "qwen2.5-1.5b", "--layers", "2", "--quiet"]
STEPS = 40
SETTINGS = SimSettings.from_knobs(model="qwen2.5-1.5b", layers=2, steps=STEPS)


def drawn(trace: dict) -> tuple[dict, dict]:
    """Per (strategy, rank): the steps of its `steps` row, and the steps of its spans."""
    names = {e["pid"]: re.fullmatch(r"rank (\d+) \((.+)\)", e["args"]["name"]).groups()
             for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    steps, spans = defaultdict(set), defaultdict(set)
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            rank, strategy = names[e["pid"]]
            (steps if e["cat"] == "step" else spans)[(strategy, int(rank))].add(e["args"]["step"])
    return steps, spans


@pytest.mark.parametrize("rule, expected", [
    (None, lambda skip: set(range(skip)) | set(range(STEPS - 10, STEPS))),  # the default
    ("all", lambda skip: set(range(STEPS))),
    ("5", lambda skip: set(range(STEPS - 5, STEPS))),
    ("left-out+3", lambda skip: set(range(skip)) | set(range(STEPS - 3, STEPS))),
])
def test_trace_draws_exactly_the_steps_the_rule_says(tmp_path, rule, expected):
    argv = SMALL + ["--steps", str(STEPS), "--out", str(tmp_path), "--jobs", "1"]
    assert main(argv + (["--trace-steps", rule] if rule else [])) == 0
    skip = default_skip_steps(SETTINGS)
    assert 0 < skip < STEPS - 10
    want = expected(skip)
    steps, spans = drawn(json.loads((tmp_path / "trace.json").read_text()))
    assert set(steps) == {(s, r) for s in STRATEGIES for r in range(SETTINGS.machine.gpus)}
    for key in steps:
        assert steps[key] == want, key
        assert spans[key] <= want and spans[key] & want, key
    summary = json.loads((tmp_path / "summary.json").read_text())
    rule_used = TraceRule.parse(rule or "left-out+10")
    assert summary["trace"]["trace_steps"] == rule_used.spec
    assert summary["trace"]["rule"] == rule_used.describe()
    ranges = summary["trace"]["steps_drawn"]["zenflow"]["0"].split(",")
    numbers = set()
    for part in ranges:
        a, _, b = part.partition("-")
        numbers |= set(range(int(a), int(b or a) + 1))
    assert numbers == want
    # the spans files hold every step whatever the trace draws
    fmt = columnar_format()
    back = getattr(Timeline, f"read_{fmt}")(tmp_path, prefix="zenflow.")
    assert set(back.steps_frame()["step"]) == set(range(STEPS))


def test_trace_steps_all_draws_every_span(tmp_path):
    assert main(SMALL + ["--steps", "14", "--strategy", "zenflow", "--trace-steps", "all",
                         "--out", str(tmp_path), "--timeline-format", "csv"]) == 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] != "step"]
    assert len(spans) == len(pd.read_csv(tmp_path / "zenflow.spans.csv"))


@pytest.mark.parametrize("fmt,other", [("csv", "*.parquet"), ("parquet", "*.spans.csv")])
def test_spans_read_back_equal_to_the_simulation(tmp_path, fmt, other):
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    assert main(SMALL + ["--steps", "16", "--out", str(tmp_path), "--timeline-format",
                         fmt]) == 0
    assert not list(tmp_path.glob(other))
    read = Timeline.read_csv if fmt == "csv" else Timeline.read_parquet
    for strategy in STRATEGIES:
        want = simulate(SETTINGS.with_(steps=16), strategy).timeline
        back = read(tmp_path, prefix=f"{strategy}.")
        assert back.spans == want.spans  # exact floats
        assert back.steps_frame().equals(want.steps_frame())


span_rows = st.lists(st.tuples(
    st.integers(0, 7), st.sampled_from(LANES), st.sampled_from(OPS), st.integers(0, 10**6),
    st.floats(0, 1e6, allow_nan=False), st.floats(0, 1e3, allow_nan=False),
    st.integers(0, 2**62)), max_size=30)


def random_timeline(rows) -> Timeline:
    tl = Timeline("simulated")
    for rank, lane, op, step, t0, dt, nbytes in rows:
        tl.add(rank, lane, op, step, t0, t0 + dt, nbytes)
        tl.mark_step(rank, step, t0, t0 + 2 * dt)
    return tl


@hsettings(max_examples=40, deadline=None)
@given(rows=span_rows)
def test_csv_round_trip_is_exact_for_any_floats(tmp_path_factory, rows):
    tmp = tmp_path_factory.mktemp("csv")
    tl = random_timeline(rows)
    tl.write_csv(tmp, prefix="r.")
    back = Timeline.read_csv(tmp, prefix="r.")
    assert back.spans == tl.spans and back._steps == tl._steps
    assert not list(tmp.glob("*.tmp"))


@hsettings(max_examples=20, deadline=None)
@given(rows=span_rows)
def test_parquet_round_trip_is_exact_for_any_floats(tmp_path_factory, rows):
    pytest.importorskip("pyarrow")
    tmp = tmp_path_factory.mktemp("parquet")
    tl = random_timeline(rows)
    tl.write_parquet(tmp, prefix="r.")
    back = Timeline.read_parquet(tmp, prefix="r.")
    assert back.spans == tl.spans and back._steps == tl._steps


def test_csv_rows_are_each_fields_text_when_ranks_repeat_a_span(tmp_path):
    """A span's copies for other ranks (zfbench.sims.replicas: the very same objects, one
    row after the other) reuse the first row's text; equal values of another type or
    sign (1 and 1.0, 0.0 and -0.0) do not, so every row is its own fields' str()."""
    tl = Timeline("simulated")
    t0, t1, step = 0.1 + 0.2, 1e-05 * 3, 7 * 143
    tl.add(0, "compute", "forward", step, t0, t0 + t1)
    for rank in (1, 2):  # copies: the same objects (a replica's rows)
        tl._spans.append((rank, *tl._spans[0][1:]))
    tl.add(0, "host", "host_optim", 1, 0.0, 1.0, 5)
    tl.add(1, "host", "host_optim", 1, -0.0, 1, 5)  # equal to the row above, other texts
    tl.add(2, "host", "host_optim", 1, 0, True, 5)
    tl.add(3, "host", "host_optim", 1, 0, True, 5)
    tl.write_csv(tmp_path, prefix="r.")
    lines = (tmp_path / "r.spans.csv").read_text().splitlines()[1:]
    assert lines == [",".join(map(str, row)) for row in tl._spans]
    assert lines[1] == f"1,compute,forward,1001,{t0},{t0 + t1},0"
    assert lines[3:6] == ["0,host,host_optim,1,0.0,1.0,5", "1,host,host_optim,1,-0.0,1,5",
                          "2,host,host_optim,1,0,True,5"]


def hand_timeline() -> Timeline:
    tl = Timeline("simulated")
    for rank, n in ((0, 10), (1, 6)):
        for step in range(n):
            tl.add(rank, "compute", "forward", step, step, step + 0.5)
            tl.add(rank, "host", "host_optim", step, step + 0.5, step + 1.5)
            tl.mark_step(rank, step, step, step + 1.0)
    return tl


def test_trace_steps_keep_the_first_and_the_last_of_each_rank():
    tl = hand_timeline()
    for step in range(7):  # a rank that marked no step: the steps of its spans
        tl.add(2, "d2h", "d2h_grad", step, step, step + 0.5, 10)
    kept = TraceSteps(first=2, last=3).kept_by_rank(tl)
    assert kept == {0: {0, 1, 7, 8, 9}, 1: {0, 1, 3, 4, 5}, 2: {0, 1, 4, 5, 6}}
    window = tl.window(TraceSteps(2, 3))
    assert sorted({(s.rank, s.step) for s in window.spans}) == sorted(
        (r, s) for r, steps in kept.items() for s in steps)
    assert TraceSteps(0, 0).kept_by_rank(tl) == {0: set(), 1: set(), 2: set()}
    assert TraceSteps(0, 100).kept_by_rank(tl)[1] == set(range(6))
    assert tl.window(TraceSteps()) is tl and tl.window(None) is tl
    with pytest.raises(ValueError):
        TraceSteps(-1, 2)


@pytest.mark.parametrize("steps", [None, TraceSteps(2, 3), TraceSteps(0, 1)])
def test_streamed_trace_is_the_merged_trace(tmp_path, monkeypatch, steps):
    monkeypatch.setattr(trace_module, "EVENTS_PER_CHUNK", 7)  # many chunks
    named = {"a": hand_timeline(), "b": simulate(SETTINGS.with_(steps=6), "zenflow").timeline}
    path = write_chrome_trace(tmp_path / "t.json", named, steps)
    assert json.loads(path.read_text()) == json.loads(json.dumps(merge_chrome_traces(named, steps)))
    assert not list(tmp_path.glob("*.tmp"))


def test_merge_without_a_window_is_unchanged():
    """`python -m zfbench.run` and validate call merge_chrome_traces(named): every step."""
    merged = merge_chrome_traces({"a": hand_timeline()})
    assert set(merged) == {"traceEvents", "displayTimeUnit"}
    steps = [e for e in merged["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert len(steps) == 16


@pytest.mark.slow
def test_worker_processes_write_the_same_files(tmp_path):
    argv = SMALL + ["--steps", "14", "--timeline-format", "csv"]
    assert main(argv + ["--jobs", "1", "--out", str(tmp_path / "one")]) == 0
    assert main(argv + ["--jobs", "2", "--out", str(tmp_path / "two")]) == 0
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir())
    for name in names:
        if name == "summary.json":  # its command line differs
            one, two = (json.loads((tmp_path / d / name).read_text()) for d in ("one", "two"))
            assert one["rows"] == two["rows"] and one["trace"] == two["trace"]
        else:
            assert (tmp_path / "one" / name).read_bytes() == \
                (tmp_path / "two" / name).read_bytes(), name


def test_runs_with_files_go_longest_first_counting_their_spans():
    """A run's estimated cost (`pilot_cost`) is its pilot's events plus its spans at
    `SPAN_COST_EVENTS`, scaled to its steps: with files zero-infinity (more spans than
    events) goes before zero-offload, which has more events and a fifth of the spans."""
    from zfbench.simulation import PILOT_STEPS, SPAN_COST_EVENTS, pilot_cost

    case = SimSettings.from_knobs(model="llama2-7b", gpus=4, pcie="gen4", steps=300)
    pilot = {s: simulate(case.with_(steps=PILOT_STEPS), s) for s in ("zero-offload",
                                                                      "zero-infinity")}
    for s, r in pilot.items():
        for files in (False, True):
            assert pilot_cost(case, s, files) == pytest.approx(
                (r.sim_events + SPAN_COST_EVENTS[files] * len(r.timeline)) * 300 / PILOT_STEPS)
    assert pilot["zero-offload"].sim_events > pilot["zero-infinity"].sim_events
    assert pilot_cost(case, "zero-infinity", True) > pilot_cost(case, "zero-offload", True)


@pytest.mark.parametrize("argv, words", [
    (["--trace-steps", "lots"], ["--trace-steps", "left-out+N"]),
    (["--trace-steps", "-3"], ["--trace-steps"]),
    (["--trace-steps", "left-out+0"], ["N >= 1"]),
    (["--jobs", "0"], ["--jobs"]),
])
def test_bad_file_flags_are_one_error_line(tmp_path, capsys, argv, words):
    out = tmp_path / "out"
    assert main(SMALL + ["--steps", "4", "--out", str(out)] + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:")
    assert all(w in err[0] for w in words)
    assert not out.exists()


def test_parquet_without_pyarrow_is_an_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(simulate_cmd, "columnar_format", lambda: "csv")
    assert main(SMALL + ["--steps", "4", "--timeline-format", "parquet"]) == 2
    assert "needs pyarrow" in capsys.readouterr().err


def readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## What a run writes")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_and_docstring_describe_the_files():
    readme, doc = readme_section(), simulate_cmd.__doc__
    help_text = simulate_cmd.build_parser().format_help()
    for words in (readme, doc):
        for word in ("summary.csv", "summary.json", "steps.csv", "spans.parquet",
                     "spans.csv", "steps.parquet", "trace.json", "--trace-steps",
                     "left-out+10", "all", "read_parquet", "read_csv", "pyarrow"):
            assert word in words, word
    assert "left-out+10" in help_text and "last N" in help_text
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    assert any("spans.parquet" in r and "spans.csv" in r for r in rows)
    assert any(r.startswith("| `trace.json`") and "--trace-steps" in r for r in rows)
