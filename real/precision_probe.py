"""Precision by measurement: bf16 on the emulated accelerator only where this CPU runs it.

A CPU without native bf16 (no AVX512-BF16 / AMX) can run bf16 matrix products of
backward many times slower than fp32 (measured 8x on an AVX2-only AMD EPYC), while one
with AMX runs them faster. `choose_precision` times forward+backward of the run's shape
in fp32 and in bf16, as the engine runs it (parameters and gradients in flat buffers with
2-D weights column by column, weight gradients accumulated in place, the device lane's
threads), and picks bf16 only where it is at
most `TOLERANCE` times slower than fp32. A bf16 pass already past its budget after one
iteration is not repeated, so a slow machine costs one slow pass, not several.

Results are cached per machine (CPU model, torch version, threads) and shape in
`$XDG_CACHE_HOME/zfbench/precision.json` (else ~/.cache), so a second run starts at once;
`ZFBENCH_CACHE_DIR` moves the cache. On CUDA the answer is bf16 without a probe.
"""
from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import torch

from zfbench.real.flat import FlatLayout
from zfbench.real.inplace_grads import InplaceGrads
from zfbench.real.model import build_model
from zfbench.core.models import ModelShape
from zfbench.core.provenance import machine

TOLERANCE = 1.1  # bf16 may be this much slower than fp32 and still be chosen
REPEATS = 3


def cache_file() -> Path:
    root = os.environ.get("ZFBENCH_CACHE_DIR")
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(base) / "zfbench")
    return Path(root) / "precision.json"


def machine_key() -> str:
    """What a cached probe answer depends on besides its shape: the CPU and torch."""
    m = machine()
    return f"{m['cpu_model']}|torch {m['torch_version']}"


def cached(key: str) -> dict | None:
    """A probe answer kept in the per-machine cache file, or None."""
    path = cache_file()
    try:
        return json.loads(path.read_text()).get(key) if path.exists() else None
    except (OSError, ValueError, AttributeError):
        return None


def remember(key: str, value: dict) -> None:
    """Add one answer to the cache file (through a rename; an unwritable cache only
    costs the probe next time)."""
    path = cache_file()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        cache = {}
    cache[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass


def _key(shape: ModelShape, batch: int, seq: int, threads: int) -> str:
    return f"{machine_key()}|{threads} threads|{shape.name}|{batch}x{seq}"


def time_forward_backward(shape: ModelShape, dtype: torch.dtype, batch: int, seq: int,
                          repeats: int = REPEATS, budget_s: float | None = None) -> float:
    """Median seconds of one forward+backward (after one warm-up pass); stops after the
    warm-up when that alone is past `budget_s`."""
    model = build_model(shape, dtype=dtype, seed=0)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in named]
    # as the engine holds them: views of flat buffers, 2-D weights column by column
    layout = FlatLayout(named, column_major=True)
    flat, flat_grads = layout.new(dtype), layout.new(dtype)
    for name, p in named:
        view = layout.view(flat, name)
        view.copy_(p.detach())
        p.data = view
        p.grad = layout.view(flat_grads, name)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape.vocab, (batch, seq + 1), generator=gen)
    mode = InplaceGrads(params)

    def once() -> float:
        start = time.perf_counter()
        with mode:
            loss = model(ids[:, :-1], ids[:, 1:])
        loss.backward()
        return time.perf_counter() - start

    first = once()
    if budget_s is not None and first > budget_s:
        return first
    return statistics.median(once() for _ in range(repeats))


def choose_precision(shape: ModelShape, batch: int, seq: int, threads: int,
                     use_cache: bool = True) -> dict:
    """{"precision", "fp32_forward_backward_s", "bf16_forward_backward_s", "cached",
    "rule"} for the emulated accelerator with `threads` device-lane threads."""
    key = _key(shape, batch, seq, threads)
    hit = cached(key) if use_cache else None
    if hit is not None:
        return {**hit, "cached": True}
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fp32 = time_forward_backward(shape, torch.float32, batch, seq)
        bf16 = time_forward_backward(shape, torch.bfloat16, batch, seq,
                                     budget_s=3 * TOLERANCE * fp32)
    finally:
        torch.set_num_threads(before)
    result = {"precision": "bf16" if bf16 <= TOLERANCE * fp32 else "fp32",
              "fp32_forward_backward_s": fp32, "bf16_forward_backward_s": bf16,
              "rule": f"bf16 when its forward+backward is at most {TOLERANCE}x fp32's"}
    if use_cache:
        remember(key, result)
    return {**result, "cached": False}
