"""Running `python -m zfbench.simulate`'s cases: every (case, strategy) simulated and
summarized, in this process or in worker processes (`--jobs`).

A run is independent of every other (its own SimPy world, nothing random), so runs can go
to separate processes with the same numbers. A worker simulates, summarizes
(`simulate_report.finish_run`) and, with `--out`, writes the run's timeline files into the
staging directory itself, handing back only the summary row, the per-step breakdown and
the window of the timeline that trace.json draws; the full timeline never crosses a
process boundary. Runs go to the workers longest first (`pilot_cost`: a few steps
simulated). `auto_jobs` picks how many: one per CPU this process may use (at most
one per run) when the runs are long enough to pay for the processes, else one.

Part of the command `python -m zfbench.simulate` (split out of its main module for
size): like the command, it imports sims/ (docs/design.md's arrows).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable

from zfbench.core.progress import progress

from zfbench.sims.costs import SimSettings
from zfbench.sims.simulator import simulate, steps_needed
from zfbench.report import add_speedups
from zfbench.simulate_report import FilePlan, case_label, finish_run

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
    work = sum(case.steps * case.ranks for _, case in cases) * len(strategies)
    if work < PARALLEL_MIN_RANK_STEPS:
        return 1
    return max(1, min(usable_cpus(), runs))


def pilot_cost(case: SimSettings, strategy: str) -> float:
    """A run's cost, estimated: the SimPy events of its first `PILOT_STEPS` steps times
    its steps (runs go to the workers longest first, so the last to finish is short)."""
    pilot = simulate(case.with_(steps=min(case.steps, PILOT_STEPS)), strategy)
    return pilot.sim_events * case.steps / pilot.settings.steps


def _one(labels: dict, case: SimSettings, strategy: str, plan: FilePlan | None,
         keep_result: bool):
    """One run: (summary row, what `results` holds for it)."""
    result = simulate(case, strategy)
    row, files = finish_run(result, labels, plan)
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
    done: list = [None] * len(tasks)
    helper = threading.Thread(target=_quietly, args=(meanwhile,), daemon=True) \
        if meanwhile else None

    def progress_bar():  # made after any fork: its monitor thread is not forked
        if helper:  # likewise: workers never see a half-done import
            helper.start()
        return progress(total=len(tasks), quiet=quiet, desc="simulating", unit="run")

    if jobs > 1 and len(tasks) > 1:
        order = sorted(range(len(tasks)), key=lambda i: -pilot_cost(*tasks[i][1:])) \
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
                              "too_short": case.steps < need})
            results[(tuple(labels.items()), strategy)] = result
        add_speedups(case_rows)
        rows.extend(case_rows)
    return rows, results
