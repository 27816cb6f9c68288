"""Memory the engine will need, estimated before anything is allocated, and the refusal.

`estimate(shape, strategy, ...)` counts the engine's own buffers (flat parameters and
gradients, device optimizer state, upload buffer, host fp32 master, moments and gradient
buffers) plus activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models": s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit; doubled for
fp32). `check_fits` compares it with what the machine has (CUDA free memory, host
MemAvailable; on the emulated accelerator both live in the same RAM) and raises
`InsufficientMemoryError` naming needed vs available and the `--layers` that would fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from zfbench.models import ModelShape
from zfbench.schedule import topk_count

GIB = 2 ** 30
# Framework overhead, allocator slack and the Python process itself (judgment: torch's
# CPU allocator and autograd's temporaries measured at 1.1-1.4x of the counted buffers
# for the shapes this engine runs; keep 30 % headroom).
HEADROOM = 1.3


class InsufficientMemoryError(MemoryError):
    """The run cannot fit; the message says by how much and what would fit."""


@dataclass(frozen=True)
class MemoryEstimate:
    device_bytes: float
    host_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.device_bytes + self.host_bytes


def activation_bytes(shape: ModelShape, batch: int, seq: int, elem_bytes: int) -> float:
    h, a = shape.hidden, shape.heads
    per_layer = seq * batch * h * (34 + 5 * a * seq / h) * (elem_bytes / 2)
    logits = batch * seq * shape.vocab * 4 * 3  # fp32 logits, their softmax and grad
    return shape.layers * per_layer + logits


def estimate(shape: ModelShape, strategy: str, batch: int, seq: int, elem_bytes: int = 4,
             topk_ratio: float = 0.1) -> MemoryEstimate:
    p = shape.total_params
    device = 2 * p * elem_bytes + activation_bytes(shape, batch, seq, elem_bytes)
    host = 0.0
    if strategy == "device":  # m, v, scratch; fp32 master and gradient copies if not fp32
        device += 12 * p + (8 * p if elem_bytes != 4 else 0)
    elif strategy in ("zero-offload", "zero-offload-dpu"):
        host += 16 * p
        if strategy == "zero-offload-dpu":
            device += p * elem_bytes
    elif strategy == "zenflow":
        selected = sum(m.rows * topk_count(m.cols, topk_ratio) for m in shape.matrices())
        selected += sum(v.numel for v in shape.vectors())
        # upload buffer; per selected element fp32 values, gradient, scratch, m, v and a
        # low-precision staging copy
        device += p * elem_bytes + (20 + elem_bytes) * selected
        host += 24 * p  # master, m, v, staging and two window buffers (fp32)
    else:
        raise ValueError(f"unknown strategy {strategy!r}")
    return MemoryEstimate(device * HEADROOM, host * HEADROOM)


def available_host_bytes() -> float:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def available_device_bytes(use_cuda: bool) -> float | None:
    if not use_cuda:
        return None
    import torch

    free, _total = torch.cuda.mem_get_info()
    return float(free)


def check_fits(shape: ModelShape, strategies: list[str], batch: int, seq: int,
               elem_bytes: int, use_cuda: bool, topk_ratio: float = 0.1,
               host_bytes: float | None = None, device_bytes: float | None = None) -> None:
    """Raise `InsufficientMemoryError` unless every strategy fits (they run one by one)."""
    host_avail = available_host_bytes() if host_bytes is None else host_bytes
    dev_avail = available_device_bytes(use_cuda) if device_bytes is None else device_bytes

    def fits(s: ModelShape) -> bool:
        for strategy in strategies:
            need = estimate(s, strategy, batch, seq, elem_bytes, topk_ratio)
            if dev_avail is None:  # emulated accelerator: one pool of RAM
                if need.total_bytes > host_avail:
                    return False
            elif need.device_bytes > dev_avail or need.host_bytes > host_avail:
                return False
        return True

    if fits(shape):
        return
    worst = max((estimate(shape, s, batch, seq, elem_bytes, topk_ratio) for s in strategies),
                key=lambda m: m.total_bytes)
    fitting = [n for n in range(shape.layers, 0, -1) if fits(shape.with_layers(n))]
    where = ("device %.1f GiB needed, %.1f GiB free; host %.1f GiB needed, %.1f GiB "
             "available" % (worst.device_bytes / GIB, dev_avail / GIB, worst.host_bytes / GIB,
                            host_avail / GIB)) if dev_avail is not None else \
        ("%.1f GiB needed (device and host share this machine's RAM), %.1f GiB "
         "available" % (worst.total_bytes / GIB, host_avail / GIB))
    hint = (f"--layers {fitting[0]} would fit" if fitting else
            "not even one layer fits: use a smaller --batch/--seq or a smaller model")
    raise InsufficientMemoryError(f"{shape.name} with {', '.join(strategies)} does not fit: "
                                  f"{where}. {hint}.")
