"""The hardware file's layout: its sections, their fields, and every number's source.

zfbench/data/hardware.json (the presets) and a user's hardware profile share one layout,
which this module owns and checks (`validate_layout`): the sections (`gpus`,
`host_links`, `hosts`, `net_links`, `nvme_drives`, `nodes`), each entry's numeric and
string fields (`SCHEMA`; which may be left out, which are fractions or integers, which may
be zero), and the rule that every number is ``{"value": ..., "source": "..."}``. A number
calibrated from one published row (its source begins `CALIBRATED_PREFIX`) carries its
sourced fallback, ``"judgment": {"value", "source"}`` (that source begins
`JUDGMENT_PREFIX`), which the presets must give. A breach is one `HardwareProfileError`
naming the file, section, entry and field. zfbench.core.hardware builds the hardware
objects from what `validate_layout` returns and writes them back in this layout.
No torch here.
"""
from __future__ import annotations

import math
from typing import Any


class HardwareProfileError(ValueError):
    """A hardware JSON that breaks the layout: names the section, entry and field."""


# a CPU accelerator's training thread (HostLink): its pass rate and the rates and per-op
# seconds of ZenFlow's ops on it, which scale with the link (`HostLink.scaled`)
THREAD_RATES = ("training_thread_bytes_per_s", "thread_layout_copy_elems_per_s",
                "thread_layout_add_extra_elems_per_s", "thread_selective_step_elems_per_s",
                "thread_selective_boundary_elems_per_s")
THREAD_OP_SECONDS = ("thread_selective_step_op_s", "thread_selective_boundary_op_s")
_THREAD_OPS = THREAD_RATES + THREAD_OP_SECONDS
_SECTIONS = ("gpus", "host_links", "hosts", "net_links", "nvme_drives", "nodes")
KIND = {"gpus": "gpu", "host_links": "host link", "hosts": "host",
        "net_links": "net link", "nvme_drives": "NVMe drive", "nodes": "node"}
# section -> (numeric fields, string fields); every entry may also carry a "note" string.
SCHEMA: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gpus": (("bf16_flops_per_s", "fp16_flops_per_s", "memory_bytes", "hbm_bytes_per_s",
              "default_mfu", "matmul_achievable_share"), ("native_pcie", "mfu_reference")),
    "host_links": (("h2d_theoretical_bytes_per_s", "d2h_theoretical_bytes_per_s",
                    "h2d_bytes_per_s", "d2h_bytes_per_s", "h2d_factor_when_d2h_busy",
                    "d2h_factor_when_h2d_busy", "setup_latency_s",
                    "staging_copy_bytes_per_s", *_THREAD_OPS), ()),
    "hosts": (("cores_per_socket", "sockets", "dram_theoretical_bytes_per_s_per_socket",
               "dram_triad_fraction", "adam_params_per_s_per_core", "adam_bytes_per_param",
               "memory_bytes", "dispatch_s_per_kernel", "fresh_page_bytes_per_s"), ()),
    "net_links": (("bytes_per_s", "latency_s", "efficiency"), ()),
    "nvme_drives": (("read_bytes_per_s", "write_bytes_per_s", "capacity_bytes"), ()),
    "nodes": (("gpus", "gpus_per_switch", "nvme_drives"), ("gpu", "link", "host", "net",
                                                          "nvme", "inter_net")),
}
# Fields an entry may leave out: a node without NVMe (e.g. a measured profile's node) or
# without a network to other nodes; a GPU without bf16 tensor cores (V100), or computing
# from the census (no default_mfu); a link whose pageable copies were not measured, or a
# real link (no training-thread rate: not a CPU accelerator); a host without a launch
# floor or whose fresh pages were not measured.
_OPTIONAL = {"host_links": frozenset({"staging_copy_bytes_per_s", *_THREAD_OPS}),
             "nodes": frozenset({"nvme", "nvme_drives", "inter_net"}),
             "gpus": frozenset({"bf16_flops_per_s", "mfu_reference", "default_mfu",
                                "matmul_achievable_share"}),
             "hosts": frozenset({"dispatch_s_per_kernel", "fresh_page_bytes_per_s"})}
_FRACTIONS = {"default_mfu", "matmul_achievable_share", "h2d_factor_when_d2h_busy",
              "d2h_factor_when_h2d_busy",
              "dram_triad_fraction", "efficiency"}
_INTEGERS = {"cores_per_socket", "sockets", "gpus", "gpus_per_switch", "nvme_drives"}
_ZERO_OK = {"setup_latency_s", "latency_s", *THREAD_OP_SECONDS}
# How a source names a number calibrated from one row of zfbench/data/published, and how
# its fallback's source begins.
CALIBRATED_PREFIX = "calibration row "
JUDGMENT_PREFIX = "judgment:"


def validate_layout(raw: Any, origin: str, require_all: bool) -> dict[str, dict[str, dict]]:
    """Check the layout; return {section: {name: {field: (value, source) | str}}}."""
    if not isinstance(raw, dict):
        raise HardwareProfileError(f"{origin}: top level must be a JSON object")
    out: dict[str, dict[str, dict]] = {}
    # "calibration" holds a measured profile's per-block times (real/profile.py); the
    # simulator reads it, this module only passes it by
    unknown = [k for k in raw if k not in _SECTIONS and k not in ("description", "calibration")
               and k[:1] != "_"]
    if unknown:
        raise HardwareProfileError(f"{origin}: unknown section(s) {unknown}; sections are: "
                                   + ", ".join(_SECTIONS))
    for section in _SECTIONS:
        if section not in raw:
            if require_all:
                raise HardwareProfileError(f"{origin}: missing section {section!r}")
            continue
        entries = raw[section]
        if not isinstance(entries, dict):
            raise HardwareProfileError(f"{origin}: section {section!r} must be an object")
        numeric, strings = SCHEMA[section]
        out[section] = {}
        for name, entry in entries.items():
            where = f"{origin}: {KIND[section]} {name!r}"
            if not isinstance(entry, dict):
                raise HardwareProfileError(f"{where} must be an object")
            extra = set(entry) - set(numeric) - set(strings) - {"note"}
            if extra:
                raise HardwareProfileError(f"{where}: unknown field(s) {sorted(extra)}; "
                                           f"expected {list(numeric) + list(strings)}")
            parsed: dict[str, Any] = {"judgments": {}}
            optional = _OPTIONAL.get(section, frozenset())
            for f in numeric:
                if f not in optional or f in entry:
                    parsed[f] = _number(entry, f, where)
                    found = _judgment(entry[f], f, where, require=require_all)
                    if found is not None:
                        parsed["judgments"][f] = found
            for f in strings:
                if f in optional and f not in entry:
                    continue
                v = entry.get(f)
                if not isinstance(v, str) or not v.strip():
                    raise HardwareProfileError(f"{where}: field {f!r} must be a non-empty string")
                parsed[f] = v
            parsed["note"] = str(entry.get("note", ""))
            out[section][name.lower()] = parsed
    return out


def _number(entry: dict, f: str, where: str) -> tuple[float, str]:
    if f not in entry:
        raise HardwareProfileError(f"{where}: missing field {f!r}")
    item = entry[f]
    if not isinstance(item, dict) or "value" not in item:
        raise HardwareProfileError(f"{where}: field {f!r} must be {{\"value\": ..., "
                                   f"\"source\": ...}}, got {item!r}")
    source = item.get("source")
    if not isinstance(source, str) or not source.strip():
        raise HardwareProfileError(f"{where}: field {f!r} has no source")
    v = item["value"]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise HardwareProfileError(f"{where}: field {f!r} value must be a finite number")
    if v < 0 or (v == 0 and f not in _ZERO_OK):
        raise HardwareProfileError(f"{where}: field {f!r} must be positive, got {v}")
    if f in _FRACTIONS and v > 1:
        raise HardwareProfileError(f"{where}: field {f!r} is a fraction in (0, 1], got {v}")
    if f in _INTEGERS and int(v) != v:
        raise HardwareProfileError(f"{where}: field {f!r} must be an integer, got {v}")
    return (int(v) if f in _INTEGERS else float(v)), source


def _judgment(item: dict, f: str, where: str, require: bool) -> tuple[float, str] | None:
    """The field's `judgment` (value, source), checked as the field is; None where it has
    none, which `require` (the bundled presets) refuses for a calibrated number."""
    calibrated = item["source"].startswith(CALIBRATED_PREFIX)
    if "judgment" not in item:
        if require and calibrated:
            raise HardwareProfileError(f"{where}: field {f!r} is calibrated from a published "
                                       f"row and has no \"judgment\" to fall back to")
        return None
    value, source = _number({f: item["judgment"]}, f, f"{where} (judgment)")
    if not calibrated or not source.startswith(JUDGMENT_PREFIX):
        raise HardwareProfileError(f"{where}: field {f!r}: only a number whose source begins "
                                   f"{CALIBRATED_PREFIX!r} carries a judgment, and its "
                                   f"source begins {JUDGMENT_PREFIX!r}")
    return value, source
