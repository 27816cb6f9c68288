"""`python -m zfbench.predict` (`zfbench predict`): a measured ZeRO-Offload step,
the node fitted to it, and every strategy simulated on that node.

Modules:
    command    the flags, `main`, the prediction and its report (`paper`: the paper's bars)
    fit        the simulator's unknowns inferred from one measured step (`infer`, `Fit`)
    inputs     the measured baselines it reads (breakdown text, DeepSpeed logs, the paper)
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
