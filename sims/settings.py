"""The simulator's knobs: `SimSettings`, made of sections, validated with messages that
name the knob.

A SimSettings is the run's `scenario` (zfbench.core.scenario.Scenario: model, layers,
micro_batch, seq, grad_accum, precision, and its `zenflow` section, defaults the GPU
node's, `GPU_NODE`) and four sections of zfbench.sims.sections: `machine`, `runtime`,
`infinity` (ZeRO-Infinity) and `measurement`; `zenflow` names the scenario's ZenFlow
section. The command line, sweeps and summary.json speak flat knob names (`topk_ratio`,
`gpus`, `offload_params`): `from_knobs` builds settings from them, `with_` changes them,
`as_dict` gives them back, `KNOB_SECTIONS` says which section holds each. The checks that
need two sections are here. `zfbench.sims.costs` re-exports all of this. It also reads a
measured profile's calibration (`load_calibration`), which the checks and the cost model
both need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

from zfbench.sims.sections import (DEFAULT_GPUS, OFFLOAD_OPTIMIZER, OFFLOAD_PARAMS,  # noqa: F401
                                   TRANSFER_MODES, Machine, Measurement, Runtime,
                                   SimSettingsError, ZeroInfinity, check_int)
from zfbench.sims.update_windows import WindowPlan, window_plan
from zfbench.core import hardware, models
from zfbench.core.config import ConfigError, ZenFlowConfig, zenflow_from_dict
from zfbench.core.memory_model import PRECISIONS
# the run's model, batch, precision and ZenFlow knobs, and the default scenario's values
from zfbench.core.scenario import (GPU_NODE, SCENARIO_FIELDS, ZENFLOW_FIELDS, Scenario,
                                   ZenFlowScenario, zenflow_scenario)
# Every strategy; zero-infinity is simulated only (the real engine runs ZeRO-3 for zenflow only).
from zfbench.core.strategies import SIM_STRATEGIES as STRATEGIES  # noqa: F401
# The ZeRO stages ZenFlow can be simulated on (`zero_stage`).
ZERO_STAGES = (2, 3)
# The sections other than the scenario, by attribute name.
SECTIONS = {"machine": Machine, "runtime": Runtime, "infinity": ZeroInfinity,
            "measurement": Measurement}


def _knob_sections() -> dict:
    """Every flat knob name -> the path of the section holding it, in the order the flat
    settings have always listed them (summary.json's settings keys)."""
    where = {name: "scenario" for name in SCENARIO_FIELDS}
    where.update({name: "scenario.zenflow" for name in ZENFLOW_FIELDS})
    for attr, section in SECTIONS.items():
        where.update({f.name: attr for f in fields(section)})
    order = ("model", "layers", "gpus", "nodes", "gpus_per_node", "inter_net", "gpu", "pcie",
             "host", "host_cores", "dispatch_s_per_kernel", "host_accum_per_core",
             "bind_cores", "pin_memory", "overlap_comm", "fused_param_upload", "zero2_reduce",
             "host_job", "net", "gpus_per_switch", "micro_batch", "seq", "grad_accum",
             "precision", "mfu",
             "activation_checkpointing", "topk_ratio", "update_interval", "auto_windows",
             "select_interval", "overlap_step", "full_warm_up_rounds", "offload",
             "pt_reserved_cores_perc", "steps", "transfers", "bandwidth_scale",
             "offload_params", "zero_stage", "offload_optimizer", "prefetch_buckets",
             "offload_activations", "tiling", "nvme", "nvme_drives", "profile", "hardware")
    if sorted(order) != sorted(where):  # a section's new field needs its flat place here
        raise RuntimeError(f"knobs without a flat place: {sorted(set(where) ^ set(order))}")
    return {name: where[name] for name in order}


# flat knob name -> "scenario", "scenario.zenflow", "machine", "runtime", "infinity" or
# "measurement"
KNOB_SECTIONS = _knob_sections()


def knob_fields() -> dict:
    """Every flat knob name -> its dataclass field (type, default) in its section."""
    every = {f.name: f for f in fields(Scenario) if f.name in SCENARIO_FIELDS}
    every.update({f.name: f for f in fields(ZenFlowScenario)})
    for section in SECTIONS.values():
        every.update({f.name: f for f in fields(section)})
    return {name: every[name] for name in KNOB_SECTIONS}


@dataclass(frozen=True)
class SimSettings:
    """Every knob of one simulation, in sections (the module docstring); build one from
    flat knob names with `from_knobs`."""
    scenario: Scenario = GPU_NODE
    machine: Machine = field(default_factory=Machine)
    runtime: Runtime = field(default_factory=Runtime)
    infinity: ZeroInfinity = field(default_factory=ZeroInfinity)
    measurement: Measurement = field(default_factory=Measurement)

    @property
    def zenflow(self) -> ZenFlowScenario:
        """The ZenFlow section, which is the scenario's (`scenario.zenflow`)."""
        return self.scenario.zenflow

    def __post_init__(self) -> None:
        _check_scenario(self.scenario)
        self._check_across()
        try:
            shape = models.get_model(self.scenario.model)
            if self.scenario.layers is not None:
                shape.with_layers(self.scenario.layers)
            if self.machine.profile is not None:
                load_calibration(self.machine.profile, shape)
            elif self.scenario.precision != "fp32":  # a GPU without bf16 (V100) refuses it
                self.machine.parts()[0].peak_flops_per_s(self.scenario.precision)
            else:
                self.machine.parts()
            self.machine.nvme_drive()
            if self.machine.nodes > 1:
                hardware.lookup("net_links", self.machine.inter_net, self.machine.hardware)
        except (ValueError, OSError) as err:
            raise SimSettingsError(str(err)) from None
        except (KeyError, TypeError, AttributeError) as err:  # a JSON file of another kind
            raise SimSettingsError(f"profile {self.machine.profile}: not a zfbench profile "
                                   f"(missing or malformed {err}); make one with python -m "
                                   f"zfbench.run --profile --out DIR") from None
        if self.scenario.precision == "fp32" and self.machine.profile is None and \
                self.machine.hardware is None:
            raise SimSettingsError("precision fp32 needs a measured --profile or an "
                                   "inferred --hardware file (the GPU presets give 16-bit "
                                   "tensor-core peaks only)")


    def _check_across(self) -> None:
        """The checks that join two sections."""
        zf, m = self.zenflow, self.machine
        if zf.zero_stage == 3 and self.measurement.transfers == "shipped":
            raise SimSettingsError(
                "zero_stage 3 simulates ZenFlow on ZeRO-3 with the design or full data path "
                "(DeepSpeed's from presets, zfbench's engine's from a measured --profile: "
                "full); the shipped path is ZeRO-2's: give --transfers design or full, or "
                "zero_stage 2")
        if self.infinity.offload_activations and (
                not self.runtime.activation_checkpointing or m.profile is not None):
            raise SimSettingsError("offload_activations moves zero-infinity's activation "
                                   "checkpoints to the host; it needs "
                                   "activation_checkpointing true (and no --profile, whose "
                                   "engine recomputes nothing)")
        if self.runtime.fused_param_upload and self.scenario.precision != "fp16":
            raise SimSettingsError(f"fused_param_upload is DeepSpeed's fp16 CPU-Adam path "
                                   f"(0.3 to 0.8); precision is {self.scenario.precision}: "
                                   f"set precision fp16 or leave fused_param_upload off")
        if self.runtime.fused_param_upload and self.runtime.host_job != "deepspeed":
            raise SimSettingsError(f"fused_param_upload is DeepSpeed's CPU-Adam path; "
                                   f"host_job {self.runtime.host_job} is zfbench's engine's: "
                                   f"give host_job deepspeed or leave fused_param_upload off")

    def window_plan(self) -> WindowPlan:
        """The host windows: every `update_interval` steps, or what "auto" resolves to."""
        return window_plan(self.zenflow.update_interval, self.zenflow.auto_windows)

    @classmethod
    def from_knobs(cls, **knobs) -> "SimSettings":
        """Settings from flat knob names (`KNOB_SECTIONS`), each over its default: the
        one way the command line, sweeps and flat dicts become sections."""
        unknown = sorted(set(knobs) - set(KNOB_SECTIONS))
        if unknown:
            raise SimSettingsError(f"unknown knob(s) {unknown}; knobs are: "
                                   f"{', '.join(KNOB_SECTIONS)}")
        return cls.from_scenario(Scenario.from_flat(knobs, GPU_NODE),
                                 **{k: v for k, v in knobs.items()
                                    if not KNOB_SECTIONS[k].startswith("scenario")})

    @classmethod
    def from_scenario(cls, scenario: Scenario, **rest) -> "SimSettings":
        """Settings that simulate `scenario`; `rest` gives the other knobs by their flat
        names (node, ranks, steps, profile, ...), none of the scenario's."""
        clash = sorted(set(rest) & set(scenario.flat()))
        if clash:
            raise SimSettingsError(f"{clash} belong to the scenario; give them there")
        unknown = sorted(set(rest) - set(KNOB_SECTIONS))
        if unknown:
            raise SimSettingsError(f"unknown knob(s) {unknown}; knobs are: "
                                   f"{', '.join(KNOB_SECTIONS)}")
        sections = {attr: section(**{k: v for k, v in rest.items()
                                     if KNOB_SECTIONS[k] == attr})
                    for attr, section in SECTIONS.items()}
        return cls(scenario=scenario, **sections)

    def with_(self, **changes) -> "SimSettings":
        """These settings with some knobs changed, by their flat names."""
        unknown = sorted(set(changes) - set(KNOB_SECTIONS))
        if unknown:
            raise SimSettingsError(f"unknown knob(s) {unknown}; knobs are: "
                                   f"{', '.join(KNOB_SECTIONS)}")
        return SimSettings.from_knobs(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict:
        """Every knob by its flat name (summary.json's settings), in KNOB_SECTIONS' order."""
        out = {}
        for name, path in KNOB_SECTIONS.items():
            section = self
            for attr in path.split("."):
                section = getattr(section, attr)
            out[name] = getattr(section, name)
        return out


def _check_scenario(sc: Scenario) -> None:
    """The scenario section's own checks (a Scenario checks nothing itself)."""
    for name in ("micro_batch", "seq", "grad_accum"):
        check_int(sc, name, 1)
    if sc.layers is not None:
        check_int(sc, "layers", 1)
    if sc.precision not in PRECISIONS:
        raise SimSettingsError(f"precision {sc.precision!r} is not supported; "
                               f"choose one of: {', '.join(PRECISIONS)}")
    zf = sc.zenflow
    if zf.zero_stage not in ZERO_STAGES:
        raise SimSettingsError(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} "
                               f"(the ZeRO stage ZenFlow runs on), got {zf.zero_stage!r}")
    try:  # one set of ZenFlow rules, shared with the engine's config
        zenflow_from_dict({**zf.config_keys(), "select_strategy": "step"}, prefix="zenflow")
    except ConfigError as err:
        raise SimSettingsError(str(err)) from None
    try:
        window_plan(zf.update_interval, zf.auto_windows)
    except ValueError as err:
        raise SimSettingsError(str(err)) from None


def fixed_interval(settings) -> int:
    """The window length of `settings` (a SimSettings) in steps; "auto" only when it
    resolves to one constant window (varying windows have no single period)."""
    constant = settings.window_plan().constant
    if constant is None:
        raise SimSettingsError(f"one window length is needed; update_interval auto with "
                               f"varying windows ({settings.zenflow.auto_windows}) has none")
    return constant


def zenflow_knobs(zf: ZenFlowConfig | None, steps_per_epoch: int | None = None) -> dict:
    """The SimSettings fields an engine config's ZenFlow section fixes (None: none), as the
    engine runs them: the select interval resolved as real/zenflow.py resolves it
    (`ZenFlowConfig.select_interval_steps`; an unsized stream, None, selects once on
    "auto"). The one home of this rule: the run's expectation, its projections and
    zfbench.validate build their settings through it (`for_engine_run`)."""
    if zf is None:
        return {}
    return zenflow_scenario(zf, steps_per_epoch).config_keys()


def for_engine_run(config, steps_per_epoch: int | None = None, **fields) -> SimSettings:
    """Settings that simulate a run of zfbench's engine with `config`
    (zfbench.core.config.EngineConfig) on a measured profile: its precision, every
    gradient down and parameter up as the engine's lanes move them (`transfers` "full"),
    its ZenFlow knobs (`zenflow_knobs`) and ZeRO stage (3 where the config's is: ZenFlow
    on ZeRO-3, zfbench.sims.zenflow_zero3_engine; else 2), one rank per "switch" (on the CPU lanes a rank's
    copies are its own threads' memory copies, as a profile's node says, not a link
    shared with another rank); `fields` (model, layers, gpus, micro_batch, seq, profile,
    steps, ...) give the rest. Built through the Scenario: the config's precision and
    ZenFlow knobs, then the scenario's fields in `fields`, over the GPU node's."""
    knobs = {"precision": config.precision, "transfers": "full", "gpus_per_switch": 1,
             **zenflow_knobs(config.zenflow, steps_per_epoch),
             "zero_stage": 3 if config.zero_stage == 3 else 2, **fields}
    scenario = Scenario.from_flat(knobs, GPU_NODE)
    rest = {k: v for k, v in knobs.items() if k not in scenario.flat()}
    return SimSettings.from_scenario(scenario, **rest)


def node_knobs(name: str, gpus: int | None = None, hardware_file: str | None = None) -> dict:
    """The knobs that put a run on the node preset `name` (hardware.json "nodes"): its GPU,
    link, host, GPU-to-GPU network, switch pairing and drives; with `gpus` (the run's total)
    above the node's GPUs, that many nodes joined by the node's `inter_net` (it must be a
    multiple of the node's GPUs). A node of `hardware_file` (the `hardware` knob's file)
    is found there, and the knobs then name that file."""
    node = hardware.get_node(name, hardware_file)
    knobs = {"gpu": node.gpu.name, "pcie": node.link.name, "host": node.host.name,
             "net": node.net.name, "gpus_per_switch": node.gpus_per_switch}
    if node.nvme is not None:
        knobs.update(nvme=node.nvme.name, nvme_drives=node.nvme_drives)
    gpus = node.gpus if gpus is None else gpus
    if hardware_file is not None:
        knobs["hardware"] = hardware_file
    if gpus <= node.gpus:
        return {**knobs, "gpus": gpus}
    if gpus % node.gpus:
        raise SimSettingsError(f"{gpus} GPUs on {name} nodes of {node.gpus}: not a whole "
                               f"number of nodes; give a multiple of {node.gpus}")
    if node.inter_net is None:
        raise SimSettingsError(f"node {name} names no inter_net, so {gpus} GPUs (more than "
                               f"its {node.gpus}) cannot be several nodes of it")
    return {**knobs, "nodes": gpus // node.gpus, "gpus_per_node": node.gpus,
            "gpus": gpus, "inter_net": node.inter_net.name}


def on_node(name: str, given: dict) -> dict:
    """The knobs `given` (what a user set) on the node preset `name`, the commands'
    `--node`: the node's GPU, link, host, networks, switch pairing and drives where
    `given` names none. `gpus` is then the run's total (above the node's count: whole
    nodes joined by its `inter_net`, as `node_knobs`); `nodes` N alone means N whole
    nodes; `gpus_per_node` is the node's own count and may not say otherwise."""
    node = hardware.get_node(name, given.get("hardware"))
    if given.get("profile"):
        raise SimSettingsError(f"--node {name} and --profile: a profile simulates the "
                               f"machine it was measured on; give one of them")
    per_node, nodes, total = given.get("gpus_per_node"), given.get("nodes"), given.get("gpus")
    if per_node is not None and per_node != node.gpus:
        raise SimSettingsError(f"--gpus-per-node {per_node} contradicts node {name} "
                               f"({node.gpus} GPUs a node); leave it out, or give --gpus")
    if nodes is not None:
        if total is not None and total != nodes * node.gpus:
            raise SimSettingsError(f"--gpus {total} contradicts --nodes {nodes} of node "
                                   f"{name} ({nodes} x {node.gpus} = {nodes * node.gpus} "
                                   f"GPUs); with a node preset --gpus is the run's total")
        total = nodes * node.gpus
    rest = {k: v for k, v in given.items() if k not in ("gpus", "nodes", "gpus_per_node")}
    return {**node_knobs(name, total, given.get("hardware")), **rest}


def _same_width(measured: str, shape: models.ModelShape) -> bool:
    """Whether a profile measured on model `measured` holds for `shape`: the same base
    model at the same width (any depth)."""
    try:
        found = models.get_model(measured)
    except ValueError:
        return False
    return found.base == shape.base and found.width_ratio == shape.width_ratio


def load_calibration(path: str, shape: models.ModelShape) -> tuple[hardware.Node, dict]:
    """The node and per-block calibration of a measured profile; its per-block times hold
    for the width they were measured at, so the model's base shape must match."""
    import json

    node = hardware.load_profile(path)["nodes"]["measured"]
    with open(path) as handle:
        cal = json.load(handle).get("calibration")
    if cal is None:
        raise SimSettingsError(f"{path}: no 'calibration' section; make one with "
                               f"python -m zfbench.run --profile --out DIR")
    if not _same_width(cal["model"], shape):
        raise SimSettingsError(f"{path} was measured on {cal['model']}; simulate the same "
                               f"model at the same width (any --layers), not {shape.name}: "
                               f"per-block times do not carry across widths")
    return node, cal


def strategy_host_lane(host: hardware.HostCPU, calibration: dict, strategy: str | None
                       ) -> tuple[hardware.HostCPU, dict]:
    """A profile's host and calibration as `strategy`'s host lane ran: where the profile
    measured that strategy's host-lane rates on its own thread count (`host_lanes`: on a
    GPU every strategy but ZenFlow runs its host step on all the rank's cores,
    zfbench.real.distributed `lane_threads`), those rates on that many cores; else as
    they are. Per-core rates are the lane's rates over its threads, as for the profile's
    own."""
    lane = (calibration.get("host_lanes") or {}).get(strategy) if strategy else None
    if not lane:
        return host, calibration
    threads = int(lane["host_threads"])
    rates = {k: v for k, v in lane.items() if k != "host_threads"}
    host = dataclasses.replace(host.with_cores(threads), adam_params_per_s_per_core=(
        rates["host_adam_params_per_s"] / threads))
    return host, {**calibration, **rates, "host_threads": threads}
