"""`python -m zfbench.validate` (`zfbench validate`): the engine against the
simulator on this machine, and (`--published`) the simulator against published GPU
measurements.

Modules:
    command    the flags, `main`, the shapes measured and simulated side by side
    shapes     the three shapes it runs, sized on this machine
    published  `--published`: the simulator against the bundled or given measurements
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
