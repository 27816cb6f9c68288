"""The hazard checker: does the engine's schedule order every cross-lane access?

On a GPU the engine's work runs on five lanes that do not wait for one another unless
told to: two CPU threads (`main`, the Python thread that issues everything, and `host`,
the host worker) and three CUDA streams (`compute`, `d2h`, `h2d`). A buffer written on one
lane and read (or overwritten) on another is safe only when the second access is ordered
after the first by a chain of waits. The CPU-emulated lanes run the same schedule in an
order that hides a missing wait, so this module checks the schedule itself, whatever the
order it happened to run in.

It is a vector-clock race detector (happens-before, as in FastTrack):
- every lane has a clock: how many ops of every lane it is ordered after;
- an op on a stream is ordered after what its issuing thread did before it (`enqueue`):
  a copy enqueued after the thread wrote its source sees that write;
- `record(lane)` snapshots the lane's clock into an event; `wait(lane, event)` joins it
  (a stream wait on an event, or a thread blocking on it or on a host job);
- every access to a tensor is a byte range of its storage, stamped with the lane and the
  lane's own count. A read must be ordered after the last overlapping write from another
  lane; a write, after that write and after every overlapping read since.
Each failure is a `Hazard` naming both accesses (lane, op, buffer); `checked` counts the
accesses compared against another lane's earlier access.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

THREAD_LANES = ("main", "host")
STREAM_LANES = ("compute", "d2h", "h2d")
LANES = THREAD_LANES + STREAM_LANES


@dataclass(frozen=True)
class Hazard:
    """One unordered pair of accesses to overlapping bytes of one buffer."""
    kind: str  # "read-after-write", "write-after-write" or "write-after-read"
    buffer: str
    lane: str
    op: str
    earlier_lane: str
    earlier_op: str

    def __str__(self) -> str:
        return (f"{self.kind} on {self.buffer}: {self.lane}/{self.op} is not ordered after "
                f"{self.earlier_lane}/{self.earlier_op} (a wait is missing)")


@dataclass
class _Access:
    write: bool
    lo: int
    hi: int
    lane: str
    stamp: int
    op: str


@dataclass
class _Buffer:
    name: str
    accesses: list[_Access] = field(default_factory=list)


def region(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage address, first byte, end byte) of what `tensor` can touch in its storage
    (a strided view covers from its first to its last element)."""
    if tensor.numel() == 0:
        return None
    size = tensor.element_size()
    first = tensor.storage_offset()
    last = first + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.untyped_storage().data_ptr(), first * size, (last + 1) * size


class HazardChecker:
    def __init__(self) -> None:
        self.clock = {lane: {other: 0 for other in LANES} for lane in LANES}
        self.buffers: dict[int, _Buffer] = {}
        self.names: dict[int, str] = {}
        self.hazards: list[Hazard] = []
        self.checked = 0
        self.accesses = 0
        self._lock = threading.RLock()

    def name(self, tensor: torch.Tensor, name: str) -> None:
        """Name a buffer in reports (its whole storage)."""
        if tensor.numel():
            self.names[tensor.untyped_storage().data_ptr()] = name

    def _join(self, lane: str, clock: dict[str, int]) -> None:
        mine = self.clock[lane]
        for other, count in clock.items():
            if count > mine[other]:
                mine[other] = count

    def enqueue(self, issuer: str, lane: str) -> None:
        """`lane` (a stream) takes work from thread `issuer`: ordered after its past."""
        if issuer != lane:
            with self._lock:
                self._join(lane, self.clock[issuer])

    def snapshot(self, lane: str) -> dict[str, int]:
        with self._lock:
            return dict(self.clock[lane])

    def join(self, lane: str, clock: dict[str, int] | None) -> None:
        if clock is not None:
            with self._lock:
                self._join(lane, clock)

    def access(self, lane: str, op: str, reads=(), writes=()) -> None:
        """Check and record one op of `lane` reading `reads` and writing `writes`."""
        with self._lock:
            seen = self.clock[lane]
            stamp = seen[lane]
            for tensor in reads:
                self._touch(lane, op, tensor, False, seen, stamp)
            for tensor in writes:
                self._touch(lane, op, tensor, True, seen, stamp)
            seen[lane] = stamp + 1

    def _touch(self, lane, op, tensor, write, seen, stamp) -> None:
        where = region(tensor)
        if where is None:
            return
        base, lo, hi = where
        buf = self.buffers.get(base)
        if buf is None:
            buf = self.buffers[base] = _Buffer(self.names.get(base, f"buffer@{base:#x}"))
        self.accesses += 1
        keep = []
        for prior in buf.accesses:
            overlaps = prior.lo < hi and lo < prior.hi
            if overlaps and (prior.write or write) and prior.lane != lane:
                self.checked += 1
                if seen[prior.lane] <= prior.stamp:
                    kind = ("write-after-write" if write else "read-after-write") \
                        if prior.write else "write-after-read"
                    self.hazards.append(Hazard(kind, buf.name, lane, op, prior.lane,
                                               prior.op))
            # a write that covers an earlier access (ordered or not) supersedes it
            if not (write and lo <= prior.lo and prior.hi <= hi):
                if not (not write and not prior.write and prior.lane == lane
                        and (prior.lo, prior.hi) == (lo, hi)):
                    keep.append(prior)
        keep.append(_Access(write, lo, hi, lane, stamp, op))
        buf.accesses = keep

    def report(self) -> dict:
        """Counts for a summary: accesses, cross-lane pairs checked, hazards found."""
        distinct = sorted({str(h) for h in self.hazards})
        return {"accesses": self.accesses, "cross_lane_checked": self.checked,
                "hazards": len(self.hazards), "distinct": distinct}
