"""`python -m zfbench.advise`: the best offloading setup for a model on a node, as a
DeepSpeed config, with its error bar.

Modules:
    command      the flags, `main`, the printed advice
    space        the setups searched, the knobs held and why
    search       the coarse grid, the refinement, the brute force
    ranking      the objectives and the ranked table
    quality      steps to quality and quality penalty from the convergence runs
    error_bars   the simulator's error in each regime
    ds_config    a setup as a DeepSpeed config
    files        advice.csv, advice.json, ds_config.json, front.png
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
