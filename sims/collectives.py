"""Ring collective costs on one node or on several (two-level, hierarchical).

Conventions (NVIDIA/nccl-tests doc/PERFORMANCE.md): `nbytes` is the whole buffer per
rank; a ring all-reduce moves 2(n-1)/n of it per rank and link, an all-gather or
reduce-scatter (n-1)/n (a reduce-scatter costs as an all-gather); every ring step pays
the link's latency once; a link runs at `bytes_per_s * efficiency` (its achieved busbw).

One node of G GPUs over the intra-node link (bandwidth b, latency l):

    allreduce(B) = 2(G-1)/G * B/b + 2(G-1) l          allgather(B) = (G-1)/G * B/b + (G-1) l

N > 1 nodes of G GPUs, the standard two-level model: each GPU owns a NIC (`inter` is per
GPU, as on DGX-class nodes), so G inter-node rings of N ranks run side by side, each on
1/G of the buffer (b', l' the inter-node network's achieved bandwidth and latency):

    allreduce(B) = RS_G(B) + AR_N(B/G) + AG_G(B)
                 = 2(G-1)/G * B/b + 2(G-1) l  +  2(N-1)/N * (B/G)/b' + 2(N-1) l'
    allgather(B) = AG_N(B/G) + AG_G(B) = (G-1)/G * B/b + (G-1) l + (N-1)/N * (B/G)/b' + (N-1) l'

With G = 1 the node terms vanish; with N = 1 these are the one-node formulas. The NICs
are not a shared resource here, so a cost is a fixed duration on each rank's net lane.
"""

from __future__ import annotations

from zfbench.core.hardware import NetLink


def _ring(link: NetLink, ranks: int, nbytes: float, passes: int) -> float:
    """`passes` ring passes (1: all-gather or reduce-scatter, 2: all-reduce) of `nbytes`
    over `ranks` ranks on `link`; 0 for one rank."""
    if ranks == 1:
        return 0.0
    return passes * (ranks - 1) / ranks * nbytes / (link.bytes_per_s * link.efficiency) + \
        passes * (ranks - 1) * link.latency_s


def allreduce_s(intra: NetLink, inter: NetLink | None, gpus_per_node: int, nodes: int,
                nbytes: float) -> float:
    """Seconds of an all-reduce of `nbytes` per rank (module docstring's formula)."""
    if nodes == 1:
        return _ring(intra, gpus_per_node, nbytes, 2)
    return (_ring(intra, gpus_per_node, nbytes, 2)
            + _ring(_need(inter), nodes, nbytes / gpus_per_node, 2))


def allgather_s(intra: NetLink, inter: NetLink | None, gpus_per_node: int, nodes: int,
                nbytes: float) -> float:
    """Seconds of an all-gather (or reduce-scatter) assembling `nbytes` per rank."""
    if nodes == 1:
        return _ring(intra, gpus_per_node, nbytes, 1)
    return (_ring(intra, gpus_per_node, nbytes, 1)
            + _ring(_need(inter), nodes, nbytes / gpus_per_node, 1))


def _need(inter: NetLink | None) -> NetLink:
    if inter is None:
        raise ValueError("several nodes need an inter-node network (inter_net)")
    return inter
