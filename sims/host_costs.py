"""The simulator's host-lane costs: what a rank's host work costs per element and core.

`HostCosts` is the part of `zfbench.sims.costs.CostModel` (which inherits it) about the
host: the cores a rank's host work gets (its share of the node, ZenFlow's pinned cores,
the CPU lanes' threads), its NUMA factor, the per-core rates of CPU-Adam, accumulation (a
ZenFlow window's first one apart), the wire conversions and window zeroing as a measured
profile or the presets give them, which host job is priced (DeepSpeed's step or
zfbench's engine chunks), and how pageable buffers and serial gradient reduction change
the schedule. It reads the cost model's settings, node, calibration and strategy; all
arithmetic about the host's hardware is here or in `zfbench.sims.host_step`.
"""

from __future__ import annotations

from functools import cached_property

from zfbench.sims import host_step, pageable
from zfbench.core.config_zenflow import split_cores
from zfbench.core.strategies import engine_host_chunk_elems, has_windows

# Host gradient accumulation: read a 16-bit gradient, read and write an fp32 accumulator.
ACCUM_BYTES_PER_ELEMENT = 10.0
# A ZenFlow window's first accumulation in zfbench's engine (issue 45): the accumulator
# written, not read (streamed stores past the cache, real/host_fused.py).
ACCUM_FIRST_BYTES_PER_ELEMENT = ACCUM_BYTES_PER_ELEMENT - 4.0
# The per-core host accumulation rate is zfbench.sims.host_step.ACCUM_ELEMS_PER_CORE_S
# (memory-bound streaming, independent of the host's CPU-Adam rate).


class HostCosts:
    """A cost model's host work (mixed into `CostModel`, whose fields it reads)."""

    @property
    def cores_per_rank(self) -> float:
        """A rank's host cores: its share of the node's on a GPU node (one host per node);
        on the CPU-emulated lanes the host lane's own threads (the profile's cores), the
        ranks' sharing of the machine being `shared_cores`'s."""
        if self.emulated:
            return self.node.host.cores
        rank = self.node.host.cores / self.gpus_per_node
        if self.zenflow_pinned:
            return float(split_cores(int(rank), self.settings.zenflow.pt_reserved_cores_perc)[1])
        return rank

    @property
    def shared_cores(self) -> tuple[tuple[int, int], float | None]:
        """((device threads, host threads) of a rank's lanes, the machine's cores that
        several ranks on the CPU-emulated lanes share: zfbench.sims.emulated.cpu_share);
        cores None for one rank, whose lanes' contention the profile measured itself."""
        cal = self.calibration or {}
        threads = (cal.get("device_threads", 1), cal.get("host_threads", 1))
        return threads, (cal.get("cpu_cores") if self.gpus > 1 else None)

    @property
    def numa_factor(self) -> float:
        """A rank's host work rate over its all-local rate on a GPU node: its threads and
        its memory on different sockets (zfbench.sims.host_step); 1 with a measured
        profile (the profile measured the rates on the machine itself)."""
        if self.calibration is not None:
            return 1.0
        h = self.node.host
        return host_step.numa_factor(h.sockets, h.cores / h.sockets, self.cores_per_rank,
                                     self.settings.runtime.bind_cores or self.zenflow_pinned)

    @property
    def zenflow_pinned(self) -> bool:
        """Whether this is ZenFlow's host work pinned as DeepSpeed pins it
        (`pt_reserved_cores_perc` given, from presets; zfbench.core.config_zenflow
        `split_cores`): on the cores the reserve leaves of
        the rank's own contiguous block (`_compute_zf_pt_affinity` binds each rank to one
        first where the launcher did not), so its memory is local as with bind_cores."""
        return (has_windows(self.strategy) and self.calibration is None
                and self.settings.zenflow.pt_reserved_cores_perc is not None)

    @cached_property
    def adam_units_per_core_s(self) -> float:
        return self.node.host.adam_params_per_s_per_core * self.numa_factor

    @cached_property
    def convert_units_per_core_s(self) -> float | None:
        """Elements/s per core of the host's wire conversions outside its AdamW kernel, as
        a profile measured them with 16-bit weights (`host_convert_elems_per_s`: the
        gradients out of the d2h wire into fp32; profiles from before issue 45 timed the
        master into the h2d wire too, which the engine's AdamW pass now writes itself);
        None where not measured (fp32 weights convert nothing; on a GPU node DeepSpeed's
        CPU-Adam, whose rate the preset is, writes the 16-bit parameters itself)."""
        rate = (self.calibration or {}).get("host_convert_elems_per_s")
        if rate is None or self.settings.scenario.precision == "fp32":
            return None
        return rate / self.node.host.cores

    @property
    def link_host_factors(self) -> dict[str, float]:
        """How the upload link and the host's work slow each other, as a profile measured
        them on a GPU (`h2d_factor_when_host_busy`, `host_factor_when_h2d_busy`); none
        (1.0: only the DRAM bandwidth is shared) from presets, on the CPU lanes, whose
        uploads are the host worker's own copies, and in older profiles."""
        cal = self.calibration or {}
        return {k: float(cal[k]) for k in ("h2d_factor_when_host_busy",
                                           "host_factor_when_h2d_busy") if k in cal}

    @cached_property
    def host_chunk_elems(self) -> int | None:
        """Elements per host optimizer job: with a profile of zfbench's engine its chunk
        for the rank's host threads (`engine_host_chunk_elems`: the accumulation, urgent,
        goes ahead of the next chunk, and each chunk's upload follows it), and from presets
        with `host_job` naming the engine; else None, a job per bucket."""
        if not (self.engine_grad_passes or self.engine_host_job):
            return None
        return engine_host_chunk_elems(int(self.cores_per_rank))

    @cached_property
    def window_first_write(self) -> bool:
        """Whether ZenFlow's window is written by its first accumulation instead of zeroed
        in the AdamW pass (zfbench's engine since issue 45): profiles that measured that
        accumulation (`host_accum_first_elems_per_s`) and presets with the engine's host
        job; profiles from before price the zeroing they measured, as then."""
        if self.calibration is None:
            return self.engine_host_job
        return "host_accum_first_elems_per_s" in self.calibration

    @cached_property
    def zero_units_per_core_s(self) -> float | None:
        """Elements/s per core of clearing ZenFlow's fp32 window, as a profile measured it
        (`host_zero_elems_per_s`: what zeroing added to zfbench's engine's AdamW pass over
        a chunk, which cleared the window chunk it read, before `window_first_write`;
        before that a pass of its own); None where not measured (presets, older profiles)
        or where nothing zeroes the window."""
        rate = (self.calibration or {}).get("host_zero_elems_per_s")
        if rate is None or self.window_first_write:
            return None
        return rate / self.node.host.cores

    @cached_property
    def accum_first_units_per_core_s(self) -> float:
        """Elements/s per core of a ZenFlow window's first accumulation: with
        `window_first_write`, as a profile measured it (`host_accum_first_elems_per_s`), or
        from presets the accumulation's bytes per second over its fewer bytes
        (ACCUM_FIRST_BYTES_PER_ELEMENT); else every accumulation's rate."""
        if not self.window_first_write:
            return self.accum_units_per_core_s
        if self.calibration is not None:
            return self.calibration["host_accum_first_elems_per_s"] / self.node.host.cores
        return (self.accum_units_per_core_s * ACCUM_BYTES_PER_ELEMENT
                / ACCUM_FIRST_BYTES_PER_ELEMENT)

    @cached_property
    def deepspeed_host_step(self) -> bool:
        """ZeRO-Offload's host step as DeepSpeed runs it (zfbench.sims.host_step: clip,
        CPU-Adam, the blocking fp32 -> 16-bit conversion over the whole partition, then one
        upload); False with a measured profile (zfbench's own engine: Adam chunk by chunk,
        each chunk up after it, conversions as the profile measured them) and from presets
        with `host_job` naming the engine (`engine_host_job`)."""
        return self.calibration is None and self.settings.runtime.host_job == "deepspeed"

    @cached_property
    def engine_host_job(self) -> bool:
        """From presets, the host optimizer job as zfbench's engine runs it (`host_job`
        "engine" or "engine-clip"): one job per engine chunk, costed from its bytes
        (zfbench.core.engine_host_bytes) at the host AdamW's streaming rate
        (zfbench.sims.host_traffic.engine_job_units_per_s)."""
        return self.calibration is None and self.settings.runtime.host_job != "deepspeed"

    @property
    def engine_clips(self) -> bool:
        """The engine's host job runs the clipping passes (`host_job` "engine-clip")."""
        return self.settings.runtime.host_job == "engine-clip"

    @property
    def grad_wire_bytes(self) -> float:
        """Bytes per element of a ZeRO-Offload gradient on its way down: from presets
        DeepSpeed converts each gradient slice to fp32 on the device before the copy
        (zfbench.sims.host_step.GRAD_WIRE_BYTES); zfbench's engine (a measured profile)
        sends the 16-bit gradient."""
        if self.deepspeed_host_step:
            return host_step.GRAD_WIRE_BYTES
        return self.elem_bytes

    @cached_property
    def pageable_copies(self) -> bool:
        """Whether the offload's host buffers are pageable (`pin_memory` False), so that
        copies block their issuing lane and are staged (zfbench.sims.pageable); never with
        a measured profile (zfbench's engine pins its buffers) or emulated."""
        return not self.settings.runtime.pin_memory and self.calibration is None

    @cached_property
    def serial_grad_reduction(self) -> bool:
        """Whether each gradient bucket's reduction and copy down run on the compute stream
        (DeepSpeed's ZeRO-2 with `overlap_comm` False), so that backward waits for them;
        never with a measured profile (zfbench's engine has its own schedule) or emulated."""
        return not self.settings.runtime.overlap_comm and self.calibration is None

    @property
    def pageable_copy_bytes_per_s(self) -> float:
        """The staging copy's cap on one rank's pageable copy: the link's measured or
        inferred `staging_copy_bytes_per_s` where its hardware file gives one, else the
        judgment of zfbench.sims.pageable."""
        measured = self.node.link.staging_copy_bytes_per_s
        if measured is not None:
            return measured
        return pageable.staging_copy_bytes_per_s(self.numa_factor)

    def stream_units_per_core_s(self, bytes_per_elem: float) -> float:
        """Elements/s per core of a host streaming pass beside Adam (clip, conversion)."""
        memo, b = self.__dict__.setdefault("_stream_memo", {}), bytes_per_elem
        if b not in memo:
            memo[b] = self.numa_factor * host_step.stream_units_per_core_s(b)
        return memo[b]

    @cached_property
    def accum_units_per_core_s(self) -> float:
        if self.calibration is not None:
            return self.calibration["host_accum_elems_per_s"] / self.node.host.cores
        per_core = self.settings.machine.host_accum_per_core  # measured on a machine's own socket
        if per_core is None:
            per_core = host_step.ACCUM_ELEMS_PER_CORE_S
        return per_core * self.numa_factor
