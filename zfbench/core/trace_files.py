"""Timeline files at scale: columnar spans and the Chrome trace, streamed to disk.

Owns how a `zfbench.core.trace.Timeline` lands in files and comes back:
- `write_timeline` / `read_timeline`: `<prefix>spans.{csv,parquet}` (every span) and
  `<prefix>steps.{csv,parquet}` (every step's wall interval). CSV always works (written a
  batch of rows at a time, floats as their shortest exact text, which pandas parses back
  exactly, so they read back equal); Parquet needs
  pyarrow (the optional `real-model` extra) and is written a row group at a time.
  `columnar_format()` is "parquet" where pyarrow imports, "csv" otherwise.
- `write_chrome_trace`: several timelines as one Chrome trace, written event batch by
  event batch (never the whole trace as one string or one list) with the very events
  `zfbench.core.trace.merge_chrome_traces` returns, optionally a window of steps
  (`zfbench.core.trace.TraceSteps`).
Every file is written to a temporary name beside it and renamed into place.
"""

from __future__ import annotations

import json
import os
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from zfbench.core.trace import (SPAN_COLUMNS, STEP_COLUMNS, Timeline, TraceSteps,
                           chrome_trace_tail, merged_chrome_events)

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

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            handle.write(",".join(columns) + "\n")
            for batch in _chunks(rows, ROWS_PER_CHUNK):
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


def write_chrome_trace(path: str | os.PathLike, named: dict[str, Timeline],
                       steps: TraceSteps | None = None) -> Path:
    """`merge_chrome_traces(named, steps)` as a JSON file, streamed: the events are
    serialized `EVENTS_PER_CHUNK` at a time; json.load of the file equals the dict."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    def write(tmp: Path) -> None:
        with open(tmp, "w") as handle:
            handle.write('{"traceEvents": [')
            sep = ""
            for batch in _chunks(merged_chrome_events(named, steps), EVENTS_PER_CHUNK):
                handle.write(sep + json.dumps(batch)[1:-1])
                sep = ", "
            handle.write("], " + json.dumps(chrome_trace_tail(steps))[1:])
    _replace_through_tmp(path, write)
    return path
