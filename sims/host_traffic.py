"""Host memory traffic: a host streaming pass's rate from its bytes and the streaming
rate the same host lane was measured to reach in its CPU-Adam.

One concept: where a ZeRO-Offload step measured on zfbench's engine pins the host lane's
AdamW rate (zfbench.predict's fit), ZenFlow's host gradient accumulation on that lane is
costed from its bytes (`ACCUM_BYTES_PER_ELEMENT`) at the bytes per second the AdamW moved
(`ADAM_BYTES_PER_PARAM` a parameter), times the share of that streaming rate the
engine's accumulation reaches on the same threads (`ACCUM_OVER_ADAM_STREAM`). Without it
the accumulation ran at the preset's per-core judgment (zfbench.sims.host_step
`ACCUM_ELEMS_PER_CORE_S`, ~8.9 GB/s a core), independent of the measured host: on the
lent H200 and H100 machines' 16-core VM hosts that judgment is 1.6x the engine's measured
accumulation per core, and the predicted ZenFlow step was 71-73% too fast
(docs/results.md, "the H100/H200 node's host work"). DeepSpeed's CPU-Adam presets are
whole-node throughputs calibrated on published rows (host_step `calibrated_adam_rate`),
not a lane's streaming rate, so the presets keep the per-core judgment. Where the
simulated host job is the engine's (`host_job`), it streams its own bytes at that rate
too (`engine_job_units_per_s`), so a fitted AdamW rate is the lane's streaming rate.
"""

from __future__ import annotations

from zfbench.sims.costs import ACCUM_BYTES_PER_ELEMENT, ADAM_BYTES_PER_PARAM

# The engine's host accumulation's bytes per second over its AdamW pass's, same host lane
# and threads, from zfbench.real.rate_probe (`host_accum_elems_per_s` x 10 B over
# `host_adam_params_per_s` x 28 B). With the engine's fused host kernels
# (real/host_fused.cpp, since 2026-11-27 23:04): 0.91-1.03 over 1 and 2 threads and 16M
# and 64M elements on an Intel Xeon (Sapphire Rapids class, AVX-512 + AMX),
# `python bench/accum_over_adam.py`, bench/results/accum_over_adam/ (2026-11-28). Rule:
# 1.0, the accumulation streams memory as fast as AdamW does. Before those kernels the
# torch-ops accumulation measured 0.42-0.46 (the H200-VM and H100-VM profiles of
# 2026-11-26/27) and 0.58-0.61 (AMD EPYC Zen 4), and this was 0.5. Out of sample: the
# H200-VM run of 2026-11-28 (the only GPU run with the fused kernels) measured its
# accumulation at 8.7 G elements/s on 8 threads, 1.24x of its ZenFlow row's AdamW stream.
ACCUM_OVER_ADAM_STREAM = 1.0


def lane_stream_bytes_per_s(adam_params_per_s: float) -> float:
    """Bytes per second a host lane streams in its AdamW pass at `adam_params_per_s`."""
    if not adam_params_per_s > 0:
        raise ValueError(f"adam_params_per_s must be > 0, got {adam_params_per_s!r}")
    return adam_params_per_s * ADAM_BYTES_PER_PARAM


def accum_elems_per_s(adam_params_per_s: float,
                      ratio: float = ACCUM_OVER_ADAM_STREAM) -> float:
    """Elements per second of the host gradient accumulation (16-bit gradient into the
    fp32 window: `ACCUM_BYTES_PER_ELEMENT`) on a lane whose AdamW runs at
    `adam_params_per_s` (per core in, per core out): its bytes at `ratio` of the lane's
    AdamW streaming rate."""
    if not 0 < ratio <= 1:
        raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
    return lane_stream_bytes_per_s(adam_params_per_s) * ratio / ACCUM_BYTES_PER_ELEMENT


def engine_job_units_per_s(adam_params_per_s: float, job_bytes: float) -> float:
    """Parameters per second of zfbench's engine's host job of `job_bytes` a parameter
    (zfbench.core.engine_host_bytes) on a lane whose AdamW runs at `adam_params_per_s`
    (per core in, per core out): its bytes at the lane's AdamW streaming rate."""
    if not job_bytes > 0:
        raise ValueError(f"job_bytes must be > 0, got {job_bytes!r}")
    return lane_stream_bytes_per_s(adam_params_per_s) / job_bytes
