"""Compute time of a model block: its elementwise traffic and the host's launch floor.

From presets a block takes

    seconds = max(GEMM and attention seconds on the measured curve by size
                  (zfbench.sims.op_curve) + elementwise bytes / HBM bandwidth,
                  its kernels x the host's seconds per kernel),

the elementwise bytes being the passes that do none of the counted FLOPs but move
activations through HBM (norms, activations, residual adds, dropout, the scores' mask and
softmax, layout copies). So the model's MFU rises with the hidden size (matrix FLOPs grow
as h^2 per token, elementwise bytes as h), as the ZeRO-Offload paper's Figures 8 and 9
show. This module owns the per-style census of those bytes (`OPT_FORWARD`,
`LLAMA_FORWARD` and kin, with their sources), the loss over the vocabulary on the head
block (`LOSS_FORWARD`, `LOSS_BACKWARD`), the host's kernel-launch floor (`KERNEL_CENSUS`,
`launch_floor_s`), and, for a GPU that gives a measured whole-model MFU instead of the
census (`GPU.default_mfu`: a profile's or predict's inferred GPU; no preset does),
`gemm_efficiency`, the one matrix efficiency that gives it at `mfu_reference`. Not
counted: the embedding lookup and its gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from zfbench.core import models

# The rows of the bundled published dataset that set a GPU constant: row id -> (GPU
# preset, field). `python -m zfbench.validate --published` marks them and leaves them out
# of the error. None since the census (issue 44): zo-fig8-10b, which set the V100's MFU
# until then, is an ordinary row, a check of the census on a V100.
CALIBRATION_ROWS: dict[str, tuple[str, str]] = {}

# Bytes of HBM traffic of one decoder layer per token, by op, in units of the hidden size
# (per hidden element of a token) or per attention-score element, 16-bit activations
# (judgment: a census of the ops as each style's reference code runs them, one pass per
# op; reads plus writes, dropout masks 1 byte).
# `opt` style: the GPT-2 layer of Megatron-LM v1 (NVIDIA/Megatron-LM mpu/transformer.py,
# GPT2ParallelTransformerLayer; the code DeepSpeed's Megatron GPT-2 examples and the
# ZeRO-Offload paper ran): apex's fused LayerNorm (one read, one write), linear biases
# inside addmm, q, k and v made contiguous for the batched matmuls (torch.matmul on the
# permuted views copies them), the context permuted back with .contiguous(), dropout after
# the attention output and the MLP, two residual adds, GeLU as one TorchScript kernel over
# the 4h intermediate; the scores [b, heads, s, s] written by QK^T, divided by sqrt(d),
# multiplied by the mask and shifted by it (two passes), softmax, dropout, read by AV.
OPT_FORWARD = {"layernorm x2": 2 * 4, "q, k, v contiguous copies": 3 * 4,
               "context permute copy": 4, "dropout x2": 2 * 5, "residual add x2": 2 * 6}
OPT_GELU_FORWARD = 4              # per intermediate element (read, write)
# The linear layers' biases, added apart from the matmul: PyTorch 1.x's F.linear fuses
# the bias into addmm only for 2-D inputs (`if input.dim() == 2 and bias is not None`)
# and Megatron's inputs are [b, s, h], so each output is written, read and written again
# (2 + 2 per element of the q/k/v, attention output, fc1 and fc2 outputs: 3h + h + 4h + h
# = 9h). Forward only: the add passes its gradient through (the bias gradients are in
# OPT_BACKWARD).
OPT_BIAS_ADDS = 9 * 4
OPT_SCORES_FORWARD = {"QK^T output": 2, "divide": 4, "mask multiply": 4,
                      "mask shift": 4, "softmax": 4, "dropout": 5, "AV input": 2}
# Its backward: LayerNorm's reads x and dy, writes dx (+ its weight-gradient partials),
# the copies' gradients copied back, dropout's dy and mask in and dx out, the residual
# branches' gradients added, GeLU's (recomputed from x) x and dy in and dx out, each
# linear's bias gradient a reduction that reads its output gradient once (3h + h + 4h +
# h elements); per score the dropout's, softmax's (y, dy in, dx out), the mask
# multiply's and the divide's gradients and the two batched matmuls' gradient I/O.
OPT_BACKWARD = {"layernorm x2": 2 * 7, "copies back": 4 * 4, "dropout x2": 2 * 5,
                "residual gradient adds x2": 2 * 6, "bias gradients (9h read)": 9 * 2}
OPT_GELU_BACKWARD = 6             # per intermediate element
OPT_SCORES_BACKWARD = {"dropout": 5, "softmax": 6, "mask multiply": 4, "divide": 4,
                       "matmul gradients": 6}
# `llama` style: Hugging Face's LlamaRMSNorm / Qwen2 layers: RMSNorm in fp32 op by op (to
# fp32 2+4, the mean of squares reads 4, the scaling 4+4, back to 16-bit 4+2, the weight
# 2+2: 28), rotary embeddings on q and k (rotate_half's cat, two multiplies and an add:
# 18 per element of q and of k), attention in fused SDPA (it reads q, k, v and writes its
# output: no scores in HBM), the gated MLP's SiLU (2+2) and gate times up (4+2) per
# intermediate element. Its backward: 1.3 x the forward (judgment: the opt census's
# hidden- and intermediate-sized backward over forward: `backward_per_forward`).
LLAMA_FORWARD = {"rmsnorm x2": 2 * 28, "attention output layout copy": 4,
                 "residual add x2": 2 * 6}
LLAMA_ROTARY_PER_QK = 18          # per element of q and of k
LLAMA_MLP_PER_INTERMEDIATE = 4 + 6


# The loss, bytes per vocabulary entry per token (judgment: the same one-pass census).
# `opt` (Megatron-LM v1's vocab-parallel cross-entropy on `output.float()`): the upcast
# (2 + 4), the max (4), the max subtracted (4 + 4), exp in place (4 + 4), the sum (4),
# the softmax by division in place, kept for backward (4 + 4); backward: the softmax
# times the incoming gradient in place (4 + 4), back to 16-bit (4 + 2). `llama` (Hugging
# Face's ForCausalLMLoss: `logits.float()`, then cross_entropy): the upcast (2 + 4),
# log_softmax (4 + 4); backward: the NLL's dense gradient (4), log_softmax's (reads its
# output and the gradient, writes: 4 + 4 + 4), back to 16-bit (4 + 2).
LOSS_FORWARD = {"opt": 6 + 4 + 8 + 8 + 4 + 8, "llama": 6 + 8}
LOSS_BACKWARD = {"opt": 8 + 6, "llama": 4 + 12 + 6}


# Kernels one block launches per micro-batch in an eager PyTorch training step, by what
# changes a layer's kernels: (style, grouped K/V heads, q/k/v biases) ->
# ((decoder layer forward, backward), (the rest: embedding, final norm, LM head and loss;
# forward, backward)). Measured: bench/kernel_census.py, zfbench's eager model
# (real/model.py, the reference codes' ops one by one) profiled on one H200 with torch
# 2.11 (bench/results/gpu/NVIDIA-H200/2026-11-27/kernel_census/kernel_census.json,
# per_layer at micro-batch 1: a two-layer slice's kernels less a one-layer slice's);
# llama2-7b, qwen2.5-1.5b and opt-1.3b stand for their rows. A kernel count does not
# change with the batch or the width.
KERNEL_CENSUS: dict[tuple[str, bool, bool], tuple[tuple[int, int], tuple[int, int]]] = {
    ("llama", False, False): ((41, 86), (14, 27)),  # llama2-7b
    ("llama", True, True): ((43, 92), (14, 29)),    # qwen2.5-1.5b
    ("opt", False, True): ((13, 39), (11, 17)),     # opt-1.3b
}


def census_key(shape: models.ModelShape) -> tuple[str, bool, bool]:
    """The census row of `shape`: its style, grouped K/V heads, q/k/v biases; a shape
    whose combination was not measured takes its style's first row."""
    biased = any(v.name.endswith("q_proj.bias") for v in shape.vectors())
    key = (shape.style, shape.kv_heads != shape.heads, biased)
    if key in KERNEL_CENSUS:
        return key
    return next(k for k in KERNEL_CENSUS if k[0] == shape.style)


def block_kernels(shape: models.ModelShape, block: models.Block,
                  checkpointing: bool) -> tuple[int, int]:
    """(forward, backward) kernels of `block`; the head block carries the rest of the
    model (embedding, final norm, LM head, loss); checkpointing's backward recomputes a
    decoder layer's forward."""
    layer, rest = KERNEL_CENSUS[census_key(shape)]
    if block.kind == "decoder":
        return layer[0], layer[1] + (layer[0] if checkpointing else 0)
    if block.kind == "head":
        return rest
    return 0, 0


def launch_floor_s(shape: models.ModelShape, block: models.Block, checkpointing: bool,
                   dispatch_s_per_kernel: float) -> tuple[float, float]:
    """(forward, backward) seconds the host needs to issue `block`'s kernels.

    An eager PyTorch step is bounded by its host too: each kernel is issued by Python, the
    dispatcher and autograd before the GPU can run it, so a block cannot take less than its
    kernels (`KERNEL_CENSUS`) times the host's seconds per kernel
    (`HostCPU.dispatch_s_per_kernel`). At fine-tuning's small micro-batches on a fast GPU
    this floor, not the FLOPs, sets the step."""
    forward, backward = block_kernels(shape, block, checkpointing)
    return forward * dispatch_s_per_kernel, backward * dispatch_s_per_kernel


def backward_per_forward() -> float:
    """The opt census's backward bytes over its forward bytes for the hidden-sized and
    intermediate-sized passes (GeLU counted at 4h; the bias adds, which have no backward
    pass of their own, left out), the ratio the llama style borrows."""
    forward = sum(OPT_FORWARD.values()) + 4 * OPT_GELU_FORWARD
    backward = sum(OPT_BACKWARD.values()) + 4 * OPT_GELU_BACKWARD
    return backward / forward


@dataclass(frozen=True)
class BlockTraffic:
    """Elementwise HBM bytes of one block per micro-batch: forward and backward (the
    backward's with the recomputed forward where activations are checkpointed)."""

    forward_bytes: float
    backward_bytes: float


def layer_bytes_per_token(shape: models.ModelShape, seq: int) -> tuple[float, float]:
    """(forward, backward) elementwise HBM bytes of one decoder layer per token."""
    h, inter = shape.hidden, shape.intermediate
    if shape.style == "opt":
        scores = shape.heads * seq  # score elements per token
        forward = ((sum(OPT_FORWARD.values()) + OPT_BIAS_ADDS) * h
                   + OPT_GELU_FORWARD * inter + sum(OPT_SCORES_FORWARD.values()) * scores)
        backward = (sum(OPT_BACKWARD.values()) * h + OPT_GELU_BACKWARD * inter
                    + sum(OPT_SCORES_BACKWARD.values()) * scores)
        return forward, backward
    attention_io = 2 * (h + 2 * shape.kv_dim) + 2 * h  # SDPA reads q, k, v; writes out
    forward = (sum(LLAMA_FORWARD.values()) * h + LLAMA_ROTARY_PER_QK * (h + shape.kv_dim)
               + attention_io + LLAMA_MLP_PER_INTERMEDIATE * inter)
    return forward, backward_per_forward() * forward


def block_traffic(shape: models.ModelShape, block: models.Block, seq: int,
                  micro_batch: int, checkpointing: bool) -> BlockTraffic:
    """The elementwise bytes of `block` for one micro-batch: a decoder layer's, the
    head's loss over the vocabulary (not recomputed: checkpointing covers the layers),
    none for the embedding."""
    tokens = seq * micro_batch
    if block.kind == "head":
        return BlockTraffic(LOSS_FORWARD[shape.style] * shape.vocab * tokens,
                            LOSS_BACKWARD[shape.style] * shape.vocab * tokens)
    if block.kind != "decoder":
        return BlockTraffic(0.0, 0.0)
    forward, backward = layer_bytes_per_token(shape, seq)
    return BlockTraffic(forward * tokens,
                        (backward + (forward if checkpointing else 0.0)) * tokens)


def model_times(shape: models.ModelShape, seq: int, micro_batch: int, checkpointing: bool,
                peak_flops_per_s: float, hbm_bytes_per_s: float
                ) -> tuple[float, float]:
    """(matrix seconds at gemm efficiency 1, elementwise seconds) of one micro-batch's
    forward and backward over the whole model."""
    bwd_factor = 3.0 if checkpointing else 2.0
    flops = sum(b.forward_flops(seq, micro_batch) for b in shape.blocks()) * (1 + bwd_factor)
    traffic = [block_traffic(shape, b, seq, micro_batch, checkpointing)
               for b in shape.blocks()]
    moved = sum(t.forward_bytes + t.backward_bytes for t in traffic)
    return flops / peak_flops_per_s, moved / hbm_bytes_per_s


def gemm_efficiency(mfu: float, reference: tuple[models.ModelShape, int, int, bool],
                    peak_flops_per_s: float, hbm_bytes_per_s: float) -> float:
    """The matrix multiplies' share of peak that gives the whole model `mfu` at the
    reference (shape, seq, micro-batch, checkpointing): mfu = G / (G / e + M) with G the
    matrix seconds at peak and M the elementwise seconds, so 1/e = 1/mfu - M/G.

    The reference is `GPU.mfu_reference`, the shape the GPU's `default_mfu` was measured or
    judged at (empty: the simulator's default scenario): at that shape nothing changes,
    elsewhere the shape decides."""
    shape, seq, micro_batch, checkpointing = reference
    gemm_s, memory_s = model_times(shape, seq, micro_batch, checkpointing,
                                   peak_flops_per_s, hbm_bytes_per_s)
    inverse = 1.0 / mfu - memory_s / gemm_s
    if inverse <= 1.0:
        raise ValueError(f"an MFU of {mfu} at {shape.name} leaves the matrix multiplies "
                         f"above the tensor cores' peak once its elementwise traffic "
                         f"({memory_s / gemm_s:.2f} of the matrix time at peak) is "
                         f"counted; lower default_mfu or give --mfu")
    return 1.0 / inverse


def parse_reference(text: str) -> tuple[str, int, int]:
    """`MODEL@MICRO_BATCHxSEQ` (a GPU's `mfu_reference`) -> (model, micro_batch, seq)."""
    try:
        model, sizes = text.rsplit("@", 1)
        micro_batch, seq = (int(x) for x in sizes.lower().split("x"))
    except ValueError:
        raise ValueError(f"mfu_reference {text!r} is not MODEL@MICRO_BATCHxSEQ "
                         f"(e.g. llama2-7b@1x1024)") from None
    if micro_batch < 1 or seq < 1 or not model:
        raise ValueError(f"mfu_reference {text!r}: model, micro-batch and seq must be given")
    return model, micro_batch, seq
