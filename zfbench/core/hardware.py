"""Named hardware for zfbench: GPUs, PCIe host links, host CPUs, GPU-to-GPU links, NVMe
drives, nodes.

This module owns the hardware vocabulary: the frozen dataclasses (GPU, HostLink, HostCPU,
NetLink, NvmeDrive, Node: their fields and the small derived quantities on them) and the
named presets. The numbers live in ``zfbench/data/hardware.json`` (package data), where
every numeric field is ``{"value": ..., "source": "..."}`` (the layout and its checks,
a number without a source refused: zfbench.core.hardware_file); this module reads that
file once and turns the entries into the dataclasses (each carrying its ``sources``), and
an object back into an entry (:func:`entry_of`). A number calibrated from one published
row carries its sourced fallback beside it, ``"judgment": {"value", "source"}``
(:func:`judgments` reads them). It also reads user profiles in the same layout
(:func:`load_profile`). Units: bytes, seconds, bytes/s per direction, FLOP/s, parameters/s.
No torch here: the simulator and the analysis code use it without a GPU stack.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from zfbench.core.hardware_file import (CALIBRATED_PREFIX, JUDGMENT_PREFIX,  # noqa: F401
                                        KIND, SCHEMA, THREAD_OP_SECONDS, THREAD_RATES,
                                        HardwareProfileError, validate_layout)

__all__ = ["GPU", "HostCPU", "HostLink", "NetLink", "Node", "NvmeDrive",
           "UnknownHardwareError", "HardwareProfileError", "load_profile", "lookup",
           "get_gpu", "get_link", "get_host", "get_net", "get_nvme", "get_node",
           "gpu_names", "link_names", "host_names", "net_names", "nvme_names",
           "node_names", "entry_of", "judgments", "CALIBRATED_PREFIX"]

# ---------------------------------------------------------------- the hardware objects

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
    # A measured whole-model MFU standing in for the op census (a profile's or predict's
    # inferred GPU); None (every preset): compute from the census (zfbench.sims.op_curve)
    default_mfu: float | None
    native_pcie: str
    # The shape `default_mfu` holds at, MODEL@MICRO_BATCHxSEQ with activation checkpointing
    # (zfbench.sims.compute_efficiency); empty: the simulator's default scenario.
    mfu_reference: str = ""
    # The best matmul rate measured on this GPU over its datasheet peak (MAMF / peak): how
    # the census's curve carries to it (zfbench.sims.op_curve); None: the curve's own GPU's
    matmul_achievable_share: float | None = None
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
    # the rate of a copy from or into pageable host memory, which the driver stages through
    # its pinned buffer (zfbench.sims.pageable), where measured or inferred (zfbench.predict
    # from a run with pageable buffers); None: the staging-copy judgment of sims/pageable.py
    staging_copy_bytes_per_s: float | None = None
    # where the accelerator is the host's own CPU (DeepSpeed's CPU accelerator): no link,
    # its "copies" and gradient passes are the training thread's memory passes, at this
    # rate (read from the run: zfbench.predict.inputs.deepspeed_pass_rate); None: a link
    training_thread_bytes_per_s: float | None = None
    # on a CPU accelerator, the ops DeepSpeed's ZenFlow adds to that thread, probed on the
    # host (bench/zenflow_cpu_ops.py; zfbench.sims.cpu_accelerator): what the column-major
    # layout adds to an embedding table's backward (its gradient copied into the layout;
    # tied to the head, both contributions summed across layouts), as table elements per
    # second of that extra, and one parameter's selective-optimizer ops on a window's
    # inner and last step; None: absent
    thread_layout_copy_elems_per_s: float | None = None
    thread_layout_add_extra_elems_per_s: float | None = None
    thread_selective_step_op_s: float | None = None
    thread_selective_step_elems_per_s: float | None = None
    thread_selective_boundary_op_s: float | None = None
    thread_selective_boundary_elems_per_s: float | None = None
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
        """All four bandwidths (and a CPU accelerator's training-thread rates) times
        ``factor`` (> 0), that thread's per-op seconds over it; factors and latency
        unchanged."""
        if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
            raise ValueError(f"scale factor must be a positive finite number, got {factor!r}")
        names = ("h2d_theoretical_bytes_per_s", "d2h_theoretical_bytes_per_s",
                 "h2d_bytes_per_s", "d2h_bytes_per_s")
        names += tuple(n for n in THREAD_RATES if getattr(self, n) is not None)
        per_op = tuple(n for n in THREAD_OP_SECONDS if getattr(self, n) is not None)
        sources = {**self.sources, **{n: f"{self.sources.get(n, '')}; scaled x{factor:g}"
                                      for n in names + per_op}}
        return dataclasses.replace(
            self, name=f"{self.name}x{factor:g}", sources=_ro(sources),
            **{n: getattr(self, n) * factor for n in names},
            **{n: getattr(self, n) / factor for n in per_op})


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
    # host seconds to issue one kernel of an eager PyTorch training step (Python, the
    # dispatcher, autograd, the launch): the floor under a launch-bound step's compute
    # (zfbench.sims.compute_efficiency); None (a measured profile's host): no floor
    dispatch_s_per_kernel: float | None = None
    # bytes/s at which a fresh host allocation's pages are first touched (faulted in),
    # beyond writing mapped memory, as a measured profile's probe gives it
    # (zfbench.real.rate_probe FRESH_PAGE_KEY); None (every preset): not measured, no cost
    # (zfbench.sims.window_copy's fresh temporary)
    fresh_page_bytes_per_s: float | None = None
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
        getters = {"gpu": get_gpu, "link": get_link, "host": get_host, "net": get_net,
                   "nvme": get_nvme}
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


class UnknownHardwareError(ValueError):
    """A hardware name that no preset (or profile) defines; the message lists valid names."""


# ---------------------------------------------------------------- building and lookup

def _vals(parsed: dict, fields: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, str]]:
    """Values and sources of `fields`; an optional field left out is None, sourceless."""
    return ({f: parsed[f][0] if f in parsed else None for f in fields},
            {f: parsed[f][1] for f in fields if f in parsed})


def _simple(cls: type) -> Any:
    section = {GPU: "gpus", HostLink: "host_links", NetLink: "net_links",
               NvmeDrive: "nvme_drives"}[cls]

    def build(name: str, p: dict) -> Any:
        vals, src = _vals(p, SCHEMA[section][0])
        strings = {f: p[f] for f in SCHEMA[section][1] if f in p}
        return cls(name=name, sources=_ro(src), **vals, **strings)
    return build


def _build_host(name: str, p: dict) -> HostCPU:
    vals, src = _vals(p, SCHEMA["hosts"][0])
    theo = vals["dram_theoretical_bytes_per_s_per_socket"] * vals["sockets"]
    sources = {**src, "cores": f"cores_per_socket x sockets: {src['cores_per_socket']}",
               "dram_theoretical_bytes_per_s":
                   f"per socket times sockets: {src['dram_theoretical_bytes_per_s_per_socket']}",
               "dram_bytes_per_s": f"theoretical total times {src['dram_triad_fraction']}"}
    keep = ("sockets", "adam_params_per_s_per_core", "adam_bytes_per_param", "memory_bytes",
            "dispatch_s_per_kernel", "fresh_page_bytes_per_s")
    return HostCPU(name=name, cores=vals["cores_per_socket"] * vals["sockets"],
                   dram_theoretical_bytes_per_s=theo,
                   dram_bytes_per_s=theo * vals["dram_triad_fraction"],
                   sources=_ro(sources), **{k: vals[k] for k in keep})


_BUILDERS = {"gpus": _simple(GPU), "host_links": _simple(HostLink), "hosts": _build_host,
             "net_links": _simple(NetLink), "nvme_drives": _simple(NvmeDrive)}
_NODE_PARTS = {"gpu": "gpus", "link": "host_links", "host": "hosts", "net": "net_links",
               "nvme": "nvme_drives", "inter_net": "net_links"}


def _build(validated: dict, fallback: dict | None, origin: str) -> dict[str, dict[str, Any]]:
    objs: dict[str, dict[str, Any]] = {}
    try:
        for section, builder in _BUILDERS.items():
            if section in validated:
                objs[section] = {n: builder(n, p) for n, p in validated[section].items()}
        if "nodes" in validated:
            objs["nodes"] = {}
        for name, p in validated.get("nodes", {}).items():
            parts = {}
            for key, section in _NODE_PARTS.items():
                if key not in p:  # an optional part left out
                    continue
                pool = {**(fallback or {}).get(section, {}), **objs.get(section, {})}
                if p[key].lower() not in pool:
                    raise UnknownHardwareError(
                        f"{origin}: node {name!r} names unknown {KIND[section]} {p[key]!r}; "
                        f"choose one of: {', '.join(sorted(pool))}")
                parts[key] = pool[p[key].lower()]
            drives = p.get("nvme_drives", (0,))[0]
            objs["nodes"][name] = Node(name=name, gpus=p["gpus"][0], note=p["note"],
                                       gpus_per_switch=p["gpus_per_switch"][0],
                                       nvme_drives=drives, **parts)
    except (HardwareProfileError, UnknownHardwareError):
        raise
    except ValueError as e:
        raise HardwareProfileError(f"{origin}: {e}") from None
    return objs


@lru_cache(maxsize=1)
def _validated_presets() -> dict[str, dict[str, dict]]:
    text = resources.files("zfbench").joinpath("data/hardware.json").read_text("utf-8")
    return validate_layout(json.loads(text), "zfbench/data/hardware.json", require_all=True)


@lru_cache(maxsize=1)
def _presets() -> dict[str, dict[str, Any]]:
    return _build(_validated_presets(), None, "zfbench/data/hardware.json")


def judgments(section: str, name: str) -> dict[str, tuple[float, str]]:
    """{field: (value, source)}: the sourced judgments the preset `name`'s calibrated
    numbers fall back to (module docstring); {} where none is calibrated."""
    return dict(_validated_presets()[section][_get(section, name).name]["judgments"])


def load_profile(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a hardware JSON in the package layout (any subset of the sections) and return
    ``{section: {name: object}}`` for the sections present. Nodes may name entries of the
    same file or built-in presets (the file's own win)."""
    p = Path(path)
    try:
        raw = json.loads(p.read_text("utf-8"))
    except json.JSONDecodeError as e:
        raise HardwareProfileError(f"{p}: not valid JSON: {e}") from None
    return _build(validate_layout(raw, str(p), require_all=False), _presets(), str(p))


def _get(section: str, name: str, extra: str | Path | None = None) -> Any:
    table = {**_presets()[section],
             **(load_profile(extra).get(section, {}) if extra is not None else {})}
    key = str(name).strip().lower().replace("_", "-")
    if key not in table:
        raise UnknownHardwareError(f"unknown {KIND[section]} {name!r}; choose one of: "
                                   + ", ".join(sorted(table)))
    return table[key]


def lookup(section: str, name: str, extra: str | Path | None = None) -> Any:
    """A preset by name, or an entry of the hardware file `extra` (same layout as
    data/hardware.json; its entries win over presets of the same name), e.g. the
    `inferred_hardware.json` that `python -m zfbench.predict` writes."""
    if section not in _BUILDERS:
        raise ValueError(f"section {section!r} is not one of {', '.join(_BUILDERS)}")
    return _get(section, name, extra)


# Getters and name lists for the built-in presets (names are case-insensitive; _ reads as -).
def get_gpu(name: str) -> GPU:
    return _get("gpus", name)

def get_link(name: str) -> HostLink:
    return _get("host_links", name)

def get_host(name: str) -> HostCPU:
    return _get("hosts", name)

def get_net(name: str) -> NetLink:
    return _get("net_links", name)

def get_nvme(name: str) -> NvmeDrive:
    return _get("nvme_drives", name)

def get_node(name: str, extra: str | Path | None = None) -> Node:
    """A node preset, or a node of the hardware file `extra` (its entries win)."""
    return _get("nodes", name, extra)

def gpu_names() -> list[str]:
    return sorted(_presets()["gpus"])

def link_names() -> list[str]:
    return sorted(_presets()["host_links"])

def host_names() -> list[str]:
    return sorted(_presets()["hosts"])

def net_names() -> list[str]:
    return sorted(_presets()["net_links"])

def nvme_names() -> list[str]:
    return sorted(_presets()["nvme_drives"])

def node_names() -> list[str]:
    return sorted(_presets()["nodes"])


def entry_of(section: str, obj: Any) -> dict[str, Any]:
    """An object back in the file layout (`{field: {"value", "source"}}`), e.g. to write
    a scaled copy of a preset into a hardware file that `lookup` reads."""
    numeric, strings = SCHEMA[section]
    derived = {"cores_per_socket": lambda h: h.cores // h.sockets,
               "dram_theoretical_bytes_per_s_per_socket":
                   lambda h: h.dram_theoretical_bytes_per_s / h.sockets,
               "dram_triad_fraction": lambda h: h.dram_bytes_per_s / h.dram_theoretical_bytes_per_s}
    out: dict[str, Any] = {}
    for f in numeric:
        value = derived[f](obj) if section == "hosts" and f in derived else getattr(obj, f)
        if value is None:  # an optional field left out (a V100's bf16 rate)
            continue
        out[f] = {"value": value, "source": obj.sources.get(f) or f"from {obj.name}"}
    out.update({f: getattr(obj, f) for f in strings if getattr(obj, f, None)})  # "": unset
    return out
