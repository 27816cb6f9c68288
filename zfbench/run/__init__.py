"""`python -m zfbench.run` (`zfbench run`): train every strategy with the real engine
on this machine and measure each op.

The package owns the run command: its flags, the memory check and the proxy when the
named model does not fit, the probes before it runs, the ranks it launches, its report
and the simulator's expectation printed beside it.

Modules:
    command    the flags, `main`, the ranks it launches, the report
    plan       the RunPlan: everything decided before the first step (plan.json)
    execute    a plan executed: the strategies one after another
    defaults   the default scenario's fixed settings (seq, precision, the GPU-sized run)
    probe      what the run measures before it runs: precision and the default shape
    proxy      the slice measured when the model cannot fit, projected whole onto a GPU node
    expect     the simulator's expectation for this machine beside a one-rank run
    report     the run's header, summary row and files (on top of zfbench.report)
    hazards    `--hazard-check`: the engine's schedules under the hazard checker
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
