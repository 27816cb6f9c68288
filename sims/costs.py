"""The simulator's cost model: what each op costs on the chosen hardware.

`SimSettings` (in `zfbench.sims.settings`, re-exported here) holds every knob of a simulation.
`CostModel` turns settings into per-rank costs, per bucket of layers in forward order:
compute seconds (matrix FLOPs at the GPU's GEMM efficiency plus elementwise bytes at its
HBM bandwidth: `compute_efficiency`; or FLOPs over peak times a given MFU), bytes each
direction moves, host work in elements (its rates per core: `zfbench.sims.host_costs`,
whose `HostCosts` it inherits), and the memory each strategy needs per rank. The SimPy
processes in `strategies.py` only schedule these costs; all arithmetic about the hardware
is here and in the modules it calls. What the simulator reads for every op is computed once per cost model
(cached properties, sizes remembered): a model serves one run, of frozen settings.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property

from zfbench.sims import collectives, compute_efficiency, device_step, op_curve, rank_memory
from zfbench.sims.host_costs import (ACCUM_BYTES_PER_ELEMENT,  # noqa: F401 (re-exported)
                                     ACCUM_FIRST_BYTES_PER_ELEMENT, HostCosts)
from zfbench.sims.settings import (OFFLOAD_PARAMS, PRECISIONS, STRATEGIES, TRANSFER_MODES,
                           SimSettings, SimSettingsError, load_calibration,
                           strategy_host_lane)
from zfbench.core import hardware, models
from zfbench.core.memory_model import activation_bytes, element_bytes
from zfbench.core.scenario import GPU_NODE
from zfbench.core.strategies import zero_stage_chosen, zero_stage_of
from zfbench.core.schedule import selected_elements

__all__ = ["STRATEGIES", "TRANSFER_MODES", "PRECISIONS", "OFFLOAD_PARAMS", "SimSettings",
           "SimSettingsError", "load_calibration", "Bucket", "CostModel",
           "ADAM_BYTES_PER_PARAM", "ACCUM_BYTES_PER_ELEMENT", "ACCUM_FIRST_BYTES_PER_ELEMENT",
           "DEVICE_OPTIM_HBM_EFFICIENCY"]

# Bytes per parameter of a memory-bound Adam step with fp32 master weights and moments:
# read+write master, m, v (24 B), read a 16-bit gradient (2 B), write a 16-bit copy (2 B).
# Source: a roofline count of the bytes above; DeepSpeed's CPU-Adam measured 11.6B
# parameters in 8.2 s (deepspeedai/DeepSpeed PR #735), well below that bound.
ADAM_BYTES_PER_PARAM = 28.0
# Fraction of peak HBM bandwidth a fused device Adam achieves (judgment; multi-tensor
# apply kernels typically reach 70-90 % of STREAM-like bandwidth).
DEVICE_OPTIM_HBM_EFFICIENCY = 0.8


@dataclass(frozen=True)
class Bucket:
    """Costs of one block of the model (embedding, a decoder layer, or the head), per rank."""

    name: str
    kind: str  # the block's (zfbench.core.models.BLOCK_KINDS): embedding, decoder or head
    numel: int
    matrix_numel: int
    selected_numel: int  # elements updated on the device under zenflow (top-k cols + 1-D)
    forward_s: float
    backward_s: float


@dataclass
class CostModel(HostCosts):
    settings: SimSettings
    # the strategy simulated, where a profile measured its host lane apart (`host_lanes`)
    strategy: str | None = None
    shape: models.ModelShape = field(init=False)
    node: hardware.Node = field(init=False)
    buckets: list[Bucket] = field(init=False)

    def __post_init__(self) -> None:
        s = self.settings
        sc = s.scenario
        shape = models.get_model(sc.model)
        self.shape = shape.with_layers(sc.layers) if sc.layers is not None else shape
        self.calibration = None
        if s.machine.profile is not None:
            measured, self.calibration = load_calibration(s.machine.profile, self.shape)
            gpu, link, host, net = measured.gpu, measured.link, measured.host, measured.net
            if s.machine.host_cores is None:
                host, self.calibration = strategy_host_lane(host, self.calibration,
                                                            self.strategy)
        else:
            gpu, link, host, net = s.machine.parts()
        if s.machine.bandwidth_scale != 1.0:
            link = link.scaled(s.machine.bandwidth_scale)
        if s.machine.host_cores is not None:
            host = host.with_cores(s.machine.host_cores)
        if s.machine.dispatch_s_per_kernel is not None:  # 0: no launch floor
            host = dataclasses.replace(host, dispatch_s_per_kernel=s.machine.dispatch_s_per_kernel
                                       or None)
        self.windows = s.window_plan()
        self.boundaries = self.windows.boundaries(
            s.measurement.steps, s.zenflow.full_warm_up_rounds, s.zenflow.select_interval)
        g = s.machine.gpus_on_node  # one node's GPUs share its host, PCIe switches and NVLink
        self.node = hardware.Node(name="custom", gpu=gpu, gpus=g, link=link,
                                  gpus_per_switch=min(s.machine.gpus_per_switch, g), host=host,
                                  net=net)
        self.inter_net = s.machine.inter_link()
        peak = gpu.peak_flops_per_s("bf16" if sc.precision == "fp32" else sc.precision)
        bwd_factor = 3.0 if s.runtime.activation_checkpointing else 2.0  # recompute adds a forward
        # One MFU for every block where one is given (--mfu, an anchor), the GPU gives a
        # measured one (a profile's or predict's inferred GPU: `default_mfu`) or the blocks'
        # times are measured; from presets each block is its census: GEMMs and attention on
        # the measured curve by size (zfbench.sims.op_curve), elementwise passes at HBM
        # bandwidth, the host's launch floor (zfbench.sims.compute_efficiency)
        by_shape = s.machine.mfu is None and self.calibration is None
        census = s.machine.mfu is None and gpu.default_mfu is None
        if census:
            self.gemm_efficiency = 0.0  # set below: the census's share of peak
        elif by_shape:  # a measured MFU held at its reference shape
            self.gemm_efficiency = self._gemm_efficiency(gpu, peak)
        else:
            self.gemm_efficiency = (s.machine.mfu if s.machine.mfu is not None
                                    else gpu.default_mfu)
        scale = op_curve.share_scale(gpu) if census else 1.0
        self.buckets = []
        flops_total = compute_total = matrix_total = 0.0
        for block in self.shape.blocks():
            flops = block.forward_flops(s.scenario.seq, s.scenario.micro_batch)
            if census:
                fwd, bwd = op_curve.block_matrix_s(
                    self.shape, block, s.scenario.seq, s.scenario.micro_batch,
                    s.runtime.activation_checkpointing, peak, scale)
            else:
                fwd = flops / (peak * self.gemm_efficiency)
                bwd = fwd * bwd_factor
            matrix_total += fwd + bwd
            if by_shape or census:
                moved = compute_efficiency.block_traffic(self.shape, block, s.scenario.seq,
                                                         s.scenario.micro_batch,
                                                         s.runtime.activation_checkpointing)
                fwd += moved.forward_bytes / gpu.hbm_bytes_per_s
                bwd += moved.backward_bytes / gpu.hbm_bytes_per_s
                if host.dispatch_s_per_kernel:  # the host issues the kernels (eager)
                    floor = compute_efficiency.launch_floor_s(
                        self.shape, block, s.runtime.activation_checkpointing,
                        host.dispatch_s_per_kernel)
                    fwd, bwd = max(fwd, floor[0]), max(bwd, floor[1])
            flops_total += flops * (1.0 + bwd_factor)
            compute_total += fwd + bwd
            if self.calibration is not None:
                fwd, bwd = self._measured_block_s(block.kind)
            matrix_numel = sum(m.numel for m in block.matrices)
            selected = selected_elements(block.matrices, block.numel - matrix_numel,
                                         s.zenflow.topk_ratio)
            self.buckets.append(Bucket(block.name, block.kind, block.numel, matrix_numel,
                                       selected, fwd, bwd))
        if census:  # the matrix multiplies' and attention's share of peak, model-wide
            self.gemm_efficiency = flops_total / (peak * matrix_total)
        # the whole model's MFU at this shape (the given one with --mfu or a profile)
        self.mfu = (flops_total / (peak * compute_total) if by_shape or census
                    else self.gemm_efficiency)
        self.flops_per_s = peak * self.mfu

    def _gemm_efficiency(self, gpu: hardware.GPU, peak: float) -> float:
        """The matrix-multiply efficiency that gives the GPU's measured `default_mfu` at
        its reference shape (zfbench.sims.compute_efficiency)."""
        if gpu.mfu_reference:
            model, micro_batch, seq = compute_efficiency.parse_reference(gpu.mfu_reference)
        else:
            model, micro_batch, seq = GPU_NODE.model, GPU_NODE.micro_batch, GPU_NODE.seq
        reference = (models.get_model(model), seq, micro_batch, True)
        try:
            return compute_efficiency.gemm_efficiency(gpu.default_mfu, reference, peak,
                                                      gpu.hbm_bytes_per_s)
        except ValueError as err:
            raise SimSettingsError(f"GPU {gpu.name!r}: {err}") from None

    def _measured_block_s(self, kind: str) -> tuple[float, float]:
        """A block's measured forward/backward seconds, scaled by tokens (linear in
        tokens: exact at the measured batch and sequence, an estimate elsewhere)."""
        cal, s = self.calibration, self.settings
        block = cal["blocks"][kind]
        scale = s.scenario.micro_batch * s.scenario.seq / block["tokens"]
        return block["forward_s"] * scale, block["backward_s"] * scale

    def is_boundary(self, t: int) -> bool:
        """Does zenflow's host window close at the end of step t (zfbench.sims.update_windows)?"""
        return self.boundaries[t]

    @cached_property
    def emulated(self) -> bool:
        """A CPU-emulated accelerator (profile measured without CUDA): gradients go down on
        the device thread, parameters go up from the host worker, as the engine does."""
        return self.calibration is not None and self.calibration.get("transfers") == "emulated"

    @cached_property
    def engine_grad_passes(self) -> bool:
        """The profile is zfbench's engine's (CPU lane or GPU): each step it checks every
        gradient for non-finite values after backward and zeroes them at the end, two
        device passes it measured (`grad_check_s_per_elem`, `grad_zero_s_per_elem`). From
        presets (DeepSpeed's ZeRO) they are not simulated: on a GPU they are memory passes
        of milliseconds beside steps of seconds."""
        cal = self.calibration or {}
        return "grad_check_s_per_elem" in cal and "grad_zero_s_per_elem" in cal

    @cached_property
    def check_rides_d2h(self) -> bool:
        """The engine's non-finite check rides the copy of the gradients down instead of a
        pass of its own (real/engine.py `_down_checked`): on the CPU lanes, one rank, fp32
        gradients (no loss scale), unbucketed, for a strategy whose whole gradient goes
        down at the step (zero-offload, ZenFlow on ZeRO-2; the callers say which)."""
        return (self.emulated and self.engine_grad_passes and self.gpus == 1
                and self.elem_bytes == 4)

    @cached_property
    def zero_rides_device_adam(self) -> bool:
        """The engine zeroes the gradients inside the `device` strategy's AdamW pass, not
        in a pass of its own (real/strategies.py `DeviceStrategy.zeroes_grads`): on the
        CPU lanes with fp32 weights (the callers say which strategy). The zeros' stores
        inside that pass are priced with it where the profile timed the engine's update
        (`device_step_s`)."""
        return self.emulated and self.engine_grad_passes and self.elem_bytes == 4

    # -- sizes ------------------------------------------------------------------------
    @cached_property
    def gpus(self) -> int:
        """Ranks of the run, over every node (ZeRO partitions over all of them)."""
        return self.settings.machine.ranks

    @property
    def gpus_per_node(self) -> int:
        return self.settings.machine.gpus_on_node

    @property
    def nodes(self) -> int:
        return self.settings.machine.nodes

    @cached_property
    def elem_bytes(self) -> int:
        """Bytes of a parameter or gradient element on the device and on the link."""
        return element_bytes(self.settings.scenario.precision)

    @cached_property
    def params(self) -> int:
        return self.shape.total_params

    @cached_property
    def model_bytes(self) -> int:
        return self.params * self.elem_bytes

    @property
    def selected_params(self) -> int:
        return sum(b.selected_numel for b in self.buckets)

    @property
    def offloaded_moment_bytes(self) -> float:
        """zenflow.offload: the bytes of the selected columns' m and v that live in each
        rank's host memory and cross the link each way per device update (0 without it).
        fp32 in zfbench's engine (a profile); in the weights' dtype from presets, as
        DeepSpeed allocates them (zenflow_stage_1_and_2.py, `exp_avg_cpu_data`). On ZeRO-3
        a rank keeps the moments of its partition's share of the selected elements."""
        if not self.settings.zenflow.offload:
            return 0.0
        per_elem = 4 if self.calibration is not None else self.elem_bytes
        selected = self.selected_params
        if self.strategy is not None and self.on_zero3(self.strategy):
            selected = self.share(selected)
        return 2.0 * per_elem * selected

    def share(self, numel: float) -> float:
        """Elements of `numel` that one rank owns under ZeRO-2 partitioning."""
        return numel / self.gpus

    # -- compute lane -----------------------------------------------------------------
    @property
    def forward_s(self) -> float:
        return sum(b.forward_s for b in self.buckets)

    def device_optim_s(self, numel: float) -> float:
        if self.calibration is not None:
            return numel / self.calibration["device_optim_elems_per_s"]
        hbm = self.node.gpu.hbm_bytes_per_s * DEVICE_OPTIM_HBM_EFFICIENCY
        return numel * ADAM_BYTES_PER_PARAM / hbm

    def device_step_s(self, numel: float) -> float:
        """The `device` strategy's whole optimizer step over `numel` elements: with a
        profile that timed the engine's own update (`device_step_s_per_elem`: its AdamW
        kernel over the flat buffer, master copies, zeroing where it rides), that; with an
        older profile the selected columns' AdamW rate and the master copies; from presets
        the fused Adam and DeepSpeed's passes beside it (zfbench.sims.device_step: norm,
        flatten, fp32 conversion, clip, copy back into the 16-bit weights)."""
        if self.calibration is not None and "device_step_s_per_elem" in self.calibration:
            return numel * self.calibration["device_step_s_per_elem"]
        s = self.device_optim_s(numel) + self.master_copy_s(numel)
        if self.calibration is None:
            hbm = self.node.gpu.hbm_bytes_per_s * DEVICE_OPTIM_HBM_EFFICIENCY
            s += device_step.beside_adam_s(numel, hbm, self.settings.scenario.precision)
        return s

    @property
    def lane_contention(self) -> tuple[float, float]:
        """Rate factors (compute while host work runs, host work while compute runs) on a
        CPU-emulated accelerator, measured by the profile; (1, 1) when not measured."""
        cal = self.calibration or {}
        return (cal.get("compute_factor_when_host_busy", 1.0),
                cal.get("host_factor_when_compute_busy", 1.0))

    def device_copy_s(self, numel: float) -> float:
        """Copying parameters within device memory (applying an uploaded update): measured
        on a CPU lane (`device_copy_s_per_elem`, profiles from this commit on), else read
        and written at the device's memory bandwidth."""
        if self.calibration is not None and "device_copy_s_per_elem" in self.calibration:
            return numel * self.calibration["device_copy_s_per_elem"]
        return numel * self.elem_bytes * 2 / (self.node.gpu.hbm_bytes_per_s *
                                              DEVICE_OPTIM_HBM_EFFICIENCY)

    def select_s(self) -> float:
        """Per-column scores read every 2-D gradient once, then a top-k per matrix."""
        matrix_numel = sum(b.matrix_numel for b in self.buckets)
        if self.calibration is not None:
            return matrix_numel * self.calibration["select_s_per_elem"]
        hbm = self.node.gpu.hbm_bytes_per_s * DEVICE_OPTIM_HBM_EFFICIENCY
        return matrix_numel * self.elem_bytes / hbm

    def column_io_s(self, every_column: bool = False) -> float:
        """ZenFlow's per-step gather of the selected columns' gradients and scatter of their
        new values, measured on a CPU lane: a part per 2-D element (`column_io_s_per_elem`)
        and one per selected element (`column_io_s_per_selected`); 0 without a profile
        (on a GPU it is a small part of the device update, inside `device_optim_s`). The
        ZeRO-2 engine's, which skips the weights whose AdamW runs on their own columns;
        `every_column`: the gather and scatter of every selected column, as ZeRO-3's
        device update does (`gather_scatter_s_*`; a profile without them: `column_io_s_*`)."""
        if self.calibration is None:
            return 0.0
        cal = self.calibration
        key = ("gather_scatter" if every_column and "gather_scatter_s_per_elem" in cal
               else "column_io")
        matrix_numel = sum(b.matrix_numel for b in self.buckets)
        selected = sum(b.selected_numel - (b.numel - b.matrix_numel) for b in self.buckets)
        return (matrix_numel * cal.get(f"{key}_s_per_elem", 0.0)
                + selected * cal.get(f"{key}_s_per_selected", 0.0))

    def master_copy_s(self, numel: float) -> float:
        """The `device` strategy's fp32-master copies with low-precision weights, measured
        on a CPU lane (`master_copy_s_per_elem`); 0 without a profile."""
        if self.calibration is None:
            return 0.0
        return numel * self.calibration.get("master_copy_s_per_elem", 0.0)

    # -- net lane (ring collectives; NCCL busbw convention) ---------------------------
    @property
    def collectives_measured(self) -> bool:
        """Whether the profile measured this run's collectives among its ranks."""
        cal = self.calibration or {}
        return "allreduce_s_per_byte" in cal and cal.get("collective_ranks") == self.gpus

    def measured_collective_s(self, op: str, nbytes: float) -> float | None:
        """Seconds of `op` ("allreduce", "allgather") of `nbytes` per rank as the profile
        measured it among this run's ranks (zfbench.real.collective_probe: a fixed part
        and a part per byte); None where the profile did not measure it."""
        if not self.collectives_measured:
            return None
        cal = self.calibration
        return cal[f"{op}_s_fixed"] + cal[f"{op}_s_per_byte"] * nbytes

    def allreduce_s(self, nbytes: float) -> float:
        """Ring all-reduce of `nbytes` per rank. One node of G: 2(G-1)/G B/bw + 2(G-1)lat.
        N > 1 nodes, two levels (zfbench.sims.collectives.hierarchical_allreduce_s): reduce-scatter
        in the node, all-reduce of B/G across nodes over each GPU's NIC, all-gather in
        the node. Measured among the ranks where the profile did (`measured_collective_s`)."""
        return self._collective_s("allreduce", nbytes)

    def allgather_s(self, nbytes: float) -> float:
        """Ring all-gather (and reduce-scatter) assembling `nbytes`: one node
        (G-1)/G B/bw + (G-1)lat; N > 1 nodes: across nodes on B/G, then in the node."""
        return self._collective_s("allgather", nbytes)

    def _collective_s(self, op: str, nbytes: float) -> float:
        """`op`'s seconds, measured or by the ring formula, once per size."""
        memo = self.__dict__.setdefault("_collective_memo", {})
        if (op, nbytes) not in memo:
            ring = collectives.allreduce_s if op == "allreduce" else collectives.allgather_s
            measured = self.measured_collective_s(op, nbytes)
            memo[(op, nbytes)] = measured if measured is not None else ring(
                self.node.net, self.inter_net, self.gpus_per_node, self.nodes, nbytes)
        return memo[(op, nbytes)]

    # -- memory per rank --------------------------------------------------------------
    def activation_bytes(self) -> float:
        """A micro-batch's activations on the device (zfbench.core.memory_model's count):
        with a measured profile the engine's (no recomputation, fp32 logits), from
        presets with the settings' recomputation."""
        s = self.settings
        if self.calibration is not None:
            return activation_bytes(self.shape, s.scenario.micro_batch, s.scenario.seq,
                                    self.elem_bytes, logits=True)
        return activation_bytes(self.shape, s.scenario.micro_batch, s.scenario.seq,
                                self.elem_bytes,
                                checkpointing=s.runtime.activation_checkpointing)

    def per_node(self, total: float) -> float:
        """One node's part of host bytes that all ranks together hold (exactly `total`
        on one node)."""
        return total if self.nodes == 1 else total / self.nodes

    def memory_per_rank(self, strategy: str) -> dict[str, float]:
        """Device bytes per rank, host and NVMe bytes for one node, by strategy
        (zfbench.sims.rank_memory)."""
        return rank_memory.memory_per_rank(self, strategy)

    def on_zero3(self, strategy: str) -> bool:
        """Whether `strategy` runs on ZeRO-3 here because the `zero_stage` knob says so
        (ZenFlow with zero_stage 3; zero-infinity is ZeRO-3 by its own rule)."""
        return zero_stage_chosen(strategy) and \
            zero_stage_of(strategy, self.settings.zenflow.zero_stage) == 3

    def fits(self, strategy: str) -> dict[str, float | bool]:
        """`memory_per_rank` beside the node's capacities, and whether it fits
        (zfbench.sims.rank_memory)."""
        return rank_memory.fits(self, strategy)
