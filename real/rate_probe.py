"""The host lane's and the links' rates on buffers of one model's size, measurable again,
and how every measurement of `zfbench.real.profile` waits for the device it times.

`RateProbe(total, dtype, host_threads, device)` allocates, once, the buffers the engine's
host side works on for a model of `total` parameters (a device-precision flat buffer, the
fp32 master, gradient and moments); `measure(repeats)` then times, as the engine does them
and with the engine's own kernels (`zfbench.real.kernels`), the d2h and h2d links alone
and together, the host lane's AdamW chunk, accumulation (and a window's first), clipping
norm and conversion, again at each strategy's host thread count (`host_lanes`), and on CUDA
how the upload link and host AdamW slow each other (`RateProbe.measure` lists each key).
tests/test_kernel_identity.py checks that the probe and the engine reach the same kernels
with the same dtypes. Pinned buffers are `zfbench.real.backend.register_pinned`'s,
released by `close()` (or when the probe is collected).

`zfbench.real.profile` measures the rates once per profile; `zfbench.validate` measures
them again right before and after each cell, because on a shared machine these
memory-bound rates drift by 1.5x within minutes (host AdamW over 175M parameters measured
0.10 s and 0.25 s on this machine half an hour apart), and the cell is best predicted from
the rates of its own minute.

Timing (`median_time`, `Clock`): on the CPU lanes work is done when the call returns, so a
wall clock around it is its time; on CUDA the call only queues it, so the timing waits for
the device (a synchronize before the clock starts and before it is read) or reads CUDA
events once the device has passed them.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from zfbench.core.strategies import chunk_bounds, engine_host_chunk_elems
from zfbench.real import kernels
from zfbench.real.backend import register_pinned, unregister_pinned

RATE_KEYS = ("d2h_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s_both",
             "h2d_bytes_per_s_both", "host_adam_params_per_s", "host_accum_elems_per_s",
             "host_norm_elems_per_s", "host_accum_first_elems_per_s")
# with 16-bit weights only: both host conversions of the wires, per element
CONVERT_KEY = "host_convert_elems_per_s"
# with 16-bit weights only (`RateProbe.fresh_page_rates`, measured by the profile, not
# around validate's cells): bytes/s at which a fp32 -> 16-bit conversion into a fresh host
# tensor first touches its output's pages, beyond the same conversion into a reused buffer
FRESH_PAGE_KEY = "host_fresh_page_bytes_per_s"


def is_cuda(device) -> bool:
    return device is not None and torch.device(device).type == "cuda"


def device_sync(device):
    """The wait that puts `device`'s queued work inside a timing: None on the CPU (its
    work is done when the call returns), else a synchronize of that GPU."""
    if not is_cuda(device):
        return None
    device = torch.device(device)
    return lambda: torch.cuda.synchronize(device)


def median_time(fn, repeats: int, device=None, sync=None) -> float:
    """Median seconds of `fn()` over `repeats` calls, each timed to completion: `sync`
    (default `device_sync(device)`; none on the CPU) runs before the clock starts and
    before it is read, e.g. a stream's synchronize to time only that stream's work."""
    sync = sync or device_sync(device)
    times = []
    for _ in range(repeats):
        if sync is not None:
            sync()
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


class Clock:
    """Points in a device's time, taken where work is issued (e.g. from module hooks):
    `mark()` is time.perf_counter() on the CPU, and on a GPU a timing CUDA event recorded
    on the issuing thread's current stream; `seconds(marks)` reads them as seconds on one
    axis (on a GPU once the device has passed them: it waits for them)."""

    def __init__(self, device=None) -> None:
        self.device = torch.device(device) if is_cuda(device) else None

    def mark(self):
        if self.device is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, marks: list) -> list[float]:
        if self.device is None or not marks:
            return list(marks)
        for event in marks:
            event.synchronize()
        base = marks[0]
        return [base.elapsed_time(event) / 1e3 for event in marks]


def in_thread(fn, threads: int):
    """Run `fn` in a fresh thread with its own torch thread count; return its result."""
    box = {}

    def target():
        torch.set_num_threads(threads)
        box["out"] = fn()
    worker = threading.Thread(target=target)
    worker.start()
    worker.join()
    return box["out"]


def fresh_page_seconds(src: torch.Tensor, into: torch.Tensor, repeats: int
                       ) -> tuple[float, float]:
    """(fresh, reused): median seconds of `src` converted into a new tensor of `into`'s
    dtype (`src.to(dtype)`, as PyTorch converts a blocking CPU -> CUDA copy that changes
    the dtype: a fresh pageable temporary, freed after) and of the same conversion into
    `into` (mapped, reused); the two alternate, each run once untimed first. PyTorch's
    CPU allocator keeps nothing: c10/core/impl/alloc_cpu.cpp `alloc_cpu` is a
    `posix_memalign` (`madvise(MADV_HUGEPAGE)` only with THP_MEM_ALLOC_ENABLE set) and
    `free_cpu` a `free` (c10/core/CPUAllocator.cpp `DefaultCPUAllocator`); glibc serves a
    block past its mmap threshold (at most 32 MiB on 64-bit, mallopt(3) M_MMAP_THRESHOLD)
    with a fresh `mmap` and unmaps it at `free`, so every such conversion faults in its
    output page by page."""
    return alternating_medians(lambda: src.to(into.dtype), lambda: into.copy_(src), repeats)


def round_robin_times(fns: dict, repeats, warm: bool = True) -> dict[str, list[float]]:
    """Seconds of each `fns[name]()` in `repeats` rounds (a count, or an iterable of rounds,
    e.g. a progress bar over them), every function once a round in turn, so that a drift of
    a shared machine's speed reaches them all alike; after one untimed call of each
    (`warm`: first touch, allocator). CPU work, done when each call returns."""
    if warm:
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in (range(repeats) if isinstance(repeats, int) else repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def alternating_medians(first, second, repeats: int) -> tuple[float, float]:
    """Median seconds of `first()` and of `second()` over `repeats` runs each, the two
    alternating (`round_robin_times`)."""
    times = round_robin_times({"first": first, "second": second}, repeats)
    return statistics.median(times["first"]), statistics.median(times["second"])


def fresh_page_bytes_per_s(nbytes: float, fresh_s: float, reused_s: float) -> float | None:
    """The rate at which fresh pages cost their first touch: `nbytes` (the fresh output's)
    over what the fresh conversion takes beyond the reused one; None where it takes no
    longer (nothing measurable: no fault term)."""
    extra = fresh_s - reused_s
    return nbytes / extra if extra > 0 else None


HOST_LANE_KEYS = ("host_adam_params_per_s", "host_accum_elems_per_s",
                  "host_norm_elems_per_s", "host_accum_first_elems_per_s")
# A profile's host-lane rates of the strategies whose host step runs on another thread
# count than the probe's (on a GPU: all the rank's cores but for ZenFlow,
# real/distributed.py `lane_threads`): {strategy: {"host_threads": n, HOST_LANE_KEYS...}}
HOST_LANES_KEY = "host_lanes"


def strategy_threads_of(calibration: dict) -> dict[str, int]:
    """{strategy: host threads} of a profile's `host_lanes` (to measure them again)."""
    return {name: int(lane["host_threads"])
            for name, lane in (calibration.get(HOST_LANES_KEY) or {}).items()}


class RateProbe:
    def __init__(self, total: int, dtype: torch.dtype, host_threads: int,
                 device=torch.device("cpu"),
                 strategy_threads: dict[str, int] | None = None) -> None:
        self.total, self.host_threads = int(total), int(host_threads)
        # strategies whose host lane runs on another thread count: measured at it too
        self.strategy_threads = {k: int(v) for k, v in (strategy_threads or {}).items()
                                 if int(v) != self.host_threads}
        self.device = torch.device(device)
        cuda = is_cuda(self.device)
        if cuda and self.device.index is None:  # this process's GPU, by index (as the engine)
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.dev = (torch.randn(self.total, device=self.device) * 0.02).to(dtype)
        self.up = torch.zeros(self.total, dtype=dtype, device=self.device)
        self.master = torch.randn(self.total)
        self.grad = torch.randn(self.total) * 1e-3
        self.m, self.v = torch.zeros(self.total), torch.zeros(self.total)
        # the gradients as the engine's host accumulation reads them: landed in the
        # device's dtype (16-bit weights cross the link as themselves)
        self.landed = self.grad if dtype == torch.float32 else \
            (self.grad * 1e3).to(dtype)
        self._pinned: list[torch.Tensor] = []
        self.streams: dict = {}
        # the CPU lanes' wires: fp32 weights land in (and leave from) the fp32 buffers
        # themselves, 16-bit ones in plain host buffers of their own dtype (the gradients
        # land where the accumulation reads them)
        if not cuda:
            self.down_wire = self.landed
            self.up_wire = self.master if dtype == torch.float32 else self.master.to(dtype)
        else:
            # the engine's CUDA link: device-dtype tensors into and out of pinned wires of
            # the same dtype (its fp32 <-> device dtype conversions run on the host lane)
            self.down_wire = register_pinned(self.total, dtype)
            self._pinned.append(self.down_wire)
            self.up_wire = register_pinned(self.total, dtype)
            self._pinned.append(self.up_wire)
            self.up_wire.copy_(self.master)
            self.streams = {"d2h": torch.cuda.Stream(self.device),
                            "h2d": torch.cuda.Stream(self.device)}
            torch.cuda.synchronize(self.device)  # `dev` is written before a stream reads it
        # where the host chunk writes the new parameters: the h2d wire, as the engine's
        # (none with fp32 weights: the master goes up itself)
        self.h2d_wire = None if dtype == torch.float32 else self.up_wire

    def host_adam(self, lo: int = 0, hi: int | None = None) -> None:
        """The engine's host chunk kernel over master[lo:hi] (default all of it in one
        call): AdamW, with 16-bit weights the new parameters into the h2d wire, in one pass
        (values are irrelevant to its time)."""
        hi = self.total if hi is None else hi
        wire = None if self.h2d_wire is None else self.h2d_wire[lo:hi]
        kernels.host_adamw_(self.master[lo:hi], self.grad[lo:hi], self.m[lo:hi],
                            self.v[lo:hi], wire, step=1, lr=1e-4, beta1=0.9, beta2=0.999,
                            eps=1e-8, weight_decay=0.01)

    def host_update(self, threads: int):
        """The engine's host update on `threads` threads, as it runs it: `host_adam` chunk
        by chunk (zfbench.core.strategies `engine_host_chunk_elems`: each chunk one
        parallel region, whose cost beyond its elements the rate then holds)."""
        bounds = chunk_bounds(self.total, engine_host_chunk_elems(threads))

        def run() -> None:
            for a, b in bounds:
                self.host_adam(a, b)
        return run

    def _links(self):
        """(d2h, h2d, d2h_sync, h2d_sync): the two copies and the waits that time each to
        its completion (none on the CPU lanes)."""
        if not self.streams:  # as real/backend.py CpuLanes and real/engine.py copy
            checked = self.dev.dtype == torch.float32  # fp32: the check rides on the d2h

            def d2h():
                if checked:
                    kernels.copy_checked_(self.down_wire, self.dev)
                else:
                    kernels.copy_(self.down_wire, self.dev)

            def h2d():
                kernels.copy_(self.up, self.up_wire)
            return d2h, h2d, None, None
        down, up = self.streams["d2h"], self.streams["h2d"]

        def d2h_cuda():
            with torch.cuda.stream(down):
                self.down_wire.copy_(self.dev, non_blocking=True)

        def h2d_cuda():
            with torch.cuda.stream(up):
                self.up.copy_(self.up_wire, non_blocking=True)
        return d2h_cuda, h2d_cuda, down.synchronize, up.synchronize

    def measure(self, repeats: int = 5) -> dict[str, float]:
        """The rate keys of a profile's `calibration`, each timed as the engine does it:

        - d2h: the device buffer copied into a host buffer of the device's dtype (the engine's
          d2h wire, `Strategy.landing_for`: with 16-bit weights the gradients cross as
          themselves and are converted on the host afterwards), on the calling (device) thread;
          on CUDA a pinned wire, on a d2h stream of its own, timed to the stream's completion;
        - h2d: a host buffer of the device's dtype (the h2d wire, into which the engine's host
          chunk writes the new parameters) copied into the device buffer, issued from a host
          worker thread (on CUDA from a pinned wire on an h2d stream); each alone, and both at
          once (d2h on the calling thread, h2d on the worker: on CUDA two streams copying at once);
        - on the host worker's threads (the CPU, either way), each with the engine's own kernel
          (`zfbench.real.kernels`, the attribute the strategies call): the host chunk
          (`host_adamw_`: AdamW over the master in the engine's chunks for those threads,
          `host_update`, with 16-bit weights writing the new parameters into the h2d wire in
          the same pass), `host_adam_params_per_s`; the host accumulation (`accumulate_`) of gradients in the
          device's dtype into fp32; the gradient clipping norm (`grad_norm`) of the fp32
          gradients; and, with 16-bit weights, the conversion the host lane still runs apart
          (`copy_`: gradients out of the d2h wire into fp32), `host_convert_elems_per_s` (absent
          with fp32 weights: the engine converts nothing then; profiles from before issue 45
          timed the h2d conversion here too, then a pass of its own); a ZenFlow window's first
          accumulation (`accumulate_` with `fresh`: it writes the window, which nothing
          zeroes), `host_accum_first_elems_per_s` (profiles before it timed instead what
          zeroing the window in the AdamW pass added, `host_zero_elems_per_s`, the engine's
          work then, which the simulator still prices from them); these host-lane
          rates again on each other thread count a strategy's host step runs on
          (`strategy_threads`; on a GPU every strategy but ZenFlow gets all the rank's cores,
          real/distributed.py `lane_threads`), as `host_lanes`: {strategy: {host_threads,
          rates}}, which the simulator takes for that strategy (sims/settings.py
          `strategy_host_lane`);
        - on CUDA, how the upload link and host AdamW slow each other: the upload timed while
          AdamW repeats on the host threads and AdamW timed while the upload repeats, as
          `h2d_factor_when_host_busy` and `host_factor_when_h2d_busy` (alone / together; the
          simulator applies them wherever an upload and host work overlap, sims/fluid.py).
        """
        nbytes = self.total * self.dev.element_size()
        d2h, h2d, d2h_sync, h2d_sync = self._links()
        d2h()
        h2d()
        d2h_alone = median_time(d2h, repeats, sync=d2h_sync)
        h2d_alone = in_thread(lambda: median_time(h2d, repeats, sync=h2d_sync),
                              self.host_threads)
        both = {}

        def h2d_loop():
            both["h2d"] = median_time(h2d, repeats, sync=h2d_sync)
        worker = threading.Thread(target=lambda: (torch.set_num_threads(self.host_threads),
                                                  h2d_loop()))
        worker.start()
        both["d2h"] = median_time(d2h, repeats, sync=d2h_sync)
        worker.join()
        rates = self.host_rates(self.host_threads, repeats)
        if self.streams:  # a GPU: the upload link and the host's memory side by side
            rates.update(self._link_host_contention(
                h2d, h2d_sync, h2d_alone, self.total / rates["host_adam_params_per_s"],
                repeats))
        lanes = {n: self.host_rates(n, repeats) for n in set(self.strategy_threads.values())}
        if lanes:
            rates[HOST_LANES_KEY] = {name: {"host_threads": n, **lanes[n]}
                                     for name, n in sorted(self.strategy_threads.items())}
        return {**rates, "d2h_bytes_per_s": nbytes / d2h_alone,
                "h2d_bytes_per_s": nbytes / h2d_alone,
                "d2h_bytes_per_s_both": nbytes / both["d2h"],
                "h2d_bytes_per_s_both": nbytes / both["h2d"]}

    def host_rates(self, threads: int, repeats: int = 5) -> dict[str, float]:
        """The host lane's rates on `threads` threads (HOST_LANE_KEYS, and CONVERT_KEY
        with 16-bit weights), each kernel run once before it is timed."""
        def accum():
            kernels.accumulate_(self.m, self.landed, 0.25)

        def accum_first():  # a window's first: written, its old values not read
            kernels.accumulate_(self.m, self.landed, 0.25, fresh=True)

        def norm():
            kernels.sum_of_squares(self.grad)

        def convert():  # out of the d2h wire (the h2d one is written by host_adam)
            kernels.copy_(self.m, self.landed)

        def timed(fn) -> float:
            return in_thread(lambda: (fn(), median_time(fn, repeats))[1], threads)
        rates = {"host_adam_params_per_s": self.total / timed(self.host_update(threads)),
                 "host_accum_elems_per_s": self.total / timed(accum),
                 "host_accum_first_elems_per_s": self.total / timed(accum_first),
                 "host_norm_elems_per_s": self.total / timed(norm)}
        if self.dev.dtype != torch.float32:
            rates[CONVERT_KEY] = self.total / timed(convert)
        return rates

    def fresh_page_rates(self, repeats: int = 3) -> dict[str, float]:
        """With 16-bit weights, FRESH_PAGE_KEY on the host lane's threads: the fp32 master
        converted into a fresh 16-bit tensor against into the h2d wire (mapped, reused:
        `fresh_page_seconds`); empty with fp32 weights (a same-dtype copy needs no
        temporary) or where the fresh conversion was not slower."""
        if self.dev.dtype == torch.float32:
            return {}
        fresh_s, reused_s = in_thread(
            lambda: fresh_page_seconds(self.master, self.up_wire, repeats), self.host_threads)
        rate = fresh_page_bytes_per_s(self.total * self.dev.element_size(), fresh_s, reused_s)
        return {} if rate is None else {FRESH_PAGE_KEY: rate}

    def _link_host_contention(self, h2d, h2d_sync, h2d_alone: float, adam_alone: float,
                              repeats: int) -> dict[str, float]:
        """On CUDA: the upload timed (from a host worker, as the engine issues it) while
        host AdamW repeats on the host threads, and host AdamW timed while the upload
        repeats; as rate factors (alone / together, at most 1). On one H100 machine the
        link kept 0.86x and AdamW fell to 0.23x (bench/results/gpu/NVIDIA-H100-80GB-HBM3,
        contention/): a profile that measures each alone says nothing of it."""
        update = self.host_update(self.host_threads)  # as `adam_alone` was timed
        halt = _loop_in_thread(update, self.host_threads)
        try:
            h2d_beside = in_thread(lambda: median_time(h2d, repeats, sync=h2d_sync),
                                   self.host_threads)
        finally:
            halt()
        halt = _loop_in_thread(lambda: (h2d(), h2d_sync()), 1)
        try:
            adam_beside = in_thread(lambda: median_time(update, repeats),
                                    self.host_threads)
        finally:
            halt()
        return {"h2d_factor_when_host_busy": min(1.0, h2d_alone / h2d_beside),
                "host_factor_when_h2d_busy": min(1.0, adam_alone / adam_beside)}

    def close(self) -> None:
        """Wait for the link streams and unpin the pinned buffers (the probe stays usable
        on the CPU lanes; on CUDA it is done)."""
        for stream in self.streams.values():
            stream.synchronize()
        for buf in self._pinned:
            unregister_pinned(buf)
        self._pinned = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: CUDA may be gone
            pass


def _loop_in_thread(fn, threads: int):
    """Start `fn` repeating on a fresh thread (its own torch thread count); returns stop()."""
    stop = threading.Event()

    def target():
        torch.set_num_threads(threads)
        while not stop.is_set():
            fn()
    worker = threading.Thread(target=target)
    worker.start()

    def halt() -> None:
        stop.set()
        worker.join()
    return halt


def lane_contention(probe: RateProbe, device_work, device_threads: int,
                    repeats: int = 5) -> dict[str, float]:
    """How much the two lanes slow each other: `device_work` (a training step's
    forward+backward, on the calling thread) timed alone and while host AdamW repeats on
    the host threads, and host AdamW timed alone and while `device_work` repeats on a
    device thread. On a CPU-emulated accelerator both are cores over the same DRAM; on
    CUDA (the probe's device) the device work is timed to its completion on the GPU and
    the repeating device thread waits for each step, so what is left is the host side
    of the GPU step (kernel launches, autograd) sharing the CPU with host AdamW. Returned
    as rate factors (alone / together, at most 1) the simulator applies while a compute
    span and host-lane work overlap."""
    host_adam = probe.host_adam
    sync = device_sync(probe.device)
    work = device_work if sync is None else lambda: (device_work(), sync())
    work()
    compute_alone = median_time(device_work, repeats, sync=sync)
    halt = _loop_in_thread(host_adam, probe.host_threads)
    compute_busy = median_time(device_work, repeats, sync=sync)
    halt()
    host_alone = in_thread(lambda: median_time(host_adam, repeats), probe.host_threads)
    halt = _loop_in_thread(work, device_threads)
    host_busy = in_thread(lambda: median_time(host_adam, repeats), probe.host_threads)
    halt()
    return {"compute_factor_when_host_busy": min(1.0, compute_alone / compute_busy),
            "host_factor_when_compute_busy": min(1.0, host_alone / host_busy)}
