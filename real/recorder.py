"""Span recording for the real engine: every op, on every lane, timed on one clock.

On CPU the clock is `time.perf_counter`, read around each op by the thread that runs it
(the device thread or the host worker), so measured spans are real wall intervals. On
CUDA, ops on streams are bracketed by CUDA events and resolved at the end of each step
against one anchor event recorded together with a CPU clock reading, so device and host
spans share the clock. Spans land in a `zfbench.core.trace.Timeline` (source "measured").
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch

from zfbench.core.trace import Timeline


class SpanRecorder:
    def __init__(self, rank: int = 0, timeline: Timeline | None = None,
                 use_cuda: bool = False) -> None:
        self.rank = rank
        self.timeline = timeline if timeline is not None else Timeline("measured")
        self.t0 = time.perf_counter()
        self.use_cuda = use_cuda
        self._lock = threading.Lock()
        self._pending_cuda: list[tuple] = []
        self._anchor = None
        if use_cuda:
            torch.cuda.synchronize()
            self._anchor = torch.cuda.Event(enable_timing=True)
            self._anchor.record()
            torch.cuda.synchronize()
            self._anchor_cpu = self.now()

    def now(self) -> float:
        """Seconds since the recorder started."""
        return time.perf_counter() - self.t0

    def add(self, lane: str, op: str, step: int, t_start: float, t_end: float,
            nbytes: int = 0) -> None:
        with self._lock:
            self.timeline.add(self.rank, lane, op, step, t_start, t_end, nbytes)

    @contextmanager
    def span(self, lane: str, op: str, step: int, nbytes: int = 0, stream=None):
        """Time the enclosed work as one span. With CUDA and a stream, the span is the
        stream's execution of the work (CUDA events), not the launch time; compute spans
        default to the current stream."""
        if self.use_cuda and stream is None and lane == "compute":
            stream = torch.cuda.current_stream()
        if self.use_cuda and stream is not None:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            yield
            end.record(stream)
            with self._lock:
                self._pending_cuda.append((lane, op, step, start, end, nbytes))
            return
        t_start = self.now()
        yield
        self.add(lane, op, step, t_start, self.now(), nbytes)

    def mark_step(self, step: int, t_start: float, t_end: float) -> None:
        with self._lock:
            self.timeline.mark_step(self.rank, step, t_start, t_end)

    def resolve_cuda(self, block: bool = True) -> None:
        """Turn recorded CUDA event pairs into spans. `block`: wait for the device first
        and resolve all; otherwise resolve those whose work is done and keep the rest (a
        step's end must not wait for an asynchronous update still on the link)."""
        if not self._pending_cuda:
            return
        if block:
            torch.cuda.synchronize()
        with self._lock:
            done, waiting = [], []
            for item in self._pending_cuda:
                (done if block or item[4].query() else waiting).append(item)
            self._pending_cuda = waiting
        for lane, op, step, start, end, nbytes in done:
            t_start = self._anchor_cpu + self._anchor.elapsed_time(start) / 1e3
            t_end = self._anchor_cpu + self._anchor.elapsed_time(end) / 1e3
            self.add(lane, op, step, t_start, max(t_end, t_start), nbytes)
