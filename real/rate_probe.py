"""The host lane's and the links' rates on buffers of one model's size, measurable again.

`RateProbe(total, dtype, host_threads)` allocates, once, the buffers the engine's host
side works on for a model of `total` parameters (a device-precision flat buffer, the fp32
master, gradient and moments); `measure(repeats)` then times, as the engine does them:
- d2h: the device buffer copied into an fp32 host buffer, on the calling (device) thread;
- h2d: the fp32 master copied into a device-precision buffer, on a host worker thread;
  each alone, and both at once;
- host AdamW (`zfbench.real.host_adam.host_adamw_`) over the whole master and the host
  accumulation (`add_` with alpha), on the host worker's threads.
It returns the rate keys of a profile's `calibration` section. `zfbench.real.profile` measures
them once per profile; `zfbench.validate` measures them again right before and after
each cell, because on a shared machine these memory-bound rates drift by 1.5x within
minutes (host AdamW over 175M parameters measured 0.10 s and 0.25 s on this machine
half an hour apart), and the cell is best predicted from the rates of its own minute.
"""

from __future__ import annotations

import statistics
import threading
import time

import torch

from zfbench.real.host_adam import host_adamw_

RATE_KEYS = ("d2h_bytes_per_s", "h2d_bytes_per_s", "d2h_bytes_per_s_both",
             "h2d_bytes_per_s_both", "host_adam_params_per_s", "host_accum_elems_per_s")


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


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


class RateProbe:
    def __init__(self, total: int, dtype: torch.dtype, host_threads: int) -> None:
        self.total, self.host_threads = int(total), int(host_threads)
        self.dev = (torch.randn(self.total) * 0.02).to(dtype)
        self.up = torch.zeros(self.total, dtype=dtype)
        self.master = torch.randn(self.total)
        self.grad = torch.randn(self.total) * 1e-3  # also the d2h destination
        self.m, self.v = torch.zeros(self.total), torch.zeros(self.total)

    def host_adam(self) -> None:
        """One host AdamW step over the whole master (values are irrelevant to its time)."""
        host_adamw_(self.master, self.grad, self.m, self.v, step=1, lr=1e-4, beta1=0.9,
                    beta2=0.999, eps=1e-8, weight_decay=0.01)

    def measure(self, repeats: int = 5) -> dict[str, float]:
        nbytes = self.total * self.dev.element_size()

        def d2h():
            self.grad.copy_(self.dev)

        def h2d():
            self.up.copy_(self.master)

        def accum():
            self.m.add_(self.grad, alpha=0.25)
        d2h()
        h2d()
        d2h_alone = median_time(d2h, repeats)
        h2d_alone = in_thread(lambda: median_time(h2d, repeats), self.host_threads)
        both = {}

        def h2d_loop():
            both["h2d"] = median_time(h2d, repeats)
        worker = threading.Thread(target=lambda: (torch.set_num_threads(self.host_threads),
                                                  h2d_loop()))
        worker.start()
        both["d2h"] = median_time(d2h, repeats)
        worker.join()
        host_adam = self.host_adam
        adam_s = in_thread(lambda: (host_adam(), median_time(host_adam, repeats))[1],
                           self.host_threads)
        accum_s = in_thread(lambda: (accum(), median_time(accum, repeats))[1],
                            self.host_threads)
        return {"d2h_bytes_per_s": nbytes / d2h_alone, "h2d_bytes_per_s": nbytes / h2d_alone,
                "d2h_bytes_per_s_both": nbytes / both["d2h"],
                "h2d_bytes_per_s_both": nbytes / both["h2d"],
                "host_adam_params_per_s": self.total / adam_s,
                "host_accum_elems_per_s": self.total / accum_s}


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
    """How much the two lanes slow each other on a CPU-emulated accelerator, where both
    are cores over the same DRAM: `device_work` (a training step's forward+backward, on
    the calling thread) timed alone and while host AdamW repeats on the host threads, and
    host AdamW timed alone and while `device_work` repeats on a device thread. Returned
    as rate factors (alone / together, at most 1) the simulator applies while a compute
    span and host-lane work overlap."""
    host_adam = probe.host_adam
    device_work()
    compute_alone = median_time(device_work, repeats)
    halt = _loop_in_thread(host_adam, probe.host_threads)
    compute_busy = median_time(device_work, repeats)
    halt()
    host_alone = in_thread(lambda: median_time(host_adam, repeats), probe.host_threads)
    halt = _loop_in_thread(device_work, device_threads)
    host_busy = in_thread(lambda: median_time(host_adam, repeats), probe.host_threads)
    halt()
    return {"compute_factor_when_host_busy": min(1.0, compute_alone / compute_busy),
            "host_factor_when_compute_busy": min(1.0, host_alone / host_busy)}
