"""Infer the simulator's unknowns from one measured ZeRO-Offload step.

A measured ZeRO-Offload step, split the way papers and dashboards split it (`Breakdown`:
GPU compute, exposed PCIe transfer, and the rest of the step, the GPU waiting for the host
optimizer), pins three of the simulator's unknowns on the node at hand:
- compute time per step: the GPU's model FLOPs utilization (`default_mfu` of the inferred
  GPU, the MFU at its reference shape, zfbench.sims.compute_efficiency), scaled until the
  simulated compute is the measured;
- the effective PCIe rates (`d2h_bytes_per_s`, `h2d_bytes_per_s` of the inferred link),
  unless the run measured its copies' own rates (`Breakdown.link_Bps`: then taken as they are);
- the host's AdamW rate (`adam_params_per_s_per_core` of the inferred host, scaled by
  one host factor; its DRAM bandwidth rises with a factor above 1 and keeps the preset's
  below it, and host accumulation keeps its per-core streaming rate: `write_hardware`).
`fit` finds them by simulating the ZeRO-Offload step with the same shape and node and
scaling each rate by simulated / measured part until all three parts agree (a
fixed-point iteration; its docstring says what a measurement cannot pin), and `infer`
fits the cases an unmeasured d2h / h2d split leaves open. Each fit is written as a
hardware file in `data/hardware.json`'s layout, every inferred number with its source,
so `python -m zfbench.simulate --hardware FILE --gpu inferred-gpu --pcie inferred-link
--host inferred-host` replays it.

Part of the command `python -m zfbench.predict` (its concept: the inference, apart from
the command line): like the command, it imports sims/ and analysis/ (docs/design.md's
arrows).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from zfbench.analysis.breakdown import summarize
from zfbench.sims.costs import CostModel, SimSettings, SimSettingsError
from zfbench.sims.simulator import simulate
from zfbench.core import hardware
from zfbench.core.scenario import GPU_NODE

PARTS = ("compute_s", "io_s", "stall_s")
NAMES = {"gpus": "inferred-gpu", "host_links": "inferred-link", "hosts": "inferred-host"}
SCALE_LIMITS = (1e-4, 1e4)  # a rate further than this from its preset is not reachable


@dataclass(frozen=True)
class Breakdown:
    """Seconds per step of a ZeRO-Offload run: GPU compute, exposed PCIe transfer (`io_s`,
    optionally split into gradients down `d2h_s` and parameters up `h2d_s`) and the rest of
    the step (`stall_s`, the GPU waiting for the host optimizer)."""
    compute_s: float
    io_s: float
    stall_s: float
    d2h_s: float | None = None
    h2d_s: float | None = None
    source: str = ""
    # each part's step-to-step standard deviation (seconds), where the steps were measured
    spread_s: dict[str, float] | None = None
    # how many steps the parts are means over, where known: the means' own uncertainty is
    # the spread over its square root (`uncertainty`)
    steps: int | None = None
    # the measured link's fixed cost per copy (seconds), where the measurement shows one
    copy_latency_s: float | None = None
    # each direction's measured rate, {"d2h"/"h2d": {"bytes_per_s", "source"}}: where
    # given, the fit takes the link from it (`MEASURED_LINK`) instead of the exposed io
    link_Bps: dict | None = None

    def __post_init__(self) -> None:
        for name, value in (self.spread_s or {}).items():
            if name not in PARTS + ("d2h_s", "h2d_s") or not math.isfinite(value) or value < 0:
                raise ValueError(f"spread of {name}: must be a part's finite spread >= 0 s, "
                                 f"got {value!r}")
        for name in PARTS + ("d2h_s", "h2d_s", "copy_latency_s"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value < 0:
                raise ValueError(f"{name[:-2]} must be a finite number of seconds >= 0, "
                                 f"got {value!r}")
        for name in ("compute_s", "stall_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name[:-2]} must be > 0 s: a ZeRO-Offload step always "
                                 f"computes and waits for the host optimizer")
        for lane, rate in (self.link_Bps or {}).items():
            value = rate.get("bytes_per_s") if isinstance(rate, dict) else None
            if lane not in ("d2h", "h2d") or isinstance(value, bool) or \
                    not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"measured link rate {lane}: must be d2h or h2d with a "
                                 f"finite bytes_per_s > 0, got {rate!r}")
        if self.steps is not None and (isinstance(self.steps, bool) or
                                       not isinstance(self.steps, int) or self.steps < 1):
            raise ValueError(f"steps: the count the parts are means over, >= 1; got "
                             f"{self.steps!r}")
        if self.link_Bps and set(self.link_Bps) != {"d2h", "h2d"}:
            raise ValueError("give a measured link rate for both d2h and h2d, or neither")
        if (self.d2h_s is None) != (self.h2d_s is None):
            raise ValueError("give both d2h and h2d, or neither (then io)")
        if self.split and not math.isclose(self.d2h_s + self.h2d_s, self.io_s,
                                           rel_tol=1e-6, abs_tol=1e-9):
            raise ValueError(f"io ({self.io_s}) must equal d2h + h2d "
                             f"({self.d2h_s} + {self.h2d_s})")

    @property
    def split(self) -> bool:
        return self.d2h_s is not None

    @property
    def step_s(self) -> float:
        return self.compute_s + self.io_s + self.stall_s

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "step_s": self.step_s}

    def spread(self, part: str) -> float:
        return (self.spread_s or {}).get(part, 0.0)

    def uncertainty(self, part: str) -> float:
        """The standard error of the part's mean: its step-to-step spread over the square
        root of the steps (the spread itself where the count is unknown)."""
        return self.spread(part) / math.sqrt(self.steps) if self.steps else self.spread(part)


@dataclass(frozen=True)
class Scales:
    """The inferred unknowns: MFU, and each rate as a factor of its preset."""
    mfu: float
    d2h: float = 1.0
    h2d: float = 1.0
    host: float = 1.0
    latency: float = 1.0  # the link's fixed cost per copy, as a factor of its own


@dataclass
class Fit:
    case: str
    scales: Scales
    settings: SimSettings  # the node of this fit: `hardware` file + inferred names
    simulated: dict  # the simulated ZeRO-Offload parts at the fitted scales
    iterations: int
    reached: bool
    note: str = ""
    entries: dict = field(default_factory=dict)
    misses_s: dict = field(default_factory=dict)  # part -> simulated - measured, unreached

    @property
    def unreached_s(self) -> float:
        """Seconds per step the fitted ZeRO-Offload step stays off the measured one in the
        parts it could not reach (0 when reached): the prediction's range widens by it."""
        return sum(abs(m) for m in self.misses_s.values())

    def residuals(self, measured: Breakdown) -> dict:
        """Simulated / measured - 1 per measured part (0 for a part measured as 0 s); the
        exposed transfer too where the link was measured (`MEASURED_LINK`): a check there."""
        return {p: (self.simulated[p] / getattr(measured, p) - 1
                    if getattr(measured, p) > 0 else 0.0) for p in _targets(measured)}


# the case where the link rates are the measured copies' own (`Breakdown.link_Bps`): the
# fit moves only MFU and the host, and the exposed transfer is a check, not a target
MEASURED_LINK = "measured-link"
# the case of a run whose host buffers are pageable (`pin_memory` false on a GPU,
# zfbench.sims.pageable): the gradients' copies down (exposed, holding backward) pin the
# d2h rate and the driver's staging copy together (`staging_copy_bytes_per_s`, scaled with
# d2h), and DeepSpeed's pageable parameter copy up runs inside `optimizer_step` (v0.19.5
# stage_1_and_2.py `step`, lines 2294-2317), so the stall is fitted with the exposed h2d
# (`pageable_parts`) and the link's h2d rate stays the preset's
PAGEABLE = "pageable"


def pageable_parts(parts: Breakdown) -> Breakdown:
    """`parts` as the pageable case fits them: the parameters' copy up within the stall."""
    return dataclasses.replace(parts, stall_s=parts.stall_s + parts.h2d_s, h2d_s=0.0,
                               io_s=parts.d2h_s)


def _targets(measured: Breakdown, case: str = "") -> tuple[str, ...]:
    if case == MEASURED_LINK:
        return ("compute_s", "stall_s")
    if case == PAGEABLE:
        return ("compute_s", "d2h_s", "stall_s")
    return ("compute_s", "d2h_s", "h2d_s", "stall_s") if measured.split else PARTS


def baseline_parts(settings: SimSettings) -> dict:
    """The simulated ZeRO-Offload step's parts (steady steps), the exposed transfer also
    per direction (time with that direction in flight and the compute lane idle), the
    busy seconds per step of the host and of each link direction, and the copies per step
    of each direction."""
    result = simulate(settings, "zero-offload")
    spans, steps = result.timeline.spans_frame(), result.timeline.steps_frame()
    skip = result.skip_steps
    whole = summarize(spans, steps, skip)
    out = {"compute_s": whole["compute_s"], "io_s": whole["exposed_io_s"],
           "stall_s": whole["host_wait_s"], "step_s": whole["step_time_s"]}
    kept = spans[spans["step"] >= skip]
    per_step = (kept["t_end_s"] - kept["t_start_s"]).groupby(kept["lane"]).sum() / \
        (whole["steps_measured"] * whole["ranks"])
    copies = kept.groupby("lane").size() / (whole["steps_measured"] * whole["ranks"])
    for lane in ("d2h", "h2d"):
        mine = spans[spans["lane"].isin(["compute", lane])]
        out[f"{lane}_s"] = summarize(mine, steps, skip)["exposed_io_s"]
    for lane in ("host", "d2h", "h2d"):
        out[f"{lane}_busy_s"] = float(per_step.get(lane, 0.0))
    for lane in ("d2h", "h2d"):
        out[f"{lane}_copies"] = float(copies.get(lane, 0.0))
    return out


def on_hardware_file(knobs: dict, path: Path) -> dict:
    """`knobs` with their GPU, link and host copied into a hardware file under the same
    names: the same node, on which a run may also be fp32 (inference fits its compute,
    so the presets' 16-bit peaks do not decide it)."""
    defaults = SimSettings()
    named = {"gpus": knobs.get("gpu", defaults.machine.gpu),
             "host_links": knobs.get("pcie", defaults.machine.pcie),
             "hosts": knobs.get("host", defaults.machine.host)}
    entries = {section: {str(name).lower(): hardware.entry_of(
        section, hardware.lookup(section, name))} for section, name in named.items()}
    path.write_text(json.dumps({"description": "presets copied by zfbench.predict",
                                **entries}, indent=1))
    return {**knobs, "hardware": str(path)}


def start_mfu(base: SimSettings) -> float:
    """The MFU a fit starts from: the one given, the GPU's measured one, or (a preset GPU
    gives none) its census's MFU at the shape an inferred GPU's MFU is held at (the
    default scenario's model, micro-batch and sequence, checkpointed, no launch floor:
    zfbench.sims.compute_efficiency.gemm_efficiency's reference), so the first round
    simulates the preset's compute there."""
    gpu = base.machine.parts()[0]
    if base.machine.mfu is not None:
        return base.machine.mfu
    if gpu.default_mfu is not None:
        return gpu.default_mfu
    reference = base.with_(model=GPU_NODE.model, layers=None, micro_batch=GPU_NODE.micro_batch,
                           seq=GPU_NODE.seq, activation_checkpointing=True,
                           dispatch_s_per_kernel=0.0)
    return CostModel(reference).mfu


def write_hardware(path: Path, base: SimSettings, scales: Scales, how: dict[str, str],
                   copy_latency: tuple[float, str] | None = None
                   ) -> tuple[SimSettings, dict]:
    """The preset parts of `base` scaled by `scales`, written as a hardware file; returns
    the settings that simulate on it and the entries written. `copy_latency`: (seconds,
    source) of a measured fixed cost per copy, in place of the link preset's."""
    gpu, link, host, _ = base.machine.parts()
    g = hardware.entry_of("gpus", gpu)
    g["default_mfu"] = {"value": scales.mfu, "source": how["mfu"]}
    ln = hardware.entry_of("host_links", link)
    for d in ("d2h", "h2d"):
        factor = getattr(scales, d)
        rate = getattr(link, f"{d}_bytes_per_s") * factor
        ln[f"{d}_bytes_per_s"] = {"value": rate, "source": how[d]}
        theo = f"{d}_theoretical_bytes_per_s"
        if rate > ln[theo]["value"]:
            ln[theo] = {"value": rate, "source": f"raised to the inferred {d} rate (the "
                        f"measurement is faster than {link.name}'s theoretical rate)"}
    costs = CostModel(base)
    if costs.pageable_copies:  # the staging copy moves with the d2h rate (`PAGEABLE`)
        ln["staging_copy_bytes_per_s"] = {
            "value": costs.pageable_copy_bytes_per_s * scales.d2h, "source": how["staging"]}
    if copy_latency is not None:
        ln["setup_latency_s"] = {"value": copy_latency[0], "source": copy_latency[1]}
    if scales.latency != 1.0:
        ln["setup_latency_s"] = {
            "value": ln["setup_latency_s"]["value"] * scales.latency, "source": how["latency"]}
    h = hardware.entry_of("hosts", host)
    # the measured compute already holds the host's cost of issuing its kernels: the
    # fitted MFU carries it, so the preset's launch floor does not apply on top
    h.pop("dispatch_s_per_kernel", None)
    h["adam_params_per_s_per_core"] = {
        "value": host.adam_params_per_s_per_core * scales.host, "source": how["host"]}
    # A faster measured CPU-Adam needs the DRAM to carry it, so the bandwidth rises with the
    # factor; a slower one says nothing about the DRAM (CPU-Adam's rate is its arithmetic
    # and threads as much as its memory traffic), so the memory-bound streaming work (host
    # accumulation, the host step's passes) keeps the preset's bandwidth.
    dram = max(1.0, scales.host)
    h["dram_theoretical_bytes_per_s_per_socket"] = {
        "value": h["dram_theoretical_bytes_per_s_per_socket"]["value"] * dram,
        "source": (f"{host.name}'s, times the inferred host factor {scales.host:.4g}"
                   if dram > 1.0 else f"{host.name}'s (a slower inferred CPU-Adam, factor "
                   f"{scales.host:.4g}, leaves the DRAM as it is)")}
    entries = {"gpus": {NAMES["gpus"]: g}, "host_links": {NAMES["host_links"]: ln},
               "hosts": {NAMES["hosts"]: h}}
    text = json.dumps({"description": "inferred by python -m zfbench.predict", **entries},
                      indent=1)
    path.write_text(text)
    return base.with_(hardware=str(path), gpu=NAMES["gpus"], pcie=NAMES["host_links"],
                      host=NAMES["hosts"], mfu=None), entries


def _how(measured: Breakdown, case: str, scales: Scales, base: SimSettings) -> dict:
    src = measured.source or "a measured breakdown"
    io = ("measured d2h {d2h_s:.4g} s and h2d {h2d_s:.4g} s".format(**measured.as_dict())
          if measured.split else f"measured io {measured.io_s:.4g} s")
    link = {"nominal": "both directions scaled alike", "d2h-only": "only d2h scaled",
            "h2d-only": "only h2d scaled", "split": "each direction on its own",
            MEASURED_LINK: "", PAGEABLE: "pageable buffers: d2h with the staging copy, "
            "h2d the preset's"}[case]
    measured_link = {d: measured.link_Bps[d]["source"] + f"; x{getattr(scales, d):.4g} of "
                     f"{base.machine.pcie}" for d in ("d2h", "h2d")} \
        if case == MEASURED_LINK else {}
    return {"mfu": f"inferred from {src}: measured compute {measured.compute_s:.4g} s "
                   f"per step",
            "d2h": f"inferred from {src}: {io} ({link}); x{scales.d2h:.4g} of {base.machine.pcie}",
            "h2d": f"inferred from {src}: {io} ({link}); x{scales.h2d:.4g} of {base.machine.pcie}",
            "host": f"inferred from {src}: measured stall {measured.stall_s:.4g} s; "
                    f"x{scales.host:.4g} of {base.machine.host}",
            "staging": f"inferred from {src}: {io} with pageable host buffers (the "
                       f"gradients' copies down holding backward); x{scales.d2h:.4g} of the "
                       f"staging-copy judgment (zfbench.sims.pageable)",
            "latency": f"inferred from {src}: {io} is shorter than the fixed costs of the "
                       f"simulated copies allow, so the whole copy time (fixed cost per "
                       f"copy and bytes) is scaled; x{scales.latency:.4g} of its fixed cost",
            **measured_link}


# Which scale each measured part moves, per case; scales in one tuple move together.
_MOVES = {"nominal": {"io_s": ("d2h", "h2d")}, "d2h-only": {"io_s": ("d2h",)},
          "h2d-only": {"io_s": ("h2d",)}, "split": {"d2h_s": ("d2h",), "h2d_s": ("h2d",)},
          MEASURED_LINK: {}, PAGEABLE: {"d2h_s": ("d2h",)}}


def fit(base: SimSettings, measured: Breakdown, case: str, workdir: Path,
        tol: float = 0.005, max_iter: int = 40) -> Fit:
    """Scale the node of `base` until its simulated ZeRO-Offload parts match `measured`.
    `case`: which link directions the exposed transfer scales (`infer`).

    What a measurement cannot pin does not constrain the fit:
    - a part is matched within `tol` of the part or of the whole step, or within the
      uncertainty of its measured mean when the measurement gives one (`Breakdown.
      uncertainty`: the step-to-step spread over the square root of the steps): a miss the
      measurement cannot resolve is no miss;
    - the link's fixed cost per copy (`setup_latency_s`) is the preset's unless the
      measurement shows one (`Breakdown.copy_latency_s`: a zfbench run whose copies differ in
      size pins it as the intercept of copy time against bytes);
    - a part that no rate can reach (a transfer shorter than the simulated copies' fixed costs
      alone: the simulated node copies in more pieces than the measured run did) is reported
      with how far off it stays (`Fit.misses_s`), and the prediction still stands, its range
      widened by that miss (`zfbench.predict`). Only contradictory input is refused: compute
      faster than the GPU's peak allows (and, in `Breakdown`, negative or non-finite parts).

    Compute is exactly FLOPs / (peak x MFU), so MFU takes one multiplicative step. An
    exposed part (stall, transfer) is a resource's busy time less what other lanes hide,
    so it moves with that busy time at a slope of at most one: each round changes the
    busy time by the part's miss over the slope (one at first, then the secant of the
    last two rounds) and rescales the rate to match, and a bracket of rates known too
    fast and too slow (bisected when a step would leave it, and forgotten when another
    rate moved) keeps the steps from overshooting where the hidden share changes."""
    gpu = base.machine.parts()[0]
    latency = None if measured.copy_latency_s is None else (
        measured.copy_latency_s, f"measured by {measured.source or 'the run'}: the "
        f"intercept of copy time against bytes over its copies")
    scales = Scales(mfu=start_mfu(base))
    if case == MEASURED_LINK:
        # each rate the copies' own bytes / busy seconds, which already hold each copy's
        # fixed cost: the simulated copies get none on top
        link = base.machine.parts()[1]
        scales = dataclasses.replace(scales, **{
            d: measured.link_Bps[d]["bytes_per_s"] / getattr(link, f"{d}_bytes_per_s")
            for d in ("d2h", "h2d")})
        latency = (0.0, "0: the measured link rates are bytes / busy seconds of the run's "
                        "copies, whose fixed costs they already hold")
    if case == PAGEABLE:
        measured = pageable_parts(measured)
    path = workdir / f"inferred_hardware.{case}.json"
    moves = {"stall_s": ("host",), **_MOVES[case]}
    brackets = {names: [SCALE_LIMITS[0], SCALE_LIMITS[1]] for names in moves.values()}
    last: dict[tuple, tuple[float, float]] = {}  # (busy, part) of the previous round
    previous = scales
    sim, settings, entries = {}, base, {}
    for it in range(1, max_iter + 1):
        settings, entries = write_hardware(path, base, scales,
                                           _how(measured, case, scales, base), latency)
        sim = baseline_parts(settings)
        if case == PAGEABLE:
            sim = {**sim, "stall_s": sim["stall_s"] + sim["h2d_s"]}
        misses = {p: sim[p] - getattr(measured, p) for p in _targets(measured, case)}
        if all(abs(m) <= _allowed(measured, p, tol) for p, m in misses.items()):
            return Fit(case, scales, settings, sim, it, True, entries=entries)
        mfu = scales.mfu * sim["compute_s"] / measured.compute_s
        if mfu > 1:
            raise SimSettingsError(
                f"measured compute {measured.compute_s:.4g} s per step is faster than "
                f"{gpu.name}'s peak allows for {base.scenario.model} at micro-batch "
                f"{base.scenario.micro_batch} x seq {base.scenario.seq} (MFU would be "
                f"{mfu:.2f}); check --gpu, --model, "
                f"--micro-batch, --seq and --gpus")
        changes = {"mfu": mfu}
        stuck = True
        latency_s = entries["host_links"][NAMES["host_links"]]["setup_latency_s"]["value"]
        for part, names in moves.items():
            now = getattr(scales, names[0])
            bracket = brackets[names]
            if any(abs(getattr(scales, k) / getattr(previous, k) - 1) > 1e-3
                   for k in ("mfu", "d2h", "h2d", "host", "latency") if k not in names):
                bracket[:] = SCALE_LIMITS  # the others moved: what it hides has changed
            if misses[part] > 0:  # too slow: the rate must rise
                bracket[0] = max(bracket[0], now)
            else:
                bracket[1] = min(bracket[1], now)
            busy = sum(sim[f"{n}_busy_s"] for n in names)
            slope = 1.0  # d part / d busy: one for one, or measured by the last round
            if names in last and abs(busy - last[names][0]) > 1e-9 * busy:
                measured_slope = (sim[part] - last[names][1]) / (busy - last[names][0])
                if measured_slope > 1e-3:
                    slope = min(measured_slope, 1.0)
            last[names] = (busy, sim[part])
            wanted = busy - misses[part] / slope
            fixed = sum(sim.get(f"{n}_copies", 0.0) for n in names) * latency_s
            if names != ("host",) and misses[part] > 0 and 0 < busy and wanted <= fixed:
                # the copies' fixed costs alone exceed it: no rate can reach it, so the
                # whole copy time is scaled, fixed cost with bytes
                factor = busy / wanted if wanted > 0 else 2.0
                changes["latency"] = min(changes.get("latency", scales.latency),
                                         scales.latency / factor)
                changes.update(dict.fromkeys(names, now * factor))
                stuck = False
                continue
            proposal = now * busy / wanted if busy > 0 and wanted > 0 else math.nan
            if not bracket[0] < proposal < bracket[1]:
                proposal = math.sqrt(bracket[0] * bracket[1])
            stuck &= math.isclose(bracket[0], bracket[1], rel_tol=1e-9)
            changes.update(dict.fromkeys(names, proposal))
        if stuck:
            break  # every bracket closed without reaching: this case cannot reach it
        previous, scales = scales, dataclasses.replace(scales, **changes)
    misses = {p: sim[p] - getattr(measured, p) for p in _targets(measured, case)
              if abs(sim[p] - getattr(measured, p)) > _allowed(measured, p, tol)}
    return Fit(case, scales, settings, sim, it, False, note=describe_misses(misses, measured),
               entries=entries, misses_s=misses)


def describe_misses(misses: dict[str, float], measured: Breakdown) -> str:
    """`h2d_s simulated 4e-05 s vs measured 1.736e-05 s (+2.264e-05 s, 0.64% of the step)`"""
    return "not reachable in this case: " + ", ".join(
        f"{p} simulated {getattr(measured, p) + m:.4g} s vs measured {getattr(measured, p):.4g}"
        f" s ({m:+.4g} s, {100 * abs(m) / measured.step_s:.2g}% of the step)"
        for p, m in misses.items())


def _allowed(measured: Breakdown, part: str, tol: float) -> float:
    """How far a simulated part may miss: `tol` of the part, or `tol` of the whole step
    for parts too small to matter (a fixed per-transfer latency floors them), or the
    uncertainty of the part's measured mean, whichever is largest. (Until session 29 the
    whole step-to-step spread was allowed, which let a noisy log's compute stand 13% off
    its mean: tinyllama[1L] on DeepSpeed's CPU accelerator, 24 steps.)"""
    return max(tol * max(getattr(measured, part), measured.step_s),
               measured.uncertainty(part))


def infer(base: SimSettings, measured: Breakdown, workdir: Path) -> list[Fit]:
    """Every case the measurement leaves open (one when the io split is measured); the
    first is the nominal fit. A fit that does not reach the measurement is returned too,
    with its misses (`Fit.misses_s`): the caller widens its range by them.

    One exposed-transfer total does not say how it divides between the two directions.
    `infer` therefore fits three cases when the split is not measured: both directions scaled
    alike (`nominal`), only gradients down slower or faster than the preset (`d2h-only`),
    only parameters up (`h2d-only`), and predictions are given at the ends of that range. A
    DeepSpeed log measures the split (gradient copy inside `bwd_allreduce`, parameter copy
    inside `step` after `optimizer_step`), and then one case is fitted to both directions.
    A run whose copies were measured (`Breakdown.link_Bps`) gives the rates themselves:
    one case, `MEASURED_LINK`, fits only MFU and the host. A split measurement of a run
    with pageable host buffers (`pin_memory` false: `CostModel.pageable_copies`) fits one
    case, `PAGEABLE`.
    """
    if measured.link_Bps:
        return [fit(base, measured, MEASURED_LINK, workdir)]
    if measured.split and CostModel(base).pageable_copies:
        return [fit(base, measured, PAGEABLE, workdir)]
    cases = ("split",) if measured.split else ("nominal", "d2h-only", "h2d-only")
    return [fit(base, measured, case, workdir) for case in cases]
