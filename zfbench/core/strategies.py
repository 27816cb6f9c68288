"""The strategy names: which strategies exist, which the engine runs, which offload.

This module owns the one list of strategy names every part and command reads (the engine's
config, the simulator's settings, the figures). Order matters: it is the order of tables,
CLI choices and figure legends.
"""
from __future__ import annotations

# Every strategy zfbench knows, in display order: what the simulator can run.
SIM_STRATEGIES = ("device", "zero-offload", "zero-offload-dpu", "zero-infinity", "zenflow")
# zero-infinity is simulated only: the real engine (real/) has no ZeRO-3 path.
SIMULATED_ONLY = ("zero-infinity",)
# What the real engine implements (a valid `zfbench.strategy` of a config).
ENGINE_STRATEGIES = tuple(s for s in SIM_STRATEGIES if s not in SIMULATED_ONLY)
# The engine's strategies whose optimizer lives on the host (offload_optimizer.device "cpu").
OFFLOAD_STRATEGIES = ("zero-offload", "zero-offload-dpu", "zenflow")
