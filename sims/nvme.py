"""Each node's NVMe drives as a shared resource of the simulation (zero-infinity with nvme).

This module owns how NVMe reads and writes share a node's drives. Every node has its own
array (the DGX-2's drives are the node's; ZeRO-Infinity's NVMe runs over many nodes, each
rank swapping its partition to its own node's drives), shared by that node's ranks only.
The drives form one striped array (DeepSpeed's `nvme_path` on a RAID-0 of the node's
drives), and the active reads and writes share its *drive time* (`nvme_rates`): with k
jobs active each gets `drives / k` drives' worth and moves `read_bytes_per_s` (or
`write_bytes_per_s`) per drive-second (judgment: a flash array serves reads and writes from
the same channels, so a mixed load gets the time-weighted mix of the sequential rates; the
vendor rates are per drive, zfbench/data/hardware.json "nvme_drives").

The drives are a second `FluidPool` beside the node's links-and-DRAM pool, so their
traffic takes neither PCIe switch bandwidth from the GPUs (the drives hang off the CPU's
own lanes) nor DRAM bandwidth from the host Adam (a simplification: DeepSpeed's aio reads
into pinned DRAM). Each rank gets two in-order lanes on it, `nvme_read` and `nvme_write`,
whose spans go to the run's timeline (`nvme_spans`), so the GPU's wait on the drives
counts as exposed I/O.
"""

from __future__ import annotations

import weakref

import simpy

from zfbench.sims.fluid import FluidPool, Job, RateFn
from zfbench.sims.lanes import Lane

READ, WRITE = "nvme_read", "nvme_write"
# Setup time per NVMe request: none modelled. A transfer here is a bucket's share, tens of
# MB and more, read in 1 MiB blocks at queue depth >= 8 (DeepSpeed's aio defaults), where
# a drive's ~100 us access latency is hidden by the queue (judgment).
NVME_LATENCY_S = 0.0


def nvme_rates(read_bytes_per_s: float, write_bytes_per_s: float, drives: int) -> RateFn:
    """Processor sharing of the array's drive time among the active NVMe jobs."""

    def rates(active: list[Job]) -> list[float]:
        share = drives / len(active)
        return [share * (read_bytes_per_s if job.kind == READ else write_bytes_per_s)
                for job in active]

    rates.job_key = lambda job: job.kind
    return rates


class NvmeNode:
    """One node's drive array: the shared pool, the span log, and each rank's lanes."""

    def __init__(self, env: simpy.Environment, timeline, read_bytes_per_s: float,
                 write_bytes_per_s: float, drives: int) -> None:
        self.env = env
        self.timeline = timeline
        self.pool = FluidPool(env, nvme_rates(read_bytes_per_s, write_bytes_per_s, drives))

    def lanes(self, rank: int) -> tuple[Lane, Lane]:
        """A rank's (read, write) lanes on the shared array."""
        return (Lane(self.env, self.timeline, self.pool, rank, READ),
                Lane(self.env, self.timeline, self.pool, rank, WRITE))


# One array per simulated node. The simulator builds one timeline per run and shares it
# among the ranks, so the timeline identifies the run without a change to its wiring; a
# rank's node is its index over the GPUs per node, as the simulator assigns host pools.
_NODES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def node_nvme(env: simpy.Environment, timeline, costs, rank: int) -> NvmeNode:
    """The array of `rank`'s node in this run (made by the first of its ranks that asks)."""
    arrays = _NODES.setdefault(timeline, {})
    index = rank // costs.gpus_per_node
    node = arrays.get(index)
    if node is None:
        s = costs.settings
        drive = s.machine.nvme_drive()
        node = arrays[index] = NvmeNode(env, timeline, drive.read_bytes_per_s,
                                        drive.write_bytes_per_s, s.machine.nvme_drives)
    return node


def nvme_spans(timeline) -> list[tuple]:
    """The NVMe spans of a simulated run, `(rank, lane, op, step, t0, t1, bytes)`; empty
    when nothing touched NVMe."""
    spans = timeline.spans_frame()
    mine = spans[spans["lane"].isin([READ, WRITE])]
    return [tuple(row) for row in mine[["rank", "lane", "op", "step", "t_start_s",
                                        "t_end_s", "bytes"]].itertuples(index=False)]


def submit(lane: Lane, op: str, rank: int, step: int, nbytes: float, deps) -> simpy.Event:
    """Queue an NVMe read or write of `nbytes` on `lane`; fires when it is done."""
    nbytes = int(round(nbytes))
    job = Job(op, rank, nbytes)
    return lane.submit(op, step, deps, seconds=NVME_LATENCY_S, job=job, nbytes=nbytes)
