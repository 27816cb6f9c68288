"""Simulated runs, for every command that simulates: `python -m zfbench.simulate`,
`python -m zfbench.predict`, the projection and the expectation of `python -m zfbench.run`,
`make figures`, bench/. The public way to the simulator above one run
(`zfbench.sims.simulator.simulate`): knobs from their text, cases run and summarized, and
their files.

- `KNOBS` and `parse_value`: every knob of `zfbench.sims.costs.SimSettings` and a knob's
  value from its text (a flag or a sweep value), with an error naming the knob.
- `run`: every (case, strategy) simulated and summarized, here or in worker processes
  (`jobs`; `auto_jobs`: one per usable CPU, at most one per run, when the runs are long
  enough to pay for the processes, else one). A run is independent of every other (its
  own SimPy world, nothing random), so the numbers are the same either way. A worker
  simulates, summarizes (`finish_run`) and, with a `FilePlan`, writes the run's timeline
  files into the staging directory itself, handing back only the summary row, the
  per-step breakdown and the window trace.json draws, each also as the text its file
  holds. Runs go longest first (`pilot_cost`).
- The report a simulated run adds to the shared one (`zfbench.report`): `summary_row`
  (the `SUMMARY_COLUMNS` `python -m zfbench.run` writes too), `too_short_warning`, and
  `write_outputs`, which writes every file (summary, steps.csv, the timelines, the
  streamed trace.json, drawing the steps `TraceRule` says) through a staging directory,
  removing an earlier run's files of the same names it did not write (`SIMULATED_FILES`).

A command module: it imports sims/ and analysis/ (docs/design.md's arrows).
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
import re
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pandas as pd

from zfbench.analysis.breakdown import step_breakdown, summarize
from zfbench.core.progress import progress
from zfbench.core.trace import (Timeline, TraceSteps, chrome_events_text, columnar_format,
                                write_chrome_trace, write_timeline)
from zfbench.report import (TIMELINE_FILES, Owned, add_speedups, complete_row, land,
                            staging_dir, steps_rows, steps_text, write_steps, write_summary)
from zfbench.sims.costs import SimSettings, SimSettingsError
from zfbench.sims.settings import knob_fields
from zfbench.sims.simulator import SimResult, simulate, steps_needed

DEFAULTS = SimSettings()
# every knob by its flat name (the flag, the sweep name, summary.json's key) -> its type
KNOBS = {name: f.type for name, f in knob_fields().items()}
DEFAULT_KNOBS = DEFAULTS.as_dict()
TRACE_STEPS_DEFAULT = "left-out+10"


def parse_value(knob: str, text: str):
    """Turn a flag or sweep value into the knob's type, with an error naming the knob."""
    default = DEFAULT_KNOBS[knob]
    kind = str(KNOBS[knob])
    try:
        if "bool" in kind:
            if text.lower() in ("1", "true", "yes", "on"):
                return True
            if text.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if "int" in kind and "str" in kind:  # an integer or a word ("auto")
            try:
                return int(text)
            except ValueError:
                return text.strip()
        if "int" in kind and "float" not in kind:
            return None if text.lower() == "none" else int(text)
        if "float" in kind:
            value = None if text.lower() == "none" else float(text)
            if value is not None and not math.isfinite(value):
                raise ValueError
            return value
        return text if default is not None or text.lower() != "none" else None
    except ValueError:
        raise SimSettingsError(f"{knob}: cannot read {text!r} as {kind}") from None


# ---------------------------------------------------------------- a run's report and files
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
                         c.flops_per_s / c.mfu, table=table, ranks=result.settings.machine.ranks))
    s = result.settings
    row["steps_left_out"] = result.skip_steps
    row["achieved_flops_per_s"] = result.flops_per_step() / row["step_time_s"]
    row["tokens_per_s"] = (s.scenario.micro_batch * s.scenario.grad_accum * s.scenario.seq
                           * s.machine.ranks / row["step_time_s"])
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
    short = [f"{case_label(labels) + ': ' if labels else ''}{case.measurement.steps} steps, needs "
             f"{steps_needed(case)}" for labels, case in cases
             if case.measurement.steps < steps_needed(case)]
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
    the timeline format ("csv" or "parquet") and whether trace.json is written at all;
    `strategies`, the order trace.json draws them in (`run` sets it), lets a worker
    render its run's part of trace.json where its place there is known."""

    staging: Path
    trace: TraceRule = TraceRule()
    fmt: str = "csv"
    chrome_trace: bool = True
    strategies: tuple[str, ...] = ()


@dataclass
class RunFiles:
    """One run once its timeline files are in the staging directory: its summary row, its
    per-step breakdown (steps.csv's rows, labelled), the window of its timeline that
    trace.json draws (None without a trace) and, made where the run was (a worker
    process, beside the other runs rather than after them all), the text of both:
    `steps_text` and the window's trace events (`chrome_events_text`) with the process
    id offset they were rendered at (`write_outputs` uses what fits)."""

    strategy: str
    labels: dict
    row: dict
    steps: pd.DataFrame
    trace: Timeline | None
    trace_steps: TraceSteps | None
    files: list[str] = field(default_factory=list)
    steps_text: str | None = None
    trace_text: tuple[int, str] | None = None


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
    shown = tl.window(window) if window else None
    return row, RunFiles(result.strategy, labels, row, table, shown, window,
                         [p.name for p in paths], steps_text(table),
                         _trace_text(shown, result.strategy, window, plan.strategies))


def _trace_text(shown: Timeline | None, strategy: str, window: TraceSteps | None,
                order: tuple[str, ...]) -> tuple[int, str] | None:
    """A run's events in trace.json, rendered at the process ids it gets there when every
    run before it in `order` has as many ranks as it (else `write_chrome_trace` renders
    them again at the right ones)."""
    if shown is None or strategy not in order:
        return None
    offset = order.index(strategy) * (max(shown.ranks, default=0) + 1)
    return offset, chrome_events_text(shown, strategy, offset, window)


# The files a simulated run writes (a sweep's case labels before each timeline's
# strategy): an earlier run's of these names that a later one did not write are removed.
SIMULATED_FILES = Owned(names=("summary.csv", "summary.json", "steps.csv", "trace.json"),
                        per_strategy=TIMELINE_FILES, labelled=True)


def write_outputs(out: Path, head: dict, rows: list[dict], results: dict,
                  extras: dict[str, str] | None = None, trace: TraceRule = TraceRule(),
                  fmt: str | None = None, staging: Path | None = None,
                  owned: Owned = SIMULATED_FILES) -> None:
    """Write every file into a staging directory, then move them into `out` and remove
    the files `owned` claims that this run did not write (zfbench.report.land; the
    command's names, by default `SIMULATED_FILES`). `results` maps (labels as a tuple
    of items, strategy) to a SimResult, or to the RunFiles `finish_run` left in
    `staging`; `head` is the summary.json's header (settings, sweep, provenance ...; the
    trace rule is added); `extras` more files by name (their text). `trace`: the steps
    trace.json draws (no trace.json with a sweep); `fmt`: the timeline format, by default Parquet where pyarrow imports, else CSV."""
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
        write_steps(stage, [r.steps for r in done.values()],
                    [r.steps_text for r in done.values()])
        if chrome:  # one case: every strategy has the same window
            window = next(iter(done.values())).trace_steps
            write_chrome_trace(stage / "trace.json",
                               {s: r.trace for (_, s), r in done.items()}, window,
                               {s: r.trace_text for (_, s), r in done.items()
                                if r.trace_text is not None})
        land(stage, out, owned)


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


# ---------------------------------------------------------------- running the cases
# Below this many simulated rank-steps in all, runs stay in this process (forking and
# shipping results back costs more than it saves on a few short runs).
PARALLEL_MIN_RANK_STEPS = 2000
PILOT_STEPS = 3  # steps simulated to estimate a run's cost


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def auto_jobs(cases: list[tuple[dict, SimSettings]], strategies: list[str]) -> int:
    """Processes for `--jobs auto`: one per usable CPU, at most one per run, and one
    when all runs together simulate fewer than `PARALLEL_MIN_RANK_STEPS` rank-steps."""
    runs = len(cases) * len(strategies)
    work = sum(case.measurement.steps * case.machine.ranks for _, case in cases) * len(strategies)
    if work < PARALLEL_MIN_RANK_STEPS:
        return 1
    return max(1, min(usable_cpus(), runs))


# What a recorded span costs a run, in SimPy events' worth of work: recorded (or copied
# for alike ranks), framed and broken down for the summary and, with files, written as
# a CSV row and windowed for trace.json. Least-squares fits over the five strategies of
# llama2-7b on 4 x a100-80g (2026-11-28, Xeon-AMX): without files, simulate() and the
# summary's CPU seconds at 1000 steps (~4.4 us an event, ~4.0 us a span: 0.9); with
# files, instructions counted by valgrind (callgrind) at 50 steps (~18 k an event, ~20 k
# a span: 1.1). Only the order of the runs follows from it (longest first): with files
# zero-infinity (1.5 M spans, 1.3 M events) goes first, which its events alone did not say.
SPAN_COST_EVENTS = {False: 0.9, True: 1.1}


def pilot_cost(case: SimSettings, strategy: str, files: bool = False) -> float:
    """A run's cost, estimated: the SimPy events and the spans (`SPAN_COST_EVENTS`, by
    whether its `files` are written) of its first `PILOT_STEPS` steps, times its steps
    (runs go to the workers longest first, so the last to finish is short)."""
    pilot = simulate(case.with_(steps=min(case.measurement.steps, PILOT_STEPS)), strategy)
    work = pilot.sim_events + SPAN_COST_EVENTS[files] * len(pilot.timeline)
    return work * case.measurement.steps / pilot.settings.measurement.steps


def _one(labels: dict, case: SimSettings, strategy: str, plan: FilePlan | None,
         keep_result: bool):
    """One run: (summary row, what `results` holds for it). The cyclic garbage collector
    is paused throughout, as `simulate` pauses it: it would rescan the run's millions
    of spans, which hold no reference cycles, while they are framed and written."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        result = simulate(case, strategy)
        row, files = finish_run(result, labels, plan)
    finally:
        if collecting:
            gc.enable()
    return row, files if plan is not None else (result if keep_result else None)


def _quietly(work: Callable[[], object]) -> None:
    """Run `work`, keeping any error for whoever calls it again to meet."""
    try:
        work()
    except Exception:  # noqa: BLE001 - the caller repeats the call and sees it
        pass


def _name(task: tuple) -> str:
    labels, _, strategy = task
    return " ".join([strategy, case_label(labels)]).strip()


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


def run(cases: list[tuple[dict, SimSettings]], strategies: list[str], quiet: bool = False,
        jobs: int = 1, plan: FilePlan | None = None,
        meanwhile: Callable[[], object] | None = None) -> tuple[list[dict], dict]:
    """Simulate every case and strategy: summary rows (each with its case's labels,
    `steps_needed` and `too_short`) and the results by (labels as a tuple of items,
    strategy). A result is the run's `RunFiles` with a plan (its files are then in
    `plan.staging`), else its SimResult in this process (`jobs` 1) or None (jobs > 1:
    timelines stay in the workers). `meanwhile` runs in a thread of this process while
    the runs go, once any worker processes are started (e.g. the provenance's torch
    import, a second's work that would otherwise come after them)."""
    tasks = [(labels, case, strategy) for labels, case in cases for strategy in strategies]
    if plan is not None and plan.chrome_trace and len(cases) == 1:  # trace.json's order
        plan = replace(plan, strategies=tuple(strategies))
    done: list = [None] * len(tasks)
    helper = threading.Thread(target=_quietly, args=(meanwhile,), daemon=True) \
        if meanwhile else None

    def progress_bar():  # made after any fork: its monitor thread is not forked
        if helper:  # likewise: workers never see a half-done import
            helper.start()
        return progress(total=len(tasks), quiet=quiet, desc="simulating", unit="run")

    if jobs > 1 and len(tasks) > 1:
        files = plan is not None
        order = sorted(range(len(tasks)), key=lambda i: -pilot_cost(*tasks[i][1:], files)) \
            if len(tasks) > jobs else range(len(tasks))
        with ProcessPoolExecutor(min(jobs, len(tasks)), mp_context=_context()) as pool:
            futures = {pool.submit(_one, *tasks[i], plan, False): i for i in order}
            bar = progress_bar()
            for future in as_completed(futures):
                i = futures[future]
                done[i] = future.result()
                bar.set_postfix_str(_name(tasks[i]))
                bar.update()
    else:
        bar = progress_bar()
        for i, task in enumerate(tasks):
            bar.set_postfix_str(_name(task))
            done[i] = _one(*task, plan, True)
            bar.update()
    bar.close()
    if helper:
        helper.join()
    rows, results, outcomes = [], {}, iter(done)
    for labels, case in cases:
        need, case_rows = steps_needed(case), []
        for strategy in strategies:
            row, result = next(outcomes)
            case_rows.append({**labels, **row, "steps_needed": need,
                              "too_short": case.measurement.steps < need})
            results[(tuple(labels.items()), strategy)] = result
        add_speedups(case_rows)
        rows.extend(case_rows)
    return rows, results
