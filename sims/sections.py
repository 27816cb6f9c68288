"""The sections a simulation's settings are made of, each a frozen dataclass that checks
its own values (zfbench.sims.settings.SimSettings composes them with the scenario).

- `Machine`: the node and its ranks (GPU, host link, host, networks, drives, a measured
  profile or a hardware file) and the overrides of its rates (MFU, kernel dispatch, host
  accumulation, link bandwidth scale);
- `Runtime`: the engine options every strategy runs with (activation checkpointing,
  pinned buffers, overlap_comm, core binding, the fused fp16 upload, and whose host
  optimizer job runs: DeepSpeed's passes or zfbench's engine's one job);
- `ZeroInfinity`: where zero-infinity keeps parameters and optimizer state, its prefetch,
  tiling and activation offload;
- `Measurement`: how long a simulation runs and which data path it models.
Checks that need two sections (a profile and a model, fp16 and the fused upload) are
SimSettings'. The names a knob may take live here too.
"""

from __future__ import annotations

from dataclasses import dataclass

from zfbench.core import hardware

# design: the paper's data path (unselected share down, unselected parameters up);
# shipped: DeepSpeed's shipped path (zenflow.md "Data moved per step"); full: the whole
# gradient down every step and whole parameters up at a boundary (zfbench's engine).
TRANSFER_MODES = ("design", "shipped", "full")
# Where zero-infinity keeps its 16-bit parameters between uses (DeepSpeed's
# offload_param.device): partitioned on the GPUs, host DRAM or NVMe; and its fp32 optimizer
# state (offload_optimizer.device): host DRAM or NVMe.
OFFLOAD_PARAMS = ("none", "cpu", "nvme")
OFFLOAD_OPTIMIZER = ("cpu", "nvme")
# `gpus`'s default: with --nodes/--gpus-per-node an unchanged `gpus` is no contradiction.
DEFAULT_GPUS = 4


class SimSettingsError(ValueError):
    """A knob has an invalid value; the message names the knob and the valid values."""


def check_int(section, name: str, minimum: int) -> None:
    """`section.name` is an integer (not a bool) >= minimum, else one error naming it."""
    value = getattr(section, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SimSettingsError(f"{name} must be an integer >= {minimum}, got {value!r}")


# `Runtime.zero2_reduce`'s values (zfbench.sims.zero2_reduce says what each costs).
ZERO2_REDUCES = ("allreduce", "reduce", "reduce-scatter")
# `Runtime.host_job`'s values: whose host optimizer job an offloading strategy runs.
HOST_JOBS = ("deepspeed", "engine", "engine-clip")


def _one_of(name: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise SimSettingsError(f"{name} {value!r} is not known; choose one of: "
                               f"{', '.join(allowed)}")


@dataclass(frozen=True)
class Machine:
    """The node, its ranks and its rates. Ranks: `gpus` is the rank count of one node
    (nodes 1, gpus_per_node unset). Several nodes: `nodes` N and `gpus_per_node` G give
    N x G ranks, and `gpus` must then be left at its default or equal N x G; `inter_net`
    (hardware.json "net_links", per GPU) joins the nodes."""
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
    net: str = "nvlink3"
    gpus_per_switch: int = 2
    mfu: float | None = None  # the GPU's model FLOPs utilization; None: by shape
    bandwidth_scale: float = 1.0  # every host link's bandwidth times this
    # The drive model and count of the node (hardware.json "nvme_drives"; per drive). The
    # defaults are those of the a100-4x-gen4 node preset: 4 x PM1733-class gen4 U.2 drives,
    # half of the DGX A100 (640 GB) datasheet's 8 x 3.84 TB for half of its 8 GPUs.
    nvme: str = "pm1733"
    nvme_drives: int = 4
    profile: str | None = None  # a measured hardware profile (python -m zfbench.run --profile)
    hardware: str | None = None  # a hardware JSON whose entries join the presets by name

    def __post_init__(self) -> None:
        check_int(self, "gpus", 1)
        check_int(self, "nodes", 1)
        if self.gpus_per_node is not None:
            check_int(self, "gpus_per_node", 1)
            ranks = self.nodes * self.gpus_per_node
            if self.gpus not in (DEFAULT_GPUS, ranks):
                raise SimSettingsError(
                    f"--gpus {self.gpus} contradicts --nodes {self.nodes} x --gpus-per-node "
                    f"{self.gpus_per_node} = {ranks} ranks; give --gpus for one node, or "
                    f"--nodes with --gpus-per-node")
        elif self.nodes > 1:
            raise SimSettingsError(f"--nodes {self.nodes} needs --gpus-per-node G (--gpus "
                                   f"is the rank count of one node)")
        check_int(self, "gpus_per_switch", 1)
        check_int(self, "nvme_drives", 1)
        if self.host_cores is not None:
            check_int(self, "host_cores", 1)
        if self.dispatch_s_per_kernel is not None and not self.dispatch_s_per_kernel >= 0:
            raise SimSettingsError(f"dispatch_s_per_kernel must be >= 0 seconds (0: no "
                                   f"launch floor), got {self.dispatch_s_per_kernel!r}")
        if self.mfu is not None and not 0 < self.mfu <= 1:
            raise SimSettingsError(f"mfu must be in (0, 1], got {self.mfu}")
        if self.host_accum_per_core is not None and not self.host_accum_per_core > 0:
            raise SimSettingsError(f"host_accum_per_core must be > 0 (elements/s), got "
                                   f"{self.host_accum_per_core}")
        if not self.bandwidth_scale > 0:
            raise SimSettingsError(f"bandwidth_scale must be > 0, got {self.bandwidth_scale}")
        if self.profile is not None and self.hardware is not None:
            raise SimSettingsError("give --profile or --hardware, not both: a profile "
                                   "already names the machine it was measured on")

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


@dataclass(frozen=True)
class Runtime:
    """DeepSpeed's engine options, for every strategy. None has an effect with a measured
    profile but `activation_checkpointing` (the profile's engine recomputes nothing)."""
    activation_checkpointing: bool = True
    # Each rank's host threads bound to its own cores (DeepSpeed's --bind_cores_to_rank,
    # off by default there and here): unbound, a rank's optimizer threads run on every
    # socket of the node and part of its memory traffic crosses sockets
    # (zfbench.sims.host_step).
    bind_cores: bool = False
    # Offloaded host buffers page-locked (DeepSpeed's offload_optimizer / offload_param
    # `pin_memory`); False: pageable, each copy blocks the device lane that issues it and
    # is staged by the driver (zfbench.sims.pageable, with DeepSpeed's defaults by version).
    # Default True, DeepSpeed's default since deepspeedai/DeepSpeed PR #8207.
    pin_memory: bool = True
    # DeepSpeed's ZeRO-2 `overlap_comm` (zfbench.sims.partitioning.ZERO2_STRATEGIES): True,
    # each gradient bucket is reduced and sent down on a side stream while backward goes
    # on; False, both run on the compute stream, so backward waits for each bucket's
    # reduction and copy (zfbench.sims.strategies `RankSim.backward`). DeepSpeed's own
    # default is False for stages 1-2 (deepspeed/runtime/zero/config.py,
    # `overlap_comm_valid`: on only for stage 3); the default here is True, as zfbench's
    # engine runs on a GPU.
    overlap_comm: bool = True
    # DeepSpeed 0.3 to 0.8's fp16 CPU-Adam with the fused upload (zfbench.sims.host_step):
    # each tile of the partition goes up, converted on the device, while the next tile's
    # Adam runs, with no host conversion pass. False: DeepSpeed since PR #3097 (2023), the
    # blocking conversion then one upload. fp16 only; zero-offload and its delayed update.
    fused_param_upload: bool = False
    # How DeepSpeed's ZeRO-2 reduces a gradient bucket to its partitions' owners
    # (zfbench.sims.zero2_reduce): "allreduce", DeepSpeed since PR #4695 (0.12.4, its
    # `use_multi_rank_bucket_allreduce` default); "reduce", one NCCL reduce per owner
    # (DeepSpeed 0.3 to 0.12.3, the ZeRO papers' rows); "reduce-scatter", the ideal one.
    zero2_reduce: str = "allreduce"
    # Whose host optimizer job the offloading strategies run on a node from presets:
    # "deepspeed", DeepSpeed's passes (zfbench.sims.host_step: unscale/clip, CPU-Adam, the
    # blocking conversion, each at its own rate; the gradients down as fp32); "engine",
    # zfbench's engine's one job per chunk of its own bytes (zfbench.core.engine_host_bytes:
    # the 16-bit gradients widened, fused AdamW writing the wire and zeroing ZenFlow's
    # window, each chunk up after it; 16-bit gradients down), its bytes streamed at the rate
    # the host's AdamW streams its 28 B (zfbench.sims.host_traffic); "engine-clip", the same
    # with the engine's clipping passes (`gradient_clipping` > 0). `python -m
    # zfbench.predict --from-run` sets it from the run's config. No effect with a profile
    # (the engine's own, measured).
    host_job: str = "deepspeed"

    def __post_init__(self) -> None:
        _one_of("zero2_reduce", self.zero2_reduce, ZERO2_REDUCES)
        _one_of("host_job", self.host_job, HOST_JOBS)


@dataclass(frozen=True)
class ZeroInfinity:
    """zero-infinity's placement: where parameters live between uses (`offload_params`:
    "none", each rank's partition on its GPU; "cpu", host DRAM; "nvme", the node's
    drives), where the optimizer state lives (`offload_optimizer`; None: with the
    parameters, the host when they stay on the GPUs), and how many buckets ahead of the
    one being computed its parameter fetches run. `prefetch_buckets` 1: DeepSpeed's
    stage3_prefetch_bucket_size defaults to 5e7 elements (DeepSpeed config docs, ZeRO
    section), under one decoder layer of a 7B model (202 M parameters in llama2-7b), so
    one whole bucket ahead is at least what DeepSpeed prefetches by default (judgment)."""
    offload_params: str = "cpu"
    offload_optimizer: str | None = None
    prefetch_buckets: int = 1
    # each decoder layer's activation checkpoint (its input, micro-batch x seq x hidden)
    # kept in host memory between forward and the layer's recomputation (DeepSpeed's
    # activation_checkpointing.cpu_checkpointing; ZeRO-Infinity, Rajbhandari et al. 2021,
    # "CPU offload for activations"): zfbench.sims.zero_infinity
    offload_activations: bool = False
    # memory-centric tiling (ZeRO-Infinity; DeepSpeed's deepspeed.zero.TiledLinear): every
    # Linear split into this many tiles, each a module that ZeRO-3 gathers on its own, so
    # the largest gather shrinks (device memory only: the schedule fetches a layer at a
    # time either way)
    tiling: int = 1

    def __post_init__(self) -> None:
        _one_of("offload_params", self.offload_params, OFFLOAD_PARAMS)
        if self.offload_optimizer is not None:
            _one_of("offload_optimizer", self.offload_optimizer, OFFLOAD_OPTIMIZER)
        check_int(self, "prefetch_buckets", 0)
        check_int(self, "tiling", 1)

    @property
    def optimizer_placement(self) -> str:
        """Where the optimizer state lives: `offload_optimizer`, else with the parameters
        (the host when they stay on the GPUs)."""
        if self.offload_optimizer is not None:
            return self.offload_optimizer
        return "cpu" if self.offload_params == "none" else self.offload_params


@dataclass(frozen=True)
class Measurement:
    """How long a simulation runs (`steps`, optimizer steps; the ones left out of its
    averages: zfbench.core.schedule.steps_left_out) and which data path it models
    (`transfers`, TRANSFER_MODES)."""
    steps: int = 40
    transfers: str = "design"

    def __post_init__(self) -> None:
        check_int(self, "steps", 1)
        _one_of("transfers", self.transfers, TRANSFER_MODES)
