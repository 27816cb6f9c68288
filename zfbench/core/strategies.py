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
# zfbench's engine runs its host optimizer in jobs of this many elements of the flat
# buffer, each chunk's parameters going up after it (real/engine.py's default; the
# simulator with a profile of the engine cuts its host updates the same way).
ENGINE_HOST_CHUNK_ELEMS = 1 << 22


def buckets_on(precision: str, overlap_comm: bool) -> bool:
    """Whether a run's offloading strategies send their gradients bucket by bucket during
    backward (zero_optimization.overlap_comm, real/grad_buckets.py): not in fp16, whose
    gradients are still loss-scaled when backward ends."""
    return bool(overlap_comm) and precision != "fp16"


def gradient_buckets_apply(strategy: str, precision: str, overlap_comm: bool) -> bool:
    """Whether the engine sends `strategy`'s gradients in buckets (`buckets_on`, for an
    offloading strategy: the device strategy sends nothing down)."""
    return strategy in OFFLOAD_STRATEGIES and buckets_on(precision, overlap_comm)
