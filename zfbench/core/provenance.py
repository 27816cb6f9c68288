"""Where a result came from: the machine, the versions and the command that made it.

Every command that writes a summary (`run`, `simulate`, `validate`) stores
`provenance(argv)` beside its rows, so a number read back later names the CPU (model, the
ISA flags that decide its speed, cores), the memory, torch and zfbench versions, whether
the CPU runs bf16 natively, the CUDA device if any, and the exact command line.
"""
from __future__ import annotations

import datetime as dt
import os
import platform
import shlex
import sys
from functools import lru_cache

# ISA flags that change how fast the CPU-emulated accelerator and host AdamW run.
_FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16",
                      "amx_bf16", "amx_tile", "asimd", "sve", "bf16")


def cpuinfo() -> tuple[str, list[str]]:
    """The CPU's model name and its full list of ISA flags, from /proc/cpuinfo."""
    model, flags = "", []
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model") and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
                if model and flags:
                    break
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def zfbench_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("zfbench")
    except PackageNotFoundError:
        return "unknown (not installed)"


@lru_cache(maxsize=1)
def machine() -> dict:
    """The machine at hand: CPU model and speed-relevant ISA flags, cores, memory, torch
    build, native bf16 on the CPU, CUDA device (None without one)."""
    import torch

    model, flags = cpuinfo()
    try:
        bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        bf16 = None
    cuda = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu_model": model,
            "cpu_flags": [f for f in _FLAGS_OF_INTEREST if f in flags],
            "cpu_count": os.cpu_count(),
            "memory_bytes": _memory_bytes(),
            "cpu_native_bf16": bf16,
            "cuda_device": cuda,
            "torch_version": torch.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform()}


def provenance(argv: list[str] | None, prog: str) -> dict:
    """The block every summary.json carries: versions, machine, command line, date."""
    args = list(sys.argv[1:] if argv is None else argv)
    info = machine()
    return {"zfbench_version": zfbench_version(),
            "torch_version": info["torch_version"],
            "machine": info,
            "command_line": " ".join([prog] + [shlex.quote(a) for a in args]),
            "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
