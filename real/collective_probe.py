"""The collectives' cost among the ranks of one run, measured with the engine's own calls.

Several ranks on one CPU (`python -m zfbench.run --gpus 4` without a GPU) exchange
gradients and parameters over gloo, and there a collective costs what the machine's cores
and memory give it, which no preset knows. `measure_collectives(ctx, total, dtype)` times,
on every rank at once (each rank must call it, with the same arguments), the very
functions the engine calls (zfbench.real.distributed):
- `allreduce_mean_` of a flat buffer of `total` elements of `dtype` (the engine's
  `reduce_grads` of the whole gradient buffer) and of a small one;
- `allgather_flat` into a buffer of that size (the engine's `gather_params`) and a small one;
each the median of `repeats` after one warm-up. From the two sizes it returns a fixed part
(seconds) and a part per byte of the buffer for each op, the keys a profile's calibration
section carries for the simulator (zfbench.sims.costs.CostModel.measured_collective_s):
`allreduce_s_fixed`, `allreduce_s_per_byte`, `allgather_s_fixed`, `allgather_s_per_byte`,
and `collective_ranks` (the world size they hold for). The lanes are otherwise idle
while it runs: what the strategies' own work adds beside a collective is the simulator's
to model, not folded into this rate.
"""

from __future__ import annotations

import statistics
import time

import torch

from zfbench.real.distributed import DistContext, allgather_flat, allreduce_mean_, barrier

SMALL_ELEMS = 1 << 14  # the small buffer: its time is nearly all the fixed part


def _median_s(ctx: DistContext, fn, repeats: int) -> float:
    fn()  # warm-up: first-touch of the buffers, gloo's connection set-up
    times = []
    for _ in range(repeats):
        barrier(ctx, "collective_probe")  # every rank starts together
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def line_through(small: tuple[float, float], large: tuple[float, float]) -> tuple[float, float]:
    """(fixed seconds, seconds per byte) of the line through two (bytes, seconds) points;
    neither negative (a noisy small point can lie above the line's intercept)."""
    (b0, t0), (b1, t1) = small, large
    per_byte = max(0.0, (t1 - t0) / (b1 - b0)) if b1 > b0 else t1 / max(b1, 1)
    return max(0.0, t1 - per_byte * b1), per_byte


def measure_collectives(ctx: DistContext, total: int, dtype: torch.dtype,
                        repeats: int = 3) -> dict:
    """The calibration keys above, measured among `ctx`'s ranks (module docstring)."""
    if not ctx.active:
        raise ValueError("measure_collectives needs several ranks (a launched run)")
    out: dict = {"collective_ranks": ctx.world}
    for op in ("allreduce", "allgather"):
        points = []
        for numel in (min(SMALL_ELEMS, total), total):
            probe = DistContext(ctx.rank, ctx.world, ctx.local_rank, ctx.backend, ctx.group)
            probe.set_total(numel)
            buf = torch.zeros(numel, dtype=dtype)
            fn = ((lambda b=buf: allreduce_mean_(probe, b)) if op == "allreduce" else
                  (lambda b=buf, p=probe: allgather_flat(p, b)))
            points.append((numel * buf.element_size(), _median_s(ctx, fn, repeats)))
            del buf
        out[f"{op}_s_fixed"], out[f"{op}_s_per_byte"] = line_through(*points)
    return out
