"""Named model shapes, built from their architecture.

This module owns the vocabulary of *what is being trained*: for each named model
(``tiny``, ``opt-350m``, ``opt-1.3b``, ``qwen2.5-0.5b``, ``qwen2.5-1.5b``,
``qwen2.5-3b``, ``tinyllama-1.1b``, ``llama2-7b``, ``llama2-13b``) it lists every weight matrix and every 1-D
parameter, grouped into forward-order blocks (``embed``, ``layers.0`` ...
``layers.N-1``, ``head``), and the matmul FLOPs each block costs per token.
Parameter counts are derived from the shape hyper-parameters (never typed in),
and the tests check them against the published totals.

Conventions
-----------
* Matrices use the torch ``nn.Linear`` layout ``[out_features, in_features]``;
  a *column* is one input feature (this is the unit ZenFlow selects).
  Embedding tables use the ``nn.Embedding`` layout ``[num_embeddings, dim]``,
  so their rows are tokens/positions and their columns are embedding features.
* Matrix names are module names (``q_proj``); vector names carry the parameter
  suffix (``q_proj.bias``, ``input_layernorm.weight``).  ``ModelShape.matrices``
  and ``ModelShape.vectors`` prefix them with the block name
  (``layers.3.q_proj``).
* FLOPs count matmuls only, at 2 FLOPs per multiply-add (``2*m*n*k``); bias
  adds, norms, activations, softmax and embedding lookups are not counted.
  The backward pass is taken as 2x the forward (gradient w.r.t. inputs plus
  gradient w.r.t. weights), the usual "6N" training convention.

Pure python: no torch import, so analysis and simulation code can use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

__all__ = [
    "UnknownModelError",
    "Matrix",
    "Vector",
    "Block",
    "ModelShape",
    "MODELS",
    "get_model",
    "model_names",
]

MATRIX_KINDS = (
    "q", "k", "v", "o", "gate", "up", "down", "fc1", "fc2",
    "embedding", "position", "proj", "lm_head", "other",
)
BLOCK_KINDS = ("embedding", "decoder", "head")


class UnknownModelError(ValueError):
    """Raised by :func:`get_model` for a name not in :data:`MODELS`."""


@dataclass(frozen=True)
class Matrix:
    """A 2-D weight, ``[rows, cols] = [out_features, in_features]``."""

    name: str
    rows: int
    cols: int
    kind: str = "other"

    def __post_init__(self) -> None:
        if self.rows <= 0 or self.cols <= 0:
            raise ValueError(f"matrix {self.name!r} must have positive shape, got {self.rows}x{self.cols}")
        if self.kind not in MATRIX_KINDS:
            raise ValueError(f"matrix {self.name!r}: unknown kind {self.kind!r}")

    @property
    def numel(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Vector:
    """A 1-D parameter (a bias or a norm weight/bias)."""

    name: str
    numel: int

    def __post_init__(self) -> None:
        if self.numel <= 0:
            raise ValueError(f"vector {self.name!r} must have positive size, got {self.numel}")


@dataclass(frozen=True)
class Block:
    """One unit of the forward pass, in forward order."""

    name: str
    kind: str
    matrices: tuple[Matrix, ...]
    vectors: tuple[Vector, ...]
    forward_flops_per_token: float
    attention_flops_per_token_per_seq: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in BLOCK_KINDS:
            raise ValueError(f"block {self.name!r}: kind must be one of {BLOCK_KINDS}, got {self.kind!r}")

    @property
    def numel(self) -> int:
        return sum(m.numel for m in self.matrices) + sum(v.numel for v in self.vectors)

    def forward_flops(self, tokens_per_seq: int, seqs: int = 1) -> float:
        """Forward FLOPs of this block for ``seqs`` sequences of ``tokens_per_seq``.

        Attention (QK^T and AV) is charged for the full ``seq x seq`` score
        matrix even though the mask is causal: this is the convention of the
        PaLM / Megatron MFU formulas, so utilisation figures compare directly.
        """
        if tokens_per_seq <= 0 or seqs <= 0:
            raise ValueError(f"tokens_per_seq and seqs must be positive, got {tokens_per_seq}, {seqs}")
        per_token = self.forward_flops_per_token + self.attention_flops_per_token_per_seq * tokens_per_seq
        return float(seqs * tokens_per_seq * per_token)


def _matmul_flops(matrices) -> float:
    return float(sum(2 * m.numel for m in matrices))


@dataclass(frozen=True)
class ModelShape:
    """Architecture hyper-parameters of a decoder-only transformer.

    ``style`` is ``"llama"`` (rotary positions, gated SiLU MLP, RMSNorm; also
    Qwen2) or ``"opt"`` (learned positions, fc1/fc2 MLP, LayerNorm, biases).
    ``word_embed_proj_dim`` of 0 means "equal to hidden"; when it differs
    (opt-350m) the model has ``project_in`` / ``project_out`` matrices.
    """

    name: str
    style: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied_embeddings: bool = False
    qkv_bias: bool = False
    linear_bias: bool = False
    norm: str = "rmsnorm"
    max_positions: int = 0
    word_embed_proj_dim: int = 0
    final_norm: bool = True
    _blocks: tuple = field(default=(), init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.style not in ("llama", "opt"):
            raise ValueError(f"model {self.name!r}: style must be 'llama' or 'opt', got {self.style!r}")
        if self.norm not in ("rmsnorm", "layernorm"):
            raise ValueError(f"model {self.name!r}: norm must be 'rmsnorm' or 'layernorm', got {self.norm!r}")
        for attr in ("vocab", "hidden", "layers", "heads", "kv_heads", "intermediate"):
            if getattr(self, attr) <= 0:
                raise ValueError(f"model {self.name!r}: {attr} must be positive")
        if self.hidden % self.heads:
            raise ValueError(f"model {self.name!r}: hidden {self.hidden} not divisible by heads {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"model {self.name!r}: heads {self.heads} not divisible by kv_heads {self.kv_heads}")
        if self.word_embed_proj_dim == 0:
            object.__setattr__(self, "word_embed_proj_dim", self.hidden)
        if self.style == "opt" and self.max_positions <= 0:
            raise ValueError(f"model {self.name!r}: opt style needs max_positions (learned positions)")
        if self.style == "llama" and self.max_positions:
            raise ValueError(f"model {self.name!r}: rotary (llama-style) models have max_positions 0")
        object.__setattr__(self, "_blocks", tuple(self._build_blocks()))

    # ------------------------------------------------------------------ shape
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def _norm_vectors(self, name: str) -> list[Vector]:
        vecs = [Vector(f"{name}.weight", self.hidden)]
        if self.norm == "layernorm":
            vecs.append(Vector(f"{name}.bias", self.hidden))
        return vecs

    def _embed_block(self) -> Block:
        d = self.word_embed_proj_dim
        mats = [Matrix("embed_tokens", self.vocab, d, "embedding")]
        if self.max_positions:
            # OPT's learned positions have dim = hidden (added after project_in).
            mats.append(Matrix("embed_positions", self.max_positions, self.hidden, "position"))
        if d != self.hidden:
            mats.append(Matrix("project_in", self.hidden, d, "proj"))
        # Lookups cost no matmul FLOPs; only project_in is a real matmul.
        flops = _matmul_flops(m for m in mats if m.kind == "proj")
        return Block("embed", "embedding", tuple(mats), (), flops, 0.0)

    def _decoder_block(self, i: int) -> Block:
        h, kv = self.hidden, self.kv_dim
        opt = self.style == "opt"
        mats = [
            Matrix("q_proj", h, h, "q"),
            Matrix("k_proj", kv, h, "k"),
            Matrix("v_proj", kv, h, "v"),
            Matrix("out_proj" if opt else "o_proj", h, h, "o"),
        ]
        if opt:
            mats += [Matrix("fc1", self.intermediate, h, "fc1"), Matrix("fc2", h, self.intermediate, "fc2")]
        else:
            mats += [
                Matrix("gate_proj", self.intermediate, h, "gate"),
                Matrix("up_proj", self.intermediate, h, "up"),
                Matrix("down_proj", h, self.intermediate, "down"),
            ]
        vecs: list[Vector] = []
        if self.linear_bias:
            vecs += [Vector(f"{m.name}.bias", m.rows) for m in mats]
        elif self.qkv_bias:
            vecs += [Vector(f"{m.name}.bias", m.rows) for m in mats if m.kind in ("q", "k", "v")]
        norms = ("self_attn_layer_norm", "final_layer_norm") if opt else ("input_layernorm", "post_attention_layernorm")
        for n in norms:
            vecs += self._norm_vectors(n)
        # Per token and per key position: QK^T is 2*head_dim FLOPs per head, AV the
        # same, over all query heads (GQA shares K/V but not the products).
        attn = 4.0 * self.heads * self.head_dim
        return Block(f"layers.{i}", "decoder", tuple(mats), tuple(vecs), _matmul_flops(mats), attn)

    def _head_block(self) -> Block:
        d = self.word_embed_proj_dim
        vecs: list[Vector] = []
        if self.final_norm:
            vecs += self._norm_vectors("final_layer_norm" if self.style == "opt" else "norm")
        mats: list[Matrix] = []
        if d != self.hidden:
            mats.append(Matrix("project_out", d, self.hidden, "proj"))
        if not self.tied_embeddings:
            mats.append(Matrix("lm_head", self.vocab, d, "lm_head"))
        # The vocabulary projection is computed whether or not its weight is
        # shared with embed_tokens, so its FLOPs are always charged here.
        flops = _matmul_flops(m for m in mats if m.kind == "proj") + 2.0 * self.vocab * d
        return Block("head", "head", tuple(mats), tuple(vecs), flops, 0.0)

    def _build_blocks(self) -> list[Block]:
        return [self._embed_block(), *(self._decoder_block(i) for i in range(self.layers)), self._head_block()]

    def blocks(self) -> list[Block]:
        """Blocks in forward order: ``embed``, ``layers.0`` .. ``layers.N-1``, ``head``."""
        return list(self._blocks)

    def matrices(self) -> list[Matrix]:
        """All matrices, names prefixed with their block (``layers.3.q_proj``)."""
        return [replace(m, name=f"{b.name}.{m.name}") for b in self._blocks for m in b.matrices]

    def vectors(self) -> list[Vector]:
        """All vectors, names prefixed with their block (``layers.3.q_proj.bias``)."""
        return [replace(v, name=f"{b.name}.{v.name}") for b in self._blocks for v in b.vectors]

    @property
    def total_params(self) -> int:
        return sum(b.numel for b in self._blocks)

    # ------------------------------------------------------------------ cost
    def forward_flops_per_token(self, seq: int) -> float:
        """Forward matmul FLOPs per token at sequence length ``seq``, attention included."""
        if seq <= 0:
            raise ValueError(f"seq must be positive, got {seq}")
        return float(sum(b.forward_flops_per_token + b.attention_flops_per_token_per_seq * seq for b in self._blocks))

    def backward_flops_per_token(self, seq: int) -> float:
        """Backward FLOPs per token: 2x forward (input grads + weight grads)."""
        return 2.0 * self.forward_flops_per_token(seq)

    # ------------------------------------------------------------------ slicing
    def with_layers(self, n: int) -> "ModelShape":
        """The same model at full width but only ``n`` decoder layers (named ``name[nL]``)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.layers:
            raise ValueError(f"{self.name}: layers must be an integer in 1..{self.layers}, got {n!r}")
        base = _SLICE_RE.sub("", self.name)
        return replace(self, name=f"{base}[{n}L]", layers=n)


_SLICE_RE = re.compile(r"\[(\d+)L\]$", re.IGNORECASE)

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # Test-sized llama-style model (no upstream config).
        ModelShape("tiny", "llama", vocab=256, hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128),
        # facebook/opt-350m config.json (do_layer_norm_before=false -> no final norm)
        ModelShape("opt-350m", "opt", vocab=50272, hidden=1024, layers=24, heads=16, kv_heads=16,
                   intermediate=4096, tied_embeddings=True, linear_bias=True, norm="layernorm",
                   max_positions=2050, word_embed_proj_dim=512, final_norm=False),
        # facebook/opt-1.3b config.json
        ModelShape("opt-1.3b", "opt", vocab=50272, hidden=2048, layers=24, heads=32, kv_heads=32,
                   intermediate=8192, tied_embeddings=True, linear_bias=True, norm="layernorm",
                   max_positions=2050, final_norm=True),
        # Qwen/Qwen2.5-0.5B config.json
        ModelShape("qwen2.5-0.5b", "llama", vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2,
                   intermediate=4864, tied_embeddings=True, qkv_bias=True),
        # Qwen/Qwen2.5-1.5B config.json
        ModelShape("qwen2.5-1.5b", "llama", vocab=151936, hidden=1536, layers=28, heads=12, kv_heads=2,
                   intermediate=8960, tied_embeddings=True, qkv_bias=True),
        # Qwen/Qwen2.5-3B config.json
        ModelShape("qwen2.5-3b", "llama", vocab=151936, hidden=2048, layers=36, heads=16, kv_heads=2,
                   intermediate=11008, tied_embeddings=True, qkv_bias=True),
        # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json (untied embeddings)
        ModelShape("tinyllama-1.1b", "llama", vocab=32000, hidden=2048, layers=22, heads=32, kv_heads=4,
                   intermediate=5632),
        # meta-llama/Llama-2-7b-hf config.json
        ModelShape("llama2-7b", "llama", vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32,
                   intermediate=11008),
        # meta-llama/Llama-2-13b-hf config.json
        ModelShape("llama2-13b", "llama", vocab=32000, hidden=5120, layers=40, heads=40, kv_heads=40,
                   intermediate=13824),
    )
}


def model_names() -> list[str]:
    """Names accepted by :func:`get_model`, in definition order."""
    return list(MODELS)


def get_model(name: str) -> ModelShape:
    """Look a model up by name; ``"<name>[<n>L]"`` gives its ``with_layers(n)`` slice."""
    key = name.strip().lower() if isinstance(name, str) else name
    if key in MODELS:
        return MODELS[key]
    if isinstance(key, str):
        m = _SLICE_RE.search(key)
        base = key[: m.start()] if m else None
        if m and base in MODELS:
            return MODELS[base].with_layers(int(m.group(1)))
    raise UnknownModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
