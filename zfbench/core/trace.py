"""Spans and timelines: the one record of what ran where, when, moving how many bytes.

A span is `(rank, lane, op, step, t_start_s, t_end_s, bytes)` exactly as docs/design.md fixes
it. Measured runs (real/) and simulated runs (sims/) both fill a `Timeline`, which also
holds the wall-clock interval of every step per rank (a step's stall is its wall time
minus the time its compute lane was busy). A timeline exports to Chrome-trace JSON
(microseconds; one process per rank, one thread per lane), whole or a window of its steps
(`TraceSteps`), and to pandas / CSV / Parquet; the files and their streamed writing are
`zfbench.core.trace_files`'s, and `Timeline.read_csv` / `read_parquet` read them back.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

LANES = ("compute", "d2h", "h2d", "host", "net", "nvme_read", "nvme_write")
OPS = (
    "forward",
    "backward",
    "select",
    "device_optim",
    "d2h_grad",
    "h2d_param",
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
        import pandas as pd

        frame = pd.DataFrame(self._spans, columns=SPAN_COLUMNS)
        frame["duration_s"] = frame["t_end_s"] - frame["t_start_s"]
        return frame

    def steps_frame(self):
        import pandas as pd

        frame = pd.DataFrame(self._steps, columns=STEP_COLUMNS)
        frame["wall_s"] = frame["t_end_s"] - frame["t_start_s"]
        return frame

    def window(self, steps: "TraceSteps | None") -> "Timeline":
        """The spans and step intervals of the steps `steps` keeps (this timeline itself
        when it keeps all)."""
        if steps is None or steps.everything:
            return self
        out = Timeline(self.source, self.meta)
        kept = steps.kept_by_rank(self)
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
        from zfbench.core.trace_files import write_timeline

        return write_timeline(self, directory, prefix, "csv")

    def write_parquet(self, directory: str | os.PathLike,
                      prefix: str = "") -> tuple[Path, Path]:
        """Write `<prefix>spans.parquet` and `<prefix>steps.parquet` (needs pyarrow);
        `read_parquet` reads them back equal."""
        from zfbench.core.trace_files import write_timeline

        return write_timeline(self, directory, prefix, "parquet")

    @classmethod
    def read_csv(cls, directory: str | os.PathLike, prefix: str = "",
                 source: str = "simulated") -> "Timeline":
        from zfbench.core.trace_files import read_timeline

        return read_timeline(cls(source), directory, prefix, "csv")

    @classmethod
    def read_parquet(cls, directory: str | os.PathLike, prefix: str = "",
                     source: str = "simulated") -> "Timeline":
        from zfbench.core.trace_files import read_timeline

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
    `zfbench.core.trace_files.write_chrome_trace` streams the very same trace to a file."""
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
