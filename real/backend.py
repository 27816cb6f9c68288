"""One schedule, two backends: the device-side operations every strategy uses.

A strategy says what runs where and what waits for what; a backend makes it so:
- `op(lane, name, t, reads=, writes=)`: a block of work on a lane (timed as a span, its
  buffer accesses declared); `copy(lane, name, t, dst, src)`: a copy on a link lane;
- `record(lane)` -> an `Event`; `wait(lane, event, why)`: the lane goes on only after it;
- `pinned(numel, dtype)`: a host buffer the link can read and write asynchronously
  (on a GPU `register_pinned`, which `zfbench.real.rate_probe` uses too);
- `end_step()`: the step's device work is done (the step's end is read after it).
Lanes: `compute`, `d2h`, `h2d` (streams on a GPU), `host` (the host worker thread) and
`main` (the thread issuing the schedule); `net` spans run in the compute lane's order.

`CudaBackend` runs the lanes as CUDA streams with events, so a wait is a stream waiting
on an event (or a thread blocking on one), never a whole-device synchronization.
`CpuLanes` is the emulated accelerator: the main thread is the device, copies run where
they are issued (h2d ones, with `cpu_link_lanes`, on a link thread: real/cpu_link.py), and
every other event is complete when recorded. Given a `HazardChecker`
(real/hazards.py) it also checks the schedule: each access against the waits declared,
as the streams of a GPU would need them, whatever order the CPU happened to run them in.
`waits_dropped` leaves named waits out, which is how tests plant a missing wait.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import torch

from zfbench.real import kernels
from zfbench.real.cpu_link import LinkWorker
from zfbench.real.hazards import THREAD_LANES, HazardChecker


class Event:
    """A point in a lane's work: a CUDA event, and the lane's clock for the checker."""
    __slots__ = ("cuda", "clock")

    def __init__(self, cuda=None, clock=None) -> None:
        self.cuda, self.clock = cuda, clock


class Backend:
    """The interface, with what both implementations share (threads, the checker)."""

    def __init__(self, recorder, hazards: HazardChecker | None = None,
                 waits_dropped: frozenset[str] = frozenset()) -> None:
        self.recorder = recorder
        self.hazards = hazards
        self.waits_dropped = frozenset(waits_dropped)
        self.waits_used: set[str] = set()  # the `why` of every wait this run declared
        self._host_thread: int | None = None
        self._host_storages: set[int] = set()

    # -- which thread is issuing --------------------------------------------------------
    def bind_host_thread(self) -> None:
        """Called by the host worker when it starts: its work is the `host` lane."""
        self._host_thread = threading.get_ident()

    def thread_lane(self) -> str:
        return "host" if threading.get_ident() == self._host_thread else "main"

    @staticmethod
    def exec_lane(lane: str) -> str:
        return "compute" if lane == "net" else lane

    def _declare(self, lane: str, name: str, reads, writes) -> None:
        if self.hazards is None:
            return
        run = self.exec_lane(lane)
        issuer = self.thread_lane()
        if run in THREAD_LANES and run != issuer:
            raise RuntimeError(f"{name}: {issuer} thread ran work declared on {run}")
        self.hazards.enqueue(issuer, run)
        self.hazards.access(run, name, reads, writes)

    def mark_host(self, tensor: torch.Tensor) -> None:
        """`tensor` lives in host memory (whatever device the emulated lanes put it on)."""
        if tensor.numel():
            self._host_storages.add(tensor.untyped_storage().data_ptr())

    def is_host(self, tensor: torch.Tensor) -> bool:
        return (tensor.numel() > 0
                and tensor.untyped_storage().data_ptr() in self._host_storages)

    def name(self, tensor: torch.Tensor, name: str) -> torch.Tensor:
        if self.hazards is not None:
            self.hazards.name(tensor, name)
        return tensor

    def access(self, lane: str, name: str, reads=(), writes=()) -> None:
        """Declare accesses of work already done on `lane` with no span of its own."""
        self._declare(lane, name, reads, writes)

    def declare_state(self, state: dict, flat_params: torch.Tensor, write: bool) -> None:
        """A checkpoint's accesses: the main thread reads (or writes) the host buffers in
        `state`, the compute lane the device ones and the parameters."""
        tensors = list(_tensors_in(state))
        host = [x for x in tensors if self.is_host(x)]
        device = [x for x in tensors if not self.is_host(x)] + [flat_params]
        for lane, group in (("main", host), ("compute", device)):
            self.access(lane, "checkpoint", reads=() if write else group,
                        writes=group if write else ())

    # -- events -----------------------------------------------------------------------
    def record(self, lane: str) -> Event:
        run = self.exec_lane(lane)
        clock = None
        if self.hazards is not None:
            self.hazards.enqueue(self.thread_lane(), run)
            clock = self.hazards.snapshot(run)
        return Event(self._record_cuda(run), clock)

    def wait(self, lane: str, event: Event | None, why: str) -> None:
        """`lane` goes on only after `event` (None: nothing to wait for)."""
        if event is None:
            return
        self.waits_used.add(why)
        if why in self.waits_dropped:
            return
        run = self.exec_lane(lane)
        self._wait_cuda(run, event)
        if self.hazards is not None:
            self.hazards.enqueue(self.thread_lane(), run)
            self.hazards.join(run, event.clock)

    def snapshot(self) -> dict | None:
        """The issuing thread's clock (a host job carries it to the worker)."""
        return None if self.hazards is None else self.hazards.snapshot(self.thread_lane())

    def join_thread(self, clock: dict | None, why: str) -> None:
        """The issuing thread is ordered after `clock` (a job it submitted or waited)."""
        self.waits_used.add(why)
        if self.hazards is not None and why not in self.waits_dropped:
            self.hazards.join(self.thread_lane(), clock)

    # -- what the implementations provide ------------------------------------------------
    def _record_cuda(self, lane: str):
        return None

    def _wait_cuda(self, lane: str, event: Event) -> None:
        pass

    @contextmanager
    def op(self, lane: str, name: str, t: int, *, reads=(), writes=(),
           nbytes: int = 0, blocking: bool = False, span: bool = True):
        """Work on `lane`, timed as span `name` (an op of the span vocabulary) unless
        `span` is False; `blocking`: the issuing thread goes on only when it is done (a
        synchronous copy)."""
        raise NotImplementedError

    def _block(self, lane: str) -> None:
        run = self.exec_lane(lane)
        if run not in THREAD_LANES:
            self.wait(self.thread_lane(), self.record(run), "a thread blocks on a copy")

    def copy(self, lane: str, name: str, t: int, dst: torch.Tensor,
             src: torch.Tensor, nbytes: int | None = None) -> None:
        """dst <- src on a link lane (d2h or h2d), as one span moving `nbytes`
        (default: the source's bytes)."""
        nbytes = src.numel() * src.element_size() if nbytes is None else nbytes
        with self.op(lane, name, t, reads=(src,), writes=(dst,), nbytes=nbytes):
            dst.copy_(src, non_blocking=self.is_cuda)

    is_cuda = False

    def pinned(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype)

    def end_step(self) -> None:
        """The step's device work (all the compute lane has been given) is done."""

    def close(self) -> None:
        pass


class CpuLanes(Backend):
    """The emulated accelerator: work runs on the thread that issues it, at once, but for
    the copies of the lanes in `async_lanes` (`cpu_link_lanes`; default none), which a
    `LinkWorker` thread runs in issue order while the issuer goes on, as a GPU's copy
    engine does; an event of such a lane is its worker's ticket, and waiting on it
    blocks (real/cpu_link.py)."""

    def __init__(self, recorder, hazards: HazardChecker | None = None,
                 waits_dropped: frozenset[str] = frozenset(),
                 async_lanes: tuple[str, ...] = ()) -> None:
        super().__init__(recorder, hazards, waits_dropped)
        self.links = {lane: LinkWorker(lane) for lane in async_lanes}

    def copy(self, lane: str, name: str, t: int, dst: torch.Tensor,
             src: torch.Tensor, nbytes: int | None = None) -> None:
        """As `Backend.copy`, through `kernels.copy_` (the emulated link's copies are host
        memory copies: fp32 ones in real/host_fused.cpp's loop)."""
        link = self.links.get(self.exec_lane(lane))
        nbytes = src.numel() * src.element_size() if nbytes is None else nbytes
        if link is None:
            with self.op(lane, name, t, reads=(src,), writes=(dst,), nbytes=nbytes):
                kernels.copy_(dst, src)
            return
        self._declare(lane, name, (src,), (dst,))

        def run() -> None:
            with self.recorder.span(lane, name, t, nbytes=nbytes):
                kernels.copy_(dst, src)
        link.submit(run)

    def _record_cuda(self, lane: str):
        link = self.links.get(lane)
        return None if link is None else (link, link.ticket())

    def _wait_cuda(self, lane: str, event: Event) -> None:
        if event.cuda is None:
            return
        link, ticket = event.cuda
        if link.lane != lane:  # a lane waits on its own events by its order alone
            link.wait(ticket)

    def close(self) -> None:
        for link in self.links.values():
            link.close()

    @contextmanager
    def op(self, lane: str, name: str, t: int, *, reads=(), writes=(),
           nbytes: int = 0, blocking: bool = False, span: bool = True):
        self._declare(lane, name, reads, writes)
        link = self.links.get(self.exec_lane(lane))
        if link is not None:  # work with a body runs here, after the lane's queued copies
            link.drain()
        if not span:
            yield
        else:
            with self.recorder.span(lane, name, t, nbytes=nbytes):
                yield
        if blocking:
            self._block(lane)


#: set to 1 to run the CPU lanes' uploads on a link thread (off by default: measured a loss
#: at moderate load, issue 45; docs/results.md)
LINK_THREAD_ENV = "ZFBENCH_CPU_LINK_THREAD"


def cpu_link_lanes(host_threads: int, cores: int | None = None,
                   enabled: bool | None = None) -> tuple[str, ...]:
    """The CPU lanes' copy lanes on a link thread of their own: h2d where enabled
    (`enabled`, default $ZFBENCH_CPU_LINK_THREAD=1) and the host lane leaves a core free
    (`cores`: this process's CPUs); else none, and the host worker runs each chunk's
    upload itself between its AdamW chunks. Where the host lane's OpenMP team takes every
    core, a third thread preempts one of the kernel's threads and its static split waits
    for it; on the 2-core Xeon-AMX the thread was a gain at load 6-8 and a loss at load 3
    (bench/results/host_lane/), hence off by default."""
    if enabled is None:
        enabled = os.environ.get(LINK_THREAD_ENV) == "1"
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else (os.cpu_count() or 1)
    return ("h2d",) if enabled and host_threads < cores else ()


class CudaBackend(Backend):
    """Streams and events: compute on the current stream, one stream per link direction,
    pinned host buffers registered exactly (no caching-allocator rounding)."""

    is_cuda = True

    def __init__(self, recorder, device: torch.device, hazards=None,
                 waits_dropped=frozenset()) -> None:
        super().__init__(recorder, hazards, waits_dropped)
        self.device = device
        with torch.cuda.device(device):
            self.streams = {"compute": torch.cuda.current_stream(device),
                            "d2h": torch.cuda.Stream(device), "h2d": torch.cuda.Stream(device)}
        self._registered: list[torch.Tensor] = []

    def stream(self, lane: str):
        return self.streams[self.exec_lane(lane)]

    def _record_cuda(self, lane: str):
        if lane in THREAD_LANES:
            return None  # a thread's work is done when it returns
        event = torch.cuda.Event()
        event.record(self.streams[lane])
        return event

    def _wait_cuda(self, lane: str, event: Event) -> None:
        if event.cuda is None:
            return
        if lane in THREAD_LANES:
            event.cuda.synchronize()  # this thread blocks until the stream got there
        else:
            self.streams[lane].wait_event(event.cuda)

    @contextmanager
    def op(self, lane: str, name: str, t: int, *, reads=(), writes=(),
           nbytes: int = 0, blocking: bool = False, span: bool = True):
        self._declare(lane, name, reads, writes)
        run = self.exec_lane(lane)
        if run in THREAD_LANES:
            if not span:
                yield
            else:
                with self.recorder.span(lane, name, t, nbytes=nbytes):
                    yield
            return
        stream = self.streams[run]
        with torch.cuda.stream(stream):
            if not span:
                yield
            else:
                with self.recorder.span(lane, name, t, nbytes=nbytes, stream=stream):
                    yield
        if blocking:
            self._block(lane)

    def pinned(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A pinned host buffer of exactly this size (`register_pinned`), unpinned by
        `close`."""
        buf = register_pinned(numel, dtype)
        self._registered.append(buf)
        return buf

    def end_step(self) -> None:
        self.streams["compute"].synchronize()

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        for buf in self._registered:
            unregister_pinned(buf)
        self._registered = []


PAGE_BYTES = 4096  # registrations cover whole pages: two buffers never share one
_REGISTERED: set[int] = set()  # host addresses register_pinned page-locked itself


def register_pinned(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A host buffer the link can copy asynchronously: page-locked by cudaHostRegister on
    a plain allocation of exactly this size, rounded to whole pages of its own
    (`pin_memory()` and `empty(pin_memory=True)` go through the caching host allocator,
    which rounds each block up to a power of two: up to 2x; two small heap buffers could
    share a page, which CUDA refuses to register twice). Release it with
    `unregister_pinned` once no copy uses it. A failed registration raises: torch keeps
    CUDA's error for the thread's next kernel launch, so carrying on would fail later in
    an unrelated op."""
    itemsize = torch.empty(0, dtype=dtype).element_size()
    nbytes = numel * itemsize
    if nbytes == 0:
        return torch.zeros(numel, dtype=dtype)
    span = -(-nbytes // PAGE_BYTES) * PAGE_BYTES
    raw = torch.zeros(span + PAGE_BYTES, dtype=torch.uint8)
    skip = (-raw.data_ptr()) % PAGE_BYTES
    page = raw[skip:skip + span]
    err = int(torch.cuda.cudart().cudaHostRegister(page.data_ptr(), span, 0))
    if err != 0:
        raise RuntimeError(f"cudaHostRegister of {span} bytes failed (CUDA error {err}); "
                           f"host memory may be short of page-lockable room (ulimit -l, "
                           f"or set zero_optimization.offload_optimizer.pin_memory false)")
    _REGISTERED.add(page.data_ptr())
    return page[:nbytes].view(dtype)


def unregister_pinned(buf: torch.Tensor) -> None:
    """Undo `register_pinned` (nothing for an empty buffer)."""
    if buf.numel() and buf.data_ptr() in _REGISTERED:
        _REGISTERED.discard(buf.data_ptr())
        torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2  # CUDA driver API, cuda.h: CUpointer_attribute
CU_MEMORYTYPE_HOST = 1  # cuda.h: CUmemorytype (page-locked host memory)


def is_page_locked(buf: torch.Tensor) -> bool:
    """Whether the CUDA driver holds `buf`'s host memory page-locked (torch's pinned
    allocator or `register_pinned`). torch's `is_pinned()` is not enough on every
    version: torch 2.11 (cu130) answered False for `register_pinned` buffers on an H200
    machine whose copies from them ran at 55 GB/s (bench/results/gpu/), so this also
    asks the driver (cuPointerGetAttribute); False without CUDA."""
    if buf.is_pinned():
        return True
    if buf.is_cuda or buf.numel() == 0 or not torch.cuda.is_available():
        return False
    import ctypes

    torch.cuda.init()  # the driver answers within the current (torch's primary) context
    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuPointerGetAttribute.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64)
    driver.cuPointerGetAttribute.restype = ctypes.c_int
    kind = ctypes.c_uint(0)
    err = driver.cuPointerGetAttribute(ctypes.byref(kind), CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                       buf.data_ptr())
    return err == 0 and kind.value == CU_MEMORYTYPE_HOST


def _tensors_in(state):
    """Every tensor in a nested state dict."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict):
        for value in state.values():
            yield from _tensors_in(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _tensors_in(value)
