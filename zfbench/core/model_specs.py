"""Model shapes written out instead of named: ``gpt2:...`` and ``llama:...`` specs, and a
Hugging Face ``config.json``.

This module owns reading such a description into the architecture fields of a
``zfbench.core.models.ModelShape`` (a plain dict; ``models.get_model`` builds the shape,
so this module imports no shapes). Accepted wherever ``--model`` is:

* ``gpt2:layers=L,hidden=H,heads=A`` -- GPT-2 style: learned positions (``positions``,
  default 1024), a 4H MLP (``ffn``), LayerNorm, biases on every linear layer, tied
  embeddings, vocabulary 50257 (``vocab``). Built as the ``opt`` style of ModelShape
  (per layer ``12H^2 + 13H``, plus ``(V + P) H`` of embeddings and ``2H`` final norm).
* ``llama:layers=L,hidden=H,heads=A`` -- Llama style: rotary positions, gated SiLU MLP,
  RMSNorm, no biases; defaults ``kv_heads`` = heads, ``ffn`` = ``256 * ceil((8H/3) / 256)``
  (meta-llama's ``FeedForward`` with ``multiple_of`` 256: 11008 at H 4096, 13824 at H
  5120, the published Llama-2 sizes), ``vocab`` = 32000, ``tied`` = false, ``qkv_bias`` =
  false (true for Qwen2-style shapes).
* a path to a Hugging Face ``config.json`` (``model_type`` gpt2, llama, mistral, qwen2
  or opt), read with the field names and defaults of those configs.

Keys are ``key=value``, comma-separated, each at most once; values are positive integers
(``tied``, ``qkv_bias``: true/false); a mistake is a ``ValueError`` naming the key or
value. A spec's canonical name (``ModelShape.name``) lists the required keys, then any
key at a non-default value, so ``get_model(shape.name) == shape``. A spec holds commas,
so it cannot be a value of ``--sweep model=...``; give it as ``--model``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from zfbench.core.model_names import UnknownModelError

__all__ = ["ModelSpecError", "STYLES", "is_spec", "spec_fields"]


class ModelSpecError(UnknownModelError):
    """A malformed model spec or config.json; the message names the key and the fix."""


REQUIRED = ("layers", "hidden", "heads")
# Optional keys per spec style and their defaults (None: derived from the required keys).
STYLES: dict[str, dict[str, object]] = {
    "gpt2": {"vocab": 50257, "positions": 1024, "ffn": None},
    "llama": {"kv_heads": None, "ffn": None, "vocab": 32000, "tied": False,
              "qkv_bias": False},
}
_BOOLEAN = {"tied", "qkv_bias"}
_EXAMPLE = {"gpt2": "gpt2:layers=48,hidden=1600,heads=25",
            "llama": "llama:layers=32,hidden=4096,heads=32"}


def is_spec(text: str) -> bool:
    """Whether ``text`` is meant as a spec or a config path rather than a preset name: it
    has ``style:`` before any ``=``, or it ends in ``.json``."""
    text = text.strip()
    head = text.split(":", 1)[0]
    return (":" in text and "=" not in head and "[" not in head) or \
        text.lower().endswith(".json")


def spec_fields(text: str) -> dict:
    """The ModelShape fields (``name`` included) of a spec or a config.json path."""
    text = text.strip()
    if text.lower().endswith(".json"):
        return _config_fields(text)
    style, _, body = text.partition(":")
    style = style.strip().lower()
    if style not in STYLES:
        raise ModelSpecError(f"model {text!r}: unknown spec style {style!r}; write "
                             f"{' or '.join(_EXAMPLE.values())} (or a config.json path)")
    values = _parse_keys(text, style, body)
    if style == "gpt2":
        return _gpt2(values)
    return _llama(values)


def llama_ffn(hidden: int) -> int:
    """Llama's SwiGLU width: 2/3 of 4H, rounded up to a multiple of 256."""
    return 256 * math.ceil(int(8 * hidden / 3) / 256)


def _parse_keys(text: str, style: str, body: str) -> dict:
    allowed = (*REQUIRED, *STYLES[style])
    usage = (f"{style} specs take {', '.join(REQUIRED)} (required) and "
             f"{', '.join(STYLES[style])} (optional), e.g. {_EXAMPLE[style]}")
    values: dict[str, object] = {}
    for item in (part.strip() for part in body.split(",")):
        if not item:
            raise ModelSpecError(f"model {text!r}: an empty item (two commas, or a comma at "
                                 f"an end); {usage}")
        key, eq, raw = (s.strip() for s in item.partition("="))
        key = key.lower()
        if not eq:
            raise ModelSpecError(f"model {text!r}: item {item!r} is not key=value; {usage}")
        if key not in allowed:
            raise ModelSpecError(f"model {text!r}: unknown key {key!r}; {usage}")
        if key in values:
            raise ModelSpecError(f"model {text!r}: key {key!r} is given twice; give it once")
        values[key] = _value(text, key, raw)
    missing = [k for k in REQUIRED if k not in values]
    if missing:
        raise ModelSpecError(f"model {text!r}: missing key {missing[0]!r}; add "
                             f"{missing[0]}=N ({usage})")
    hidden, heads = values["hidden"], values["heads"]
    if hidden % heads:
        raise ModelSpecError(f"model {text!r}: hidden {hidden} is not divisible by heads "
                             f"{heads}; choose heads that divide hidden")
    kv = values.get("kv_heads")
    if kv is not None and heads % kv:
        raise ModelSpecError(f"model {text!r}: heads {heads} is not divisible by kv_heads "
                             f"{kv}; choose kv_heads that divide heads")
    return {**{k: v for k, v in STYLES[style].items()}, **values}


def _value(text: str, key: str, raw: str):
    if key in _BOOLEAN:
        low = raw.lower()
        if low in ("true", "1", "yes"):
            return True
        if low in ("false", "0", "no"):
            return False
        raise ModelSpecError(f"model {text!r}: key {key!r} must be true or false, got {raw!r}")
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1 or str(value) != raw.lstrip("+"):
        raise ModelSpecError(f"model {text!r}: key {key!r} must be a positive integer, "
                             f"got {raw!r}")
    return value


def _name(style: str, v: dict, derived: dict) -> str:
    """Required keys, then each optional key whose value is not its default."""
    items = [f"{k}={v[k]}" for k in REQUIRED]
    for key, default in STYLES[style].items():
        default = derived.get(key, default)
        if v[key] is not None and v[key] != default:
            value = str(v[key]).lower() if key in _BOOLEAN else v[key]
            items.append(f"{key}={value}")
    return f"{style}:" + ",".join(items)


def _gpt2(v: dict) -> dict:
    derived = {"ffn": 4 * v["hidden"]}
    ffn = v["ffn"] if v["ffn"] is not None else derived["ffn"]
    return {"name": _name("gpt2", v, derived), "style": "opt", "vocab": v["vocab"],
            "hidden": v["hidden"], "layers": v["layers"], "heads": v["heads"],
            "kv_heads": v["heads"], "intermediate": ffn, "tied_embeddings": True,
            "linear_bias": True, "norm": "layernorm", "max_positions": v["positions"],
            "final_norm": True}


def _llama(v: dict) -> dict:
    derived = {"ffn": llama_ffn(v["hidden"]), "kv_heads": v["heads"]}
    return {"name": _name("llama", v, derived), "style": "llama", "vocab": v["vocab"],
            "hidden": v["hidden"], "layers": v["layers"], "heads": v["heads"],
            "kv_heads": v["kv_heads"] if v["kv_heads"] is not None else v["heads"],
            "intermediate": v["ffn"] if v["ffn"] is not None else derived["ffn"],
            "tied_embeddings": v["tied"], "qkv_bias": v["qkv_bias"]}


# ------------------------------------------------------------------ config.json
_LLAMA_TYPES = ("llama", "mistral", "qwen2")


def _config_fields(path: str) -> dict:
    p = Path(path)
    try:
        cfg = json.loads(p.read_text("utf-8"))
    except FileNotFoundError:
        raise ModelSpecError(f"model {path!r}: no such file (a config.json path, a spec "
                             f"such as {_EXAMPLE['gpt2']}, or a preset name)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelSpecError(f"model {path!r}: cannot read it as JSON ({err})") from None
    if not isinstance(cfg, dict):
        raise ModelSpecError(f"model {path!r}: a config.json is a JSON object")
    kind = str(cfg.get("model_type", "")).lower()

    def need(key: str, default=None):
        value = cfg.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelSpecError(f"model {path!r}: {kind} config field {key!r} must be a "
                                 f"positive integer, got {value!r}")
        return value

    if kind == "gpt2":
        hidden = need("n_embd")
        inner = cfg.get("n_inner")
        return {"name": path, "style": "opt", "vocab": need("vocab_size"), "hidden": hidden,
                "layers": need("n_layer"), "heads": need("n_head"), "kv_heads": need("n_head"),
                "intermediate": need("n_inner") if inner is not None else 4 * hidden,
                "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
                "linear_bias": True, "norm": "layernorm", "max_positions": need("n_positions"),
                "final_norm": True}
    if kind in _LLAMA_TYPES:
        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        head_dim = cfg.get("head_dim")
        if head_dim is not None and head_dim * heads != hidden:
            raise ModelSpecError(f"model {path!r}: head_dim {head_dim} x heads {heads} != "
                                 f"hidden_size {hidden}; zfbench's shapes have "
                                 f"head_dim = hidden / heads")
        return {"name": path, "style": "llama", "vocab": need("vocab_size"), "hidden": hidden,
                "layers": need("num_hidden_layers"), "heads": heads,
                "kv_heads": need("num_key_value_heads", heads),
                "intermediate": need("intermediate_size"),
                "tied_embeddings": bool(cfg.get("tie_word_embeddings", False)),
                "qkv_bias": kind == "qwen2" or bool(cfg.get("attention_bias", False))}
    if kind == "opt":
        hidden = need("hidden_size")
        # OPT's learned position table has 2 more rows than max_position_embeddings
        # (transformers' OPTLearnedPositionalEmbedding offset), as opt-1.3b's 2050
        return {"name": path, "style": "opt", "vocab": need("vocab_size"), "hidden": hidden,
                "layers": need("num_hidden_layers"), "heads": need("num_attention_heads"),
                "kv_heads": need("num_attention_heads"), "intermediate": need("ffn_dim"),
                "tied_embeddings": bool(cfg.get("tie_word_embeddings", True)),
                "linear_bias": bool(cfg.get("enable_bias", True)), "norm": "layernorm",
                "max_positions": need("max_position_embeddings") + 2,
                "word_embed_proj_dim": need("word_embed_proj_dim", hidden),
                "final_norm": bool(cfg.get("do_layer_norm_before", True))}
    raise ModelSpecError(f"model {path!r}: model_type {cfg.get('model_type')!r} is not "
                         f"supported; a config.json of model_type gpt2, "
                         f"{', '.join(_LLAMA_TYPES)} or opt is")
