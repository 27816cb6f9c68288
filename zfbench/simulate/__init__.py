"""`python -m zfbench.simulate` (`zfbench simulate`, `zfbench-simulate`): simulate
every strategy on a named node and print the table.

The package owns the command line only: the flags, sweeps and the files it writes. The
simulated runs themselves go through `zfbench.simulation`, the simulator's public face
that predict, run, figures and bench/ share, so no command imports this package.

Modules:
    command    the flags (every SimSettings knob), `main`, sweeps, the table and files
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
