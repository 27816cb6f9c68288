"""Training data for the real engine: a learnable synthetic stream and byte-level real text.

This module owns where batches come from.  Every source yields, forever,
``{"input_ids": LongTensor[B, T], "labels": LongTensor[B, T]}`` with the labels
already shifted (``labels[:, t]`` is the token after ``input_ids[:, t]``), which is
what :meth:`zfbench.real.model.DecoderLM.forward` expects.

* :func:`synthetic_batches`: sequences drawn from a fixed random Markov (bigram)
  table with a few likely successors per token, so a model can push the loss well
  below ``log(vocab)``; the table comes from ``table_seed`` and the sampling from
  ``seed``, so two seeds give two samples of the same "language".
* :class:`ByteTokenizer`: UTF-8 bytes as ids 0..255, optional special ids after.
* :func:`text_batches`: random windows over a byte-tokenized text, with a
  deterministic train / held-out split by position (held-out = the last part).
* :func:`default_text`: the standard library's ``pydoc_data.topics`` text, a
  real-text corpus that needs no download.
* :func:`made_ahead`: the first batches of a stream made at once, before a run's clock
  starts, so that making them never sits between two steps.

Pure numpy sampling, torch only for the yielded tensors; deterministic per seed.
"""

from __future__ import annotations

import os
import re
from collections import deque
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch

__all__ = [
    "made_ahead",
    "synthetic_batches",
    "bigram_table",
    "ByteTokenizer",
    "BYTE_VOCAB",
    "text_batches",
    "load_text",
    "split_tokens",
    "default_text",
]

BYTE_VOCAB = 256
SUCCESSORS = 8  # likely next tokens per token in the synthetic language
_LOOKS_LIKE_FILE = re.compile(r"^[^\s]+\.[A-Za-z0-9]{1,8}$")


def _check_positive(**kw: int) -> None:
    for key, val in kw.items():
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val <= 0:
            raise ValueError(f"{key} must be a positive integer, got {val!r}")


def _as_batch(windows: np.ndarray) -> dict:
    """``[B, T+1]`` token windows -> shifted input_ids / labels."""
    t = torch.from_numpy(np.ascontiguousarray(windows, dtype=np.int64))
    return {"input_ids": t[:, :-1].contiguous(), "labels": t[:, 1:].contiguous()}


# ----------------------------------------------------------------------------- synthetic
def bigram_table(vocab: int, successors: int = SUCCESSORS, table_seed: int = 0):
    """The synthetic language: ``(next_ids [vocab, k], probs [k])``.

    Token ``i`` is followed by ``next_ids[i, j]`` with probability ``probs[j]``
    (``k = min(successors, vocab)``, weights halving with ``j``; the successors of
    a row are distinct for ``vocab <= 1024``, drawn with replacement above, where
    a duplicate only merges mass).  The conditional entropy is therefore at most
    ``-sum(probs * log(probs))`` nats (about 1.4 for k = 8), far below ``log(vocab)``.
    """
    _check_positive(vocab=vocab, successors=successors)
    k = min(successors, vocab)
    rng = np.random.default_rng([int(table_seed), 0x5EED])
    if vocab <= 1024:
        nxt = np.argsort(rng.random((vocab, vocab)), axis=1)[:, :k]
    else:
        nxt = rng.integers(0, vocab, size=(vocab, k))
    # Successors are already in random order, so fixed decaying weights suffice.
    weights = 0.5 ** np.arange(k, dtype=np.float64)
    return nxt.astype(np.int64), weights / weights.sum()


def synthetic_batches(vocab: int, batch: int, seq: int, seed: int, *, table_seed: int = 0,
                      successors: int = SUCCESSORS) -> Iterator[dict]:
    """Endless seeded batches from the fixed bigram language of :func:`bigram_table`.

    The same ``(vocab, batch, seq, seed, table_seed)`` always gives the same stream.
    Each sequence starts at a uniformly random token; successor choices are drawn
    for the whole batch at once and only the table walk loops over positions.
    Bad sizes raise when called, not at the first ``next``.
    """
    _check_positive(vocab=vocab, batch=batch, seq=seq)
    nxt, probs = bigram_table(vocab, successors, table_seed)
    cum = np.cumsum(probs)
    cum[-1] = 1.0
    rng = np.random.default_rng([int(seed), 0xDA7A])

    def stream() -> Iterator[dict]:
        while True:
            out = np.empty((batch, seq + 1), dtype=np.int64)
            out[:, 0] = rng.integers(0, vocab, size=batch)
            choice = np.searchsorted(cum, rng.random((batch, seq)), side="right")
            for t in range(seq):
                out[:, t + 1] = nxt[out[:, t], choice[:, t]]
            yield _as_batch(out)

    return stream()


# ----------------------------------------------------------------------------- tokenizer
class ByteTokenizer:
    """Byte-level tokenizer: ids 0..255 are UTF-8 bytes, specials follow from 256.

    ``encode`` never emits specials (add them with :meth:`token_id`); ``decode``
    renders a special id as its name unless ``skip_special=True``.  Any str
    round-trips: ``decode(encode(s)) == s``.
    """

    def __init__(self, special_tokens: Sequence[str] = ()):
        specials = list(special_tokens)
        if len(set(specials)) != len(specials):
            raise ValueError(f"duplicate special tokens: {specials}")
        self.special_tokens = tuple(specials)
        self._special_ids = {name: BYTE_VOCAB + i for i, name in enumerate(specials)}

    @property
    def vocab_size(self) -> int:
        return BYTE_VOCAB + len(self.special_tokens)

    def token_id(self, name: str) -> int:
        try:
            return self._special_ids[name]
        except KeyError:
            raise KeyError(f"unknown special token {name!r}; have {list(self.special_tokens)}") from None

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode needs a str, got {type(text).__name__}")
        return list(text.encode("utf-8", errors="surrogatepass"))

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        parts: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < BYTE_VOCAB:
                buf.append(i)
            elif BYTE_VOCAB <= i < self.vocab_size:
                parts.append(_decode_bytes(buf))
                buf = bytearray()
                if not skip_special:
                    parts.append(self.special_tokens[i - BYTE_VOCAB])
            else:
                raise ValueError(f"token id {i} outside 0..{self.vocab_size - 1}")
        parts.append(_decode_bytes(buf))
        return "".join(parts)


def _decode_bytes(buf: bytearray) -> str:
    """Exact inverse of ``encode`` on its outputs; invalid UTF-8 becomes U+FFFD."""
    try:
        return bytes(buf).decode("utf-8", errors="surrogatepass")
    except UnicodeDecodeError:
        return bytes(buf).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------- real text
def default_text() -> str:
    """The stdlib ``pydoc_data.topics`` help texts, joined in sorted key order."""
    from pydoc_data import topics

    return "\n".join(topics.topics[k] for k in sorted(topics.topics))


def load_text(path_or_text) -> tuple[bytes, str]:
    """``(utf-8 bytes, label)`` of a file or a literal text.

    A :class:`os.PathLike` is always a file.  A ``str`` is a file when it names an
    existing one, or when it has no newline and looks like a path (contains a path
    separator, or is a single word ending in an extension such as ``.txt``); such a
    str that does not exist raises :class:`FileNotFoundError`.  Any other str is
    the text itself.
    """
    if isinstance(path_or_text, os.PathLike):
        path = Path(path_or_text)
    elif isinstance(path_or_text, str):
        s = path_or_text
        short = "\n" not in s and len(s) < 4096
        if short and (os.path.isfile(s) or "/" in s or os.sep in s or _LOOKS_LIKE_FILE.match(s)):
            path = Path(s)
        else:
            return s.encode("utf-8", errors="surrogatepass"), "<text>"
    else:
        raise TypeError(f"text_batches needs a path or a str, got {type(path_or_text).__name__}")
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {str(path)!r}")
    return path.read_bytes(), str(path)


def split_tokens(tokens: np.ndarray, split: str, heldout_fraction: float) -> np.ndarray:
    """Train = the first ``1 - heldout_fraction`` of the tokens, held-out = the rest."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction!r}")
    cut = len(tokens) - int(round(len(tokens) * heldout_fraction))
    return tokens[:cut] if split == "train" else tokens[cut:]


def text_batches(path_or_text, batch: int, seq: int, seed: int, split: str = "train",
                 heldout_fraction: float = 0.1, vocab: int | None = None) -> Iterator[dict]:
    """Endless seeded batches of random ``seq + 1``-byte windows from one split of a text.

    ``vocab`` is the model's vocabulary: it must be at least 256 (the byte
    tokenizer's); larger is fine.  Windows never cross the train / held-out
    boundary.  Arguments are checked when called (not at the first ``next``); errors
    name the source and the needed length when a split is too short for one window.
    """
    _check_positive(batch=batch, seq=seq)
    if vocab is not None and vocab < BYTE_VOCAB:
        raise ValueError(f"model vocab {vocab} is smaller than the byte tokenizer's vocab {BYTE_VOCAB}")
    raw, label = load_text(path_or_text)
    tokens = np.frombuffer(raw, dtype=np.uint8)
    part = split_tokens(tokens, split, heldout_fraction)
    need = seq + 1
    if len(part) < need:
        raise ValueError(
            f"{label}: the {split!r} split has {len(part)} bytes (of {len(tokens)} total, heldout_fraction "
            f"{heldout_fraction}) but one window needs seq + 1 = {need} bytes"
        )
    part = part.astype(np.int64)
    rng = np.random.default_rng([int(seed), 0x7E47, 0 if split == "train" else 1])
    offsets = np.arange(need)

    def stream() -> Iterator[dict]:
        while True:
            starts = rng.integers(0, len(part) - need + 1, size=batch)
            yield _as_batch(part[starts[:, None] + offsets])

    return stream()


# --------------------------------------------------------------------------- ahead
#: made_ahead's default cap on the batches it holds (bytes of their tensors)
AHEAD_MAX_BYTES = 256 << 20


def made_ahead(stream: Iterator[dict], count: int,
               max_bytes: int = AHEAD_MAX_BYTES) -> Iterator[dict]:
    """The same stream, its first ``count`` batches made now (at most ``max_bytes`` of
    them; the rest as the stream makes them).

    The synthetic walk loops over positions in Python: 7.6 ms a batch of 8 x 4018 tokens
    on a 2-core EPYC. Made between two steps it held the GIL against the host worker and
    kept the device idle (on one H100 the run loop left it 10-15 ms between steps;
    bench/results/gpu/NVIDIA-H100-80GB-HBM3/README.md). A training framework's loader
    works ahead of the step; so does this.
    """
    first = next(stream)
    nbytes = sum(t.numel() * t.element_size() for t in first.values())
    held = deque([first])
    while len(held) < count and (len(held) + 1) * nbytes <= max_bytes:
        held.append(next(stream))

    def chained() -> Iterator[dict]:
        while held:  # each let go once handed out
            yield held.popleft()
        yield from stream
    return chained()
