"""DeepSpeed ZeRO-2's reduction of one gradient bucket among the data-parallel ranks, as
each DeepSpeed release runs it (`Runtime.zero2_reduce`, issue 44 item 3).

`average_tensor` in DeepSpeed's ZeRO-2 (deepspeed/runtime/zero/stage2.py at the
ZeRO-Offload release, deepspeedai/DeepSpeed 41db1c2 (PR #391, 2020); stage_1_and_2.py
later) cuts a bucket into runs of consecutive elements that one rank owns (one run per
owner, `zfbench.sims.partitioning.owned_runs`) and:

- "reduce" (DeepSpeed 0.3 to 0.12.3): one `dist.reduce(grad_slice, dst=owner,
  async_op=True)` per run, all on one NCCL communicator, so one after the other. NCCL's
  reduce is a pipelined ring chain: each rank sends the whole slice once (busbw = algbw,
  NVIDIA/nccl-tests doc/PERFORMANCE.md), and every one of its R - 1 hops pays its link's
  latency. Across N nodes of G GPUs the chain crosses each node boundary through the
  node's NICs, which NCCL's channels use side by side (G b' together). A slice of s bytes:
      reduce(s) = s / min(b, G b') + (R - N) l + (N - 1) l'        (R = N G)
  b, l the intra-node link's achieved bandwidth and latency, b', l' the inter-node
  network's per GPU (zfbench.sims.collectives' conventions). The bucket: the sum over runs.
- "allreduce" (DeepSpeed 0.12.4 on: `use_multi_rank_bucket_allreduce`, default True since
  PR #4695, November 2023): `allreduce_and_scatter` all-reduces the bucket and each rank
  keeps its runs: `collectives.allreduce_s` of the whole bucket.
- "reduce-scatter": an ideal ring reduce-scatter, (n-1)/n of the bucket per rank
  (`collectives.allgather_s`); no DeepSpeed release runs it for ZeRO-2 (the reference
  the ablation, bench/zo_scaling.py, switches back to; ZeRO-3 runs a real one).
"""

from __future__ import annotations

from zfbench.sims.sections import ZERO2_REDUCES  # noqa: F401  (the styles, in order)
# The span op of a reduction to the owners (zfbench.sims.zero3.REDUCE_SCATTER_OP's name).
REDUCE_OP = "reduce_scatter"


def ring_reduce_s(intra, inter, gpus_per_node: int, nodes: int, nbytes: float) -> float:
    """Seconds of one NCCL ring reduce of `nbytes` to one root over `nodes` x
    `gpus_per_node` ranks (module docstring's formula); 0 on one rank."""
    ranks = gpus_per_node * nodes
    if ranks == 1:
        return 0.0
    bandwidth = intra.bytes_per_s * intra.efficiency
    if nodes > 1:
        bandwidth = min(bandwidth, gpus_per_node * inter.bytes_per_s * inter.efficiency)
    hops = (ranks - nodes) * intra.latency_s
    if nodes > 1:
        hops += (nodes - 1) * inter.latency_s
    return nbytes / bandwidth + hops


def bucket_reduce_s(c, i: int, runs: list[float]) -> float:
    """Seconds of bucket i's gradient reduction on cost model `c`, its owners' `runs` of
    elements given (zfbench.sims.partitioning.owned_runs), in the style of its settings'
    `zero2_reduce` (module docstring); memoized per bucket."""
    memo = c.__dict__.setdefault("_zero2_reduce_memo", {})
    if i not in memo:
        style = c.settings.runtime.zero2_reduce
        nbytes = c.buckets[i].numel * c.elem_bytes
        if style == "allreduce":
            memo[i] = c.allreduce_s(nbytes)
        elif style == "reduce-scatter":
            memo[i] = c.allgather_s(nbytes)
        else:
            memo[i] = sum(ring_reduce_s(c.node.net, c.inter_net, c.gpus_per_node, c.nodes,
                                        n * c.elem_bytes) for n in runs)
    return memo[i]
