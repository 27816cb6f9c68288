"""The engine's host update split, against the bare kernel on the same thread and buffers
(issue 45: what around the kernel costs the in-engine host AdamW).

    python bench/host_chunk_split.py [--steps 24] [--out bench/results/host_chunk_split]

Runs bench/vs_deepspeed.py's zfbench side in sequential mode (ZenFlow, opt-350m[2L], seq
128, fp32, top-k 0.1, U 4, every core for both lanes; no DeepSpeed needed), timing each
AdamW chunk (`HostState.adam_chunk`) and each upload (`Strategy.params_up`) in the wall
clock and in the process's CPU time (nothing else runs in the process meanwhile: the
training thread waits for the host job). Then, on the engine's own host worker and
buffers, the bare kernels, alternating, each call after a first: the engine's kernel
over the whole master (`kernels.host_adamw_`, with and without the window's zeroing),
the same in the engine's chunks, and torch's fused AdamW (`host_adam.host_adamw_`, what
vs_deepspeed.py's kernel comparison times). Rates are parameters per wall second and per
CPU second (on a shared machine the CPU seconds move less with the load). Writes
DIR/<date>_<time>.json with the load averages before and after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ds_engines import ds_config, make_zf, seeded_batches, train_step  # noqa: E402

from zfbench.core.models import get_model  # noqa: E402
from zfbench.core.progress import progress  # noqa: E402
from zfbench.core.provenance import machine  # noqa: E402
from zfbench.real import kernels, strategies  # noqa: E402
from zfbench.real.host_adam import host_adamw_ as torch_fused_adamw_  # noqa: E402
from zfbench.real.model import build_model  # noqa: E402

WARMUP = 8  # steps left out: two windows of U 4


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed_engine(steps: int) -> tuple[object, list]:
    """The engine after `steps` sequential-mode steps, and (kind, elements, wall s, CPU s)
    of every AdamW chunk and upload after the warm-up."""
    log: list = []
    adam, up = strategies.HostState.adam_chunk, strategies.Strategy.params_up

    def adam_chunk(self, a, b, *args, **kw):
        c0, t0 = cpu_s(), time.perf_counter()
        adam(self, a, b, *args, **kw)
        log.append(("adam", b - a, time.perf_counter() - t0, cpu_s() - c0))

    def params_up(self, t, target, a, b, wire):
        c0, t0 = cpu_s(), time.perf_counter()
        up(self, t, target, a, b, wire)
        log.append(("upload", b - a, time.perf_counter() - t0, cpu_s() - c0))
    zen = {"topk_ratio": 0.1, "update_interval": 4, "select_strategy": "step",
           "select_interval": 0, "overlap_step": False, "full_warm_up_rounds": 0}
    shape = get_model("opt-350m").with_layers(2)
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(cores)
    strategies.HostState.adam_chunk, strategies.Strategy.params_up = adam_chunk, params_up
    try:
        engine = make_zf(build_model(shape, seed=0), ds_config(1, zen, 1e-4, 0.01, 0.0),
                         cores, cores)
        for i, batch in enumerate(progress(seeded_batches(shape.vocab, 1, 128, steps, 0),
                                           desc="engine steps", unit="step")):
            if i == WARMUP:
                log.clear()
            train_step(engine, batch)
        engine.finish()
    finally:
        strategies.HostState.adam_chunk, strategies.Strategy.params_up = adam, up
    return engine, log


def bare_on_worker(engine, repeats: int) -> dict:
    """The bare kernels on the engine's host worker and buffers, alternating."""
    host, o = engine.strategy.host, engine.strategy.opt
    grad = host.grads[0]
    hyper = dict(lr=o.lr, beta1=o.betas[0], beta2=o.betas[1], eps=o.eps,
                 weight_decay=o.weight_decay)
    calls = {
        "engine_kernel_whole": lambda: kernels.host_adamw_(
            host.master, grad, host.m, host.v, None, step=100, **hyper),
        "engine_kernel_whole_zeroing": lambda: kernels.host_adamw_(
            host.master, grad, host.m, host.v, None, step=100, zero_grad=True, **hyper),
        "engine_kernel_chunks_zeroing": lambda: [kernels.host_adamw_(
            host.master[a:b], grad[a:b], host.m[a:b], host.v[a:b], None, step=100,
            zero_grad=True, **hyper) for a, b in host.chunks],
        "torch_fused_whole": lambda: torch_fused_adamw_(
            host.master, grad, host.m, host.v, step=100, **hyper)}
    times: dict = {k: [] for k in calls}

    def run() -> None:
        for r in range(repeats + 1):
            for name in (list(calls) if r % 2 else list(calls)[::-1]):
                c0, t0 = cpu_s(), time.perf_counter()
                calls[name]()
                if r:
                    times[name].append((time.perf_counter() - t0, cpu_s() - c0))
    engine.host_lane.wait(engine.host_lane.submit("host_optim", 10 ** 6, [run]), 600.0)
    n = host.numel
    return {k: {"params_per_wall_s": n / statistics.median(x[0] for x in v),
                "params_per_cpu_s": n / statistics.median(x[1] for x in v)}
            for k, v in times.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "host_chunk_split")
    args = ap.parse_args(argv)
    if args.steps < WARMUP + 4 or args.repeats < 1:
        ap.error(f"--steps must be >= {WARMUP + 4} (the first {WARMUP} are left out) and "
                 f"--repeats >= 1")
    before = os.getloadavg()
    engine, log = timed_engine(args.steps)
    spans = [s for s in engine.timeline.spans if s.step >= WARMUP]
    busy = sum(s.duration_s for s in spans if s.lane == "host" and s.op == "host_optim")
    updates = len({s.step for s in spans if s.op == "host_optim"})
    parts = {}
    for kind in ("adam", "upload"):
        rows = [x for x in log if x[0] == kind]
        elems, wall, cpu = (sum(x[i] for x in rows) for i in (1, 2, 3))
        parts[kind] = {"wall_s": wall, "cpu_s": cpu, "params_per_wall_s": elems / wall,
                       "params_per_cpu_s": elems / cpu}
    n = engine.layout.total
    out = {"machine": machine(), "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(
               timespec="seconds"), "args": vars(args) | {"out": str(args.out)},
           "params": n, "host_updates": updates, "host_optim_busy_s": busy,
           "host_optim_params_per_s": updates * n / busy,
           "other_in_host_optim_s": busy - parts["adam"]["wall_s"] - parts["upload"]["wall_s"],
           "engine": parts, "bare_on_host_worker": bare_on_worker(engine, args.repeats),
           "loadavg_before": before, "loadavg_after": os.getloadavg()}
    engine.close()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d_%H%M.json")
    path.write_text(json.dumps(out, indent=1, default=str))
    print(f"host_optim: {out['host_optim_params_per_s'] / 1e6:.0f} M params per busy s over "
          f"{updates} updates; other than AdamW and uploads {out['other_in_host_optim_s']:.4f} s")
    for kind, p in parts.items():
        print(f"  engine {kind:6s}: {p['params_per_wall_s'] / 1e6:5.0f} M per wall s, "
              f"{p['params_per_cpu_s'] / 1e6:5.0f} M per CPU s")
    for kind, p in out["bare_on_host_worker"].items():
        print(f"  bare {kind:28s}: {p['params_per_wall_s'] / 1e6:5.0f} M per wall s, "
              f"{p['params_per_cpu_s'] / 1e6:5.0f} M per CPU s")
    print(f"load {before[0]:.1f} -> {out['loadavg_after'][0]:.1f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
