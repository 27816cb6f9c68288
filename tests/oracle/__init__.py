"""The closed-form oracle the tests hold the event simulation to (test-only).

This package owns an independent steady-state model of every strategy, derived from the
dependency structure of `sims/strategies.py`: `steady.py` (`steady_state`, one closed form
per strategy), `zero3.py` (zero-infinity's), `parts.py` (the lanes, per-op terms, checks
and period-map iteration they are built from). It never runs SimPy. Nothing outside
tests/ imports it; tests import it as `oracle` (pytest puts tests/ on the path, as it
does for `engine_helpers`).
"""

from .steady import OracleResult, steady_state

__all__ = ["OracleResult", "steady_state"]
