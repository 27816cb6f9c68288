"""Named model shapes, built from their architecture.

This module owns the vocabulary of *what is being trained*: for each named model
(``tiny``, ``opt-350m``, ``opt-1.3b``, ``qwen2.5-0.5b``, ``qwen2.5-1.5b``,
``qwen2.5-3b``, ``tinyllama-1.1b``, ``llama2-7b``, ``llama2-13b``, ``llama2-70b``) it lists every weight
matrix and every 1-D parameter, grouped into forward-order blocks (``embed``,
``layers.0`` ... ``layers.N-1``, ``head``), and the matmul FLOPs each block costs per
token. Parameter counts are derived from the shape hyper-parameters (never typed in),
and the tests check them against the published totals.

Conventions: matrices use the ``nn.Linear`` layout ``[out_features, in_features]``, so a
*column* is one input feature (the unit ZenFlow selects); embedding tables use
``nn.Embedding``'s ``[num_embeddings, dim]``. Matrix names are module names (``q_proj``),
vector names carry the parameter suffix (``q_proj.bias``); ``ModelShape.matrices`` and
``vectors`` prefix them with the block name (``layers.3.q_proj``). FLOPs count matmuls
only, at 2 per multiply-add; bias adds, norms, activations, softmax and lookups are not
counted, and backward is 2x forward (the usual "6N" convention).

Slices (proxies small enough to measure): ``llama2-7b[2L]`` (depth,
:meth:`ModelShape.with_layers`), ``llama2-7b[w0.125]`` (width,
:meth:`ModelShape.with_width`), ``llama2-7b[1L][w0.125]`` (both); :func:`get_model`
parses them back and says how each is cut, and the slice knows its model
(:attr:`ModelShape.base`, :meth:`ModelShape.slice_summary`). Pure python: no torch
import, so analysis and simulation code can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fractions import Fraction
from numbers import Real

from zfbench.core.model_names import (UnknownModelError, format_width, legacy_depth,
                                        parse_model_name, slice_name, strip_suffix)
from zfbench.core.model_specs import ModelSpecError, is_spec, spec_fields

__all__ = [
    "UnknownModelError",
    "ModelSpecError",
    "SPEC_SYNTAX",
    "Matrix",
    "Vector",
    "Block",
    "ModelShape",
    "MODELS",
    "get_model",
    "model_names",
    "parse_model_name",
]

MATRIX_KINDS = (
    "q", "k", "v", "o", "gate", "up", "down", "fc1", "fc2",
    "embedding", "position", "proj", "lm_head", "other",
)
BLOCK_KINDS = ("embedding", "decoder", "head")


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
    Qwen2) or ``"opt"`` (learned positions, fc1/fc2 MLP, LayerNorm, biases; also
    GPT-2, which has the same parameters).
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
    # The whole named model this shape is a slice of (None: it is a whole model). Set by
    # with_layers / with_width; not part of equality (the name and the dimensions are).
    sliced_from: ModelShape | None = field(default=None, repr=False, compare=False, hash=False)
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
        self._check_slice()
        object.__setattr__(self, "_blocks", tuple(self._build_blocks()))

    def _check_slice(self) -> None:
        """Keep ``sliced_from`` truthful: a shape renamed (``dataclasses.replace``) away
        from its base's slice names becomes a model of its own; one that keeps a slice
        name must have the dimensions that slice has."""
        base = self.sliced_from
        if base is None:
            return
        if not isinstance(base, ModelShape):
            raise TypeError(f"model {self.name!r}: sliced_from must be a ModelShape, got {type(base).__name__}")
        base = base.base
        object.__setattr__(self, "sliced_from", base)
        root = strip_suffix(base.name)
        if not self.name.startswith(root + "["):
            object.__setattr__(self, "sliced_from", None)
            return
        want = {**_width_dims(base, self.heads), "layers": min(self.layers, base.layers)}
        want.update({k: getattr(base, k) for k in _KEPT_BY_SLICES})
        got = {k: getattr(self, k) for k in want}
        if got != want:
            diff = ", ".join(f"{k} {got[k]} (expected {want[k]})" for k in want if got[k] != want[k])
            raise ValueError(f"model {self.name!r}: not a slice of {base.name} ({diff}); make slices with "
                             f"with_layers / with_width, or give the shape a name of its own")

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
    @property
    def base(self) -> ModelShape:
        """The whole named model this shape is a slice of (itself when it is not a slice)."""
        return self.sliced_from if self.sliced_from is not None else self

    @property
    def is_slice(self) -> bool:
        return self.sliced_from is not None

    @property
    def width_fraction(self) -> float:
        """This shape's width relative to :attr:`base`: ``hidden / base.hidden``, exactly
        ``heads / base.heads`` (1.0 for a whole-width shape)."""
        return self.hidden / self.base.hidden

    @property
    def width_ratio(self) -> Fraction:
        """:attr:`width_fraction` as an exact fraction (``Fraction(1, 8)``)."""
        return Fraction(self.heads, self.base.heads)

    @property
    def param_fraction(self) -> float:
        """``total_params`` relative to :attr:`base`'s (1.0 for a whole model)."""
        return self.total_params / self.base.total_params

    def slice_summary(self) -> str:
        """One line saying what this shape is relative to its base, e.g.
        ``"llama2-7b at 1 of 32 layers and 1/8 width: 0.108% of its parameters
        (7.26M of 6.74B)"``."""
        base = self.base
        if not self.is_slice:
            return f"{self.name}: the whole model ({_count(self.total_params)} parameters)"
        depth = f"all {base.layers} layers" if self.layers == base.layers else \
            f"{self.layers} of {base.layers} layers"
        width = "full width" if self.heads == base.heads else f"{self.width_ratio} width"
        pct = 100.0 * self.param_fraction
        return (f"{strip_suffix(base.name)} at {depth} and {width}: {pct:.3g}% of its parameters "
                f"({_count(self.total_params)} of {_count(base.total_params)})")

    def _slice_parts(self) -> tuple[int | None, int]:
        """``(layers named in the name or None, heads)`` of this shape, for re-slicing."""
        if not self.is_slice:
            return legacy_depth(self.name), self.heads
        _, depth, _ = parse_model_name(self.name)
        return depth, self.heads

    def with_layers(self, n: int) -> "ModelShape":
        """The same model at this shape's width but only ``n`` decoder layers.

        Named ``<base>[<n>L]`` (``<base>[<n>L][w<f>]`` on a width slice); ``n`` is
        1..``self.layers``.  ``s.with_layers(n).with_width(f) ==
        s.with_width(f).with_layers(n)``, names included.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.layers:
            raise ValueError(f"{self.name}: layers must be an integer in 1..{self.layers}, got {n!r}")
        return _make_slice(self.base, n, self.heads)

    def with_width(self, fraction: float) -> ModelShape:
        """The same architecture at ``fraction`` of the base model's width.

        The number of attention heads is scaled by ``fraction`` and rounded half up
        (``head_dim`` is kept, so ``hidden = heads * head_dim``); the realised width
        ``r = heads' / heads`` (:attr:`width_fraction`) then scales the vocabulary,
        the intermediate size and OPT's word-embedding projection (each rounded half
        up), so every matrix, embedding and LM head included, shrinks by about
        ``r**2`` and the shares of embedding, layers and head in the parameters stay
        the same.  K/V heads keep the query-per-K/V-head grouping where it divides,
        else the divisor of the new head count nearest to it (``heads % kv_heads ==
        0``, at least 1).  Learned positions (OPT) keep their count (they bound the
        sequence length), so that table shrinks by ``r`` only.

        ``fraction`` is relative to :attr:`base` (not compounded on a slice) and
        must be in (0, 1] and leave at least one head (``>= 0.5 / heads``).  A
        fraction that rounds to the base's head count gives the full width.  The
        name states the realised width: ``<base>[w<r>]``, ``<base>[<n>L][w<r>]``
        with a depth slice (``r`` to 4 significant digits, e.g.
        ``llama2-7b[w0.125]``, ``qwen2.5-0.5b[w0.07143]`` for 1 of 14 heads).
        """
        base = self.base
        root = strip_suffix(base.name)
        if isinstance(fraction, bool) or not isinstance(fraction, Real) or not math.isfinite(fraction) \
                or not 0 < fraction <= 1:
            raise ValueError(f"{root}: width fraction must be a number in (0, 1], got {fraction!r}; e.g. "
                             f"with_width(0.125) or get_model('{root}[w0.125]') for 1/8 of its width")
        heads = math.floor(float(fraction) * base.heads + 0.5)
        if heads < 1:
            least = format_width(1, base.heads)
            raise ValueError(f"{root}: width fraction {fraction!r} leaves {fraction * base.heads:.3g} of its "
                             f"{base.heads} attention heads (head_dim {base.head_dim} is kept); use a fraction "
                             f"of at least {least} (one head), e.g. {root}[w{least}]")
        dims = _width_dims(base, heads)
        if dims["word_embed_proj_dim"] < 1 or (base.word_embed_proj_dim != base.hidden and
                                              dims["word_embed_proj_dim"] == dims["hidden"]):
            raise ValueError(f"{root}: width fraction {fraction!r} leaves no room for its word-embedding "
                             f"projection ({base.word_embed_proj_dim} of hidden {base.hidden}); use a larger "
                             f"fraction")
        depth, _ = self._slice_parts()
        return _make_slice(base, self.layers if depth is None else depth, heads, depth is not None)


# Fields a slice copies from its base unchanged (the rest are width dims or layers).
_KEPT_BY_SLICES = ("style", "tied_embeddings", "qkv_bias", "linear_bias", "norm", "max_positions",
                   "final_norm")



def _count(n: int) -> str:
    """A parameter count in three significant digits: ``7.26M``, ``6.74B``, ``26.8K``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _round_ratio(x: int, num: int, den: int) -> int:
    """``x * num / den`` rounded half up, in integers (deterministic)."""
    return (2 * x * num + den) // (2 * den)


def _width_dims(base: ModelShape, heads: int) -> dict:
    """The width dimensions of ``base`` cut to ``heads`` attention heads (see ``with_width``)."""
    n = base.heads
    hidden = heads * base.head_dim
    if base.kv_heads == n:
        kv = heads
    else:  # the divisor of `heads` nearest to heads * kv / n (ties: the larger)
        kv = min((d for d in range(1, heads + 1) if heads % d == 0),
                 key=lambda d: (abs(d * n - heads * base.kv_heads), -d))
    proj = hidden if base.word_embed_proj_dim == base.hidden else \
        _round_ratio(base.word_embed_proj_dim, heads, n)
    return {"heads": heads, "kv_heads": kv, "hidden": hidden, "vocab": _round_ratio(base.vocab, heads, n),
            "intermediate": _round_ratio(base.intermediate, heads, n), "word_embed_proj_dim": proj}


def _make_slice(base: ModelShape, layers: int, heads: int, depth_named: bool = True) -> ModelShape:
    """``base`` at ``layers`` layers and ``heads`` heads; the whole ``base`` when neither is cut
    and no depth is named."""
    if not depth_named and layers == base.layers and heads == base.heads:
        return base
    name = slice_name(strip_suffix(base.name), layers if depth_named else None, heads, base.heads)
    dims = _width_dims(base, heads) if heads != base.heads else {}
    return replace(base, name=name, layers=layers, sliced_from=base, **dims)


# What get_model takes besides a preset name (zfbench.core.model_specs).
SPEC_SYNTAX = ("gpt2:layers=L,hidden=H,heads=A, llama:layers=L,hidden=H,heads=A[,kv_heads=K,"
               "ffn=F,vocab=V] or a Hugging Face config.json path")

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
        # meta-llama/Llama-2-70b-hf config.json (grouped-query attention: 8 key/value heads;
        # Touvron et al. 2023, "Llama 2", Table 1: 70B uses GQA)
        ModelShape("llama2-70b", "llama", vocab=32000, hidden=8192, layers=80, heads=64, kv_heads=8,
                   intermediate=28672),
    )
}


def model_names() -> list[str]:
    """Names accepted by :func:`get_model`, in definition order."""
    return list(MODELS)


def get_model(name: str) -> ModelShape:
    """Look a model up by name, slices included (case and surrounding spaces ignored):

    * ``"<model>"``: the whole model of :data:`MODELS`;
    * ``"<model>[<n>L]"``: its ``with_layers(n)`` depth slice;
    * ``"<model>[w<fraction>]"``: its ``with_width(fraction)`` width slice;
    * ``"<model>[<n>L][w<fraction>]"``: both (``[w<fraction>][<n>L]`` also accepted);
    * a written-out shape, ``gpt2:layers=L,hidden=H,heads=A``, ``llama:...`` or a Hugging
      Face ``config.json`` path (:mod:`zfbench.core.model_specs`), sliced the same way.

    A width slice scales heads, hidden, intermediate, vocabulary (and OPT's word-embedding
    projection) by the fraction with ``head_dim`` kept, so every matrix (embedding and LM
    head included) shrinks by about ``fraction**2`` and the mix of parameters between
    embedding, layers and head stays the same; a depth slice keeps embedding and head
    whole. One bracket per item and no commas, colons or ``=``, so a name survives the
    comma-separated lists of ``--sweep model=...`` and ``bench/ds_wallclock.py --shapes
    name:batch:seq``, and ``name.split("[")[0]`` is still its base.

    ``get_model(s.name) == s`` for every slice ``s`` of a built-in model.  An unknown
    base model or a malformed suffix raises :class:`UnknownModelError` (a
    ``ValueError``); a depth or width out of range, ``ValueError`` from the slicer.
    """
    if not isinstance(name, str):
        raise UnknownModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    key = name.strip().lower()
    if key in MODELS:
        return MODELS[key]
    base, depth, width = parse_model_name(name)
    if is_spec(base):
        shape = ModelShape(**spec_fields(base))
    elif base.lower() not in MODELS:
        raise UnknownModelError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}"
                                + (" (with an optional slice suffix: [<n>L], [w<fraction>] or "
                                   "[<n>L][w<fraction>])" if (depth, width) != (None, None) else "")
                                + f", or write a shape: {SPEC_SYNTAX}")
    else:
        shape = MODELS[base.lower()]
    if width is not None:
        shape = shape.with_width(width)
    if depth is not None:
        shape = shape.with_layers(depth)
    return shape
