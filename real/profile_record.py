"""A measured profile as a record: the hardware-file layout the simulator reads.

`build_profile` turns what `zfbench.real.profile.measure_profile` measured (per-block
times, link and host-lane rates, the device measured on: `describe_device`) into the layout
of `zfbench/data/hardware.json`, one `{value, source}` per number, every source naming
this measurement, plus a `calibration` section with the raw rates, the blocks, the
machine and the device. `with_rates` rebuilds a profile with some rates measured again
(around one run: `zfbench.real.rate_probe`), `mean_profile` averages profiles of one shape.
`python -m zfbench.simulate --profile FILE` reads the result.
"""

from __future__ import annotations

import datetime
import statistics
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch

from zfbench.real.flat import device_dtype
from zfbench.real.host_fused import status as host_kernels_status
from zfbench.real.rate_probe import FRESH_PAGE_KEY
from zfbench.core.models import get_model
from zfbench.core.provenance import machine

if TYPE_CHECKING:
    from zfbench.real.runner import RunSpec

__all__ = ["DEVICE_KEYS", "build_profile", "describe_device", "mean_profile", "with_rates"]


NOT_A_LIMIT = ("not a limit: host Adam and accumulation rates are measured directly on the "
               "host lane, so DRAM bandwidth is already in them")


def _mem_total() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return float(line.split()[1]) * 1024
    return 16e9


def describe_device(device: torch.device) -> dict:
    """The calibration's account of the device measured on: its name ("cpu" for the
    emulated lanes), how the links moved data ("cuda" copies or "emulated" memory copies)
    and, on a GPU, its total memory."""
    if device.type != "cuda":
        return {"device": "cpu", "transfers": "emulated"}
    return {"device": torch.cuda.get_device_name(device), "transfers": "cuda",
            "device_memory_bytes": int(torch.cuda.get_device_properties(device).total_memory)}


DEVICE_KEYS = ("device", "transfers", "device_memory_bytes")


def _device_memory_and_hbm(info: dict, rates: dict, m) -> tuple[dict, dict]:
    """`memory_bytes` and `hbm_bytes_per_s` of the measured device: a GPU's total memory and
    its measured device-to-device copy rate; on the CPU lanes a nominal 64 GB and the d2h
    rate (a memory copy, as on those lanes)."""
    if info.get("transfers") != "cuda" or "device_memory_bytes" not in info:
        return m(64e9), m(rates["d2h_bytes_per_s"])
    itemsize = device_dtype(rates["precision"]).itemsize
    memory = {"value": float(info["device_memory_bytes"]),
              "source": f"torch.cuda.get_device_properties().total_memory of {info['device']}"}
    hbm = m(2 * itemsize / rates["device_copy_s_per_elem"])  # read + write per element
    hbm["source"] += ": a device-to-device copy of the flat parameters, read+write bytes / s"
    return memory, hbm


def build_profile(spec: RunSpec, shape, blocks: dict, dev_threads: int, host_threads: int,
                  rates: dict, device_info: dict | None = None) -> dict:
    """The measurements in the hardware.json layout ({value, source} per number);
    `device_info` (`describe_device`, default the CPU lanes') goes into the calibration."""
    info = describe_device(torch.device("cpu")) if device_info is None else device_info
    when = datetime.datetime.now().isoformat(timespec="seconds")
    src = f"measured by python -m zfbench.run --profile ({shape.name}, batch {spec.micro_batch}, " \
          f"seq {spec.seq}, {dev_threads}+{host_threads} threads, {when})"

    def m(value: float) -> dict:
        return {"value": float(value), "source": src}
    fwd_flops = sum(b["forward_flops"] for b in blocks.values())
    fwd_s = sum(b["forward_s"] * (shape.layers if k == "decoder" else 1)
                for k, b in blocks.items())
    both_d2h = min(1.0, rates["d2h_bytes_per_s_both"] / rates["d2h_bytes_per_s"])
    both_h2d = min(1.0, rates["h2d_bytes_per_s_both"] / rates["h2d_bytes_per_s"])
    memory, hbm = _device_memory_and_hbm(info, rates, m)
    return {
        "description": src,
        "gpus": {"measured-device": {
            "bf16_flops_per_s": m(fwd_flops / fwd_s), "fp16_flops_per_s": m(fwd_flops / fwd_s),
            "memory_bytes": memory, "hbm_bytes_per_s": hbm,
            "default_mfu": m(1.0), "native_pcie": "measured-link"}},
        "host_links": {"measured-link": {
            "h2d_theoretical_bytes_per_s": m(rates["h2d_bytes_per_s"]),
            "d2h_theoretical_bytes_per_s": m(rates["d2h_bytes_per_s"]),
            "h2d_bytes_per_s": m(rates["h2d_bytes_per_s"]),
            "d2h_bytes_per_s": m(rates["d2h_bytes_per_s"]),
            "h2d_factor_when_d2h_busy": m(max(both_h2d, 1e-3)),
            "d2h_factor_when_h2d_busy": m(max(both_d2h, 1e-3)),
            "setup_latency_s": m(0.0)}},
        "hosts": {"measured-host": {
            "cores_per_socket": {"value": host_threads, "source": src + ": host lane threads"},
            "sockets": {"value": 1, "source": src},
            "dram_theoretical_bytes_per_s_per_socket": {"value": 1e15, "source": NOT_A_LIMIT},
            "dram_triad_fraction": {"value": 1.0, "source": NOT_A_LIMIT},
            "adam_params_per_s_per_core": m(rates["host_adam_params_per_s"] / host_threads),
            "adam_bytes_per_param": {"value": 28.0, "source": "roofline, hardware.md"},
            "memory_bytes": m(_mem_total()),
            # profiles before session 28 have none: no fault term (zfbench.sims.window_copy)
            **({"fresh_page_bytes_per_s": m(rates[FRESH_PAGE_KEY])}
               if FRESH_PAGE_KEY in rates else {})}},
        "net_links": {"measured-net": {
            "bytes_per_s": {"value": 1e12, "source": "not measured: one rank"},
            "latency_s": {"value": 1e-6, "source": "not measured: one rank"},
            "efficiency": {"value": 1.0, "source": "not measured: one rank"}}},
        "nodes": {"measured": {
            "gpu": "measured-device", "gpus": {"value": 1, "source": src},
            "link": "measured-link", "gpus_per_switch": {"value": 1, "source": src},
            "host": "measured-host", "net": "measured-net"}},
        "calibration": {
            "machine": machine(),  # CPU model, ISA flags, cores, memory, torch version
            # the host kernels' path the probe timed: 'cpp' (one pass) or 'torch'
            "host_kernels": host_kernels_status(load=False)["path"],
            "model": shape.name, "batch": spec.micro_batch, "seq": spec.seq,
            "device_threads": dev_threads, "host_threads": host_threads,
            "blocks": blocks, **rates, "source": src, **info},
    }


_CAL_META = ("model", "batch", "seq", "device_threads", "host_threads", "blocks", "source",
             *DEVICE_KEYS)


def with_rates(profile: dict, rates: dict) -> dict:
    """The profile with some calibration rates replaced (e.g. host and link rates measured
    again around one run, `zfbench.real.rate_probe`) and its hardware sections rebuilt from them."""
    cal = profile["calibration"]
    measured = {k: v for k, v in cal.items() if k not in _CAL_META}
    measured.update(rates)
    spec = SimpleNamespace(micro_batch=cal["batch"], seq=cal["seq"])
    return build_profile(spec, get_model(cal["model"]), cal["blocks"], cal["device_threads"],
                         cal["host_threads"], measured,
                         {k: cal[k] for k in DEVICE_KEYS if k in cal})


def mean_profile(profiles: list[dict]) -> dict:
    """The element-wise mean of profiles of one shape (numbers averaged, everything else
    taken from the first), e.g. one measured before and one after a batch of runs."""
    first = profiles[0]
    if isinstance(first, dict):
        return {k: mean_profile([p[k] for p in profiles]) for k in first}
    if isinstance(first, float):  # measurements; counts (batch, threads) are ints
        return statistics.fmean(profiles)
    return first
