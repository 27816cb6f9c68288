"""Flat host buffers: one contiguous fp32 tensor per kind of state, with a view per parameter.

The host side of every offloading strategy keeps its fp32 master weights, Adam moments and
gradient buffers as single flat tensors (fast kernels, one allocation, pinned on CUDA),
addressed per parameter through views. `FlatLayout` knows where each parameter lives and
how to cut the buffer into contiguous chunks for the host optimizer; `LOW_PRECISION` maps
a config precision to the device buffers' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# the device weights' and gradients' dtype per config precision (fp32 otherwise)
LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def device_dtype(precision: str) -> torch.dtype:
    return LOW_PRECISION.get(precision, torch.float32)


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


class FlatLayout:
    def __init__(self, named_params: list[tuple[str, torch.Tensor]]) -> None:
        self.slots: list[Slot] = []
        offset = 0
        for name, p in named_params:
            self.slots.append(Slot(name, tuple(p.shape), offset, p.numel()))
            offset += p.numel()
        self.total = offset
        self.by_name = {s.name: s for s in self.slots}

    def new(self, dtype=torch.float32, pin: bool = False) -> torch.Tensor:
        buf = torch.zeros(self.total, dtype=dtype)
        return buf.pin_memory() if pin else buf

    def view(self, flat: torch.Tensor, name: str) -> torch.Tensor:
        s = self.by_name[name]
        return flat[s.offset:s.offset + s.numel].view(s.shape)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {s.name: flat[s.offset:s.offset + s.numel].view(s.shape) for s in self.slots}

    def gather(self, flat: torch.Tensor, tensors: dict[str, torch.Tensor]) -> None:
        """Copy each named tensor into its slot of `flat` (converting dtype)."""
        for s in self.slots:
            flat[s.offset:s.offset + s.numel].view(s.shape).copy_(tensors[s.name])

    def chunks(self, chunk_elems: int) -> list[tuple[int, int]]:
        """Contiguous [start, end) ranges of at most `chunk_elems` covering the buffer."""
        step = max(1, int(chunk_elems))
        return [(a, min(a + step, self.total)) for a in range(0, self.total, step)]
