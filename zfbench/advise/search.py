"""The search: setups checked against the memory model, simulated, refined around the best.

This module owns how advise walks a `Space`: every setup of the coarse grid (plus the
default ZenFlow setup) is checked against the memory model and, where it fits, simulated;
then, from the best three setups and each strategy's best (where within `REFINE_WITHIN`
of the best), a coordinate
descent tries every setup one knob (or the micro-batch split) away and moves to the best
that improves the objective, until none does (`MAX_ROUNDS` at most). `brute_force`
simulates every setup of the space instead (what the tests hold the search to).

A run is as short as its measurement allows: ZenFlow's warm-up, two update windows and
one measured window -- and with a select interval S, S measured steps, so that the mean
holds one reselection per S steps -- the other strategies `FIXED_RUN_STEPS` steps, their
first `FIXED_SKIP_STEPS` left out (both zfbench.core.schedule.measurement_window): the
steady step of a simulation (nothing random) does not change with more steps.
Runs go to worker processes (`jobs`); the numbers are the same either way.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable

from zfbench.advise.space import Setup, Space, default_zenflow, settings_of
from zfbench.core.progress import progress
from zfbench.core.schedule import FIXED_RUN_STEPS, measurement_window
from zfbench.core.strategies import windowed_measure
from zfbench.sims.costs import CostModel, SimSettings, SimSettingsError
from zfbench.sims.simulator import simulate
from zfbench.simulation import summary_row

MAX_ROUNDS = 4
TOP_STARTS = 3  # the refinement starts from the best this many, and each strategy's best
# ... where that is within this factor of the best score (a strategy 1.5 times slower on
# the coarse grid is not made the fastest by its other knobs; a judgment, which
# tests/test_advise.py holds against a brute-force search)
REFINE_WITHIN = 1.5
KEPT = ("step_time_s", "tokens_per_s", "compute_s", "exposed_io_s", "host_wait_s",
        "stall_fraction", "mfu", "device_bytes_per_rank", "device_capacity_bytes",
        "host_bytes", "host_capacity_bytes")


def run_settings(base: SimSettings, setup: Setup) -> SimSettings:
    """`setup` on `base`, as many steps as its measurement needs
    (zfbench.core.schedule.measurement_window)."""
    settings = settings_of(base, setup)
    zf = settings.zenflow
    windowed = windowed_measure(setup.strategy)
    skip, steps = measurement_window(windowed, zf.full_warm_up_rounds,
                                     settings.window_plan().lengths)
    if not windowed:
        return settings.with_(steps=steps)
    if zf.select_interval > 0:  # one reselection in the measured steps
        steps = max(steps, skip + zf.select_interval)
    return settings.with_(steps=max(steps, FIXED_RUN_STEPS))


def evaluate(base: SimSettings, setup: Setup) -> dict:
    """The memory model's verdict and, where the setup fits, its simulated steady step
    (`KEPT` of zfbench.simulation.summary_row); `simulated` says which (`refused`: the
    settings refused the combination)."""
    try:
        settings = run_settings(base, setup)
        fit = CostModel(settings, setup.strategy).fits(setup.strategy)
    except SimSettingsError as err:  # a combination the simulator refuses: not a setup
        return {"fits": False, "simulated": False, "refused": str(err)}
    out = {"fits": bool(fit["fits"]), "simulated": False,
           "device_bytes_per_rank": fit["device_bytes_per_rank"],
           "device_capacity_bytes": fit["device_capacity_bytes"],
           "host_bytes": fit["host_bytes"], "host_capacity_bytes": fit["host_capacity_bytes"],
           "nvme_bytes": fit["nvme_bytes"],
           "steps_simulated": settings.measurement.steps}
    if not fit["fits"]:
        return out
    row = summary_row(simulate(settings, setup.strategy))
    out.update({k: row[k] for k in KEPT}, simulated=True)
    return out


def _context():
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)


@dataclass
class Evaluator:
    """Evaluates setups once each (a cache by setup), here or in `jobs` processes, with a
    progress line per batch."""
    base: SimSettings
    jobs: int = 1
    quiet: bool = False

    def __post_init__(self) -> None:
        self.done: dict[Setup, dict] = {}
        self.pool = ProcessPoolExecutor(self.jobs, mp_context=_context()) \
            if self.jobs > 1 else None

    def submit(self, work: Callable, *args):
        """Run `work(*args)` beside the simulations (a future), or now without workers."""
        if self.pool is None:
            return _Done(work(*args))
        return self.pool.submit(work, *args)

    def __call__(self, setups: list[Setup], what: str) -> dict[Setup, dict]:
        todo = [s for s in dict.fromkeys(setups) if s not in self.done]
        bar = progress(total=len(todo), desc=f"advise: {what}", unit="setup",
                       quiet=self.quiet or not todo)
        if self.pool is None:
            for setup in todo:
                bar.set_postfix_str(setup.label())
                self.done[setup] = evaluate(self.base, setup)
                bar.update()
        else:
            futures = [(s, self.pool.submit(evaluate, self.base, s)) for s in todo]
            for setup, future in futures:
                self.done[setup] = future.result()
                bar.set_postfix_str(setup.label())
                bar.update()
        bar.close()
        return {s: self.done[s] for s in setups}

    @property
    def simulated(self) -> int:
        return sum(r["simulated"] for r in self.done.values())

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class _Done:
    def __init__(self, value) -> None:
        self.value = value

    def result(self):
        return self.value


def _best(results: dict[Setup, dict], score: Callable, among=None) -> Setup | None:
    fitting = [s for s, r in results.items() if r["simulated"]
               and (among is None or among(s))]
    return min(fitting, key=lambda s: score(s, results[s]), default=None)


def search(space: Space, per_gpu: int, evaluator: Evaluator, score: Callable
           ) -> dict[Setup, dict]:
    """The coarse grid, then the coordinate descent (module docstring); every setup
    evaluated, by setup. `score(setup, result)` is the objective (lower is better)."""
    grid = [s for name in space.strategies for s in space.setups(name, per_gpu, True)]
    default = default_zenflow(space.strategies, per_gpu)
    results = dict(evaluator(grid + ([default] if default else []), "coarse grid"))
    ranked = sorted((s for s, r in results.items() if r["simulated"]),
                    key=lambda s: score(s, results[s]))
    if not ranked:
        return results
    limit = REFINE_WITHIN * score(ranked[0], results[ranked[0]])
    starts = list(dict.fromkeys(
        ranked[:TOP_STARTS] + [b for name in space.strategies
                               for b in [_best(results, score,
                                               lambda s, n=name: s.strategy == n)]
                               if b and score(b, results[b]) <= limit]))
    for round_ in range(1, MAX_ROUNDS + 1):
        around = {start: space.neighbours(start) for start in starts}
        found = evaluator([n for ns in around.values() for n in ns],
                          f"refinement round {round_}")
        results.update(found)
        moved = []
        for start, ns in around.items():
            best = _best({n: results[n] for n in ns}, score)
            if best is not None and score(best, results[best]) < \
                    score(start, results[start]):
                moved.append(best)
        if not moved:
            break
        starts = list(dict.fromkeys(moved))
    return results


def brute_force(space: Space, per_gpu: int, evaluator: Evaluator) -> dict[Setup, dict]:
    """Every setup of the space evaluated (the reference the search is checked against)."""
    every = [s for name in space.strategies for s in space.setups(name, per_gpu)]
    return evaluator(every, "every setup")
