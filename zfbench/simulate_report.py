"""What `python -m zfbench.simulate` adds to the shared report (`zfbench.report`: the
columns, the table, summary.csv/json and steps.csv): a simulated run's summary row, the
too-short warning, and the timeline and trace files.

`summary_row` turns one simulated run into `zfbench.report.SUMMARY_COLUMNS` (the same
columns `python -m zfbench.run` writes for a measured run), `too_short_warning` is the
one line naming runs too short to contain a steady state. `finish_run` summarizes one run
and, with a `FilePlan`, writes its timeline files into the staging directory and keeps
the window of it the Chrome trace draws (`TraceRule`), so a worker process can do it all
and hand back only small things; `write_outputs` writes the rest (summary, steps.csv, the
streamed trace.json) and lands every file through a staging directory and renames.

Part of the command `python -m zfbench.simulate` (split out of its main module for size):
like the command, it imports real/, sims/ or analysis/ (docs/design.md's arrows).
"""

from __future__ import annotations

import os
import re
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from zfbench.analysis.breakdown import step_breakdown, summarize
from zfbench.sims.costs import SimSettings
from zfbench.sims.simulator import SimResult, steps_needed
from zfbench.core.trace import (Timeline, TraceSteps, columnar_format, write_chrome_trace,
                                write_timeline)
from zfbench.report import (complete_row, land, staging_dir, steps_rows, write_steps,
                            write_summary)

TRACE_STEPS_DEFAULT = "left-out+10"


def summary_row(result: SimResult, spans=None, steps=None, table=None) -> dict:
    """`zfbench.report.SUMMARY_COLUMNS` for one run (mfu NaN with a measured profile: its
    compute is measured, not a peak times an MFU); `spans`, `steps` (the timeline's
    frames) and `table` (their step breakdown) when the caller already has them."""
    tl, c = result.timeline, result.costs
    spans = tl.spans_frame() if spans is None else spans
    steps = tl.steps_frame() if steps is None else steps
    row = {"strategy": result.strategy}
    row.update(summarize(spans, steps, result.skip_steps,
                         c.model_bytes, result.host_optim_params_per_step(),
                         None if c.calibration else result.flops_per_step(),
                         c.flops_per_s / c.mfu, table=table))
    s = result.settings
    row["steps_left_out"] = result.skip_steps
    row["achieved_flops_per_s"] = result.flops_per_step() / row["step_time_s"]
    row["tokens_per_s"] = s.micro_batch * s.grad_accum * s.seq * s.ranks / row["step_time_s"]
    fit = c.fits(result.strategy)
    row.update({"device_bytes_per_rank": fit["device_bytes_per_rank"],
                "device_capacity_bytes": fit["device_capacity_bytes"],
                "host_bytes": fit["host_bytes"], "host_capacity_bytes":
                fit["host_capacity_bytes"], "fits": fit["fits"]})
    return complete_row(row)


def case_label(labels: dict) -> str:
    """`knob=value` of every swept knob, comma-separated ("" without a sweep)."""
    return ",".join(f"{k}={v}" for k, v in labels.items())


def too_short_warning(cases: list[tuple[dict, SimSettings]]) -> str | None:
    """One line naming the runs too short to contain a steady state (fewer steps than
    `zfbench.sims.simulator.steps_needed`), or None when every run is long enough."""
    short = [f"{case_label(labels) + ': ' if labels else ''}{case.steps} steps, needs "
             f"{steps_needed(case)}" for labels, case in cases
             if case.steps < steps_needed(case)]
    if not short:
        return None
    return (f"warning: too short to contain a steady state (warm-up + 2 update windows "
            f"left out + 1 measured window; rows marked too_short): {'; '.join(short)}")


def _prefix(labels: dict, strategy: str) -> str:
    label = case_label(labels).replace("/", "_").replace(os.sep, "_")
    return f"{label}.{strategy}." if label else f"{strategy}."


@dataclass(frozen=True)
class TraceRule:
    """`--trace-steps`: which steps trace.json draws of each strategy and rank. `all`:
    every step; `N`: the last N; `left-out+N` (the default, N=10): the steps left out of
    the averages (warm-up and two update windows) and the last N."""

    left_out: bool = True
    last: int | None = 10

    @classmethod
    def parse(cls, text: str) -> "TraceRule":
        text = text.strip().lower()
        if text == "all":
            return cls(False, None)
        match = re.fullmatch(r"(left-out\+)?(\d+)", text)
        if not match or int(match.group(2)) < 1:
            raise ValueError(f"--trace-steps wants all, N or left-out+N with N >= 1 (got "
                             f"{text!r})")
        return cls(bool(match.group(1)), int(match.group(2)))

    @property
    def spec(self) -> str:
        return "all" if self.last is None else \
            f"{'left-out+' if self.left_out else ''}{self.last}"

    def steps(self, skip_steps: int) -> TraceSteps:
        """The window for a run that leaves out its first `skip_steps` steps."""
        return TraceSteps(skip_steps if self.left_out else 0, self.last)

    def describe(self) -> str:
        if self.last is None:
            return "every step of each strategy and rank"
        head = ("the steps left out of the averages (warm-up and two update windows) and "
                if self.left_out else "")
        return f"{head}the last {self.last} steps of each strategy and rank"


@dataclass(frozen=True)
class FilePlan:
    """Where and how a run's files go: the staging directory, trace.json's window rule,
    the timeline format ("csv" or "parquet") and whether trace.json is written at all."""

    staging: Path
    trace: TraceRule = TraceRule()
    fmt: str = "csv"
    chrome_trace: bool = True


@dataclass
class RunFiles:
    """One run once its timeline files are in the staging directory: its summary row, its
    per-step breakdown (steps.csv's rows, labelled) and the window of its timeline that
    trace.json draws (None without a trace)."""

    strategy: str
    labels: dict
    row: dict
    steps: pd.DataFrame
    trace: Timeline | None
    trace_steps: TraceSteps | None
    files: list[str] = field(default_factory=list)


def finish_run(result: SimResult, labels: dict, plan: FilePlan | None):
    """(summary row, RunFiles or None): the run summarized from one breakdown of its
    timeline; with a plan, its timeline files written into the staging directory."""
    tl = result.timeline
    spans, steps = tl.spans_frame(), tl.steps_frame()
    table = step_breakdown(spans, steps)
    row = summary_row(result, spans, steps, table)
    if plan is None:
        return row, None
    del spans, steps
    paths = write_timeline(tl, plan.staging, _prefix(labels, result.strategy), plan.fmt)
    table = steps_rows(table, result.strategy, labels)
    window = plan.trace.steps(result.skip_steps) if plan.chrome_trace else None
    return row, RunFiles(result.strategy, labels, row, table,
                         tl.window(window) if window else None, window,
                         [p.name for p in paths])


def write_outputs(out: Path, head: dict, rows: list[dict], results: dict,
                  extras: dict[str, str] | None = None, trace: TraceRule = TraceRule(),
                  fmt: str | None = None, staging: Path | None = None) -> None:
    """Write every file into a staging directory, then move them into `out`.
    `results` maps (labels as a tuple of items, strategy) to a SimResult, or to the
    RunFiles `finish_run` left in `staging`; `head` is the summary.json's header
    (settings, sweep, provenance ...; the trace rule is added); `extras` more files by
    name (their text). `trace`: the steps trace.json draws (no trace.json with a sweep);
    `fmt`: the timeline format, by default Parquet where pyarrow imports, else CSV."""
    chrome = all(not items for items, _ in results)
    with nullcontext(staging) if staging is not None else staging_dir(out) as stage:
        plan = FilePlan(stage, trace, fmt or columnar_format(), chrome)
        done = {key: r if isinstance(r, RunFiles) else finish_run(r, dict(key[0]), plan)[1]
                for key, r in results.items()}
        for name, text in (extras or {}).items():
            (stage / name).write_text(text)
        head = {**head, "trace": {
            "written": chrome, "trace_steps": trace.spec, "rule": trace.describe(),
            "steps_drawn": {s: steps_drawn(r.trace) for (_, s), r in done.items()
                            if chrome and r.trace is not None},
            "timeline_format": plan.fmt}}
        knobs = list(dict(next(iter(results))[0])) if results else []
        write_summary(stage, head, rows, knobs)
        write_steps(stage, [r.steps for r in done.values()])
        if chrome:  # one case: every strategy has the same window
            window = next(iter(done.values())).trace_steps
            write_chrome_trace(stage / "trace.json",
                               {s: r.trace for (_, s), r in done.items()}, window)
        land(stage, out)


def steps_drawn(timeline: Timeline) -> dict[str, str]:
    """Per rank, the steps a (windowed) timeline holds as ranges, e.g. "0-11,990-999"."""
    out = {}
    for rank in timeline.ranks:
        numbers = sorted({s[1] for s in timeline._steps if s[0] == rank})
        ranges, start = [], None
        for i, n in enumerate(numbers):
            if start is None:
                start = n
            if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
                ranges.append(f"{start}-{n}" if n != start else f"{n}")
                start = None
        out[str(rank)] = ",".join(ranges)
    return out
