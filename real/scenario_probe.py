"""The default scenario sized on the machine at hand: is host AdamW longer than compute?

ZenFlow is for the regime where the host's AdamW over every parameter takes longer than
the device's forward+backward. Whether a shape is in that regime depends on this CPU
(memory bandwidth, bf16 support, cores), so `size_scenario` measures it instead of
trusting numbers from another machine: forward+backward of each candidate shape (the
precision probe's timing, in the engine's layout) and host AdamW's rate on the host
lane's threads (over a slice of the model's size: it is memory-bound, so linear in the
parameters). It picks the first candidate whose ratio host AdamW / forward+backward is at
least `TARGET_RATIO`, else the one with the highest ratio, and says which. The answer is
cached beside the precision probe's (per CPU model, torch version, threads, shape).
"""
from __future__ import annotations

import statistics
import time

import torch

from zfbench.real.host_adam import host_adamw_
from zfbench.real.precision_probe import cached, choose_precision, machine_key, remember
from zfbench.real.rate_probe import in_thread
from zfbench.core.models import ModelShape

TARGET_RATIO = 1.3  # host AdamW alone at least this many times forward+backward
SLICE_PARAMS = 1 << 25  # host AdamW is timed on at most this many parameters


def host_adam_params_per_s(params: int, threads: int, repeats: int = 3) -> float:
    """Host AdamW's rate (parameters/s) on `threads` threads, over min(params, slice)."""
    n = int(min(params, SLICE_PARAMS))

    def run() -> float:
        master, grad = torch.randn(n), torch.randn(n) * 1e-3
        m, v = torch.zeros(n), torch.zeros(n)

        def once() -> float:
            start = time.perf_counter()
            host_adamw_(master, grad, m, v, step=1, lr=1e-4, beta1=0.9, beta2=0.999,
                        eps=1e-8, weight_decay=0.01)
            return time.perf_counter() - start
        once()  # first touch of the pages
        return statistics.median(once() for _ in range(repeats))
    return n / in_thread(run, threads)


def size_scenario(candidates: list[tuple[ModelShape, int, int]], device_threads: int,
                  host_threads: int, precision: str | None = None,
                  use_cache: bool = True) -> dict:
    """Choose (shape, batch, seq) from `candidates`, in order, by the measured ratio.

    `precision` None: measured per candidate too (zfbench.real.precision_probe). Returns the
    chosen index and shape, precision, the ratio and each candidate's measurements."""
    key = "scenario|" + "|".join(f"{s.name}:{b}x{q}" for s, b, q in candidates) + \
        f"|{precision}|{device_threads}+{host_threads}|{machine_key()}"
    hit = cached(key) if use_cache else None
    if hit is not None:
        return {**hit, "cached": True}
    rate = host_adam_params_per_s(max(s.total_params for s, _, _ in candidates),
                                  host_threads)
    tried = []
    for i, (shape, batch, seq) in enumerate(candidates):
        probe = choose_precision(shape, batch, seq, device_threads, use_cache=use_cache)
        chosen = precision or probe["precision"]
        fwd_bwd = probe[f"{chosen}_forward_backward_s"]
        adam = shape.total_params / rate
        tried.append({"index": i, "shape": shape.name, "batch": batch, "seq": seq,
                      "precision": chosen, "forward_backward_s": fwd_bwd,
                      "host_adam_s": adam, "ratio": adam / fwd_bwd})
        if adam / fwd_bwd >= TARGET_RATIO:
            break
    best = next((t for t in tried if t["ratio"] >= TARGET_RATIO),
                max(tried, key=lambda t: t["ratio"]))
    result = {**best, "host_adam_params_per_s": rate, "target_ratio": TARGET_RATIO,
              "in_regime": best["ratio"] >= TARGET_RATIO, "candidates": tried}
    if use_cache:
        remember(key, result)
    return {**result, "cached": False}
