"""Bytes: the size of one element per precision, and the host bytes per parameter of each
strategy.

This module owns the numbers that the engine's memory estimate (real/memory.py) and the
simulator's memory fit check (sims/costs.py) must agree on:

- `ELEMENT_BYTES` / `element_bytes(precision)`: bytes of one device weight or gradient
  element (and of one element on the link) per config precision (a test holds them to the
  engine's dtypes, `zfbench.real.flat.DTYPES`).
- `host_bytes_per_param(strategy, elem_bytes, bucketed)`: what an offloading strategy
  keeps in host memory per parameter, as the engine allocates it (real/strategies.py
  `HostState` and `wire`): fp32 master, m and v; fp32 gradient buffers, one for
  ZeRO-Offload (with or without DPU), three for ZenFlow (a staging buffer and two
  alternating windows, real/zenflow.py); with 16-bit weights two pinned wires in that
  dtype; for DPU with gradients bucketed during backward, a second landing buffer.
- `engine_device_bytes(...)`: the device buffers zfbench's engine allocates per strategy
  (used for a measured profile; the GPU-node presets follow DeepSpeed's layouts,
  sims/device_memory.py).
- `activation_bytes(...)`: the activations a micro-batch keeps for backward, one formula
  for the engine (no recomputation, fp32 logits) and the simulator's GPU node (full
  recomputation, as DeepSpeed's examples run).
"""
from __future__ import annotations

from zfbench.core.strategies import STRATEGY, STRATEGY_LIST, delayed

# Bytes of one element per precision (the simulator's order of precisions).
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
PRECISIONS = tuple(ELEMENT_BYTES)
FP32_BYTES = ELEMENT_BYTES["fp32"]

# Host optimizer state per parameter: fp32 master weights, Adam's m and v.
HOST_OPTIMIZER_STATE_BYTES = 3 * FP32_BYTES
# fp32 gradient buffers per parameter in host memory, per strategy (device: none).
HOST_GRAD_BUFFERS = {s.name: s.host_grad_buffers for s in STRATEGY_LIST
                     if s.host_grad_buffers is not None}


def element_bytes(precision: str) -> int:
    """Bytes of one device weight / gradient element in `precision`."""
    try:
        return ELEMENT_BYTES[precision]
    except KeyError:
        raise ValueError(f"precision {precision!r} is not known; choose one of: "
                         f"{', '.join(PRECISIONS)}") from None


def host_bytes_per_param(strategy: str, elem_bytes: int = FP32_BYTES,
                         bucketed: bool = False) -> int:
    """Host bytes per parameter the engine allocates for `strategy` (0 for device): the
    optimizer state, the strategy's fp32 gradient buffers, with `elem_bytes`-wide
    (16-bit) weights the d2h and h2d wires, and a second landing buffer for dpu's
    gradient buckets (`bucketed`: `gradient_buckets_apply` holds)."""
    try:
        buffers = HOST_GRAD_BUFFERS[strategy]
    except KeyError:
        raise ValueError(f"strategy {strategy!r} has no host memory model; known: "
                         f"{', '.join(HOST_GRAD_BUFFERS)}") from None
    if buffers == 0:
        return 0
    wires = 2 * elem_bytes if elem_bytes != FP32_BYTES else 0
    second_landing = elem_bytes if bucketed and delayed(strategy) else 0
    return HOST_OPTIMIZER_STATE_BYTES + buffers * FP32_BYTES + wires + second_landing


# Activation bytes per layer per token without recomputation, 16-bit: s*b*h*(34 + 5*a*s/h)
# (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
# Models", eq. 1); with full recomputation 2*s*b*h per layer is kept (the layer input).
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34.0
# The loss on fp32 logits keeps the logits, their softmax and their gradient: 3 x 4 bytes
# per vocabulary entry per token (torch's cross-entropy over an fp32 upcast; judgement
# from the ops the engine's models run, zfbench.real.model).
LOGITS_BYTES_PER_TOKEN_VOCAB = 3 * FP32_BYTES


def activation_bytes(shape, micro_batch: int, seq: int, elem_bytes: int = 2,
                     checkpointing: bool = False, logits: bool = False) -> float:
    """Bytes of activations one micro-batch of `micro_batch` x `seq` tokens keeps for
    backward on a model `shape` (zfbench.core.models.ModelShape), in `elem_bytes`
    elements: every layer's whole set (Korthikanti et al.'s count, scaled from 16-bit),
    or with `checkpointing` each layer's input plus one layer's whole set (recomputed
    in backward); `logits`: plus the fp32 logits, softmax and gradient."""
    h, tokens = shape.hidden, micro_batch * seq
    scale = elem_bytes / 2  # the count is for 16-bit activations
    whole = tokens * h * (ACTIVATION_BYTES_PER_TOKEN_HIDDEN + 5 * shape.heads * seq / h)
    if checkpointing:
        kept = shape.layers * 2 * tokens * h + whole
    else:
        kept = shape.layers * whole
    extra = tokens * shape.vocab * LOGITS_BYTES_PER_TOKEN_VOCAB if logits else 0.0
    return kept * scale + extra


def engine_device_bytes(strategy: str, params: float, elem_bytes: int, selected: float,
                        activations: float, moments_offloaded: bool = False,
                        bucket_elems: float = 500_000_000) -> float:
    """Bytes zfbench's engine holds on its device for `strategy`: the flat parameters and
    gradients in the device's dtype and the `activations`, plus the device strategy's
    fp32 m, v and scratch (and, with 16-bit weights, an fp32 master and gradient copy);
    DPU's upload buffer; ZenFlow's upload buffer and, per `selected` element (the top-k
    columns of every matrix plus every vector), fp32 values, gradient, scratch, m and v
    and a staging copy in the device's dtype (real/strategies.py, real/zenflow.py); with
    `moments_offloaded` (zenflow.offload) m and v live on the host and the device holds one
    bucket's (`bucket_elems` parameters' share of them, real/zenflow_offload.py)."""
    device = 2 * params * elem_bytes + activations
    rule = STRATEGY[strategy].memory if strategy in STRATEGY else None
    if rule == "device-adam":
        device += 3 * FP32_BYTES * params + (2 * FP32_BYTES * params
                                              if elem_bytes != FP32_BYTES else 0)
    elif rule == "host-adam-upload-buffer":
        device += params * elem_bytes
    elif rule == "host-adam-selected":
        device += params * elem_bytes + (5 * FP32_BYTES + elem_bytes) * selected
        if moments_offloaded:
            bucket = min(1.0, bucket_elems / params) if params else 1.0
            device -= 2 * FP32_BYTES * selected * (1.0 - bucket)
    elif rule != "host-adam":
        raise ValueError(f"unknown strategy {strategy!r}")
    return device
