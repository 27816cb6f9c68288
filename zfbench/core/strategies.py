"""The strategy record: which strategies exist, what each moves and where it runs AdamW.

This module owns the one record of strategies every part and command reads (the engine's
config, the simulator's settings, the figures); the engine and the simulator register
their implementations against its names in their own packages. Order matters: it is the
order of tables, CLI choices and figure legends.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Strategy:
    """What one strategy is, as the code branches on it (the defaults: ZeRO-Offload's)."""
    name: str
    label: str  # display label (figure legends)
    moves: str  # what crosses PCIe per step, in words
    # The memory model's rule (zfbench.core.memory_model; "zero3": zfbench.sims.zero3)
    memory: str
    host_grad_buffers: int | None  # fp32 gradient buffers per parameter on the host
    adamw: str = "host"  # where AdamW runs: "device", "host" or "both" (top-k on device)
    d2h: bool = True  # gradients go down to the host every step
    h2d: bool = True  # parameters come up from the host every step
    offloads_optimizer: bool = True  # optimizer state on the host (offload_optimizer cpu)
    offloads_params: bool = False  # parameters live on the host too (ZeRO-3)
    engine: bool = True  # zfbench's engine (real/) runs it; False: simulated only
    delayed: bool = False  # its host update lags one step behind (DPU)
    has_windows: bool = False  # ZenFlow's update windows (accumulate, then one host update)
    # Steps left out of a measurement: "fixed" (FIXED_SKIP_STEPS of FIXED_RUN_STEPS, the
    # delayed update's first lag) or "windows" (warm-up plus two update windows, then one
    # measured): zfbench.core.schedule.measurement_window
    measure: str = "fixed"
    # The simulator models its gradients as DeepSpeed's ZeRO-2 does from presets (buckets
    # reduce-scattered, `overlap_comm`; zfbench.sims.partitioning)
    sim_zero2: bool = True
    sim_grad_accum: bool = True  # the simulator runs it with grad_accum > 1
    # The ZeRO stage the simulator runs it at: 2, 3 (zero-infinity), or "2|3" where the
    # `zero_stage` knob chooses (ZenFlow: sims/zenflow_zero3.py on stage 3)
    sim_stages: str = "2"


STRATEGY_LIST = (
    Strategy("device", "device (no offload)", "nothing: gradients and AdamW stay on the GPU",
             "device-adam", 0, adamw="device", d2h=False, h2d=False,
             offloads_optimizer=False),
    Strategy("zero-offload", "ZeRO-Offload",
             "every step: all gradients down, all updated parameters up", "host-adam", 1),
    Strategy("zero-offload-dpu", "ZeRO-Offload + DPU",
             "every step: all gradients down, all parameters up a step late",
             "host-adam-upload-buffer", 1, delayed=True),
    Strategy("zero-infinity", "ZeRO-Infinity",
             "every step: parameters up for forward and backward, gradients down", "zero3",
             None, offloads_params=True, engine=False, sim_zero2=False, sim_stages="3"),
    Strategy("zenflow", "ZenFlow",
             "every step: the unselected gradients down; once a window: their parameters up",
             "host-adam-selected", 3, adamw="both", has_windows=True, measure="windows",
             sim_zero2=False, sim_grad_accum=False, sim_stages="2|3"),
)
STRATEGY = {s.name: s for s in STRATEGY_LIST}

# Every strategy zfbench knows, in display order: what the simulator can run.
SIM_STRATEGIES = tuple(STRATEGY)
# zero-infinity is simulated only: the real engine (real/) runs ZeRO-3 for zenflow only.
SIMULATED_ONLY = tuple(s.name for s in STRATEGY_LIST if not s.engine)
# What the real engine implements (a valid `zfbench.strategy` of a config).
ENGINE_STRATEGIES = tuple(s for s in SIM_STRATEGIES if s not in SIMULATED_ONLY)
# The engine's strategies whose optimizer lives on the host (offload_optimizer.device "cpu").
OFFLOAD_STRATEGIES = tuple(s.name for s in STRATEGY_LIST if s.engine and s.offloads_optimizer)
# DeepSpeed's ZeRO-Offload step, with and without its delayed update (DPU).
ZERO_OFFLOAD_STRATEGIES = tuple(s.name for s in STRATEGY_LIST
                                if s.sim_zero2 and s.offloads_optimizer)
# The strategy speed-ups are reported against (the paper's baseline).
BASELINE = "zero-offload"
# zfbench's engine runs its host optimizer in jobs of at least this many elements of the
# flat buffer, each chunk's parameters going up after it, and an urgent accumulation able
# to run between two (real/engine.py's default; the simulator with a profile of the engine
# cuts its host updates the same way: `engine_host_chunk_elems`).
ENGINE_HOST_CHUNK_ELEMS = 1 << 22
# ... and of this many per host-lane thread where that is more. Each chunk is one parallel
# region of the lane's threads, and what a region costs beyond its elements grows as each
# thread's share shrinks: the engine's chunk with the bf16 wire against one call over the
# whole buffer on 2 threads of a Xeon (bench/results/host_chunk_size, 96M elements, quiet):
# 0.5M elements a thread 8-12% slower, 2M 2-4%, 8M 1-2%. On one H200's 8-thread host
# the 4M chunks (0.5M a thread) ran 0.76-0.83 of AdamW alone where the wire's bytes allow
# 0.93 (NVIDIA-H200/2026-11-27/call2/contention). 2M a thread: a judgment from those
# shares; one and two threads keep 4M. `make gpu-check`'s `chunk_size` step measures it on
# a GPU's host.
ENGINE_HOST_CHUNK_ELEMS_PER_THREAD = 1 << 21


def engine_host_chunk_elems(host_threads: int) -> int:
    """Elements of the engine's host optimizer job on a host lane of `host_threads`
    threads: `ENGINE_HOST_CHUNK_ELEMS`, or `ENGINE_HOST_CHUNK_ELEMS_PER_THREAD` a thread
    where that is more."""
    return max(ENGINE_HOST_CHUNK_ELEMS,
               ENGINE_HOST_CHUNK_ELEMS_PER_THREAD * max(1, int(host_threads)))


def chunk_bounds(n: int, size: int) -> list[tuple[int, int]]:
    """[lo, hi) of consecutive chunks of `size` elements (the last shorter) over `n`."""
    size = max(1, int(size))
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def _trait(name: str, trait: str):
    s = STRATEGY.get(name)
    return None if s is None else getattr(s, trait)


def offloads(name: str) -> bool:
    """Whether `name` keeps its optimizer state on the host (False for unknown names)."""
    return bool(_trait(name, "offloads_optimizer"))


def offloads_params(name: str) -> bool:
    """Whether `name` keeps its parameters on the host too (ZeRO-3)."""
    return bool(_trait(name, "offloads_params"))


def zero_stage_chosen(name: str) -> bool:
    """Whether the simulator runs `name` at the ZeRO stage the `zero_stage` knob gives
    (ZenFlow: 2 or 3) rather than at a stage of its own."""
    return _trait(name, "sim_stages") == "2|3"


def zero_stage_of(name: str, zero_stage: int = 2) -> int:
    """The ZeRO stage the simulator runs `name` at when the `zero_stage` knob is
    `zero_stage`: the knob's for a strategy that runs at either (`zero_stage_chosen`),
    else the strategy's own (3 for zero-infinity, 2 for the rest)."""
    if zero_stage_chosen(name):
        return zero_stage
    return int(_trait(name, "sim_stages") or 2)


# Strategies the `zero_stage` knob applies to (ZenFlow), in display order.
ZERO_STAGE_STRATEGIES = tuple(s.name for s in STRATEGY_LIST if s.sim_stages == "2|3")


def delayed(name: str) -> bool:
    """Whether `name`'s host update lags a step (DPU)."""
    return bool(_trait(name, "delayed"))


def has_windows(name: str) -> bool:
    """Whether `name` updates the host in windows (ZenFlow)."""
    return bool(_trait(name, "has_windows"))


def device_adamw(name: str) -> bool:
    """Whether `name` runs all of AdamW on the device (no host update at all)."""
    return _trait(name, "adamw") == "device"


def selects_on_device(name: str) -> bool:
    """Whether `name` keeps AdamW state on the device for a selected slice (ZenFlow)."""
    return _trait(name, "adamw") == "both"


def zero_offload(name: str) -> bool:
    """Whether `name` is DeepSpeed's ZeRO-Offload step (`ZERO_OFFLOAD_STRATEGIES`)."""
    return name in ZERO_OFFLOAD_STRATEGIES


def windowed_measure(name: str) -> bool:
    """Whether `name`'s measurement leaves out its warm-up and two update windows (rule
    "windows") rather than FIXED_SKIP_STEPS (zfbench.core.schedule.measurement_window)."""
    return _trait(name, "measure") == "windows"


def windowed_of(by_name: dict):
    """The value `by_name` (keyed by strategy name) holds for the windowed strategy
    (ZenFlow), None where it has none."""
    return next((v for k, v in by_name.items() if has_windows(k)), None)


def buckets_on(precision: str, overlap_comm: bool) -> bool:
    """Whether a run's offloading strategies send their gradients bucket by bucket during
    backward (zero_optimization.overlap_comm, real/grad_buckets.py): not in fp16, whose
    gradients are still loss-scaled when backward ends."""
    return bool(overlap_comm) and precision != "fp16"


def gradient_buckets_apply(strategy: str, precision: str, overlap_comm: bool) -> bool:
    """Whether the engine sends `strategy`'s gradients in buckets (`buckets_on`, for an
    offloading strategy: the device strategy sends nothing down)."""
    return strategy in OFFLOAD_STRATEGIES and buckets_on(precision, overlap_comm)
