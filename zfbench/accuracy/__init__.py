"""`python -m zfbench.accuracy` (`zfbench accuracy`): fine-tuning accuracy per
strategy on SmolLM2-135M.

Modules:
    command    the flags, `main`, the fine-tuning runs and the accuracy table
"""


def __getattr__(name: str):
    """`main` and `build_parser` are the command module's, loaded on first use, so that
    importing one module of this package does not load the whole command."""
    if name in ("main", "build_parser"):
        from . import command
        return getattr(command, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
