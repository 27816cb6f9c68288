"""Bytes per parameter that zfbench's engine's host optimizer job moves through host memory.

The engine runs an offloading step's host work as one job on its host lane
(real/strategies.py `OffloadStrategy.host_step_chunks`, real/zenflow.py `update_chunks`):
the gradients that crossed in the device's 16-bit dtype widened into the fp32 gradient
(`to_host_dtype`, ZeRO-Offload only: ZenFlow's window is fp32 already), the clipping norm
and scaling where `gradient_clipping` > 0 (`HostState.clip_`), then chunk by chunk one
fused pass (real/host_fused.py `host_adamw_`): AdamW reads the fp32 gradient, master, m
and v and writes master, m and v, and rounds the new parameters into the 16-bit h2d wire
(until issue 45 it also zeroed ZenFlow's window, the `zero` share; now the window's first
accumulation writes it, zfbench.sims.costs `window_first_write`). DeepSpeed's ZeRO-Offload step runs
other passes (zfbench.sims.host_step). The simulator costs the engine's job from these
bytes (`host_job_bytes`) when its `host_job` setting names the engine (issue 44).
"""

from __future__ import annotations

FP32_BYTES = 4
# the fused AdamW pass: fp32 gradient read (4), master, m and v read and written (24)
ADAMW_BYTES = FP32_BYTES + 3 * 2 * FP32_BYTES
# ZenFlow's window zeroed in the same pass: one fp32 write
ZERO_BYTES = FP32_BYTES
# clipping: the global norm reads the fp32 gradient; the scaling (`mul_` in place, run
# when the norm exceeds the clip) reads and writes it, counted always (an upper bound)
CLIP_BYTES = FP32_BYTES + 2 * FP32_BYTES


def wire_bytes(elem_bytes: int) -> int:
    """The new parameters rounded into the h2d wire inside AdamW's pass: one 16-bit write;
    none with fp32 weights (the master goes up itself)."""
    return 0 if elem_bytes == FP32_BYTES else elem_bytes


def from_wire_bytes(elem_bytes: int) -> int:
    """The gradients widened from the d2h wire into fp32: a 16-bit read and an fp32 write;
    none with fp32 weights (they land in the fp32 gradient)."""
    return 0 if elem_bytes == FP32_BYTES else elem_bytes + FP32_BYTES


def host_job_bytes(elem_bytes: int, from_wire: float = 0.0, zero: float = 0.0,
                   clip: bool = False) -> float:
    """Bytes per parameter of one host job: AdamW with its wire, plus the share `from_wire`
    of its elements widened from the d2h wire and the share `zero` zeroed (each in [0, 1]),
    plus the clipping passes. bf16 ZeRO-Offload: 36 B (48 clipped); ZenFlow's window 30 B
    (34 zeroed)."""
    for name, share in (("from_wire", from_wire), ("zero", zero)):
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"{name} must be a share in [0, 1], got {share!r}")
    return (ADAMW_BYTES + wire_bytes(elem_bytes) + from_wire * from_wire_bytes(elem_bytes)
            + zero * ZERO_BYTES + (CLIP_BYTES if clip else 0))
