"""The hardware dataclasses: GPU, HostLink, HostCPU, NetLink, NvmeDrive and Node.

This module owns the frozen objects `zfbench.core.hardware` builds from data/hardware.json (and
re-exports): their fields, units (bytes, seconds, bytes/s per direction, FLOP/s,
parameters/s) and the small derived quantities on them. Split out of hardware.py for size;
reading, validating and naming presets stays there.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

_PRECISIONS = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
               "half": "fp16"}
_DIRECTIONS = ("h2d", "d2h")


def _ro(sources: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(sources))


def _sources_field() -> Any:
    # Excluded from ==/hash so the frozen dataclasses stay hashable and compare by numbers.
    return field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class GPU:
    name: str
    bf16_flops_per_s: float | None  # None: no bf16 tensor cores (V100)
    fp16_flops_per_s: float
    memory_bytes: float
    hbm_bytes_per_s: float
    default_mfu: float
    native_pcie: str
    sources: Mapping[str, str] = _sources_field()

    def peak_flops_per_s(self, precision: str) -> float:
        """Dense tensor-core peak for ``"bf16"`` or ``"fp16"`` (torch-style aliases accepted)."""
        key = _PRECISIONS.get(str(precision).lower())
        if key is None:
            raise ValueError(f"unknown precision {precision!r}; choose one of: bf16, fp16")
        if key == "bf16" and self.bf16_flops_per_s is None:
            raise ValueError(f"GPU {self.name!r} has no bf16 tensor cores; use precision fp16")
        return self.bf16_flops_per_s if key == "bf16" else self.fp16_flops_per_s


@dataclass(frozen=True)
class HostLink:
    """One x16 host link; h2d and d2h are separate resources that interfere when both run."""
    name: str
    h2d_theoretical_bytes_per_s: float
    d2h_theoretical_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    h2d_factor_when_d2h_busy: float
    d2h_factor_when_h2d_busy: float
    setup_latency_s: float
    sources: Mapping[str, str] = _sources_field()

    def __post_init__(self) -> None:
        for d in _DIRECTIONS:
            if getattr(self, f"{d}_bytes_per_s") > getattr(self, f"{d}_theoretical_bytes_per_s"):
                raise ValueError(f"host link {self.name!r}: measured {d}_bytes_per_s exceeds "
                                 f"{d}_theoretical_bytes_per_s")

    def bytes_per_s(self, direction: str, other_busy: bool = False) -> float:
        """Measured rate of one direction, reduced by its factor while the other one runs."""
        d = str(direction).lower()
        if d not in _DIRECTIONS:
            raise ValueError(f"unknown direction {direction!r}; choose one of: h2d, d2h")
        if d == "h2d":
            return self.h2d_bytes_per_s * (self.h2d_factor_when_d2h_busy if other_busy else 1.0)
        return self.d2h_bytes_per_s * (self.d2h_factor_when_h2d_busy if other_busy else 1.0)

    def scaled(self, factor: float) -> HostLink:
        """All four bandwidths times ``factor`` (> 0); factors and latency unchanged."""
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be a positive finite number, got {factor!r}")
        names = ("h2d_theoretical_bytes_per_s", "d2h_theoretical_bytes_per_s",
                 "h2d_bytes_per_s", "d2h_bytes_per_s")
        sources = {**self.sources, **{n: f"{self.sources.get(n, '')}; scaled x{factor:g}"
                                      for n in names}}
        return dataclasses.replace(
            self, name=f"{self.name}x{factor:g}", sources=_ro(sources),
            **{n: getattr(self, n) * factor for n in names})


@dataclass(frozen=True)
class HostCPU:
    """A whole host (all sockets). ``cores`` and the DRAM rates are node totals."""
    name: str
    cores: int
    sockets: int
    dram_bytes_per_s: float              # achievable: theoretical total * STREAM triad fraction
    dram_theoretical_bytes_per_s: float  # node total
    adam_params_per_s_per_core: float
    adam_bytes_per_param: float
    memory_bytes: float
    sources: Mapping[str, str] = _sources_field()

    @property
    def cores_per_socket(self) -> int:
        return self.cores // self.sockets

    def adam_params_per_s(self, cores: int) -> float:
        """Host Adam rate on ``cores`` cores (clamped to the host's), capped by DRAM bandwidth."""
        if cores < 0:
            raise ValueError(f"cores must be >= 0, got {cores}")
        used = min(cores, self.cores)
        return min(used * self.adam_params_per_s_per_core,
                   self.dram_bytes_per_s / self.adam_bytes_per_param)

    def with_cores(self, cores: int) -> HostCPU:
        """The same host with ``cores`` cores in total; DRAM (a node resource) is unchanged."""
        if int(cores) != cores or cores < 1:
            raise ValueError(f"cores must be a positive integer, got {cores!r}")
        return dataclasses.replace(self, cores=int(cores), sockets=min(self.sockets, int(cores)))


@dataclass(frozen=True)
class NetLink:
    """GPU-to-GPU link for collectives: per direction per GPU, and ring busbw efficiency."""
    name: str
    bytes_per_s: float
    latency_s: float
    efficiency: float
    sources: Mapping[str, str] = _sources_field()

    @property
    def achieved_bytes_per_s(self) -> float:
        """Bus bandwidth a ring collective reaches (nccl-tests busbw convention)."""
        return self.bytes_per_s * self.efficiency


@dataclass(frozen=True)
class NvmeDrive:
    """One NVMe drive (every number per drive): sequential read and write, capacity."""
    name: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    capacity_bytes: float
    sources: Mapping[str, str] = _sources_field()


@dataclass(frozen=True)
class Node:
    name: str
    gpu: GPU
    gpus: int
    link: HostLink
    gpus_per_switch: int
    host: HostCPU
    net: NetLink
    nvme: NvmeDrive | None = None  # the node's drive model, `nvme_drives` of them
    nvme_drives: int = 0
    inter_net: NetLink | None = None  # the network joining several such nodes, per GPU
    note: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        for n in ("gpus", "gpus_per_switch"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"node {self.name!r}: {n} must be a positive int, got {v!r}")
        if self.gpus_per_switch > self.gpus:
            raise ValueError(f"node {self.name!r}: gpus_per_switch {self.gpus_per_switch} "
                             f"> gpus {self.gpus}")

    def upstream_bytes_per_s(self, direction: str) -> float:
        """One switch's upstream: a single x16 link of the node's generation (measured rate),
        shared by the ``gpus_per_switch`` GPUs behind it."""
        return self.link.bytes_per_s(direction)

    def per_gpu_upstream_bytes_per_s(self, direction: str) -> float:
        """Each GPU's share of its switch's upstream when all GPUs behind it transfer at once."""
        return self.upstream_bytes_per_s(direction) / self.gpus_per_switch

    def with_(self, **changes: Any) -> Node:
        """``dataclasses.replace`` that resolves names for gpu/link/host/net and clamps
        gpus_per_switch to gpus."""
        from zfbench.core import hardware  # the preset getters (hardware imports this module)

        getters = {"gpu": hardware.get_gpu, "link": hardware.get_link,
                   "host": hardware.get_host, "net": hardware.get_net,
                   "nvme": hardware.get_nvme}
        for key, getter in getters.items():
            if isinstance(changes.get(key), str):
                changes[key] = getter(changes[key])
        for key in ("gpus", "gpus_per_switch"):
            v = changes.get(key, getattr(self, key))
            if isinstance(v, bool) or int(v) != v:
                raise ValueError(f"{key} must be an int, got {v!r}")
            changes[key] = int(v)
        changes["gpus_per_switch"] = min(changes["gpus_per_switch"], changes["gpus"])
        return dataclasses.replace(self, **changes)
