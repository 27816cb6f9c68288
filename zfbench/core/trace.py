"""Spans and timelines: the one record of what ran where, when, moving how many bytes.

A span is `(rank, lane, op, step, t_start_s, t_end_s, bytes)` exactly as docs/design.md fixes
it. Measured runs (real/) and simulated runs (sims/) both fill a `Timeline`, which also
holds the wall-clock interval of every step per rank (a step's stall is its wall time
minus the time its compute lane was busy). A timeline exports to Chrome-trace JSON
(microseconds; one process per rank, one thread per lane), whole or a window of its steps
(`TraceSteps`), and to pandas / CSV / Parquet.

The files, at scale (the second half of this module; every file is written to a temporary
name beside it and renamed into place):
- `write_timeline` / `read_timeline` (and `Timeline.write_csv` / `read_csv` /
  `write_parquet` / `read_parquet`): `<prefix>spans.{csv,parquet}` (every span) and
  `<prefix>steps.{csv,parquet}` (every step's wall interval). CSV always works (written a
  batch of rows at a time, floats as their shortest exact text, which pandas parses back
  exactly, so they read back equal); Parquet needs pyarrow (the optional `real-model`
  extra) and is written a row group at a time. `columnar_format()` is "parquet" where
  pyarrow imports, "csv" otherwise.
- `write_chrome_trace`: several timelines as one Chrome trace, written event batch by
  event batch (never the whole trace as one string or one list) with the very events
  `merge_chrome_traces` returns, optionally a window of steps (`TraceSteps`).
- `write_json_atomic` / `write_csv_atomic`: a JSON payload or a table, through a rename.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from zfbench.core.span_table import rows_frame, span_lines

LANES = ("compute", "d2h", "h2d", "host", "net", "nvme_read", "nvme_write")
OPS = (
    "forward",
    "backward",
    "select",
    "device_optim",
    "d2h_grad",
    "h2d_param",
    "d2h_act",
    "h2d_act",
    "h2d_moments",
    "d2h_moments",
    "host_accum",
    "host_optim",
    "host_clip",
    "host_convert",
    "allreduce",
    "allgather",
    "reduce_scatter",
    "nvme_read",
    "nvme_write",
)
# A step's exposed I/O: the GPU idle while one of these is in flight (zfbench.analysis.breakdown)
TRANSFER_LANES = ("d2h", "h2d", "net", "nvme_read", "nvme_write")
SPAN_COLUMNS = ["rank", "lane", "op", "step", "t_start_s", "t_end_s", "bytes"]
STEP_COLUMNS = ["rank", "step", "t_start_s", "t_end_s"]
_LANE_SET = frozenset(LANES)
_OP_SET = frozenset(OPS)


@dataclass(frozen=True)
class Span:
    """One timed operation on one lane of one rank."""

    rank: int
    lane: str
    op: str
    step: int
    t_start_s: float
    t_end_s: float
    bytes: int = 0

    def __post_init__(self) -> None:
        check_span(self.lane, self.op, self.t_start_s, self.t_end_s)

    @property
    def duration_s(self) -> float:
        return self.t_end_s - self.t_start_s


def check_span(lane: str, op: str, t_start_s: float, t_end_s: float) -> None:
    """Refuse a span outside the vocabulary or running backwards in time."""
    if lane not in _LANE_SET:
        raise ValueError(f"unknown lane {lane!r}; lanes are: {', '.join(LANES)}")
    if op not in _OP_SET:
        raise ValueError(f"unknown op {op!r}; ops are: {', '.join(OPS)}")
    if not t_end_s >= t_start_s:
        raise ValueError(f"span {op} on {lane} ends before it starts ({t_start_s} > {t_end_s})")


class Timeline:
    """Spans and per-step wall intervals of one run, measured or simulated.

    Spans are stored as plain tuples (a simulation adds about a million of them), checked
    on the way in, and turned into `Span` objects or a DataFrame on demand.
    """

    def __init__(self, source: str = "simulated", meta: dict | None = None) -> None:
        if source not in ("measured", "simulated"):
            raise ValueError(f"source must be 'measured' or 'simulated', not {source!r}")
        self.source = source
        self.meta: dict = dict(meta or {})
        self._spans: list[tuple] = []
        self._steps: list[tuple] = []

    # -- recording -------------------------------------------------------------------
    def add(self, rank: int, lane: str, op: str, step: int, t_start_s: float,
            t_end_s: float, nbytes: int = 0) -> None:
        # check_span's checks, inlined for the simulator's million calls; it says what failed.
        if lane not in _LANE_SET or op not in _OP_SET or not t_end_s >= t_start_s:
            check_span(lane, op, t_start_s, t_end_s)
        self._spans.append((rank, lane, op, step, t_start_s, t_end_s, int(nbytes)))

    def mark_step(self, rank: int, step: int, t_start_s: float, t_end_s: float) -> None:
        """Record the wall interval of `step` on `rank` (from its start to the next's)."""
        if not t_end_s >= t_start_s:
            raise ValueError(f"step {step} on rank {rank} ends before it starts")
        self._steps.append((rank, step, t_start_s, t_end_s))

    # -- reading ---------------------------------------------------------------------
    @property
    def spans(self) -> list[Span]:
        return [Span(*s) for s in self._spans]

    def __len__(self) -> int:
        return len(self._spans)

    @property
    def ranks(self) -> list[int]:
        return sorted({s[0] for s in self._spans} | {s[0] for s in self._steps})

    def spans_frame(self):
        frame = rows_frame(self._spans, SPAN_COLUMNS)
        frame["duration_s"] = frame["t_end_s"] - frame["t_start_s"]
        return frame

    def steps_frame(self):
        frame = rows_frame(self._steps, STEP_COLUMNS)
        frame["wall_s"] = frame["t_end_s"] - frame["t_start_s"]
        return frame

    def window(self, steps: "TraceSteps | None") -> "Timeline":
        """The spans and step intervals of the steps `steps` keeps (this timeline itself
        when it keeps all)."""
        if steps is None or steps.everything:
            return self
        out = Timeline(self.source, self.meta)
        kept = steps.kept_by_rank(self)
        same = set(kept.values())
        if len(same) == 1:  # every rank (each one is in `kept`) keeps the same steps
            only = same.pop()
            out._spans = [s for s in self._spans if s[3] in only]
            out._steps = [s for s in self._steps if s[1] in only]
            return out
        out._spans = [s for s in self._spans if s[3] in kept.get(s[0], ())]
        out._steps = [s for s in self._steps if s[1] in kept.get(s[0], ())]
        return out

    # -- export ----------------------------------------------------------------------
    def chrome_events(self, label: str | None = None, pid_offset: int = 0,
                      steps: "TraceSteps | None" = None) -> Iterator[dict]:
        """Chrome-trace events (trace event format, microseconds), one at a time: a
        process per rank, a thread per lane, plus a `steps` thread marking each step's
        wall interval; with `steps`, only the spans and intervals of the steps it keeps
        (every rank keeps its process and threads)."""
        label = label or self.source
        step_tid = len(LANES)
        for rank in self.ranks:
            pid = pid_offset + rank
            yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                   "args": {"name": f"rank {rank} ({label})"}}
            yield {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                   "args": {"sort_index": pid}}
            for tid, lane in enumerate(LANES):
                yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": lane}}
                yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}}
            yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": step_tid,
                   "args": {"name": "steps"}}
        shown = self.window(steps)
        lane_tid = {lane: i for i, lane in enumerate(LANES)}
        for rank, lane, op, step, t0, t1, nbytes in shown._spans:
            yield {"ph": "X", "name": op, "cat": lane, "pid": pid_offset + rank,
                   "tid": lane_tid[lane], "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6,
                   "args": {"step": step, "bytes": nbytes}}
        for rank, step, t0, t1 in shown._steps:
            yield {"ph": "X", "name": f"step {step}", "cat": "step",
                   "pid": pid_offset + rank, "tid": step_tid, "ts": t0 * 1e6,
                   "dur": (t1 - t0) * 1e6, "args": {"step": step}}

    def to_chrome_trace(self, label: str | None = None, pid_offset: int = 0) -> dict:
        """The whole timeline as one Chrome-trace dict (`chrome_events`, every step)."""
        return {"traceEvents": list(self.chrome_events(label, pid_offset)),
                "displayTimeUnit": "ms",
                "otherData": {"source": self.source, **_jsonable(self.meta)}}

    def write_csv(self, directory: str | os.PathLike, prefix: str = "") -> tuple[Path, Path]:
        """Write `<prefix>spans.csv` and `<prefix>steps.csv` (streamed in chunks, each
        through a rename); `read_csv` reads them back equal."""
        return write_timeline(self, directory, prefix, "csv")

    def write_parquet(self, directory: str | os.PathLike,
                      prefix: str = "") -> tuple[Path, Path]:
        """Write `<prefix>spans.parquet` and `<prefix>steps.parquet` (needs pyarrow);
        `read_parquet` reads them back equal."""
        return write_timeline(self, directory, prefix, "parquet")

    @classmethod
    def read_csv(cls, directory: str | os.PathLike, prefix: str = "",
                 source: str = "simulated") -> "Timeline":
        return read_timeline(cls(source), directory, prefix, "csv")

    @classmethod
    def read_parquet(cls, directory: str | os.PathLike, prefix: str = "",
                     source: str = "simulated") -> "Timeline":
        return read_timeline(cls(source), directory, prefix, "parquet")

    def extend(self, rows: Iterable[tuple]) -> None:
        for rank, lane, op, step, t0, t1, nbytes in rows:
            self.add(int(rank), lane, op, int(step), float(t0), float(t1), int(nbytes))


@dataclass(frozen=True)
class TraceSteps:
    """Which steps a Chrome trace draws, per timeline (one strategy) and rank: every step
    numbered below `first` (a run's warm-up and the update windows left out of its
    averages) and the last `last` steps the rank ran (marked with `mark_step`);
    `last=None` draws every step."""

    first: int = 0
    last: int | None = None

    def __post_init__(self) -> None:
        if self.first < 0 or (self.last is not None and self.last < 0):
            raise ValueError(f"trace steps need first >= 0 and last >= 0 (got {self})")

    @property
    def everything(self) -> bool:
        return self.last is None

    def kept_by_rank(self, timeline: Timeline) -> dict[int, frozenset[int]]:
        """For each rank, the step numbers drawn: of the steps it marked (those of its
        spans where it marked none)."""
        seen: dict[int, set[int]] = {}
        for rank, step, _, _ in timeline._steps:
            seen.setdefault(rank, set()).add(step)
        unmarked = {span[0] for span in timeline._spans} - seen.keys()
        for span in timeline._spans if unmarked else ():
            if span[0] in unmarked:
                seen.setdefault(span[0], set()).add(span[3])
        out = {}
        for rank, numbers in seen.items():
            ordered = sorted(numbers)
            tail = ordered if self.last is None else ordered[max(len(ordered) - self.last, 0):]
            out[rank] = frozenset([n for n in ordered if n < self.first] + tail)
        return out

    def describe(self) -> str:
        """The rule in words (for --help, summary.json and the trace's otherData)."""
        if self.everything:
            return "every step"
        head = f"steps 0-{self.first - 1} (left out of the averages) and " \
            if self.first else ""
        return f"{head}the last {self.last} steps of each strategy and rank"


def merged_chrome_events(named: dict[str, Timeline],
                         steps: TraceSteps | None = None) -> Iterator[dict]:
    """The events of several timelines side by side (e.g. one per strategy), each in its
    own block of process ids so Perfetto shows them one above the other; with `steps`,
    only the steps it keeps of each."""
    offset = 0
    for label, timeline in named.items():
        yield from timeline.chrome_events(label, offset, steps)
        offset += max(timeline.ranks, default=0) + 1


def chrome_trace_tail(steps: TraceSteps | None = None) -> dict:
    """The keys after `traceEvents` in a merged trace: with a window, the rule drawn."""
    tail = {"displayTimeUnit": "ms"}
    if steps is not None and not steps.everything:
        tail["otherData"] = {"steps_drawn": steps.describe(), "first": steps.first,
                             "last": steps.last}
    return tail


def merge_chrome_traces(named: dict[str, Timeline], steps: TraceSteps | None = None) -> dict:
    """One Chrome trace holding several timelines (`merged_chrome_events`) as a dict;
    `write_chrome_trace` streams the very same trace to a file."""
    return {"traceEvents": list(merged_chrome_events(named, steps)),
            **chrome_trace_tail(steps)}


def write_json_atomic(path: str | os.PathLike, payload) -> Path:
    """Write JSON through a temporary file and a rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)
    return path


def write_csv_atomic(frame, path: Path) -> None:
    """A table as CSV through a temporary file and a rename."""
    tmp = path.with_name(path.name + ".tmp")
    frame.to_csv(tmp, index=False)
    os.replace(tmp, path)


def _jsonable(meta: dict) -> dict:
    return json.loads(json.dumps(meta, default=str))


# ---------------------------------------------------------------- timeline files at scale
FORMATS = ("csv", "parquet")
ROWS_PER_CHUNK = 1 << 16  # rows per Parquet row group / per CSV write
EVENTS_PER_CHUNK = 1 << 14  # Chrome-trace events serialized per write


def columnar_format() -> str:
    """The timeline format a run writes by default: "parquet" where pyarrow imports,
    else "csv"."""
    try:
        import pyarrow  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        return "csv"
    return "parquet"


def timeline_paths(directory: str | os.PathLike, prefix: str,
                   fmt: str) -> tuple[Path, Path]:
    """`<prefix>spans.<fmt>` and `<prefix>steps.<fmt>` in `directory`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown timeline format {fmt!r}; formats are: {', '.join(FORMATS)}")
    directory = Path(directory)
    return directory / f"{prefix}spans.{fmt}", directory / f"{prefix}steps.{fmt}"


def _chunks(rows: Iterable, size: int) -> Iterator[list]:
    it = iter(rows)
    while batch := list(islice(it, size)):
        yield batch


def _replace_through_tmp(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_csv(path: Path, columns: list[str], rows: list[tuple]) -> None:
    # Every field as str(): ints as digits, floats as their shortest text that reads back
    # exactly (what the csv module writes too, a third slower); lanes and ops are words
    # of the vocabulary, never needing quotes.
    line = ",".join(["%s"] * len(columns)) + "\n"
    spans = columns == SPAN_COLUMNS

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            handle.write(",".join(columns) + "\n")
            for batch in _chunks(rows, ROWS_PER_CHUNK):
                if spans:  # each distinct time of the batch formatted once
                    handle.write(span_lines(batch, {}))
                else:
                    handle.write("".join([line % row for row in batch]))
    _replace_through_tmp(path, write)


_ARROW_TYPES = {"rank": "int64", "lane": "string", "op": "string", "step": "int64",
                "t_start_s": "float64", "t_end_s": "float64", "bytes": "int64"}


def _write_parquet(path: Path, columns: list[str], rows: list[tuple]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, getattr(pa, _ARROW_TYPES[c])()) for c in columns])

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for batch in _chunks(rows, ROWS_PER_CHUNK):
                arrays = [pa.array(col, type=field.type)
                          for col, field in zip(zip(*batch), schema)]
                writer.write_table(pa.Table.from_arrays(arrays, schema=schema))
            if not rows:
                writer.write_table(schema.empty_table())
    _replace_through_tmp(path, write)


def write_timeline(timeline: Timeline, directory: str | os.PathLike, prefix: str = "",
                   fmt: str = "csv") -> tuple[Path, Path]:
    """Every span and every step interval of `timeline` as `<prefix>spans.<fmt>` and
    `<prefix>steps.<fmt>` in `directory` (made if missing)."""
    spans_path, steps_path = timeline_paths(directory, prefix, fmt)
    spans_path.parent.mkdir(parents=True, exist_ok=True)
    write = _write_csv if fmt == "csv" else _write_parquet
    write(spans_path, SPAN_COLUMNS, timeline._spans)
    write(steps_path, STEP_COLUMNS, timeline._steps)
    return spans_path, steps_path


def _read_rows(path: Path, fmt: str, columns: list[str]) -> Iterator[tuple]:
    if fmt == "csv":
        import pandas as pd

        # pandas 3 parses floats exactly by default (and deprecates the argument); before
        # it, only "round_trip" gives back the very floats written.
        exact = {} if int(pd.__version__.split(".")[0]) >= 3 else \
            {"float_precision": "round_trip"}
        frame = pd.read_csv(path, **exact)
        return frame[columns].itertuples(index=False, name=None)
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=columns)
    return zip(*(table.column(c).to_pylist() for c in columns))


def read_timeline(timeline: Timeline, directory: str | os.PathLike, prefix: str = "",
                  fmt: str = "csv") -> Timeline:
    """Fill `timeline` (checked span by span) from the files `write_timeline` wrote."""
    spans_path, steps_path = timeline_paths(directory, prefix, fmt)
    timeline.extend(_read_rows(spans_path, fmt, SPAN_COLUMNS))
    for rank, step, t0, t1 in _read_rows(steps_path, fmt, STEP_COLUMNS):
        timeline.mark_step(int(rank), int(step), float(t0), float(t1))
    return timeline


def chrome_events_text(timeline: Timeline, label: str, pid_offset: int = 0,
                       steps: TraceSteps | None = None) -> str:
    """The JSON text of `timeline.chrome_events(label, pid_offset, steps)`, the events
    separated as `write_chrome_trace` writes them: rendered where the timeline is (a
    worker process), then handed to `write_chrome_trace` as `rendered`."""
    return ", ".join(json.dumps(batch)[1:-1] for batch in _chunks(
        timeline.chrome_events(label, pid_offset, steps), EVENTS_PER_CHUNK))


def write_chrome_trace(path: str | os.PathLike, named: dict[str, Timeline],
                       steps: TraceSteps | None = None,
                       rendered: dict[str, tuple[int, str]] | None = None) -> Path:
    """`merge_chrome_traces(named, steps)` as a JSON file, streamed: the events are
    serialized `EVENTS_PER_CHUNK` at a time; json.load of the file equals the dict.
    `rendered`: a timeline's (process id offset, `chrome_events_text`) made beforehand,
    used where the offset is the one the merged trace gives it (the same text)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rendered = rendered or {}

    def texts() -> Iterator[str]:
        offset = 0
        for label, timeline in named.items():
            made = rendered.get(label)
            text = made[1] if made is not None and made[0] == offset else \
                chrome_events_text(timeline, label, offset, steps)
            if text:
                yield text
            offset += max(timeline.ranks, default=0) + 1

    def write(tmp: Path) -> None:
        with open(tmp, "w") as handle:
            handle.write('{"traceEvents": [')
            sep = ""
            for text in texts():
                handle.write(sep + text)
                sep = ", "
            handle.write("], " + json.dumps(chrome_trace_tail(steps))[1:])
    _replace_through_tmp(path, write)
    return path
