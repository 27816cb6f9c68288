"""The host lane: one worker thread with its own torch thread budget, running host work.

The worker takes tasks in order, with one exception that mirrors the simulator's host
lane: urgent tasks (gradient accumulation) go ahead of queued normal tasks (optimizer
chunks) not yet started, so a long asynchronous Adam never holds up the accumulation the
next step needs. A job is a list of chunk callables sharing one `Future`; each chunk
records its own span. A chunk that raises fails its job's future with the original
traceback, cancels the job's remaining chunks, and is kept as `error` so the engine's next
`step()` re-raises it: a dead worker never makes the engine hang.

A job starts only after the events it was given (`after`: the worker blocks on each, e.g.
the d2h copy of the gradients it reads), and carries the ordering the backend's hazard
checker needs (real/backend.py): the submitting thread's past before it, the worker's past
after it, handed to whoever waits for the job.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from concurrent.futures import Future
from typing import Callable

import torch

from zfbench.real.distributed import DistributedError
from zfbench.real.recorder import SpanRecorder


class HostWorkerError(RuntimeError):
    """The host worker failed; the original exception is chained as the cause."""


def raise_worker_failure(err: BaseException):
    """Raise, in the main thread, the host worker's error `err`: a failed collective (a
    peer died or timed out) as itself, a DistributedError naming the rank and the op,
    whichever thread met it first; anything else as a HostWorkerError caused by it."""
    if isinstance(err, DistributedError):
        raise err
    raise HostWorkerError(f"host worker failed: {err!r}") from err


_OPEN_LANES: weakref.WeakSet = weakref.WeakSet()


def _close_open_lanes() -> None:
    """At interpreter exit, let every lane not yet closed finish its queued jobs and stop.
    A script that ends with an overlapped host update in flight (a DeepSpeed script never
    calls close()) would otherwise leave the daemon worker inside a torch kernel while the
    process tears torch down, and the process aborts ("terminate called without an active
    exception", seen on CI in a two-rank checkpoint script, 1 run in 6)."""
    for lane in list(_OPEN_LANES):
        lane.close()


atexit.register(_close_open_lanes)


class _Job:
    def __init__(self, op: str, step: int, chunks: list[Callable[[], int | None]],
                 lane: str, after, clock) -> None:
        self.op, self.step, self.lane = op, step, lane
        self.chunks = deque(chunks)
        self.after = list(after)  # (event, why) to wait for before the first chunk
        self.clock = clock  # the submitting thread's clock (hazard checking)
        self.started = False
        self.future: Future = Future()


class HostLane:
    def __init__(self, recorder: SpanRecorder, threads: int, name: str = "host-lane",
                 device=None, backend=None) -> None:
        self.recorder = recorder
        self.device = device  # a CUDA device: the worker's uploads go to this rank's GPU
        self.backend = backend  # real.backend: events to wait on, the hazard checker
        self.threads = max(1, int(threads))
        self.error: BaseException | None = None
        self._urgent: deque[_Job] = deque()
        self._normal: deque[_Job] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        _OPEN_LANES.add(self)

    def submit(self, op: str, step: int, chunks: list[Callable[[], int | None]],
               urgent: bool = False, lane: str = "host", after=()) -> Future:
        """Queue a job of chunk callables; each returns the bytes it moved (or None).
        `after`: (event, why) pairs the worker waits for before the first chunk."""
        backend = self.backend
        job = _Job(op, step, list(chunks), lane, after,
                   backend.snapshot() if backend is not None else None)
        if not job.chunks:
            job.future.set_result(job.clock)
            return job.future
        with self._cv:
            if self._closed:
                raise HostWorkerError("host lane is closed")
            (self._urgent if urgent else self._normal).append(job)
            self._cv.notify()
        return job.future

    def _next(self) -> _Job | None:
        with self._cv:
            while not (self._urgent or self._normal or self._closed):
                self._cv.wait()
            if self._urgent:
                return self._urgent[0]
            if self._normal:
                return self._normal[0]
            return None

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)
        if self.device is not None:  # the current device is per thread: not GPU 0
            torch.cuda.set_device(self.device)
        if self.backend is not None:
            self.backend.bind_host_thread()
        while True:
            job = self._next()
            if job is None:
                return
            chunk = job.chunks.popleft()
            start = self.recorder.now()
            try:
                if not job.started:
                    job.started = True
                    self._begin(job)
                    start = self.recorder.now()
                moved = chunk()
                # (inside: a span the recorder refuses fails the job, not the worker,
                # whose death would leave every waiter blocked)
                self.recorder.add(job.lane, job.op, job.step, start, self.recorder.now(),
                                  int(moved or 0))
            except BaseException as err:  # keep it for the engine; never die silently
                self.error = err
                with self._cv:
                    self._remove(job)
                job.future.set_exception(err)
                continue
            if not job.chunks:
                with self._cv:
                    self._remove(job)
                job.future.set_result(self.backend.snapshot() if self.backend else None)

    def _begin(self, job: _Job) -> None:
        """Before a job's first chunk: ordered after its submitter, then its events."""
        if self.backend is None:
            return
        self.backend.join_thread(job.clock, "host job after its submission")
        for event, why in job.after:
            self.backend.wait("host", event, why)

    def _remove(self, job: _Job) -> None:
        for queue in (self._urgent, self._normal):
            if queue and queue[0] is job:
                queue.popleft()
                return

    def wait(self, future: Future | None, timeout_s: float,
             why: str = "main waits for a host job") -> None:
        """Wait for a job; re-raise its error, or fail after `timeout_s` seconds."""
        if future is None:
            return
        try:
            clock = future.result(timeout=timeout_s)
            if self.backend is not None:
                self.backend.join_thread(clock, why)
        except TimeoutError:
            raise HostWorkerError(f"host worker did not finish within {timeout_s:.0f} s "
                                  f"(raise zfbench.host_timeout_s if the host is this slow)"
                                  ) from None
        except BaseException as err:
            raise_worker_failure(err)

    def check(self) -> None:
        if self.error is not None:
            err, self.error = self.error, None
            raise_worker_failure(err)

    def idle(self) -> bool:
        with self._cv:
            return not (self._urgent or self._normal)

    def close(self) -> None:
        """Finish the queued jobs, then stop the worker."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=60)
        _OPEN_LANES.discard(self)
