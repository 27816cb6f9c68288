"""`python -m zfbench.figures` (`make figures`): the paper's figures into
paper_figures/, simulated (1-9, 16, 17) and measured (10-15).

Modules:
    command    the flags, `main`, every figure drawn from its data
    data       the simulated datasets behind the figures, and their cache
    measure    the measured runs behind figures 10-15, run when their files are missing
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
