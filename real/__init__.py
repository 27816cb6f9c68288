"""The real engine: ZenFlow and its baselines in PyTorch (`real.initialize`)."""

from zfbench.real.engine import Engine, NonFiniteGradientError, initialize

__all__ = ["Engine", "NonFiniteGradientError", "initialize"]
