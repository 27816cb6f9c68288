"""`python -m zfbench.validate` (`zfbench validate`): the engine against the
simulator on this machine, and (`--published`) the simulator against published GPU
measurements.

Modules:
    command    the flags, `main`, the shapes measured and simulated side by side
    shapes     the three shapes it runs, sized on this machine
    published  `--published`: the simulator against the bundled or given measurements,
               with the leave-one-source-out error
    rows       the published-measurements format and a row's simulation settings
    calibrated the constants calibrated from single published rows: their judgments,
               the judged hardware file, the same-setting rule simulate and predict mark
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
