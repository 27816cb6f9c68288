"""`zero_optimization.zenflow.offload`: the device AdamW's moments kept in host memory.

ZenFlow's device AdamW (real/zenflow_device.py) keeps fp32 m and v for the selected columns of
every 2-D weight and for every 1-D parameter. With `offload` they live in one host buffer
instead (pinned when `offload_optimizer.pin_memory` is set) and visit the device around
each device update, bucket by bucket: h2d into a device staging buffer (`h2d_moments`,
its m and its v), AdamW on the bucket's parameters (`device_optim`), d2h back
(`d2h_moments`). On ZeRO-2 a bucket takes parameters in order until their sizes (whole
parameters, as DeepSpeed counts them) reach `reduce_bucket_size` elements; on ZeRO-3 (one
flat run of the shard's selected elements) it is a SIMD-aligned range of at most that
many. The device holds one bucket's moments at a time.
The numbers are those of the moments kept on the device: the same fp32 values travel.
(DeepSpeed buckets by `allgather_bucket_size`, keeps the moments in the weights' dtype
and also moves the remembered selected columns to the host: docs/zenflow.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MomentBucket:
    """A run of moments that travel together: elements [offset, offset + numel) of the
    entries laid end to end (the entries `names`, shaped `shapes`, when it holds whole
    ones); its m and v are those ranges of the host buffer's m half and v half."""
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offset: int
    numel: int


def plan_buckets(entries: list[tuple[str, tuple[int, ...], int]],
                 bucket_elems: int) -> list[MomentBucket]:
    """Buckets of (name, moment shape, parameter numel) entries, in order: a bucket closes
    once its parameters' numel reaches `bucket_elems` (DeepSpeed's rule in
    ZenFlowSelectiveAdamW's offloaded step)."""
    buckets, names, shapes, numel, counted, offset = [], [], [], 0, 0, 0

    def close() -> None:
        nonlocal names, shapes, numel, counted, offset
        if names:
            buckets.append(MomentBucket(tuple(names), tuple(shapes), offset, numel))
            offset += numel
        names, shapes, numel, counted = [], [], 0, 0

    for name, shape, param_numel in entries:
        names.append(name)
        shapes.append(tuple(shape))
        numel += int(torch.Size(shape).numel())
        counted += int(param_numel)
        if counted >= bucket_elems:
            close()
    close()
    return buckets


#: elements a ranged bucket's bounds are multiples of: whole vectors of the CPU's widest
#: SIMD (64 floats), so an AdamW over a bucket rounds each element as one over the whole
#: buffer does (torch's vector loop and its remainder loop round differently)
ALIGN = 64


def ranged_buckets(total: int, bucket_elems: int) -> list[MomentBucket]:
    """Buckets of one flat run of `total` moments: consecutive ranges of at most
    `bucket_elems` elements (rounded down to ALIGN, at least ALIGN)."""
    size = max(ALIGN, bucket_elems // ALIGN * ALIGN)
    return [MomentBucket((), (), a, min(size, total - a)) for a in range(0, total, size)]


class OffloadedMoments:
    """The host buffer of the moments (every m, then every v, entries end to end) and the
    device staging buffer that one bucket's moments use during its AdamW."""

    def __init__(self, backend, entries: list[tuple[str, tuple[int, ...], int]],
                 buckets: list[MomentBucket], device: torch.device, pin: bool) -> None:
        self.B = backend
        self.buckets = buckets
        self.total = sum(int(torch.Size(shape).numel()) for _, shape, _ in entries)
        host = (backend.pinned(2 * self.total, torch.float32) if pin
                else torch.zeros(2 * self.total, dtype=torch.float32))
        backend.mark_host(host)
        self.host = backend.name(host, "host.zenflow_moments")
        self.host_m, self.host_v = self.host[:self.total], self.host[self.total:]
        staging = max((2 * b.numel for b in self.buckets), default=0)
        self.staging = backend.name(torch.zeros(staging, dtype=torch.float32, device=device),
                                    "zenflow_moments_staging")
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        at = 0
        for name, shape, _ in entries:
            n = int(torch.Size(shape).numel())
            self.m[name] = self.host_m[at:at + n].view(shape)
            self.v[name] = self.host_v[at:at + n].view(shape)
            at += n
        self.sent_back = None  # the event after the last d2h out of the staging buffer

    @property
    def host_bytes(self) -> int:
        return self.host.numel() * self.host.element_size()

    def staged(self, bucket: MomentBucket) -> tuple[torch.Tensor, torch.Tensor]:
        """The bucket's m and v in the staging buffer, each flat (after `bring_in`)."""
        return (self.staging[:bucket.numel], self.staging[bucket.numel:2 * bucket.numel])

    def _pairs(self, bucket: MomentBucket):
        """(staging span, host span) of the bucket's m, then of its v."""
        a, b = bucket.offset, bucket.offset + bucket.numel
        m, v = self.staged(bucket)
        return ((m, self.host_m[a:b]), (v, self.host_v[a:b]))

    def bring_in(self, t: int, bucket: MomentBucket):
        """h2d: the bucket's m and v into the staging buffer (after the last bucket's left
        it); returns the device views {name: m}, {name: v} of its whole entries."""
        B = self.B
        B.wait("h2d", self.sent_back,
               "the moments' h2d waits until the last bucket's moments left the staging buffer")
        for device_span, host_span in self._pairs(bucket):
            B.copy("h2d", "h2d_moments", t, device_span, host_span)
        B.wait("compute", B.record("h2d"), "the device AdamW waits for its moments")
        m, v = self.staged(bucket)
        views_m, views_v, at = {}, {}, 0
        for name, shape in zip(bucket.names, bucket.shapes):
            n = int(torch.Size(shape).numel())
            views_m[name], views_v[name] = m[at:at + n].view(shape), v[at:at + n].view(shape)
            at += n
        return views_m, views_v

    def send_back(self, t: int, bucket: MomentBucket) -> None:
        """d2h: the bucket's updated moments back into the host buffer, once the compute
        lane wrote them."""
        B = self.B
        B.wait("d2h", B.record("compute"), "the moments' d2h waits for the device AdamW")
        for device_span, host_span in self._pairs(bucket):
            B.copy("d2h", "d2h_moments", t, host_span, device_span)
        self.sent_back = B.record("d2h")

    def settle(self, why: str) -> None:
        """The issuing thread goes on only after the last d2h (before it reads or writes
        the host buffer itself: a reselection's zeroing, a checkpoint)."""
        self.B.wait(self.B.thread_lane(), self.sent_back, why)
