"""The simulator's knobs: `SimSettings`, validated with messages that name the knob.

This module owns every knob of a simulation (model, node, batch, precision, ZenFlow
parameters, offload placement, steps) and the names a knob may take (transfer modes, where
offloaded parameters live; the strategies and precisions are zfbench.core's, re-exported
here, and the defaults are zfbench.core's scenario: `SimSettings.scenario` is the run's
model, batch, precision and ZenFlow knobs as one `zfbench.core.scenario.Scenario`, whose
`GPU_NODE` gives their defaults). `zfbench.sims.costs` turns
settings into costs and re-exports all of this (knobs and their checks are one concept,
the costs they imply another). It also reads a
measured profile's calibration (`load_calibration`), which both the checks here and the
cost model need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, replace

from zfbench.sims.update_windows import WindowPlan, window_plan
from zfbench.core import hardware, models
from zfbench.core.config import ConfigError, ZenFlowConfig, zenflow_from_dict
from zfbench.core.memory_model import PRECISIONS
# the run's model, batch, precision and ZenFlow knobs, and the default scenario's values
from zfbench.core.scenario import GPU_NODE, Scenario, zenflow_scenario
# Every strategy; zero-infinity is simulated only (the real engine has no ZeRO-3 path).
from zfbench.core.strategies import SIM_STRATEGIES as STRATEGIES  # noqa: F401
# design: the paper's data path (unselected share down, unselected parameters up);
# shipped: DeepSpeed's shipped path (zenflow.md "Data moved per step"); full: the whole
# gradient down every step and whole parameters up at a boundary (zfbench's engine).
TRANSFER_MODES = ("design", "shipped", "full")
# Where zero-infinity keeps its 16-bit parameters between uses (DeepSpeed's
# offload_param.device): partitioned on the GPUs, host DRAM or NVMe; and its fp32 optimizer
# state (offload_optimizer.device): host DRAM or NVMe.
OFFLOAD_PARAMS = ("none", "cpu", "nvme")
OFFLOAD_OPTIMIZER = ("cpu", "nvme")
# The ZeRO stages ZenFlow can be simulated on (`zero_stage`).
ZERO_STAGES = (2, 3)


# `gpus`'s default: with --nodes/--gpus-per-node an unchanged `gpus` is no contradiction.
DEFAULT_GPUS = 4


class SimSettingsError(ValueError):
    """A knob has an invalid value; the message names the knob and the valid values."""


_ZF = GPU_NODE.zenflow


@dataclass(frozen=True)
class SimSettings:
    """Every knob of one simulation. The run's own part (model, layers, micro_batch, seq,
    grad_accum, precision and the ZenFlow knobs) is a `zfbench.core.scenario.Scenario`:
    `scenario` reads it, `from_scenario` builds settings from one, and its defaults are
    the GPU node's scenario (`GPU_NODE`); the flat fields keep their names."""
    model: str = GPU_NODE.model
    layers: int | None = GPU_NODE.layers
    # Ranks: `gpus` is the rank count of one node (nodes 1, gpus_per_node unset: today's
    # meaning). Several nodes: `nodes` N and `gpus_per_node` G give N x G ranks, and
    # `gpus` is then ignored unless it contradicts them (it must be left at its default
    # or equal N x G). `inter_net` (hardware.json "net_links", per GPU) joins the nodes.
    gpus: int = DEFAULT_GPUS
    nodes: int = 1
    gpus_per_node: int | None = None
    inter_net: str = "ib-hdr-200"
    gpu: str = "a100-80g"
    pcie: str = "gen4"
    host: str = "epyc-7763-milan"
    host_cores: int | None = None
    # Host seconds to issue one kernel of an eager step (the floor under launch-bound
    # compute, zfbench.sims.compute_efficiency); None: the host preset's; 0: no floor (a
    # step captured in a CUDA graph or compiled into few kernels). No effect with --mfu
    # or a measured profile.
    dispatch_s_per_kernel: float | None = None
    # Host gradient accumulation, elements/s per core on the core's own socket (the node's
    # NUMA factor and DRAM bandwidth still apply); None: zfbench.sims.host_step.
    # ACCUM_ELEMS_PER_CORE_S (a judgment). `python -m zfbench.run` sets it from the rate it
    # measured with the engine's kernel (zfbench.run.proxy).
    host_accum_per_core: float | None = None
    # Each rank's host threads bound to its own cores (DeepSpeed's --bind_cores_to_rank,
    # off by default there and here): unbound, a rank's optimizer threads run on every
    # socket of the node and part of its memory traffic crosses sockets
    # (zfbench.sims.host_step). No effect with a measured profile.
    bind_cores: bool = False
    # Offloaded host buffers page-locked (DeepSpeed's offload_optimizer / offload_param
    # `pin_memory`); False: pageable, each copy blocks the device lane that issues it and
    # is staged by the driver (zfbench.sims.pageable, with DeepSpeed's defaults by version).
    # Default True, DeepSpeed's default since deepspeedai/DeepSpeed PR #8207.
    pin_memory: bool = True
    # DeepSpeed's ZeRO-2 `overlap_comm` (from presets, for its strategies:
    # zfbench.sims.partitioning.ZERO2_STRATEGIES): True, each gradient bucket is reduced and sent down on a side
    # stream while backward goes on; False, both run on the compute stream, so backward
    # waits for each bucket's reduction and copy (zfbench.sims.strategies `RankSim.backward`).
    # DeepSpeed's own default is False for stages 1-2 (deepspeed/runtime/zero/config.py,
    # `overlap_comm_valid`: on only for stage 3); the default here is True, as zfbench's
    # engine runs on a GPU. No effect with a measured profile.
    overlap_comm: bool = True
    # DeepSpeed 0.3 to 0.8's fp16 CPU-Adam with the fused upload (zfbench.sims.host_step):
    # each tile of the partition goes up, converted on the device, while the next tile's
    # Adam runs, with no host conversion pass. False: DeepSpeed since PR #3097 (2023), the
    # blocking conversion then one upload. fp16 only (DeepSpeed took it for fp16 weights);
    # zero-offload and its delayed update from presets; no effect with a measured profile.
    fused_param_upload: bool = False
    net: str = "nvlink3"
    gpus_per_switch: int = 2
    micro_batch: int = GPU_NODE.micro_batch
    seq: int = GPU_NODE.seq
    # Micro-steps per optimizer step (DeepSpeed's gradient_accumulation_steps): each runs
    # forward and backward, and the offloading strategies send its gradients down and
    # accumulate them on the host; the last one ends with the strategy's update.
    grad_accum: int = GPU_NODE.grad_accum
    precision: str = GPU_NODE.precision
    mfu: float | None = None
    activation_checkpointing: bool = True
    # ZenFlow: zfbench's scenario (zfbench.core.config_zenflow.SCENARIO_ZENFLOW, which
    # says why it is not DeepSpeed's config defaults); warm-up rounds are DeepSpeed's.
    topk_ratio: float = _ZF.topk_ratio
    # steps, or "auto" (resolved by zfbench.sims.update_windows)
    update_interval: int | str = _ZF.update_interval
    auto_windows: str | None = None  # what "auto" resolves to: N, N1,N2,... or a windows.csv
    select_interval: int = _ZF.select_interval  # steps
    overlap_step: bool = _ZF.overlap_step
    full_warm_up_rounds: int = _ZF.full_warm_up_rounds
    # zero_optimization.zenflow.offload: the selected columns' moments live in host memory
    # and cross the link up and back around every device update (zfbench.sims.costs
    # `offloaded_moment_bytes`)
    offload: bool = _ZF.offload
    # ZenFlow's host work on the cores DeepSpeed's pt_reserved_cores_perc leaves each rank
    # (DeepSpeed pins its ZenFlow optimizer process to them and keeps the reserved share
    # for training: deepspeed/runtime/zenflow/zenflow_utils.py, `_split_affinity`); None:
    # all the rank's cores, the design's. From presets: a profile measures the engine's.
    pt_reserved_cores_perc: float | None = None
    steps: int = 40
    transfers: str = "design"
    bandwidth_scale: float = 1.0
    # zero-infinity: where parameters live between uses ("none": each rank's partition
    # on its GPU; "cpu": host DRAM; "nvme": the node's NVMe drives), where the optimizer
    # state lives (`offload_optimizer`; None: with the parameters, the host when they stay
    # on the GPUs), and how many buckets ahead of the one being
    # computed its parameter fetches run. Default 1: DeepSpeed's stage3_prefetch_bucket_size
    # defaults to 5e7 elements (DeepSpeed config docs, ZeRO section), under one decoder
    # layer of a 7B model (202 M parameters in llama2-7b), so one whole bucket ahead is at
    # least what DeepSpeed prefetches by default (judgment).
    offload_params: str = "cpu"
    # The ZeRO stage ZenFlow runs on (`zfbench.core.strategies.zero_stage_of`; the other
    # strategies keep their own): 2, its 16-bit model whole on every GPU; 3, DeepSpeed's
    # `ZenFlowZeroOptimizer_Stage3` (PR #7516): parameters partitioned over the ranks and
    # gathered block by block (zfbench.sims.zenflow_zero3). From presets only.
    zero_stage: int = 2
    offload_optimizer: str | None = None
    prefetch_buckets: int = 1
    # zero-infinity: each decoder layer's activation checkpoint (its input, micro-batch x
    # seq x hidden) kept in host memory between forward and the layer's recomputation
    # (DeepSpeed's activation_checkpointing.cpu_checkpointing; ZeRO-Infinity, Rajbhandari
    # et al. 2021, "CPU offload for activations"): zfbench.sims.zero_infinity.
    offload_activations: bool = False
    # zero-infinity: memory-centric tiling (ZeRO-Infinity, Rajbhandari et al. 2021; DeepSpeed's
    # deepspeed.zero.TiledLinear): every Linear split into this many tiles, each a module
    # that ZeRO-3 gathers on its own, so the largest gather shrinks (device memory only:
    # the schedule fetches a layer at a time either way).
    tiling: int = 1
    # The drive model and count of the node (hardware.json "nvme_drives"; per drive). The
    # defaults are those of the a100-4x-gen4 node preset: 4 x PM1733-class gen4 U.2 drives,
    # half of the DGX A100 (640 GB) datasheet's 8 x 3.84 TB for half of its 8 GPUs.
    nvme: str = "pm1733"
    nvme_drives: int = 4
    profile: str | None = None  # a measured hardware profile (python -m zfbench.run --profile)
    hardware: str | None = None  # a hardware JSON whose entries join the presets by name

    @property
    def optimizer_placement(self) -> str:
        """Where zero-infinity's optimizer state lives: `offload_optimizer`, else with the
        parameters (the host when they stay on the GPUs)."""
        if self.offload_optimizer is not None:
            return self.offload_optimizer
        return "cpu" if self.offload_params == "none" else self.offload_params

    def __post_init__(self) -> None:
        _check_int(self, "gpus", 1)
        _check_int(self, "nodes", 1)
        if self.gpus_per_node is not None:
            _check_int(self, "gpus_per_node", 1)
            ranks = self.nodes * self.gpus_per_node
            if self.gpus not in (DEFAULT_GPUS, ranks):
                raise SimSettingsError(
                    f"--gpus {self.gpus} contradicts --nodes {self.nodes} x --gpus-per-node "
                    f"{self.gpus_per_node} = {ranks} ranks; give --gpus for one node, or "
                    f"--nodes with --gpus-per-node")
        elif self.nodes > 1:
            raise SimSettingsError(f"--nodes {self.nodes} needs --gpus-per-node G (--gpus "
                                   f"is the rank count of one node)")
        _check_int(self, "gpus_per_switch", 1)
        _check_int(self, "micro_batch", 1)
        _check_int(self, "seq", 1)
        _check_int(self, "grad_accum", 1)
        _check_int(self, "steps", 1)
        _check_int(self, "prefetch_buckets", 0)
        _check_int(self, "tiling", 1)
        _check_int(self, "nvme_drives", 1)
        if self.zero_stage not in ZERO_STAGES:
            raise SimSettingsError(f"zero_stage must be one of {', '.join(map(str, ZERO_STAGES))} "
                                   f"(the ZeRO stage ZenFlow runs on), got {self.zero_stage!r}")
        if self.zero_stage == 3 and (self.profile is not None or self.transfers == "shipped"):
            raise SimSettingsError(
                "zero_stage 3 simulates DeepSpeed's ZenFlow on ZeRO-3 from presets with the "
                "design or full data path: give no --profile (zfbench's engine has no "
                "ZeRO-3 path to measure) and --transfers design or full, or zero_stage 2")
        if self.zero_stage == 3 and self.offload:
            raise SimSettingsError(
                "offload (zenflow.offload, the moments in host memory) is simulated on "
                "ZeRO-2 only: give zero_stage 2 or offload false")
        if self.offload_params not in OFFLOAD_PARAMS:
            raise SimSettingsError(f"offload_params {self.offload_params!r} is not known; "
                                   f"choose one of: {', '.join(OFFLOAD_PARAMS)}")
        if self.offload_optimizer is not None and \
                self.offload_optimizer not in OFFLOAD_OPTIMIZER:
            raise SimSettingsError(f"offload_optimizer {self.offload_optimizer!r} is not "
                                   f"known; choose one of: {', '.join(OFFLOAD_OPTIMIZER)}")
        if self.offload_activations and (not self.activation_checkpointing
                                         or self.profile is not None):
            raise SimSettingsError("offload_activations moves zero-infinity's activation "
                                   "checkpoints to the host; it needs "
                                   "activation_checkpointing true (and no --profile, whose "
                                   "engine recomputes nothing)")
        if self.layers is not None:
            _check_int(self, "layers", 1)
        if self.host_cores is not None:
            _check_int(self, "host_cores", 1)
        if self.dispatch_s_per_kernel is not None and not self.dispatch_s_per_kernel >= 0:
            raise SimSettingsError(f"dispatch_s_per_kernel must be >= 0 seconds (0: no "
                                   f"launch floor), got {self.dispatch_s_per_kernel!r}")
        if self.precision not in PRECISIONS:
            raise SimSettingsError(f"precision {self.precision!r} is not supported; "
                                   f"choose one of: {', '.join(PRECISIONS)}")
        if self.transfers not in TRANSFER_MODES:
            raise SimSettingsError(f"transfers {self.transfers!r} is not known; "
                                   f"choose one of: {', '.join(TRANSFER_MODES)}")
        if self.fused_param_upload and self.precision != "fp16":
            raise SimSettingsError(f"fused_param_upload is DeepSpeed's fp16 CPU-Adam path "
                                   f"(0.3 to 0.8); precision is {self.precision}: set "
                                   f"precision fp16 or leave fused_param_upload off")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise SimSettingsError(f"mfu must be in (0, 1], got {self.mfu}")
        if self.host_accum_per_core is not None and not self.host_accum_per_core > 0:
            raise SimSettingsError(f"host_accum_per_core must be > 0 (elements/s), got "
                                   f"{self.host_accum_per_core}")
        if not self.bandwidth_scale > 0:
            raise SimSettingsError(f"bandwidth_scale must be > 0, got {self.bandwidth_scale}")
        try:  # one set of ZenFlow rules, shared with the engine's config
            zenflow_from_dict({
                "topk_ratio": self.topk_ratio, "update_interval": self.update_interval,
                "select_interval": self.select_interval, "select_strategy": "step",
                "overlap_step": self.overlap_step,
                "full_warm_up_rounds": self.full_warm_up_rounds, "offload": self.offload,
                **({} if self.pt_reserved_cores_perc is None else
                   {"pt_reserved_cores_perc": self.pt_reserved_cores_perc})},
                prefix="zenflow")
        except ConfigError as err:
            raise SimSettingsError(str(err)) from None
        try:
            self.window_plan()
        except ValueError as err:
            raise SimSettingsError(str(err)) from None
        try:
            shape = models.get_model(self.model)
            if self.layers is not None:
                shape.with_layers(self.layers)
            if self.profile is not None:
                load_calibration(self.profile, shape)
            elif self.precision != "fp32":  # a GPU without bf16 (V100) refuses it here
                self.parts()[0].peak_flops_per_s(self.precision)
            else:
                self.parts()
            self.nvme_drive()
            if self.nodes > 1:
                hardware.lookup("net_links", self.inter_net, self.hardware)
        except (ValueError, OSError) as err:
            raise SimSettingsError(str(err)) from None
        except (KeyError, TypeError, AttributeError) as err:  # a JSON file of another kind
            raise SimSettingsError(f"profile {self.profile}: not a zfbench profile "
                                   f"(missing or malformed {err}); make one with python -m "
                                   f"zfbench.run --profile --out DIR") from None
        if self.profile is not None and self.hardware is not None:
            raise SimSettingsError("give --profile or --hardware, not both: a profile "
                                   "already names the machine it was measured on")
        if self.precision == "fp32" and self.profile is None and self.hardware is None:
            raise SimSettingsError("precision fp32 needs a measured --profile or an "
                                   "inferred --hardware file (the GPU presets give 16-bit "
                                   "tensor-core peaks only)")

    def parts(self) -> tuple:
        """The (gpu, host link, host, net) named by the knobs: presets, or entries of
        the `hardware` file (python -m zfbench.predict writes one)."""
        return tuple(hardware.lookup(section, name, self.hardware) for section, name in
                     (("gpus", self.gpu), ("host_links", self.pcie), ("hosts", self.host),
                      ("net_links", self.net)))

    @property
    def gpus_on_node(self) -> int:
        """GPUs (ranks) per node: `gpus_per_node` where given, else `gpus` (one node)."""
        return self.gpus if self.gpus_per_node is None else self.gpus_per_node

    @property
    def ranks(self) -> int:
        """Ranks of the run: nodes x GPUs per node."""
        return self.nodes * self.gpus_on_node

    def inter_link(self) -> hardware.NetLink | None:
        """The inter-node network per GPU (`inter_net`); None on one node."""
        if self.nodes == 1:
            return None
        return hardware.lookup("net_links", self.inter_net, self.hardware)

    def nvme_drive(self) -> hardware.NvmeDrive:
        """The NVMe drive named by `nvme` (one drive; the node has `nvme_drives` of them)."""
        return hardware.lookup("nvme_drives", self.nvme, self.hardware)

    def window_plan(self) -> WindowPlan:
        """The host windows: every `update_interval` steps, or what "auto" resolves to."""
        return window_plan(self.update_interval, self.auto_windows)

    @property
    def scenario(self) -> Scenario:
        """The run's model, batch, precision and ZenFlow knobs, as one Scenario."""
        return Scenario.from_flat(asdict(self), GPU_NODE)

    @classmethod
    def from_scenario(cls, scenario: Scenario, **rest) -> "SimSettings":
        """Settings that simulate `scenario`; `rest` gives the other knobs (node, ranks,
        steps, profile, ...), none of the scenario's."""
        clash = sorted(set(rest) & set(scenario.flat()))
        if clash:
            raise SimSettingsError(f"{clash} belong to the scenario; give them there")
        return cls(**scenario.flat(), **rest)

    def with_(self, **changes) -> "SimSettings":
        unknown = sorted(set(changes) - set(asdict(self)))
        if unknown:
            raise SimSettingsError(f"unknown knob(s) {unknown}; knobs are: "
                                   f"{', '.join(asdict(self))}")
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def fixed_interval(settings) -> int:
    """The window length of `settings` (a SimSettings) in steps; "auto" only when it
    resolves to one constant window (varying windows have no single period)."""
    constant = settings.window_plan().constant
    if constant is None:
        raise SimSettingsError(f"one window length is needed; update_interval auto with "
                               f"varying windows ({settings.auto_windows}) has none")
    return constant


def zenflow_knobs(zf: ZenFlowConfig | None, steps_per_epoch: int | None = None) -> dict:
    """The SimSettings fields an engine config's ZenFlow section fixes (None: none), as the
    engine runs them: the select interval resolved as real/zenflow.py resolves it
    (`ZenFlowConfig.select_interval_steps`; an unsized stream, None, selects once on
    "auto"). The one home of this rule: the run's expectation, its projections and
    zfbench.validate build their settings through it (`for_engine_run`)."""
    if zf is None:
        return {}
    return asdict(zenflow_scenario(zf, steps_per_epoch))


def for_engine_run(config, steps_per_epoch: int | None = None, **fields) -> SimSettings:
    """Settings that simulate a run of zfbench's engine with `config`
    (zfbench.core.config.EngineConfig) on a measured profile: its precision, every
    gradient down and parameter up as the engine's lanes move them (`transfers` "full"),
    its ZenFlow knobs (`zenflow_knobs`), one rank per "switch" (on the CPU lanes a rank's
    copies are its own threads' memory copies, as a profile's node says, not a link
    shared with another rank); `fields` (model, layers, gpus, micro_batch, seq, profile,
    steps, ...) give the rest. Built through the Scenario: the config's precision and
    ZenFlow knobs, then the scenario's fields in `fields`, over the GPU node's."""
    knobs = {"precision": config.precision, "transfers": "full", "gpus_per_switch": 1,
             **zenflow_knobs(config.zenflow, steps_per_epoch), **fields}
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


def _check_int(settings: SimSettings, name: str, minimum: int) -> None:
    value = getattr(settings, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimSettingsError(f"{name} must be an integer >= {minimum}, got {value!r}")


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
