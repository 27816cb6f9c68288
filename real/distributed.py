"""Data parallel over torch.distributed, ZeRO-2 style: what one rank needs to know and do.

A `DistContext` is the rank's view of the process group: rank, world size, local rank,
the backend (NCCL with CUDA, gloo without), and this rank's contiguous shard
`[lo, hi)` of the engine's flat parameter buffer. Shards are equal (ceil(total / world))
except the last, so the parameter all-gather runs on padded, equal-sized pieces.

The collectives, each recorded as a `net` span whose `bytes` is the payload the rank
contributes to the collective (the tensor it reduces, or the gathered output's size):
- `allreduce_grads`: the flat gradient buffer, averaged over ranks (op `allreduce`);
- `allgather_shards`: every rank's updated shard into a full flat buffer (op `allgather`);
- `allreduce_scores` / `allgather_grads`: ZenFlow's selection exchange (per-column score
  vectors, or the full gradient), see real/zenflow.py.
Host-lane collectives (the global gradient norm for clipping) run in the host worker
thread, so they use a second, gloo-only group: each group keeps its own order, and the
host worker's sequence of jobs is the same on every rank.

`init_from_env` is what both launch paths call: torchrun (or `python -m zfbench.run
--gpus N`, which uses torch's elastic launcher) sets RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT; the process group gets a timeout, so a peer that died makes
the others fail with an error instead of waiting forever.
"""

from __future__ import annotations

import atexit
import gc
import datetime
import os
import socket
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from zfbench.core.config_zenflow import split_cores

DEFAULT_TIMEOUT_S = 120.0


class DistributedError(RuntimeError):
    """A collective failed (a peer died or timed out); names the rank and the op."""


@dataclass
class DistContext:
    rank: int
    world: int
    local_rank: int
    backend: str
    group: object = None  # the default group (main thread collectives)
    host_group: object = None  # gloo group for the host worker thread
    lo: int = 0
    hi: int = 0
    shard: int = 0  # padded shard size: world * shard >= total
    peers: list | None = None  # every rank's (host name, process id), gathered at join

    @property
    def active(self) -> bool:
        return self.world > 1

    def set_total(self, total: int) -> None:
        self.shard = -(-total // self.world)
        self.lo = min(total, self.rank * self.shard)
        self.hi = min(total, self.lo + self.shard)


def env_world() -> tuple[int, int, int] | None:
    """(rank, world, local_rank) from torchrun's variables, or None outside a launch."""
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return None
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return rank, world, int(os.environ.get("LOCAL_RANK", rank))


def init_from_env(use_cuda: bool, timeout_s: float = DEFAULT_TIMEOUT_S) -> DistContext:
    """Join (or create) the process group of this launch; a 1-rank context without one."""
    found = env_world()
    if found is None or found[1] == 1:
        return DistContext(0, 1, 0, "none")
    rank, world, local = found
    backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local)
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout)
        # the group is ours: take it down before the interpreter's teardown, where gloo's
        # threads, still joinable, abort the process ("terminate called without an
        # active exception") in a script that never calls destroy_process_group
        atexit.register(shutdown)
    host_group = dist.new_group(backend="gloo", timeout=timeout)
    return _with_peers(DistContext(rank, world, local, backend, dist.group.WORLD, host_group))


def from_process_group() -> DistContext:
    """A context on an already initialized default group (tests, embedding users)."""
    if not dist.is_initialized():
        return DistContext(0, 1, 0, "none")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    backend = dist.get_backend()
    host_group = dist.new_group(backend="gloo") if world > 1 else None
    return _with_peers(DistContext(rank, world, local, str(backend), dist.group.WORLD,
                                   host_group))


def _with_peers(ctx: DistContext) -> DistContext:
    """`ctx` knowing every rank's host and process id, so that a failed collective can
    name the rank that died (`dead_ranks`)."""
    if ctx.world > 1:
        peers: list = [None] * ctx.world
        dist.all_gather_object(peers, (socket.gethostname(), os.getpid()), group=ctx.group)
        ctx.peers = peers
    return ctx


def dead_ranks(ctx: DistContext) -> list[int]:
    """The ranks known to have died: those on this host whose process is gone (a rank on
    another host cannot be looked at from here)."""
    if not ctx.peers:
        return []
    here = socket.gethostname()
    mine = [(rank, pid) for rank, (host, pid) in enumerate(ctx.peers)
            if rank != ctx.rank and host == here]
    for _ in range(10):  # a peer's socket closes as it exits: give the exit a moment
        gone = [rank for rank, pid in mine if not _alive(pid)]
        if gone:
            return gone
        time.sleep(0.1)
    return []


def _alive(pid: int) -> bool:
    """Whether process `pid` runs (an exited child its parent has not reaped yet, a
    zombie, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def join_launch(use_cuda: bool) -> DistContext:
    """The data-parallel context `zfbench.real.initialize` runs in, found as DeepSpeed
    finds its own: the initialized default group of a script that called
    `init_process_group` (torchrun's usual script), else torchrun's variables (the group
    is created from them), else one rank."""
    if dist.is_available() and dist.is_initialized():
        return from_process_group()
    return init_from_env(use_cuda)


def broadcast_from_rank0(ctx: DistContext, tensor: torch.Tensor) -> None:
    """Every rank's `tensor` becomes rank 0's (replicas that were built apart start
    equal, as DeepSpeed broadcasts the model at initialize)."""
    _run(ctx, "broadcast", lambda: dist.broadcast(tensor, src=0, group=ctx.group))


def barrier(ctx: DistContext, op: str) -> None:
    """Every rank has reached this point (`op` names it in the error if one never does)."""
    _run(ctx, op, lambda: dist.barrier(group=ctx.group))


def shutdown() -> None:
    """Take this process's groups down while the interpreter is whole: destroy them, then
    collect the garbage that still holds them (engine objects in reference cycles), so
    gloo's objects die now rather than in the interpreter's teardown, where a rank could
    abort after all its work ("terminate called without an active exception"). Resumed
    two-rank zero-offload-dpu runs of tests/checkpoint_worker.py on 2 cores (session 12):
    2 of 80 launches aborted with the destroy alone, 0 of 120 with the collection."""
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def _run(ctx: DistContext, op: str, fn):
    try:
        return fn()
    except RuntimeError as err:  # gloo / NCCL: a peer closed its connection or timed out
        gone = dead_ranks(ctx)
        who = (f"rank {', '.join(map(str, gone))} died" if gone else
               "another rank died or timed out")
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise DistributedError(f"rank {ctx.rank}/{ctx.world}: collective {op} failed: {who}"
                               f" ({first_line})") from err


def run_collective(ctx: DistContext, op: str, fn):
    """`fn()` (a collective named `op`), a failure reported as a `DistributedError`."""
    return _run(ctx, op, fn)


def allreduce_mean_(ctx: DistContext, tensor: torch.Tensor) -> None:
    _run(ctx, "allreduce", lambda: dist.all_reduce(tensor, group=ctx.group))
    tensor.div_(ctx.world)


def allreduce_sum_(ctx: DistContext, tensor: torch.Tensor, host: bool = False) -> None:
    group = ctx.host_group if host else ctx.group
    _run(ctx, "allreduce", lambda: dist.all_reduce(tensor, group=group))


def allgather_flat(ctx: DistContext, target: torch.Tensor, src: torch.Tensor | None = None
                   ) -> None:
    """Every rank's shard [lo, hi) of `src` (default `target`) into the whole `target`."""
    src = target if src is None else src
    total = target.numel()
    piece = torch.zeros(ctx.shard, dtype=src.dtype, device=src.device)
    piece[:ctx.hi - ctx.lo].copy_(src[ctx.lo:ctx.hi])
    out = torch.empty(ctx.shard * ctx.world, dtype=src.dtype, device=src.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    _run(ctx, "allgather", lambda: gather(out, piece, group=ctx.group))
    target.copy_(out[:total])


def gather_timeline(ctx: DistContext, timeline):
    """Every rank's spans and steps in one Timeline on every rank (all_gather_object)."""
    from zfbench.core.trace import Timeline

    parts: list = [None] * ctx.world
    mine = (list(timeline._spans), list(timeline._steps))
    _run(ctx, "allgather", lambda: dist.all_gather_object(parts, mine, group=ctx.group))
    merged = Timeline(timeline.source, timeline.meta)
    for spans, steps in parts:
        merged.extend(spans)
        for rank, step, t0, t1 in steps:
            merged.mark_step(rank, step, t0, t1)
    return merged


def default_thread_split(cores: int | None = None, reserved: float = 0.5
                         ) -> tuple[int, int]:
    """(device_threads, host_threads): the cores split between the device (training) lane
    and the host lane by DeepSpeed's rule for ZenFlow's pt_reserved_cores_perc
    (deepspeed/runtime/zenflow/zenflow_utils.py, `_compute_zf_pt_affinity`): the device
    lane gets ceil(reserved x cores), the host lane the rest; where that leaves either
    side none (reserved 0, reserved 1, or one core) both use all the cores. 0.5 is an
    even split (the larger half to the device lane on an odd count)."""
    return split_cores(cores or os.cpu_count() or 2, reserved)


def rank_threads(world: int, cores: int | None = None, reserved: float = 0.5
                 ) -> tuple[int, int]:
    """(device_threads, host_threads) per rank: the cores split evenly among the ranks,
    then each rank's share split between its device lane (a `reserved` share: ZenFlow's
    pt_reserved_cores_perc) and host lane, at least 1 each."""
    if cores is None:
        cores = available_cores()
    return default_thread_split(max(2, cores // max(1, world)), reserved)


def lane_threads(reserved: float | None, cuda: bool, world: int = 1, active: bool = False,
                 cores: int | None = None) -> tuple[int, int]:
    """(device_threads, host_threads) of one rank's engine, as DeepSpeed gives its host
    step the cores. `reserved` is ZenFlow's pt_reserved_cores_perc (None: another
    strategy). On the CPU lanes the rank's cores are the emulated device's and the host's
    together, split by `reserved` (an even split for the other strategies). On a GPU the
    device lane is a thread that launches kernels: ZenFlow's host work gets the cores
    pt_reserved_cores_perc leaves (DeepSpeed pins its optimizer process to them,
    runtime/zenflow/zenflow_utils.py), and every other strategy's host step all of the
    rank's cores, as DeepSpeed's CPU-Adam runs OpenMP over the process's cores
    (`host_threads_by_strategy` says the same to the rate probe)."""
    # the rank's cores, as rank_threads and default_thread_split count them
    total = (max(2, (cores or available_cores()) // max(1, world)) if active
             else cores or os.cpu_count() or 2)
    if cuda and reserved is None:
        return total, total
    return split_cores(total, 0.5 if reserved is None else reserved)


def host_threads_by_strategy(reserved: float, world: int = 1, active: bool = False,
                             cores: int | None = None) -> dict[str, int]:
    """The host threads each engine strategy with host work runs on a GPU
    (`lane_threads`; ZenFlow at `reserved`, its default 0.5 where a profile measures)."""
    from zfbench.core.strategies import OFFLOAD_STRATEGIES, has_windows

    return {name: lane_threads(reserved if has_windows(name) else None, True, world,
                               active, cores)[1] for name in OFFLOAD_STRATEGIES}


def available_cores() -> int:
    """The cores this process may run on (its affinity), else the machine's count."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 2


def bind_cores(rank: int, world: int) -> list[int] | None:
    """Pin this rank to its own contiguous block of the allowed cores (as DeepSpeed's
    launcher does with numactl), when there are at least as many cores as ranks."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    per = len(allowed) // world
    if per < 1:
        return None
    mine = allowed[rank * per:(rank + 1) * per]
    os.sched_setaffinity(0, mine)
    return mine


def selection_bytes(shape, elem_bytes: int = 2, score_bytes: int = 4) -> dict:
    """Bytes one rank moves per selection for a named shape (zfbench.core.models): the score
    all-reduce (`score_bytes` x cols per 2-D weight) against the all-gather of the full
    gradient (rows x cols x `elem_bytes`); the ratio is rows-weighted (the reference:
    the all-gather moves `rows` times more bytes per weight when elem == score bytes)."""
    mats = shape.matrices()
    scores = sum(score_bytes * m.cols for m in mats)
    gather = sum(elem_bytes * m.rows * m.cols for m in mats)
    return {"model": shape.name, "matrices": len(mats), "scores_bytes": scores,
            "allgather_bytes": gather, "allgather_over_scores": gather / scores}
