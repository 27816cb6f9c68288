"""What bench/ds_wallclock.py observes around DeepSpeed's steps, apart from the steps
themselves: the machine (CPU model, ISA flags, cores, memory), CPU accounting over a step
(`cpu_sample`: busy CPU seconds of the machine, our threads' CPU seconds and run-queue
wait, from /proc), and DeepSpeed's own output (`capture_deepspeed`: its prints and its
logger's records into the run's log file, kept per step; `parse_timers`: the
`time (ms) | name: value | ...` lines that `wall_clock_breakdown` prints, in seconds).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
             "amx_tile", "amx_bf16", "amx_int8")
TIMER_LINE = re.compile(r"time \(ms\)\s*\|(.*)$")


# ------------------------------------------------------------------ machine
def machine() -> dict:
    import torch

    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    info = {k.strip(): v.strip() for k, _, v in
            (line.partition(":") for line in text.splitlines()) if v}
    flags = set(info.get("Flags", "").split())
    return {"cpu_model": info.get("Model name"), "sockets": info.get("Socket(s)"),
            "cores_per_socket": info.get("Core(s) per socket"),
            "threads_per_core": info.get("Thread(s) per core"), "cpus": os.cpu_count(),
            "cores": len(os.sched_getaffinity(0)),
            "l3": info.get("L3 cache"), "hypervisor": info.get("Hypervisor vendor"),
            "isa": {f: f in flags for f in ISA_FLAGS}, "torch_threads": torch.get_num_threads(),
            "torch_config_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                   / 2**30, 1)}


def cpu_sample(pids=()) -> tuple[float, float, float]:
    """(busy CPU s of the machine, CPU s of our threads, s our threads sat runnable on a
    run queue): over a step, busy - own is what other processes took meanwhile, and the
    run-queue wait of this process and `pids` (/proc/PID/task/*/schedstat) what they cost us."""
    with open("/proc/stat") as f:
        user, nice, system, _, _, irq, softirq = (int(x) for x in f.readline().split()[1:8])
    own = wait = 0
    for pid in (os.getpid(), *pids):
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError):
                run_ns, wait_ns, _ = stat.read_text().split()
                own, wait = own + int(run_ns), wait + int(wait_ns)
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK"), own / 1e9, wait / 1e9


# ------------------------------------------------------------------ capture
class Capture(io.TextIOBase):
    """stdout replacement: every line DeepSpeed prints goes to the log file as printed,
    and is also kept in `pending` for the step being run (and echoed if asked)."""

    def __init__(self, path: Path, echo: bool):
        self.file, self.echo, self.buf, self.pending = open(path, "w"), echo, "", []

    def write(self, s: str) -> int:
        self.file.write(s)
        if self.echo:
            sys.__stdout__.write(s)
        self.buf += s
        *lines, self.buf = self.buf.split("\n")
        self.pending += lines
        return len(s)

    def take(self) -> list[str]:
        self.file.flush()
        out, self.pending = self.pending, []
        return out


@contextlib.contextmanager
def capture_deepspeed(path: Path, echo: bool):
    """DeepSpeed's prints and its logger's INFO records into `path`; its own stdout
    handler is muted meanwhile (restored after)."""
    from deepspeed.utils import logger

    cap = Capture(path, echo)
    handler = logging.StreamHandler(cap)
    handler.setFormatter(logger.handlers[0].formatter if logger.handlers else None)
    saved = (logger.level, [(h, h.level) for h in logger.handlers])
    for h in logger.handlers:
        h.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stdout(cap):
            yield cap
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        for h, level in saved[1]:
            h.setLevel(level)
        cap.file.close()


def parse_timers(lines: list[str]) -> dict:
    """All `time (ms) | name: value | ...` fields of these lines, in seconds."""
    fields = [f.partition(":") for m in map(TIMER_LINE.search, lines) if m
              for f in m.group(1).split("|")]
    return {k.strip(): float(v) / 1e3 for k, sep, v in fields if sep}
