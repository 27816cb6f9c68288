"""Simulating only node 0 where every node repeats it, side by side in one process with
simulating every node: the wall time of `zfbench.sims.simulator.simulate` both ways on
the same settings, and whether the step times agree.

    python bench/repeating_nodes.py [--nodes 2,8,32] [--model SHAPE] [--repeats 2] [--out DIR]

Default case: a 1T-parameter GPT-2 shape (128 layers, hidden 25,600) under zero-infinity
with parameters and optimizer state on NVMe, on DGX-2 nodes of 16 V100s, micro-batch 5,
4 steps (the size of the ZeRO-Infinity paper's multi-node rows). Writes
DIR/repeating_nodes.json (rows: best wall time of each way, their ratio, the two mean
step times, and the machine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zfbench.core.provenance import provenance  # noqa: E402
from zfbench.core.trace import write_json_atomic  # noqa: E402
from zfbench.sims.costs import SimSettings  # noqa: E402
from zfbench.sims.settings import node_knobs  # noqa: E402
from zfbench.sims.simulator import simulate  # noqa: E402

TRILLION = "gpt2:layers=128,hidden=25600,heads=160"


def timed(settings: SimSettings, every_node: bool, repeats: int) -> tuple[float, float]:
    """(best wall seconds, mean step seconds of rank 0) of one way of simulating."""
    best, step = float("inf"), 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = simulate(settings, "zero-infinity", every_node=every_node)
        best = min(best, time.perf_counter() - t0)
        steps = result.timeline.steps_frame()
        step = float(steps[steps["rank"] == 0]["wall_s"].mean())
    return best, step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", default="2,8,32")
    p.add_argument("--model", default=TRILLION)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    rows = []
    for nodes in (int(n) for n in args.nodes.split(",")):
        knobs = node_knobs("dgx2-v100", 16 * nodes)
        settings = SimSettings.from_knobs(**knobs, model=args.model, micro_batch=5, seq=1024,
                                          precision="fp16", offload_params="nvme",
                                          offload_optimizer="nvme", steps=4)
        alone_s, alone_step = timed(settings, False, args.repeats)
        every_s, every_step = timed(settings, True, args.repeats)
        rows.append({"nodes": nodes, "gpus": 16 * nodes, "node0_alone_wall_s": alone_s,
                     "every_node_wall_s": every_s, "speedup": every_s / alone_s,
                     "node0_alone_step_s": alone_step, "every_node_step_s": every_step})
        print(f"{nodes:>3} nodes: node 0 alone {alone_s:7.2f} s, every node {every_s:7.2f} s "
              f"({every_s / alone_s:5.1f}x); step {alone_step:.6g} s vs {every_step:.6g} s")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "repeating_nodes.json",
                      {"provenance": provenance(argv, "bench/repeating_nodes.py"),
                       "model": args.model, "rows": rows})
    print(f"wrote {args.out}/repeating_nodes.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
