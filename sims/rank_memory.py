"""What each strategy holds per rank, and whether it fits the node.

`memory_per_rank(c, strategy)` gives a `CostModel` `c`'s device bytes per rank, and the
host and NVMe bytes of one node (of `c.nodes`, each holding its ranks' share): the
engine's allocation where a measured profile describes zfbench's engine, DeepSpeed's
otherwise (ZeRO-2 device Adam and ZeRO-Offload: zfbench.sims.device_memory; ZeRO-3 and
zero-infinity: zfbench.sims.zero3; host state: zfbench.core.memory_model). `fits` sets
those beside the node's GPU, host and NVMe capacities. The costs of time live in
zfbench.sims.costs; this module only counts bytes.
"""

from __future__ import annotations

from zfbench.core.memory_model import engine_device_bytes, host_bytes_per_param
from zfbench.core.strategies import STRATEGY, buckets_on, has_windows, zero_offload
from zfbench.sims import device_memory, zero3

# Bytes per selected element of ZenFlow's device AdamW state (fp32 m, v and master slice).
SELECTED_STATE_BYTES = 12


def staged_moments(moments: float, elems: float) -> float:
    """Device bytes that `zenflow.offload` saves: the offloaded moments leave the device
    but for one reduce bucket's share of `elems` staged at a time (a negative number)."""
    return moments * (min(1.0, device_memory.REDUCE_BUCKET_ELEMS / elems) - 1.0)


def memory_per_rank(c, strategy: str) -> dict[str, float]:
    """Device bytes per rank, host bytes and NVMe bytes for one node, by strategy
    (zero-infinity: zfbench.sims.zero3.memory)."""
    rule = STRATEGY[strategy].memory
    if rule == "zero3":
        return zero3.memory(c)
    p, b = c.params, c.elem_bytes
    part = c.share(p)
    act = c.activation_bytes()
    moments = c.offloaded_moment_bytes if has_windows(strategy) else 0.0
    if c.calibration is not None:  # zfbench's engine, as it allocates
        device = engine_device_bytes(strategy, p, b, c.selected_params, act,
                                     moments_offloaded=moments > 0)
    elif rule == "device-adam":  # ZeRO-2 at its step's peak (zfbench.sims.device_memory)
        device = device_memory.device_strategy_bytes(p, part, b, act)
    elif zero_offload(strategy):  # DeepSpeed's: params + two gradient buckets
        device = device_memory.zero_offload_device_bytes(p, b, act)
    elif c.on_zero3(strategy):  # ZenFlow on ZeRO-3: partitioned, gathered per block
        device = zero3.zenflow_device_bytes(c) + (staged_moments(moments, part) if moments
                                                  else 0.0)
    else:  # ZenFlow on ZeRO-2: 16-bit weights and gradients, AdamW state of the selection
        device = p * b + p * b + c.selected_params * SELECTED_STATE_BYTES + act
        device += staged_moments(moments, p) if moments else 0.0
    # the node's ranks' host state as the engine allocates it (zfbench.core.memory_model:
    # fp32 master, m, v, the strategy's fp32 gradient buffers and 16-bit wires; none
    # for device), with gradient buckets where the schedule has them (copy engines)
    bucketed = buckets_on(c.settings.scenario.precision, not c.emulated)
    host = float(c.per_node(p * host_bytes_per_param(strategy, b, bucketed)
                            + c.gpus * moments))
    return {"device_bytes_per_rank": device, "host_bytes": host, "nvme_bytes": 0.0}


def fits(c, strategy: str) -> dict[str, float | bool]:
    """`memory_per_rank` with the node's GPU, host and NVMe capacities, and `fits`: all
    three within them."""
    mem = memory_per_rank(c, strategy)
    dev_cap = float(c.node.gpu.memory_bytes)
    host_cap = float(c.node.host.memory_bytes)
    m = c.settings.machine
    nvme_cap = float(m.nvme_drive().capacity_bytes * m.nvme_drives)
    return {**mem, "device_capacity_bytes": dev_cap, "host_capacity_bytes": host_cap,
            "nvme_capacity_bytes": nvme_cap,
            "fits": mem["device_bytes_per_rank"] <= dev_cap and mem["host_bytes"] <= host_cap
            and mem["nvme_bytes"] <= nvme_cap}
