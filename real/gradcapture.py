"""Capture per-column gradient norms from a training run, cheaply (never whole gradients).

Covers: `kind_of(name)` (q/k/v/o/gate/up/down/embedding/lm_head/other, for HF Llama names,
`zfbench.real.model.DecoderLM` names and OPT's out_proj/fc1/fc2), and `GradCapture`, which after
`engine.backward(loss)` and before `engine.step()` reads each trainable 2-D weight's
gradient and keeps per column the squared L2 norm and the L1 norm (sum over rows; a
column is an input feature, the unit ZenFlow selects). Every `detail_every` steps it
hands each matrix's squared gradient (numpy) to `detail_fn(step, name, kind, g2)`, which
returns summary rows to keep (`zfbench.gradients` passes the row / column / element and
spatial shares of `zfbench.analysis.gradstats`: real/ never imports analysis/), and it keeps one
matrix's |gradient| at one step for a heatmap. `frame()` is the long table
`zfbench.analysis.gradstats` reads.

Usage:
    cap = GradCapture(engine.named_params)
    loss = engine(ids, labels); engine.backward(loss); cap.capture(step); engine.step()
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import torch


_KIND_PATTERNS = (
    ("q", r"q_proj"), ("k", r"k_proj"), ("v", r"v_proj"), ("o", r"(o_proj|out_proj)"),
    ("gate", r"gate_proj"), ("up", r"(up_proj|fc1)"), ("down", r"(down_proj|fc2)"),
    ("embedding", r"(embed_tokens|embed_positions|wte|wpe)"), ("lm_head", r"lm_head"),
)


def kind_of(name: str) -> str:
    for kind, pattern in _KIND_PATTERNS:
        if re.search(rf"(^|\.){pattern}(\.|$)", name):
            return kind
    return "other"


class GradCapture:
    """Per-step column norms of every trainable 2-D weight (optionally a subset).

    `layers`: names to record (default all 2-D); `detail_every`: steps between the
    whole-gradient summaries (0 = never); `detail_max_elems`: matrices larger than this
    (the 49152 x 576 embedding) are left out of the element-level summaries;
    `heatmap_layer`: the matrix whose pooled |gradient| is kept at `heatmap_step`.
    """

    def __init__(self, named_params, layers=None, detail_every: int = 8,
                 detail_max_elems: int = 4_000_000, heatmap_layer: str | None = None,
                 heatmap_step: int = 0, detail_fn=None) -> None:
        wanted = set(layers) if layers is not None else None
        self.params = [(n, p) for n, p in named_params
                       if p.dim() == 2 and (wanted is None or n in wanted)]
        if not self.params:
            raise ValueError("no 2-D trainable weight to record")
        self.detail_every = detail_every
        self.detail_max_elems = detail_max_elems
        self.heatmap_layer = heatmap_layer or self._default_heatmap_layer()
        self.heatmap_step = heatmap_step
        self.detail_fn = detail_fn
        self._steps: list[int] = []
        self._sq: list[np.ndarray] = []   # per step: all columns of all layers, float32
        self._l1: list[np.ndarray] = []
        self.details: list[dict] = []
        self.heatmap_grad: np.ndarray | None = None  # |g| of heatmap_layer at heatmap_step
        self._index = self._column_index()

    def _default_heatmap_layer(self) -> str:
        for name, _ in self.params:
            if kind_of(name) == "q":
                return name
        return self.params[0][0]

    def _column_index(self) -> pd.DataFrame:
        names, kinds, cols = [], [], []
        for name, p in self.params:
            n = p.shape[1]
            names.append(np.full(n, name, dtype=object))
            kinds.append(np.full(n, kind_of(name), dtype=object))
            cols.append(np.arange(n, dtype=np.int32))
        return pd.DataFrame({"layer": pd.Categorical(np.concatenate(names)),
                             "kind": pd.Categorical(np.concatenate(kinds)),
                             "col": np.concatenate(cols)})

    @torch.no_grad()
    def capture(self, step: int) -> None:
        sq, l1 = [], []
        detail = (self.detail_fn is not None and self.detail_every
                  and step % self.detail_every == 0)
        for name, p in self.params:
            g = p.grad
            if g is None:
                g = torch.zeros_like(p)
            g = g.detach().float()
            g2 = g.square()
            sq.append(g2.sum(0).cpu().numpy())
            l1.append(g.abs().sum(0).cpu().numpy())
            if detail:
                self._detail(step, name, g2)
            if step == self.heatmap_step and name == self.heatmap_layer:
                self.heatmap_grad = g.abs().cpu().numpy()
        self._steps.append(int(step))
        self._sq.append(np.concatenate(sq).astype(np.float32))
        self._l1.append(np.concatenate(l1).astype(np.float32))

    def _detail(self, step: int, name: str, g2: torch.Tensor) -> None:
        if g2.numel() > self.detail_max_elems:
            return
        self.details.extend(self.detail_fn(step, name, kind_of(name), g2.cpu().numpy()))

    def frame(self) -> pd.DataFrame:
        """step, layer, kind, col, sq_norm, l1_norm: one row per recorded step and column."""
        if not self._steps:
            raise ValueError("nothing captured yet")
        n = len(self._index)
        reps = len(self._steps)
        out = pd.DataFrame({
            "step": np.repeat(np.asarray(self._steps, dtype=np.int32), n),
            "layer": pd.Categorical.from_codes(np.tile(self._index["layer"].cat.codes, reps),
                                               self._index["layer"].cat.categories),
            "kind": pd.Categorical.from_codes(np.tile(self._index["kind"].cat.codes, reps),
                                              self._index["kind"].cat.categories),
            "col": np.tile(self._index["col"].to_numpy(), reps),
            "sq_norm": np.concatenate(self._sq),
            "l1_norm": np.concatenate(self._l1),
        })
        return out

    def detail_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.details)
