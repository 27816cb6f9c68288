"""Seconds of a model's GEMMs and attention by their size, per GPU: the census's curve.

The curve is the project's own sweep on one H200 (bench/results/gpu/NVIDIA-H200/2026-11-27/
op_efficiency: every GEMM of qwen2.5-1.5b's and llama2-7b's layers and heads, forward and
both gradients, and causal SDPA, at 512-8192 tokens, each op repeated back to back), kept
as knots in zfbench/data/op_curve.json (`knots_from_rows` rebuilds them from the sweep's
rows; tests/test_op_curve.py checks they agree). A knot is a size the sweep measured, x =
the op's FLOPs over the datasheet peak (its seconds at peak), and the median of its rows'
seconds, made non-decreasing in x. Between knots log-seconds is linear in log-x; below the
smallest size an op takes the smallest size's seconds (the sweep's small GEMMs cost ~16-20
us whatever their size: what issuing them costs); above the largest it keeps the largest's
efficiency. Another GPU runs the curve at its own x, its seconds times the reference GPU's
achievable matmul share over its own (`GPU.matmul_achievable_share`, each sourced; a
judgment: a GEMM's share of its GPU's best depends on its seconds at peak alone).

`block_matrix_s` times a block's GEMMs (a matrix's forward and its two gradients at the
micro-batch's tokens; a tied head's vocabulary projection too) and its attention: fused
causal SDPA for the `llama` style, the explicit batched matmuls of Megatron-LM v1 for `opt`
(GEMMs on the curve, a judgment). Elementwise passes and the host's launch floor are
zfbench.sims.compute_efficiency's.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from zfbench.core import hardware, models

KINDS = ("gemm", "attention_forward", "attention_forward_backward")
# The sweep counts causal attention's FLOPs over half the score matrix and its backward at
# 2.5x the forward (bench/op_efficiency.py, FlashAttention-2's convention); the simulator's
# blocks count the full matrix (zfbench.core.models.Block.forward_flops).
CAUSAL_SHARE = 0.5
FORWARD_BACKWARD_OVER_FORWARD = 1.0 + 2.5
DATA_PATH = "data/op_curve.json"


@dataclass(frozen=True)
class Curve:
    """Knots (x = seconds at peak, seconds) per op kind, measured on `gpu` (a preset)."""

    gpu: str
    knots: dict[str, tuple[tuple[float, float], ...]]

    def seconds(self, kind: str, x: float) -> float:
        """Seconds of an op of kind `kind` whose FLOPs take `x` seconds at peak, on the
        reference GPU (module docstring)."""
        if x <= 0:
            return 0.0
        pts = self.knots[kind]
        if x <= pts[0][0]:
            return pts[0][1]
        if x >= pts[-1][0]:
            return x * pts[-1][1] / pts[-1][0]
        for (x0, t0), (x1, t1) in zip(pts, pts[1:]):
            if x <= x1:
                w = math.log(x / x0) / math.log(x1 / x0)
                return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
        raise AssertionError("unreachable: x lies inside the knots")


def knots_from_rows(rows: list[dict], peak_flops_per_s: float
                    ) -> dict[str, tuple[tuple[float, float], ...]]:
    """The curve's knots from the sweep's rows (op_efficiency.csv's columns kind, op,
    flops, seconds): per kind and size the median seconds, non-decreasing in size."""
    groups: dict[str, dict[float, list[float]]] = {k: {} for k in KINDS}
    for row in rows:
        kind = row["kind"]
        if kind == "attention":
            kind = "attention_forward_backward" if row["op"].endswith(
                "forward_backward") else "attention_forward"
        if kind not in groups:
            continue  # elementwise rows: the census counts their bytes instead
        x = float(row["flops"]) / peak_flops_per_s
        groups[kind].setdefault(x, []).append(float(row["seconds"]))
    out = {}
    for kind, by_x in groups.items():
        if not by_x:
            raise ValueError(f"the sweep has no {kind} rows")
        knots, slowest = [], 0.0
        for x in sorted(by_x):
            slowest = max(slowest, statistics.median(by_x[x]))
            knots.append((x, slowest))
        out[kind] = tuple(knots)
    return out


@lru_cache(maxsize=1)
def curve() -> Curve:
    """The bundled curve (zfbench/data/op_curve.json)."""
    raw = json.loads(resources.files("zfbench").joinpath(DATA_PATH).read_text("utf-8"))
    return Curve(raw["gpu"], {k: tuple((float(x), float(t)) for x, t in raw[k])
                              for k in KINDS})


def share_scale(gpu: hardware.GPU) -> float:
    """The reference GPU's achievable matmul share over `gpu`'s: how much longer `gpu`
    takes than the reference at the same seconds at peak (1 where `gpu` gives none)."""
    reference = hardware.get_gpu(curve().gpu).matmul_achievable_share
    own = gpu.matmul_achievable_share
    return 1.0 if own is None else reference / own


def op_s(kind: str, flops: float, peak_flops_per_s: float, scale: float) -> float:
    """Seconds of one op of `flops` on a GPU of that peak and `share_scale`."""
    return curve().seconds(kind, flops / peak_flops_per_s) * scale


def gemm_flops(block: models.Block, tokens: int) -> list[float]:
    """FLOPs of each of `block`'s weight GEMMs (forward) at `tokens`: one a matrix that
    multiplies activations, and the rest of its counted FLOPs (a head's vocabulary
    projection with tied embeddings) as one more."""
    sizes = [2.0 * m.numel * tokens for m in block.matrices
             if m.kind not in ("embedding", "position")]
    rest = block.forward_flops_per_token * tokens - sum(sizes)
    return sizes + ([rest] if rest > 1e-9 * max(1.0, sum(sizes)) else [])


def attention_s(shape: models.ModelShape, block: models.Block, seq: int, micro_batch: int,
                peak_flops_per_s: float, scale: float) -> tuple[float, float]:
    """(forward, backward) seconds of a decoder block's attention (module docstring)."""
    full = block.attention_flops_per_token_per_seq * seq * seq * micro_batch
    if full <= 0:
        return 0.0, 0.0
    if shape.style == "opt":  # QK^T and AV as batched matmuls, twice each in backward
        one = op_s("gemm", full / 2, peak_flops_per_s, scale)
        return 2 * one, 4 * one
    forward_flops = full * CAUSAL_SHARE
    forward = op_s("attention_forward", forward_flops, peak_flops_per_s, scale)
    both = op_s("attention_forward_backward", forward_flops * FORWARD_BACKWARD_OVER_FORWARD,
                peak_flops_per_s, scale)
    return forward, max(both - forward, 0.0)


def block_matrix_s(shape: models.ModelShape, block: models.Block, seq: int,
                   micro_batch: int, checkpointing: bool, peak_flops_per_s: float,
                   scale: float) -> tuple[float, float]:
    """(forward, backward) seconds of `block`'s GEMMs and attention for one micro-batch;
    checkpointing's backward recomputes a decoder layer's forward."""
    tokens = seq * micro_batch
    gemms = [op_s("gemm", f, peak_flops_per_s, scale) for f in gemm_flops(block, tokens)]
    attn_fwd, attn_bwd = attention_s(shape, block, seq, micro_batch, peak_flops_per_s, scale)
    forward = sum(gemms) + attn_fwd
    backward = 2 * sum(gemms) + attn_bwd
    if checkpointing and block.kind == "decoder":
        backward += forward
    return forward, backward
