"""`zero_optimization.zenflow.offload`: the device AdamW's moments kept in host memory.

ZenFlow's device AdamW (real/zenflow.py) keeps fp32 m and v for the selected columns of
every 2-D weight and for every 1-D parameter. With `offload` they live in one host buffer
instead (pinned when `offload_optimizer.pin_memory` is set) and visit the device around
each device update, bucket by bucket: h2d into a device staging buffer (`h2d_moments`),
AdamW on the bucket's parameters (`device_optim`), d2h back (`d2h_moments`). A bucket
takes parameters in order until their sizes (whole parameters, as DeepSpeed counts them)
reach `reduce_bucket_size` elements, so the device holds one bucket's moments at a time.
The numbers are those of the moments kept on the device: the same fp32 values travel.
(DeepSpeed buckets by `allgather_bucket_size`, keeps the moments in the weights' dtype
and also moves the remembered selected columns to the host: docs/zenflow.md.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MomentBucket:
    """Consecutive entries (weight names) whose moments travel together: m then v, each
    `numel` elements, at `offset` in the host buffer (2 x numel from there)."""
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
            offset += 2 * numel
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


class OffloadedMoments:
    """The host buffer of every bucket's moments and the device staging buffer that one
    bucket's moments use during its AdamW."""

    def __init__(self, backend, entries: list[tuple[str, tuple[int, ...], int]],
                 bucket_elems: int, device: torch.device, pin: bool) -> None:
        self.B = backend
        self.buckets = plan_buckets(entries, bucket_elems)
        total = 2 * sum(b.numel for b in self.buckets)
        host = (backend.pinned(total, torch.float32) if pin
                else torch.zeros(total, dtype=torch.float32))
        backend.mark_host(host)
        self.host = backend.name(host, "host.zenflow_moments")
        staging = max((2 * b.numel for b in self.buckets), default=0)
        self.staging = backend.name(torch.zeros(staging, dtype=torch.float32, device=device),
                                    "zenflow_moments_staging")
        self.m: dict[str, torch.Tensor] = {}
        self.v: dict[str, torch.Tensor] = {}
        for bucket in self.buckets:
            m, v = self._views(self.host[bucket.offset:bucket.offset + 2 * bucket.numel],
                               bucket)
            self.m.update(m)
            self.v.update(v)
        self.sent_back = None  # the event after the last d2h out of the staging buffer

    @staticmethod
    def _views(flat: torch.Tensor, bucket: MomentBucket):
        """{name: m view}, {name: v view} of one bucket's [m..., v...] span `flat`."""
        m, v, at = {}, {}, 0
        for name, shape in zip(bucket.names, bucket.shapes):
            n = int(torch.Size(shape).numel())
            m[name] = flat[at:at + n].view(shape)
            v[name] = flat[bucket.numel + at:bucket.numel + at + n].view(shape)
            at += n
        return m, v

    @property
    def host_bytes(self) -> int:
        return self.host.numel() * self.host.element_size()

    def bring_in(self, t: int, bucket: MomentBucket):
        """h2d: the bucket's moments into the staging buffer (after the last bucket's
        left it); returns the device views {name: m}, {name: v} the AdamW updates."""
        B = self.B
        span = self.staging[:2 * bucket.numel]
        B.wait("h2d", self.sent_back,
               "the moments' h2d waits until the last bucket's moments left the staging buffer")
        B.copy("h2d", "h2d_moments", t, span,
               self.host[bucket.offset:bucket.offset + 2 * bucket.numel])
        B.wait("compute", B.record("h2d"), "the device AdamW waits for its moments")
        return self._views(span, bucket)

    def send_back(self, t: int, bucket: MomentBucket) -> None:
        """d2h: the bucket's updated moments back into the host buffer, once the compute
        lane wrote them."""
        B = self.B
        B.wait("d2h", B.record("compute"), "the moments' d2h waits for the device AdamW")
        B.copy("d2h", "d2h_moments", t,
               self.host[bucket.offset:bucket.offset + 2 * bucket.numel],
               self.staging[:2 * bucket.numel])
        self.sent_back = B.record("d2h")

    def settle(self, why: str) -> None:
        """The issuing thread goes on only after the last d2h (before it reads or writes
        the host buffer itself: a reselection's zeroing, a checkpoint)."""
        self.B.wait(self.B.thread_lane(), self.sent_back, why)
