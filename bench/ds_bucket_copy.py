"""DeepSpeed's gradient copies into its reduction bucket, timed inside its own method and
without a profiler: ZeRO-Offload against ZenFlow (optional extra, never in CI).

    /work/dsvenv/bin/python bench/ds_bucket_copy.py [--shape "tinyllama-1.1b[1L]:1:32"]
        [--steps 16] [--out DIR]     # -> DIR/bucket_copy.json

Why: under torch.profiler (bench/ds_trace.py) DeepSpeed 0.19.5's ZenFlow spent 2.2-2.8x
ZeRO-Offload's time in `reduce_independent_p_g_buckets_and_remove_grads`'s `copy_` of each
gradient into the bucket, though its source (`grad.permute(...).contiguous()`,
stage_1_and_2.py line 1208) is already contiguous for a column-major gradient. Here each
`Tensor.copy_` of a million elements or more made inside that method (and only there) is
timed, then made again at once into the same destination (its pages now touched, the
source read again): the first against the repeat tells what the first copy pays beyond
streaming; the two engines side by side tell whether ZenFlow pays more. One process per
engine, DeepSpeed on its CPU accelerator, fp32, one rank, the configs of
bench/ds_wallclock.py (ZeRO-2, offload_optimizer cpu, top-k 0.1, U 4, sequential); the
last quarter of the steps kept. The repeat doubles each copy's work, so these steps are
not step-time measurements.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

ENGINES = ("zero_offload", "zenflow_seq")
MIN_ELEMS = 1_000_000  # smaller copies are timer noise


def one_engine(engine: str, shape_spec: str, steps: int) -> dict:
    """The timed copies of one engine's last quarter of `steps` steps, by size."""
    import torch

    from ds_engines import import_deepspeed, make_ds, seeded_batches, train_step
    from ds_wallclock import default_engine_args, engine_config, parse_shapes
    from zfbench.core.models import get_model
    from zfbench.core.provenance import machine
    from zfbench.real.model import build_model

    ds = import_deepspeed(False)
    from deepspeed.runtime.zero import stage_1_and_2 as zero2

    [(name, batch, seq)] = parse_shapes(shape_spec)
    shape = get_model(name)
    cfg = engine_config(default_engine_args(), batch, engine)
    copies, inside = [], [False]
    plain_copy = torch.Tensor.copy_

    def timed_copy(dst, src, non_blocking=False):
        if not inside[0] or dst.numel() < MIN_ELEMS:
            return plain_copy(dst, src, non_blocking)
        t0 = time.perf_counter()
        out = plain_copy(dst, src, non_blocking)
        t1 = time.perf_counter()
        plain_copy(dst, src, non_blocking)
        copies.append({"elems": dst.numel(), "first_s": t1 - t0,
                       "again_s": time.perf_counter() - t1,
                       "source_contiguous": src.is_contiguous(), "dst_ptr": dst.data_ptr()})
        return out

    method = zero2.DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads

    def timed_method(self, param, i):
        inside[0] = True
        try:
            return method(self, param, i)
        finally:
            inside[0] = False

    zero2.DeepSpeedZeroOptimizer.reduce_independent_p_g_buckets_and_remove_grads = timed_method
    torch.Tensor.copy_ = timed_copy
    dse = make_ds(ds, build_model(shape, seed=0), cfg)
    keep_from = steps - max(1, steps // 4)
    for t, b in enumerate(seeded_batches(shape.vocab, batch, seq, steps, 0)):
        if t == keep_from:
            copies.clear()
        train_step(dse, b, [])
    by_size: dict[int, list] = {}
    for c in copies:
        by_size.setdefault(c["elems"], []).append(c)
    return {"engine": engine, "shape": shape_spec, "steps": steps, "kept_steps": steps - keep_from,
            "machine": machine(), "torch_threads": torch.get_num_threads(),
            "loadavg": list(os.getloadavg()),
            "by_size": [{"elems": n, "calls": len(cs),
                         "first_ms_median": 1e3 * statistics.median(c["first_s"] for c in cs),
                         "again_ms_median": 1e3 * statistics.median(c["again_s"] for c in cs),
                         "source_contiguous": sorted({c["source_contiguous"] for c in cs}),
                         "destinations": len({c["dst_ptr"] for c in cs})}
                        for n, cs in sorted(by_size.items())]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="tinyllama-1.1b[1L]:1:32", help="MODEL:BATCH:SEQ")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--out", type=Path,
                   default=ROOT / "bench/results/predict_deepspeed_trace/tinyllama_zen5")
    p.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)  # the child's
    args = p.parse_args(argv)
    if args.steps < 4:
        p.error(f"--steps must be at least 4, got {args.steps}")
    if args.engine:  # one engine in this process (DeepSpeed's patches stay in it)
        print(json.dumps(one_engine(args.engine, args.shape, args.steps)))
        return 0
    results = []
    for engine in ENGINES:
        done = subprocess.run([sys.executable, __file__, "--engine", engine, "--shape",
                               args.shape, "--steps", str(args.steps)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"error: {engine}: {done.stderr[-2000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    for r in results:
        for s in r["by_size"]:
            print(f"{r['engine']:13s} {s['elems']:>10d} elems: first {s['first_ms_median']:6.1f} "
                  f"ms, again {s['again_ms_median']:6.1f} ms ({s['calls']} calls, "
                  f"{s['destinations']} destinations, source contiguous "
                  f"{s['source_contiguous']})")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bucket_copy.json").write_text(json.dumps(
        {"benchmark": "ds_bucket_copy", "date_utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                  time.gmtime()),
         "engines": results}, indent=1) + "\n")
    print(f"wrote {args.out}/bucket_copy.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
