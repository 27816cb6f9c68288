"""Executing a `RunPlan` (zfbench.run.plan): the strategies trained one after another.

`execute(plan, ctx)` prints the run's header (rank 0), measures what the machine offers
before any strategy allocates (`memory_room`), trains each strategy with its engine
config from the plan, and, where the plan asks for this machine's profile (the sized
default run, --profile, a proxy's ranks on this CPU), measures it around them
(zfbench.run.expect.Calibration) or after them (`write_profile`). It decides nothing:
every setting is the plan's. It returns an `Execution`, which zfbench.run.command's
`report` turns into the table and the files; with several ranks (`ctx`) every rank
executes and only rank 0 reports.
"""
from __future__ import annotations

import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from zfbench.core.trace import write_json_atomic
from zfbench.real.runner import RunSpec, train
from zfbench.run.probe import describe_scenario
from zfbench.report import remove_stale
from zfbench.run.report import PROFILE_FILES, describe_config, measurement_window, memory_room

PROFILE_DIR = Path("runs/profile")  # where a profile goes without --out


@dataclass
class Execution:
    """What executing a plan gave: each strategy's result, this process's place among the
    ranks, the machine's memory before the run (rank 0), the profile measured (its path
    and the line that says so) and each strategy's own profile (`profiles`)."""

    results: dict = field(default_factory=dict)
    lead: bool = True
    ranks: int = 1
    room: dict | None = None
    expect: bool = False
    profile_path: Path | None = None
    profile_note: str | None = None
    profiles: dict = field(default_factory=dict)


def wants_expectation(plan, ranks: int) -> bool:
    """This machine's profile around the strategies (zfbench.run.expect): the no-flag run,
    --profile, and a proxy's ranks sharing this CPU."""
    return ((plan.scenario_probe is not None or plan.profile or plan.proxy is not None)
            and (ranks == 1 or not plan.use_cuda))


def print_header(plan, ranks: int) -> None:
    """What is measured, on what, in which configs, and the warnings (stderr)."""
    spec, shape = plan.spec, plan.spec.shape()
    if plan.proxy is not None:
        from zfbench.run.proxy import describe_proxy

        for line in describe_proxy(plan.proxy, spec.micro_batch, spec.seq):
            print(line, file=sys.stderr)
    print(f"{shape.name}: {shape.total_params / 1e6:.1f}M parameters, {ranks} rank(s) x "
          f"batch {spec.micro_batch} x seq {spec.seq}, {spec.steps} optimizer steps per "
          f"strategy (measured)", file=sys.stderr)
    if plan.scenario_probe is not None:
        print("  " + describe_scenario(plan.scenario_probe), file=sys.stderr)
    notes: list[str] = []
    for cfg in plan.configs.values():
        print("  " + describe_config(cfg, use_cuda=plan.use_cuda), file=sys.stderr)
        notes += [n for n in cfg.notes if n not in notes]
    for note in notes:
        print(f"  warning: {note}", file=sys.stderr)
    windows = {s: measurement_window(c) for s, c in plan.configs.items()}
    skip = max(w[0] for w in windows.values())
    for s, (_, needed) in windows.items():
        if spec.steps < max(needed, skip + 2):
            print(f"  warning: {s}: {spec.steps} steps are too short to measure it "
                  f"({skip} steps are left out as warm-up, then one full window): use "
                  f"--steps {max(needed, skip + 2)} or more; its row is marked "
                  f"too_short", file=sys.stderr)


def write_profile(spec: RunSpec, out: Path | None) -> tuple[Path, str]:
    """Measure this machine's profile for `spec` (zfbench.real.profile) into
    OUT/profile.json, removing an earlier run's OUT/profiles/<strategy>.json (it measures
    none around the strategies): (its path, the line that says what it measured)."""
    from zfbench.real.profile import measure_profile

    path = (out or PROFILE_DIR) / "profile.json"
    profile = measure_profile(spec)
    write_json_atomic(path, profile)
    remove_stale(path.parent, PROFILE_FILES, ())
    cal = profile["calibration"]
    lanes = "".join(f", {name} {lane['host_adam_params_per_s'] / 1e6:.0f} M on "
                    f"{lane['host_threads']}" for name, lane in
                    (cal.get("host_lanes") or {}).items())
    return path, (f"profile: host Adam {cal['host_adam_params_per_s'] / 1e6:.0f} M params/s "
                  f"on {cal['host_threads']} thread(s){lanes}, d2h "
                  f"{cal['d2h_bytes_per_s'] / 1e9:.1f} GB/s, h2d "
                  f"{cal['h2d_bytes_per_s'] / 1e9:.1f} GB/s -> {path}")


def execute(plan, ctx=None) -> Execution:
    """Train every strategy of `plan` (`ctx`: this rank's DistContext in a launched run)."""
    ex = Execution(lead=ctx is None or ctx.rank == 0, ranks=1 if ctx is None else ctx.world)
    if ex.lead:
        print_header(plan, ex.ranks)
        ex.room = memory_room(plan.use_cuda)  # before any strategy allocates
    ex.expect = wants_expectation(plan, ex.ranks)
    calibration = None
    if ex.expect:
        from zfbench.real.distributed import available_cores
        from zfbench.run.expect import Calibration

        calibration = Calibration(plan.spec, ctx, None if plan.bind_cores
                                  else available_cores())
        calibration.begin()
    for strategy in plan.strategies:
        with calibration.around(strategy) if calibration else nullcontext():
            ex.results[strategy] = train(plan.spec, strategy,
                                         progress=ex.lead and not plan.quiet, dist=ctx,
                                         config=plan.configs[strategy])
    if calibration is not None:  # the collectives are timed on every rank
        ex.profile_path = calibration.finish(plan.out or PROFILE_DIR)
        ex.profiles = calibration.paths
        ex.profile_note = (f"profile: the mean of one measured before and one after the "
                           f"strategies, host and link rates also around each -> "
                           f"{ex.profile_path}")
    elif ex.lead and (plan.profile or plan.project):
        ex.profile_path, ex.profile_note = write_profile(plan.spec, plan.out)
    return ex
