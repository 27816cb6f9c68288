"""Gradients sent down in buckets during backward (DeepSpeed's `overlap_comm`).

Backward produces gradients roughly from the last parameter to the first. With
`zero_optimization.overlap_comm` the engine cuts its flat gradient buffer into buckets of
about `reduce_bucket_size` elements along the parameters' order, from the end, and as soon
as every parameter of a bucket has its gradient the bucket's d2h copy is queued on the d2h
lane (after an event on the compute lane), so the link works while backward goes on; what
is not sent when backward returns is sent then. A parameter's gradient is complete when
every contribution has been added (autograd's post-accumulate hook, and `InplaceGrads`,
real/inplace_grads.py, for what it writes straight into the buffer, having counted the
contributions in the forward), so a bucket is never sent early; late is only less overlap.

With several ranks each bucket is first all-reduced, then the part inside this rank's
shard goes down (ZeRO-2); every rank must issue the same collectives in the same order, so
there a bucket is sent only after every bucket before it. Used in bf16 or fp32 by every
offloading strategy (`zfbench.core.strategies.gradient_buckets_apply`): each names a host
buffer free to be written during backward (`grads_landing`); zero-offload-dpu alternates
two, since its pending host step still reads the previous step's gradients.
"""

from __future__ import annotations

import torch


class GradBuckets:
    def __init__(self, engine, bucket_elems: int) -> None:
        self.e = engine
        self.buckets: list[tuple[int, int, list[int]]] = []  # (lo, hi, param ids)
        self.bucket_of: dict[int, int] = {}
        params = {slot.name: p for slot, (_, p) in zip(engine.layout.slots,
                                                       engine.named_params)}
        lo = hi = None
        ids: list[int] = []
        for slot in sorted(engine.layout.slots, key=lambda s: -s.offset):
            if hi is not None and hi - slot.offset > bucket_elems and ids:
                self.buckets.append((lo, hi, ids))
                hi, ids = None, []
            hi = slot.offset + slot.numel if hi is None else hi
            lo = slot.offset
            ids.append(id(params[slot.name]))
        if ids:
            self.buckets.append((lo, hi, ids))
        for index, (_, _, members) in enumerate(self.buckets):
            for pid in members:
                self.bucket_of[pid] = index
        self.hooks = [p.register_post_accumulate_grad_hook(self._autograd_done)
                      for _, p in engine.named_params]
        self.armed = False

    @staticmethod
    def expected(inplace_grads) -> dict[int, int]:
        """How many reports complete each parameter's gradient in this backward: its
        routed uses plus one for autograd's hook when other ops used it (parameters not
        seen in the forward wait for the end of backward); {} without InplaceGrads."""
        if inplace_grads is None:
            return {}
        counts = {pid: n + (pid in inplace_grads.plain)
                  for pid, n in inplace_grads.uses.items()}
        for pid in inplace_grads.plain:
            counts.setdefault(pid, 1)
        return counts

    def arm(self, t: int, landing: torch.Tensor, expected: dict[int, int]) -> None:
        """Before a backward at an accumulation boundary: send into `landing` (the host
        buffer of the shard), each parameter complete after `expected[id]` reports."""
        self.t, self.landing, self.armed = t, landing, True
        self.left = dict(expected)
        self.waiting = [sum(1 for pid in ids if self.left.get(pid, 1) > 0)
                        for _, _, ids in self.buckets]
        self.sent = [False] * len(self.buckets)
        self.next = 0  # several ranks: the first bucket not yet sent
        for index, count in enumerate(self.waiting):
            if count == 0:
                self._ready(index)

    def _autograd_done(self, param: torch.Tensor) -> None:
        self.contributed(param)

    def contributed(self, param: torch.Tensor) -> None:
        """One contribution to `param`'s gradient has been added."""
        if not self.armed:
            return
        pid = id(param)
        left = self.left.get(pid, 1) - 1
        self.left[pid] = left
        if left == 0:
            index = self.bucket_of[pid]
            self.waiting[index] -= 1
            if self.waiting[index] == 0:
                self._ready(index)

    def _ready(self, index: int) -> None:
        """Bucket `index` is complete: send it, or (several ranks) every bucket up to the
        first one still incomplete, in order."""
        if not self.e.dist.active:
            self._send(index)
            return
        while self.next < len(self.buckets) and self.waiting[self.next] == 0:
            self._send(self.next)
            self.next += 1

    def _send(self, index: int) -> None:
        if self.sent[index]:
            return
        self.sent[index] = True
        e, B = self.e, self.e.backend
        lo, hi, _ = self.buckets[index]
        if e.dist.active:
            e.reduce_grads(self.t, lo, hi)
        a, b = max(lo, e.shard_lo), min(hi, e.shard_hi)  # this rank's part of it
        if a >= b:
            return
        B.wait("d2h", B.record("compute"), "a bucket's d2h waits for its gradients")
        B.copy("d2h", "d2h_grad", self.t, self.landing[a - e.shard_lo:b - e.shard_lo],
               e.flat_grads[a:b])

    def finish(self):
        """After backward: send what is left; the d2h event after the last bucket."""
        for index, sent in enumerate(self.sent):  # in bucket order
            if not sent:
                self._send(index)
        self.armed = False
        return self.e.backend.record("d2h")

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []
