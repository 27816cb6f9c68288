"""Flat host buffers: one contiguous fp32 tensor per kind of state, with a view per parameter.

The host side of every offloading strategy keeps its fp32 master weights, Adam moments and
gradient buffers as single flat tensors (fast kernels, one allocation, pinned on CUDA),
addressed per parameter through views. `FlatLayout` knows where each parameter lives and
how to cut the buffer into contiguous chunks for the host optimizer. `DTYPES` is the
engine's one map from a config precision to its torch dtype (the device buffers' and the
gradients' on the wire; `LOW_PRECISION` is its 16-bit part, and the element sizes are
`zfbench.core.memory_model.ELEMENT_BYTES`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the torch dtype of each config precision (device weights and gradients, communication)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# the low-precision ones: a precision not in here keeps fp32 device buffers
LOW_PRECISION = {k: v for k, v in DTYPES.items() if v != torch.float32}


def is_column_major(t: torch.Tensor) -> bool:
    """A 2-D tensor whose columns are contiguous (a column-major `FlatLayout` slot)."""
    return t.dim() == 2 and not t.is_contiguous() and t.t().is_contiguous()


def selected_shape(t: torch.Tensor, k: int) -> tuple[int, int]:
    """Shape of a buffer holding k columns of `t`: one row per column ([k, rows]) for a
    column-major tensor, [rows, k] for a row-major one, so each layout copies
    contiguous runs."""
    return (k, t.shape[0]) if is_column_major(t) else (t.shape[0], k)


def take_columns(t: torch.Tensor, idx: torch.Tensor, out: torch.Tensor | None = None):
    """The columns `idx` of the 2-D `t`, shaped as `selected_shape`: k contiguous runs
    for a column-major tensor; a gather over every row for a row-major one (an expanded
    index: faster than index_select along dim 1 on CPU)."""
    if is_column_major(t):
        return torch.index_select(t.t(), 0, idx, out=out)
    cols = idx.expand(t.shape[0], idx.numel())
    return torch.gather(t, 1, cols, out=out) if out is not None else t.gather(1, cols)


def put_columns(t: torch.Tensor, idx: torch.Tensor, values: torch.Tensor) -> None:
    """Write `values` (shaped as `selected_shape`) into the columns `idx` of `t`."""
    if is_column_major(t):
        t.t().index_copy_(0, idx, values)
    else:
        t.index_copy_(1, idx, values)


def device_dtype(precision: str) -> torch.dtype:
    return LOW_PRECISION.get(precision, torch.float32)


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    column_major: bool = False  # a 2-D [rows, cols] stored as [cols, rows]


class FlatLayout:
    """Where each parameter lives in a flat buffer. With `column_major` (the engine's
    layout) every 2-D weight [rows, cols] is stored column by column, so one column (an
    input feature: what ZenFlow selects) is `rows` contiguous elements, and gathering or
    scattering k columns moves about k columns' bytes instead of touching every cache line
    of the matrix. `view()` still gives the logical [rows, cols] tensor (a transposed
    view); `view(...).t()` is the contiguous [cols, rows] storage."""

    def __init__(self, named_params: list[tuple[str, torch.Tensor]],
                 column_major: bool = False) -> None:
        self.slots: list[Slot] = []
        offset = 0
        for name, p in named_params:
            self.slots.append(Slot(name, tuple(p.shape), offset, p.numel(),
                                   column_major and p.dim() == 2))
            offset += p.numel()
        self.total = offset
        self.by_name = {s.name: s for s in self.slots}

    def new(self, dtype=torch.float32, pin: bool = False) -> torch.Tensor:
        buf = torch.zeros(self.total, dtype=dtype)
        return buf.pin_memory() if pin else buf

    @staticmethod
    def _view(flat: torch.Tensor, s: Slot) -> torch.Tensor:
        piece = flat[s.offset:s.offset + s.numel]
        if s.column_major:
            return piece.view(s.shape[1], s.shape[0]).t()
        return piece.view(s.shape)

    def view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        """The logical tensor of parameter `name` (shape as the parameter's)."""
        return self._view(flat, self.by_name[name])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s.name: self._view(flat, s) for s in self.slots}

    def gather(self, flat: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Copy each named tensor into its slot of `flat` (converting dtype)."""
        for s in self.slots:
            self._view(flat, s).copy_(tensors[s.name])

    def chunks(self, chunk_elems: int) -> list[tuple[int, int]]:
        """Contiguous [start, end) ranges of at most `chunk_elems` covering the buffer."""
        step = max(1, int(chunk_elems))
        return [(a, min(a + step, self.total)) for a in range(0, self.total, step)]

    def ranges_except(self, names) -> list[tuple[int, int]]:
        """The [start, end) ranges of the slots not in `names`, adjacent slots merged (the
        step's zeroing where the engine leaves the slots backward writes over: real/engine.py
        `_zero_grads`, measured as such by real/profile.py)."""
        ranges: list[list[int]] = []
        for s in self.slots:
            if s.name in names:
                continue
            if ranges and ranges[-1][1] == s.offset:
                ranges[-1][1] += s.numel
            else:
                ranges.append([s.offset, s.offset + s.numel])
        return [(lo, hi) for lo, hi in ranges]
