"""A labelled task built from text on disk: which pydoc topic does a paragraph come from?

Covers: the construction of the topic-classification task (docs/convergence.md says why
each rule is there), its deterministic split, its token encoding for SmolLM2 and
`TopicHead`, the classifier the engine trains. No hub, no download: the text is the
standard library's `pydoc_data.topics` (the help texts behind `help("topic")`).

Construction (`build_task`):
1. every topic's text is cut into paragraphs at blank lines, whitespace collapsed;
   paragraphs shorter than `min_chars` characters are dropped (headings, one-liners);
2. a paragraph whose text occurs under more than one topic is dropped everywhere (the
   topics overlap: "specialnames" repeats "customization", "compound" repeats "try"),
   so every kept paragraph has exactly one correct label;
3. the `classes` topics with the most paragraphs left are the labels (ties by name);
4. each class's paragraphs are shuffled with `split_seed` (fixed: the split never depends
   on the training seed) and cut into train / validation / test by `fractions`.

Encoding (`encode_examples`): the first `prefix_tokens` tokens of the paragraph (a
paragraph with fewer tokens is dropped, so all examples have one length and need no
padding) followed by the prompt "\\nTopic:"; the label is a letter " A", " B", ...
(one SmolLM2 token each), and the model's score for a class is the LM head's logit of
that letter at the last position (`TopicHead`): a verbalizer, so the pretrained head
is reused and nothing new is initialized.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zfbench.real.hf_model import run_blocks

PROMPT = "\nTopic:"
LETTERS = "ABCDEFGHIJKLMNOP"


@dataclass(frozen=True)
class TopicTask:
    classes: tuple[str, ...]             # topic keys, label i = classes[i]
    splits: dict                         # "train"/"val"/"test" -> list[(text, label)]

    def counts(self) -> dict:
        return {s: np.bincount([y for _, y in ex], minlength=len(self.classes)).tolist()
                for s, ex in self.splits.items()}


def paragraphs(text: str, min_chars: int) -> list[str]:
    out = []
    for p in re.split(r"\n\s*\n", text):
        p = " ".join(p.split())
        if len(p) >= min_chars:
            out.append(p)
    return out


def build_task(topics: dict[str, str] | None = None, classes: int = 8, min_chars: int = 100,
               fractions: tuple[float, float] = (0.6, 0.2), split_seed: int = 0) -> TopicTask:
    """The task from `topics` (default `pydoc_data.topics.topics`); see the module doc."""
    if topics is None:
        from pydoc_data import topics as pt
        topics = pt.topics
    owners: dict[str, set] = {}
    per_topic = {}
    for key in sorted(topics):
        per_topic[key] = list(dict.fromkeys(paragraphs(topics[key], min_chars)))
        for p in per_topic[key]:
            owners.setdefault(p, set()).add(key)
    unique = {k: [p for p in ps if len(owners[p]) == 1] for k, ps in per_topic.items()}
    ranked = sorted(unique, key=lambda k: (-len(unique[k]), k))[:classes]
    if len(ranked) < classes or min(len(unique[k]) for k in ranked) < 3:
        raise ValueError(f"not enough topics with 3+ unique paragraphs for {classes} classes")
    rng = np.random.default_rng([split_seed, 0x70B1C])
    splits = {"train": [], "val": [], "test": []}
    for label, key in enumerate(ranked):
        ps = unique[key]
        order = rng.permutation(len(ps))
        n_train = max(1, int(round(fractions[0] * len(ps))))
        n_val = max(1, int(round(fractions[1] * len(ps))))
        for i, j in enumerate(order):
            part = "train" if i < n_train else "val" if i < n_train + n_val else "test"
            splits[part].append((ps[j], label))
    return TopicTask(tuple(ranked), splits)


def label_token_ids(tokenizer, n: int) -> list[int]:
    """The token id of " A", " B", ... (each must be one token)."""
    ids = []
    for letter in LETTERS[:n]:
        t = tokenizer(" " + letter, add_special_tokens=False)["input_ids"]
        if len(t) != 1:
            raise ValueError(f"label ' {letter}' is {len(t)} tokens, not one")
        ids.append(t[0])
    return ids


def encode_examples(examples, tokenizer, prefix_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids [N, prefix_tokens + len(prompt)], labels [N]) of the examples long enough."""
    prompt = tokenizer(PROMPT, add_special_tokens=False)["input_ids"]
    rows, labels = [], []
    for text, label in examples:
        t = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(t) >= prefix_tokens:
            rows.append(t[:prefix_tokens] + prompt)
            labels.append(label)
    if not rows:
        raise ValueError(f"no example has {prefix_tokens} tokens")
    return torch.tensor(rows, dtype=torch.int64), torch.tensor(labels, dtype=torch.int64)


class TopicHead(nn.Module):
    """`forward(hidden, labels) -> cross-entropy` over the class letters' logits at the
    last position. `hidden` enters decoder block `first` (`hf_model.prefix_hidden`; 0 =
    the embeddings, then `ids` are token ids). `logits(hidden)` gives [N, classes]."""

    def __init__(self, lm: nn.Module, first: int, label_ids: list[int]) -> None:
        super().__init__()
        self.lm = lm
        self.first = first
        self.register_buffer("label_ids", torch.tensor(label_ids, dtype=torch.int64),
                             persistent=False)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        base = self.lm.model
        if self.first == 0 and hidden.dtype == torch.int64:
            hidden = base.embed_tokens(hidden)
        hidden = run_blocks(self.lm, hidden, self.first)
        last = base.norm(hidden[:, -1])
        return last @ self.lm.lm_head.weight[self.label_ids].T

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.logits(hidden).float(), labels)


@torch.no_grad()
def evaluate(head: TopicHead, batches) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) over `(hidden, labels)` batches, in eval mode."""
    was = head.training
    head.eval()
    loss, correct, count = 0.0, 0, 0
    for x, y in batches:
        z = head.logits(x).float()
        loss += float(F.cross_entropy(z, y, reduction="sum"))
        correct += int((z.argmax(1) == y).sum())
        count += len(y)
    head.train(was)
    return loss / count, correct / count
