"""`python -m zfbench.gradients` (`zfbench gradients`): gradient statistics of a
real fine-tuning run (SmolLM2-135M, or the tiny model).

Modules:
    command    the flags, `main`, the training run and the statistics it writes
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
