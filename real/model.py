"""A decoder-only transformer in plain torch, built from a :class:`zfbench.core.models.ModelShape`.

This module owns the trainable network the real engine runs: :func:`build_model`
turns a named shape into a :class:`DecoderLM` whose parameter names and shapes are
exactly the shape's ``matrices()`` (``<name>.weight``) and ``vectors()``, so the
engine, the selection code and the simulator all speak of the same tensors
(``embed.{embed_tokens,embed_positions,project_in}``, ``layers.<i>.{q_proj,...,<norms>}``,
``head.{norm|final_layer_norm,project_out,lm_head}``). Two styles, as in
:mod:`zfbench.core.models`:

* ``"llama"`` (Llama 2, Qwen 2.5): RMSNorm, rotary positions (``rotate_half``
  convention), SwiGLU MLP (``gate_proj``/``up_proj``/``down_proj``), grouped K/V
  heads, optional q/k/v biases, lm_head tied to ``embed_tokens`` or not.
* ``"opt"``: LayerNorm with bias, learned positions offset by 2, ReLU MLP
  (``fc1``/``fc2``), biases on every decoder linear, optional ``project_in`` /
  ``project_out`` when the word-embedding width differs from ``hidden``. A shape
  without a final norm (opt-350m, ``do_layer_norm_before=False`` upstream) is run
  post-layernorm; one with it pre-layernorm.

Initialisation is seeded and device-independent (drawn on CPU with a
``torch.Generator``): every matrix ~ N(0, 0.02), norm weights 1, biases 0.
``device="meta"`` builds the module without allocating or initialising anything.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from zfbench.core.models import ModelShape
from zfbench.real.zero3 import register_external_parameter

__all__ = ["DecoderLM", "build_model", "norm_eps", "rope_theta", "apply_rotary", "rotary_cos_sin", "INIT_STD",
           "count_parameters"]

INIT_STD = 0.02
_SLICE = re.compile(r"(?:\[[^\[\]]*\])+$")  # slice suffixes: [2L], [w0.125], [1L][w0.125]

# Upstream config.json values, by base-name prefix (first match wins).
# meta-llama/Llama-2-*-hf: rms_norm_eps 1e-5, rope_theta 10000.
# Qwen/Qwen2.5-*: rms_norm_eps 1e-6, rope_theta 1e6.
_NORM_EPS = (("llama", 1e-5), ("qwen", 1e-6), ("opt", 1e-5))
_ROPE_THETA = (("llama", 10_000.0), ("qwen", 1_000_000.0))
_DEFAULT_RMS_EPS = 1e-6
_DEFAULT_LN_EPS = 1e-5  # torch / OPT LayerNorm default
_DEFAULT_THETA = 10_000.0
OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding: position t lives at row t + 2


def _base_name(shape: ModelShape) -> str:
    return _SLICE.sub("", shape.name).lower()


def norm_eps(shape: ModelShape) -> float:
    """Norm epsilon for ``shape``: from the upstream config table, else the norm's default."""
    base = _base_name(shape)
    for prefix, eps in _NORM_EPS:
        if base.startswith(prefix):
            return eps
    return _DEFAULT_RMS_EPS if shape.norm == "rmsnorm" else _DEFAULT_LN_EPS


def rope_theta(shape: ModelShape) -> float:
    """Rotary base for ``shape`` (llama2 10000, qwen2.5 1e6, otherwise 10000)."""
    base = _base_name(shape)
    for prefix, theta in _ROPE_THETA:
        if base.startswith(prefix):
            return theta
    return _DEFAULT_THETA


# ----------------------------------------------------------------------------- pieces
class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 and cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def _norm(shape: ModelShape, eps: float) -> nn.Module:
    if shape.norm == "rmsnorm":
        return RMSNorm(shape.hidden, eps)
    return nn.LayerNorm(shape.hidden, eps=eps)


def rotary_cos_sin(seq: int, head_dim: int, theta: float, device=None, dtype=torch.float32):
    """``cos, sin`` of shape ``[seq, head_dim]`` for positions ``0..seq-1`` (halves repeated)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x[..., T, head_dim]`` by position: pairs ``(i, i + head_dim/2)`` turn together."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    """One transformer block; its children are the shape's per-layer names (flat)."""

    def __init__(self, shape: ModelShape, eps: float):
        super().__init__()
        h, kv, inter = shape.hidden, shape.kv_dim, shape.intermediate
        self.opt = shape.style == "opt"
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.kv_heads, shape.head_dim
        self.pre_norm = not self.opt or shape.final_norm
        qkv_b = shape.linear_bias or shape.qkv_bias
        other_b = shape.linear_bias
        self.q_proj = nn.Linear(h, h, bias=qkv_b)
        self.k_proj = nn.Linear(h, kv, bias=qkv_b)
        self.v_proj = nn.Linear(h, kv, bias=qkv_b)
        if self.opt:
            self.out_proj = nn.Linear(h, h, bias=other_b)
            self.fc1 = nn.Linear(h, inter, bias=other_b)
            self.fc2 = nn.Linear(inter, h, bias=other_b)
            self.self_attn_layer_norm = _norm(shape, eps)
            self.final_layer_norm = _norm(shape, eps)
        else:
            self.o_proj = nn.Linear(h, h, bias=other_b)
            self.gate_proj = nn.Linear(h, inter, bias=other_b)
            self.up_proj = nn.Linear(h, inter, bias=other_b)
            self.down_proj = nn.Linear(inter, h, bias=other_b)
            self.input_layernorm = _norm(shape, eps)
            self.post_attention_layernorm = _norm(shape, eps)

    def attention(self, x: torch.Tensor, rope) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        if rope is not None:
            q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if self.kv_heads != self.heads:
            # Query head j reads K/V head j // group (consecutive heads share one K/V head).
            group = self.heads // self.kv_heads
            k = k[:, :, None].expand(b, self.kv_heads, group, t, self.head_dim).reshape(b, self.heads, t, self.head_dim)
            v = v[:, :, None].expand(b, self.kv_heads, group, t, self.head_dim).reshape(b, self.heads, t, self.head_dim)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.out_proj(y) if self.opt else self.o_proj(y)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.opt:
            return self.fc2(F.relu(self.fc1(x)))
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def forward(self, x: torch.Tensor, rope=None) -> torch.Tensor:
        if self.opt:
            n1, n2 = self.self_attn_layer_norm, self.final_layer_norm
        else:
            n1, n2 = self.input_layernorm, self.post_attention_layernorm
        if self.pre_norm:
            x = x + self.attention(n1(x), rope)
            return x + self.mlp(n2(x))
        x = n1(x + self.attention(x, rope))  # OPT post-layernorm (do_layer_norm_before=False)
        return n2(x + self.mlp(x))


class Embed(nn.Module):
    """Token lookup, then (OPT) ``project_in`` and learned positions."""

    def __init__(self, shape: ModelShape):
        super().__init__()
        d = shape.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(shape.vocab, d)
        if shape.max_positions:
            self.embed_positions = nn.Embedding(shape.max_positions, shape.hidden)
        if d != shape.hidden:
            self.project_in = nn.Linear(d, shape.hidden, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        if hasattr(self, "project_in"):
            x = self.project_in(x)
        if hasattr(self, "embed_positions"):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device) + OPT_POSITION_OFFSET
            x = x + self.embed_positions(pos)
        return x


class Head(nn.Module):
    """Final norm, (OPT) ``project_out``; ``lm_head`` only when not tied to the embedding."""

    def __init__(self, shape: ModelShape, eps: float):
        super().__init__()
        d = shape.word_embed_proj_dim
        if shape.final_norm:
            setattr(self, "final_layer_norm" if shape.style == "opt" else "norm", _norm(shape, eps))
        if d != shape.hidden:
            self.project_out = nn.Linear(shape.hidden, d, bias=False)
        if not shape.tied_embeddings:
            self.lm_head = nn.Linear(d, shape.vocab, bias=False)

    def forward(self, x: torch.Tensor, tied_weight: torch.Tensor | None) -> torch.Tensor:
        for name in ("norm", "final_layer_norm", "project_out"):
            mod = getattr(self, name, None)
            if mod is not None:
                x = mod(x)
        return F.linear(x, tied_weight) if tied_weight is not None else self.lm_head(x)


# ----------------------------------------------------------------------------- model
class DecoderLM(nn.Module):
    """Decoder-only language model; ``forward(input_ids, labels=None)``.

    With ``labels`` (targets already aligned with input positions, ``-100`` ignored)
    it returns the mean cross-entropy over non-ignored positions; otherwise the
    logits ``[B, T, vocab]``.
    """

    def __init__(self, shape: ModelShape):
        super().__init__()
        self.shape = shape
        self.eps = norm_eps(shape)
        self.rope_theta = rope_theta(shape) if shape.style == "llama" else None
        self.embed = Embed(shape)
        self.layers = nn.ModuleList(DecoderLayer(shape, self.eps) for _ in range(shape.layers))
        self.head = Head(shape, self.eps)
        if shape.tied_embeddings:  # the head reads the embedding's weight (ZeRO-3 gathers it)
            register_external_parameter(self.head, self.embed.embed_tokens, "weight")
        self._rope_cache: dict = {}

    @property
    def max_seq(self) -> int | None:
        """Longest sequence the model accepts (learned positions), ``None`` for rotary."""
        return self.shape.max_positions - OPT_POSITION_OFFSET if self.shape.max_positions else None

    def _rope(self, t: int, device, dtype):
        if self.rope_theta is None:
            return None
        key = (t, str(device), dtype)
        if key not in self._rope_cache:
            cos, sin = rotary_cos_sin(t, self.shape.head_dim, self.rope_theta, device=device, dtype=dtype)
            self._rope_cache = {key: (cos, sin)}  # keep only the latest length
        return self._rope_cache[key]

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, seq], got shape {tuple(input_ids.shape)}")
        t = input_ids.shape[1]
        if self.max_seq is not None and t > self.max_seq:
            raise ValueError(f"{self.shape.name}: sequence length {t} exceeds the {self.max_seq} learned positions")
        x = self.embed(input_ids)
        rope = self._rope(t, x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, rope)
        tied = self.embed.embed_tokens.weight if self.shape.tied_embeddings else None
        logits = self.head(x, tied)
        if labels is None:
            return logits
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels shape {tuple(labels.shape)} != input_ids shape {tuple(input_ids.shape)}")
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        """Seeded init: matrices N(0, 0.02), 1-D ``*.weight`` (norms) 1, biases 0.

        Values are drawn on CPU in float32 in ``named_parameters`` order, so a seed
        gives the same model on every device and dtype (up to the dtype's rounding).
        """
        gen = torch.Generator(device="cpu").manual_seed(int(seed))
        for name, p in self.named_parameters():
            if p.device.type == "meta":
                continue
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32).mul_(INIT_STD))
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.fill_(1.0)


def build_model(shape: ModelShape, dtype: torch.dtype = torch.float32, device="cpu", seed: int = 0) -> DecoderLM:
    """Build and seed-initialise a :class:`DecoderLM` for ``shape`` on ``device`` in ``dtype``.

    The module is constructed on the meta device and materialised once with
    ``to_empty``, so no time is spent on torch's default init; ``device="meta"``
    returns the unmaterialised module (shapes only) for the largest models.
    """
    if not isinstance(shape, ModelShape):
        raise TypeError(f"build_model needs a ModelShape, got {type(shape).__name__}")
    if shape.style == "llama" and shape.head_dim % 2:
        raise ValueError(f"{shape.name}: rotary embedding needs an even head_dim, got {shape.head_dim}")
    with torch.device("meta"):
        model = DecoderLM(shape)
    model = model.to(dtype=dtype)
    if torch.device(device).type != "meta":
        model = model.to_empty(device=device)
        model.reset_parameters(seed)
    return model


def count_parameters(model: nn.Module) -> int:
    """Number of distinct parameter elements (a tied weight counts once)."""
    return sum(p.numel() for p in model.parameters())

